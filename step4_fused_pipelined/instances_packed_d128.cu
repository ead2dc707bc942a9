// FlashAttention, step by step — step 4g: the packed-batch kernels at d = 128, bf16 and fp16 (configs.h, Packed).
#include "step4_fused_pipelined/prepare.cuh"

template std::function<void()> fa::step4::prepare_packed_named<__nv_bfloat16, 128>(const std::string&, const fa::Problem&,
                                                                        const fa::AttnParams&, const fa::step4::PackedBatch&,
                                                                        int64_t, int64_t);
template std::function<void()> fa::step4::prepare_packed_named<__half, 128>(const std::string&, const fa::Problem&,
                                                                 const fa::AttnParams&, const fa::step4::PackedBatch&,
                                                                 int64_t, int64_t);
