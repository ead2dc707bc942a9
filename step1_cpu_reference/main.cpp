// FlashAttention, step by step — step 1's executable: the common CLI around the CPU reference.
#include "common/harness.h"

int main(int argc, char** argv) { return fa::stage_main("step1_cpu_reference", argc, argv); }
