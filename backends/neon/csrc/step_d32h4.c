/* The step specialised for d_model 32 with 4 heads. */
#define D_MODEL 32
#define N_HEADS 4
#define KERNEL_NAME emg_kernel_d32h4
#include "step_impl.h"
