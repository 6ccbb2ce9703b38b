/* The step specialised for d_model 240. */
#define D_MODEL 240
#define KERNEL_NAME emg_kernel_d240
#include "step_impl.h"
