/* The step specialised for d_model 16. */
#define D_MODEL 16
#define KERNEL_NAME emg_kernel_d16
#include "step_impl.h"
