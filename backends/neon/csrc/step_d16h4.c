/* The step specialised for d_model 16 with 4 heads. */
#define D_MODEL 16
#define N_HEADS 4
#define KERNEL_NAME emg_kernel_d16h4
#include "step_impl.h"
