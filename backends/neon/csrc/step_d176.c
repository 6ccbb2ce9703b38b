/* The step specialised for d_model 176. */
#define D_MODEL 176
#define KERNEL_NAME emg_kernel_d176
#include "step_impl.h"
