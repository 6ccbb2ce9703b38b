/* The step specialised for d_model 128 with 4 heads. */
#define D_MODEL 128
#define N_HEADS 4
#define KERNEL_NAME emg_kernel_d128h4
#include "step_impl.h"
