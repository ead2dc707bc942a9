// FlashAttention, step by step — step 4: the fp16, d = 64 kernels of every configuration (configs.h).
#include "step4_fused_pipelined/prepare.cuh"

template std::function<void()> fa::step4::prepare_named<__half, 64>(const std::string&, const fa::Problem&,
                                                                 const fa::AttnParams&);
