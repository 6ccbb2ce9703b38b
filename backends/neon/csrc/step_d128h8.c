/* The step specialised for d_model 128 with 8 heads. */
#define D_MODEL 128
#define N_HEADS 8
#define KERNEL_NAME emg_kernel_d128h8
#include "step_impl.h"
