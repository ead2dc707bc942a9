// FlashAttention, step by step — step 5: the fp16, d = 128 kernels of every configuration (configs.h).
#include "prepare.cuh"

FA_STEP5_FOR_EACH_CONFIG(FA_STEP5_INSTANTIATE, __half, 128)
FA_STEP5_FOR_EACH_D128_CONFIG(FA_STEP5_INSTANTIATE, __half)
