/* The step specialised for d_model 192. */
#define D_MODEL 192
#define KERNEL_NAME emg_kernel_d192
#include "step_impl.h"
