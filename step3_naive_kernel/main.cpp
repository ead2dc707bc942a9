// FlashAttention, step by step — step 3's executable: the common CLI around the first CUDA kernel.
#include "common/harness.h"

int main(int argc, char** argv) { return fa::stage_main("step3_naive_kernel", argc, argv); }
