// FlashAttention, step by step — step 7: the fp16, d = 128 kernels of every configuration (configs.h).
#include "step7_hopper_wgmma/prepare.cuh"

template std::function<void()> fa::step7::prepare_named<__half, 128>(const std::string&, const fa::Problem&,
                                                                 const fa::AttnParams&);
