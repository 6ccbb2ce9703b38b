/* The step specialised for d_model 80. */
#define D_MODEL 80
#define KERNEL_NAME emg_kernel_d80
#include "step_impl.h"
