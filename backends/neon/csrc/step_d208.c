/* The step specialised for d_model 208. */
#define D_MODEL 208
#define KERNEL_NAME emg_kernel_d208
#include "step_impl.h"
