/* The step specialised for d_model 224. */
#define D_MODEL 224
#define KERNEL_NAME emg_kernel_d224
#include "step_impl.h"
