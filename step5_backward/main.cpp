// FlashAttention, step by step — step 5's executable: the common CLI around step 4's training forward and
// the backward kernels (--backward runs them; --inputs reads do.npy; --dump writes dq/dk/dv.npy).
// The stage hands itself and step 1's oracle (what --check compares with) to the harness.
#include "harness/cli.h"
#include "step1_cpu_reference/reference.h"
#include "step5_backward/backward.h"

int main(int argc, char** argv) { return fa::stage_main(fa::step5::stage(), fa::step1::oracle(), argc, argv); }
