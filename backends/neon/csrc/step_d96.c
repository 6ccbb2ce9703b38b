/* The step specialised for d_model 96. */
#define D_MODEL 96
#define KERNEL_NAME emg_kernel_d96
#include "step_impl.h"
