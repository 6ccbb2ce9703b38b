/* The step specialised for d_model 64 with 4 heads. */
#define D_MODEL 64
#define N_HEADS 4
#define KERNEL_NAME emg_kernel_d64h4
#include "step_impl.h"
