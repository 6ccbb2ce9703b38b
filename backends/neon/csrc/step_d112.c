/* The step specialised for d_model 112. */
#define D_MODEL 112
#define KERNEL_NAME emg_kernel_d112
#include "step_impl.h"
