// FlashAttention, step by step — step 1's executable: the common CLI around the CPU reference.
// The stage hands itself and step 1's oracle (what --check compares with) to the harness.
#include "harness/cli.h"
#include "step1_cpu_reference/reference.h"


int main(int argc, char** argv) { return fa::stage_main(fa::step1::stage(), fa::step1::oracle(), argc, argv); }
