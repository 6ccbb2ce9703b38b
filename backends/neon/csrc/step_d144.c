/* The step specialised for d_model 144. */
#define D_MODEL 144
#define KERNEL_NAME emg_kernel_d144
#include "step_impl.h"
