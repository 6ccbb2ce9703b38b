/* The step specialised for d_model 32. */
#define D_MODEL 32
#define KERNEL_NAME emg_kernel_d32
#include "step_impl.h"
