/* The step specialised for d_model 256. */
#define D_MODEL 256
#define KERNEL_NAME emg_kernel_d256
#include "step_impl.h"
