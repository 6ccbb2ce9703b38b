/* The training step, compiled once per supported (d_model, n_heads) from step_impl.h. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "attention.h"
#include "expf.h"
#include "gemm.h"
#ifdef EMG_BF16
#include "gemm_bf16.h"
#endif
#include "norm.h"
#include "session.h"
#include "transpose.h"
#include "xent.h"

/* Live rows per block of a chunk (step_impl.h, chunk_step): about two batches of 16. Measured per sample at
 * batch 256 against batch 64 (d64 / d128): unblocked 15% / 3% slower; blocks of 480 rows 2% slower / 2%
 * faster; 240 rows 2% / 2% faster; 120 rows about even. */
#define BLOCK_ROWS 240

#define D_MODEL 16
#define N_HEADS 4
#define SFX _d16h4
#include "step_impl.h"
#undef D_MODEL
#undef N_HEADS
#undef SFX

#define D_MODEL 32
#define N_HEADS 4
#define SFX _d32h4
#include "step_impl.h"
#undef N_HEADS
#undef SFX
#define N_HEADS 8
#define SFX _d32h8
#include "step_impl.h"
#undef D_MODEL
#undef N_HEADS
#undef SFX

#define D_MODEL 64
#define N_HEADS 4
#define SFX _d64h4
#include "step_impl.h"
#undef N_HEADS
#undef SFX
#define N_HEADS 8
#define SFX _d64h8
#include "step_impl.h"
#undef D_MODEL
#undef N_HEADS
#undef SFX

#define D_MODEL 128
#define N_HEADS 4
#define SFX _d128h4
#include "step_impl.h"
#undef N_HEADS
#undef SFX
#define N_HEADS 8
#define SFX _d128h8
#include "step_impl.h"
#undef D_MODEL
#undef N_HEADS
#undef SFX

static const struct emg_kernel *const kernels[] = {
    &kernel_d16h4, &kernel_d32h4, &kernel_d32h8, &kernel_d64h4,
    &kernel_d64h8, &kernel_d128h4, &kernel_d128h8,
};

const struct emg_kernel *emg_x86_find_kernel(int d_model, int n_heads) {
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        if (kernels[i]->d_model == d_model && kernels[i]->n_heads == n_heads) return kernels[i];
    return NULL;
}
