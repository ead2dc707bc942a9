// FlashAttention, step by step — step 4: the bf16, d = 128 kernels of every configuration (configs.h).
#include "step4_fused_pipelined/prepare.cuh"

template std::function<void()> fa::step4::prepare_named<__nv_bfloat16, 128>(const std::string&, const fa::Problem&,
                                                                 const fa::AttnParams&);
