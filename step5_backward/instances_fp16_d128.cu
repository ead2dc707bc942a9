// FlashAttention, step by step — step 5: the fp16, d = 128 kernels of every configuration (configs.h).
#include "step5_backward/prepare.cuh"

template std::function<void()> fa::step5::prepare_named<__half, 128>(const std::string&, const fa::Problem&,
                                                                   const fa::step5::BwdParams&);
