// FlashAttention, step by step — step 5's executable: the common CLI around step 4's training forward and
// the backward kernels (--backward runs them; --inputs reads do.npy; --dump writes dq/dk/dv.npy).
#include "common/harness.h"

int main(int argc, char** argv) { return fa::stage_main("step5_backward", argc, argv); }
