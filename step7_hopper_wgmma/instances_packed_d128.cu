// FlashAttention, step by step — step 7e: the packed-batch kernels at d = 128, bf16 and fp16 (kernel_7e_packed.cuh).
#include "step7_hopper_wgmma/prepare.cuh"

template std::function<void()> fa::step7::prepare_packed<__nv_bfloat16, 128>(const fa::Problem&, const fa::AttnParams&,
                                                                           const fa::step4::PackedBatch&, int64_t, int64_t);
template std::function<void()> fa::step7::prepare_packed<__half, 128>(const fa::Problem&, const fa::AttnParams&,
                                                                    const fa::step4::PackedBatch&, int64_t, int64_t);
