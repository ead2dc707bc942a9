// FlashAttention, step by step — step 5: the packed-batch backward kernels at d = 128, bf16 and fp16 (configs.h, Packed).
#include "step5_backward/prepare.cuh"

template std::function<void()> fa::step5::prepare_packed_named<__nv_bfloat16, 128>(const std::string&, const fa::Problem&,
                                                                        const fa::step5::BwdParams&,
                                                                        const fa::step5::PackedRows&, int64_t, int64_t);
template std::function<void()> fa::step5::prepare_packed_named<__half, 128>(const std::string&, const fa::Problem&,
                                                                 const fa::step5::BwdParams&, const fa::step5::PackedRows&,
                                                                 int64_t, int64_t);
