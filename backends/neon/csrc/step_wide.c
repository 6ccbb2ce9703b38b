/* The step for widths above the compiled ones (NEON_WIDE_MIN..EMG_MAX_D_MODEL in steps of 16): step_impl.h
 * compiled once with the width read from the session's shape, so the build adds one unit, not 48. */
#define NEON_STEP_WIDE
#define KERNEL_NAME emg_neon_kernel_wide
#include "step_impl.h"
