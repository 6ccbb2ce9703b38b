/* The session object behind the ABI's opaque emg_session (the shared layer's emg_core plus the Neon
 * buffers), and the table of specialised kernels. */
#ifndef EMG_NEON_SESSION_H
#define EMG_NEON_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "emg_backend.h"

typedef struct emg_kernel {
    int d_model, n_heads;
    size_t work_bytes; /* per-sequence activations and gradients */
    /* Zeroes s->core.grads, then fills it with d(mean loss)/d(params) of the batch; returns the mean loss. */
    float (*loss_grad)(emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths);
    /* Rebuilds the transposed weight copies from s->core.params (after Adam or set_state). */
    void (*sync_transposed)(emg_session *s);
} emg_kernel;

struct emg_session {
    emg_core core; /* shape, layout, step and the training state: owned by the shared layer */
    const emg_kernel *kernel;
    float *wt;   /* transposed copies: Wqkv^T [D][3D], Wo^T [D][D], Wf1^T [D][4D], Wf2^T [4D][D] */
    void *work;
};

/* One table entry per specialised translation unit (step_d*.c). */
extern const emg_kernel emg_kernel_d16h4, emg_kernel_d32h4, emg_kernel_d64h4, emg_kernel_d128h4,
    emg_kernel_d128h8;

/* Adam over the whole flat buffer with the header's constants (adam.c). */
void emg_adam_update(float *params, const float *grads, float *m, float *v, long n, int64_t step, float lr);

#endif
