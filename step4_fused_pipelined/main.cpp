// FlashAttention, step by step — step 4's executable: the common CLI around the fused forward kernel.
// The stage hands itself and step 1's oracle (what --check compares with) to the harness.
#include "harness/cli.h"
#include "step1_cpu_reference/reference.h"
#include "step4_fused_pipelined/fused.h"

int main(int argc, char** argv) { return fa::stage_main(fa::step4::stage(), fa::step1::oracle(), argc, argv); }
