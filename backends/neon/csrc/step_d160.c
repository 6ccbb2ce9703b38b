/* The step specialised for d_model 160. */
#define D_MODEL 160
#define KERNEL_NAME emg_kernel_d160
#include "step_impl.h"
