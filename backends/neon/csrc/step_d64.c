/* The step specialised for d_model 64. */
#define D_MODEL 64
#define KERNEL_NAME emg_kernel_d64
#include "step_impl.h"
