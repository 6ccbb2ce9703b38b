/* The training step, compiled once per supported width (d_model 16..256 in steps of 16) from step_impl.h:
 * the GEMM tile shapes depend on the width. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "attention.h"
#include "encoder.h"
#include "expf.h"
#include "gemm.h"
#ifdef EMG_BF16
#include "gemm_bf16.h"
#endif
#include "norm.h"
#include "session.h"
#include "transpose.h"
#include "xent.h"

/* Attention with the width and head count as run-time values: one copy for every head count that step_impl.h
 * does not compile as a constant. */
#define NOT_INLINED static __attribute__((noinline, noclone))

NOT_INLINED void attention_forward_any(int D, int H, const float *qkv, float *o, float *att, int L, float *scratch) {
    attention_forward(D, H, qkv, o, att, L, att_lanes(L), scratch);
}

NOT_INLINED void attention_backward_any(int D, int H, const float *qkv, const float *att, const float *dout,
                                        float *dqkv, int L, float *scratch) {
    attention_backward(D, H, qkv, att, dout, dqkv, L, att_lanes(L), scratch);
}

#define D_MODEL 16
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 32
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 48
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 64
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 80
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 96
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 112
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 128
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 144
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 160
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 176
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 192
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 208
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 224
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 240
#include "step_impl.h"
#undef D_MODEL
#define D_MODEL 256
#include "step_impl.h"
#undef D_MODEL

/* kernels[i] is the step for d_model 16 * (i + 1). */
static const struct emg_kernel *const kernels[] = {
    &kernel_d16,  &kernel_d32,  &kernel_d48,  &kernel_d64,  &kernel_d80,  &kernel_d96,  &kernel_d112, &kernel_d128,
    &kernel_d144, &kernel_d160, &kernel_d176, &kernel_d192, &kernel_d208, &kernel_d224, &kernel_d240, &kernel_d256,
};

const struct emg_kernel *emg_x86_find_kernel(int d_model) {
    const int i = d_model / 16 - 1;
    if (d_model % 16 != 0 || i < 0 || i >= (int)(sizeof kernels / sizeof kernels[0])) return NULL;
    return kernels[i];
}
