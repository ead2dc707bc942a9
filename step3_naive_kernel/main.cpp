// FlashAttention, step by step — step 3's executable: the common CLI around the first CUDA kernel.
// The stage hands itself and step 1's oracle (what --check compares with) to the harness.
#include "harness/cli.h"
#include "step1_cpu_reference/reference.h"
#include "step3_naive_kernel/naive.h"

int main(int argc, char** argv) { return fa::stage_main(fa::step3::stage(), fa::step1::oracle(), argc, argv); }
