// FlashAttention, step by step — step 7's executable: the common CLI around the Hopper forward (sm_90 only).
#include "harness/cli.h"
#include "step1_cpu_reference/reference.h"
#include "step7_hopper_wgmma/hopper.h"

int main(int argc, char** argv) { return fa::stage_main(fa::step7::stage(), fa::step1::oracle(), argc, argv); }
