// FlashAttention, step by step — step 4's executable: the common CLI around the fused forward kernel.
#include "common/harness.h"

int main(int argc, char** argv) { return fa::stage_main("step4_fused_pipelined", argc, argv); }
