/* The step specialised for d_model 128. */
#define D_MODEL 128
#define KERNEL_NAME emg_kernel_d128
#include "step_impl.h"
