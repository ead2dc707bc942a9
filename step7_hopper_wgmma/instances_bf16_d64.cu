// FlashAttention, step by step — step 7: the bf16, d = 64 kernels of every configuration (configs.h).
#include "step7_hopper_wgmma/prepare.cuh"

template std::function<void()> fa::step7::prepare_named<__nv_bfloat16, 64>(const std::string&, const fa::Problem&,
                                                                 const fa::AttnParams&);
