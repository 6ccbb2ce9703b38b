/* The step specialised for d_model 48. */
#define D_MODEL 48
#define KERNEL_NAME emg_kernel_d48
#include "step_impl.h"
