// FlashAttention, step by step — step 5: the bf16, d = 64 kernels of every configuration (configs.h).
#include "step5_backward/prepare.cuh"

template std::function<void()> fa::step5::prepare_named<__nv_bfloat16, 64>(const std::string&, const fa::Problem&,
                                                                   const fa::step5::BwdParams&);
