/* The session object shared by the backend hooks (session.c), the thread split (threads.c) and the per-size
 * step kernels (step.c). */
#ifndef EMG_X86_SESSION_H
#define EMG_X86_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "emg_backend.h"
#include "threads.h"

struct emg_session;

/* One compiled specialisation of the step for a (d_model, n_heads). */
struct emg_kernel {
    int d_model, n_heads;
    /* Forward (and backward into grads when it is not NULL) on an already validated batch. */
    void (*loss_and_grad)(struct emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths,
                          float *loss, float *grads);
    /* The shared layer's fused train_step hook (emg_backend.h): forward, backward, the finiteness gate,
     * Adam (which also judges the parameters it writes) and the transposed copies in one pool region;
     * returns the verdict (enum emg_step_verdict). */
    int (*train_step)(struct emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths, float lr,
                      float *loss);
    /* Rebuild the transposed weight copies from params (after every parameter change). */
    void (*sync_transposed)(struct emg_session *s);
};

/* The kernel for (d_model, n_heads), or NULL. */
const struct emg_kernel *emg_x86_find_kernel(int d_model, int n_heads);

struct emg_session {
    emg_core core; /* shape, layout, step and the training state: owned by the shared layer */
    const struct emg_kernel *k;
    int max_rows;
#ifndef EMG_BF16
    /* Transposed weight copies used by the forward GEMMs: [in][out]. WlmT is padded to 32 columns. */
    float *wqkv_t, *wo_t, *wf1_t, *wf2_t, *wlm_t;
#endif
    /* Activations over packed live rows (max_rows: every chunk starts on a multiple of ROW_PAD). */
    float *x0, *n1, *qkv, *o, *x1, *n2, *hid, *x2, *logits, *r0, *r1, *r2, *att;
#ifdef EMG_BF16
    /* avx512_bf16 build: weights packed into bf16 pairs (gemm_bf16.h) for the forward (W^T, packed straight
     * from W) and backward GEMMs, rebuilt after every update; two bf16 scratch rows of 4 * d per packed row. */
    float *pk_qkv_t, *pk_o_t, *pk_f1_t, *pk_f2_t, *pk_lm_t, *pk_lm, *pk_f2, *pk_f1, *pk_o, *pk_qkv;
    float *bf_a, *bf_b;
#endif
    /* Backward buffers. */
    float *dx2, *dhid, *dn2, *dx1, *dout, *dqkv, *dn1;
    /* Row bookkeeping: input token, target token and position per packed row. */
    int *row_tok, *row_tgt, *row_pos;
    void *arena; /* one allocation holding all float buffers */
    /* Threads (threads.h): NULL with one; each step's chunk per participant. */
    struct emg_threads *threads;
    struct emg_chunk chunks[EMG_X86_MAX_THREADS];
};

#define LOGIT_LD 32 /* logits rows padded from VOCAB (27) to 32 floats */

#endif /* EMG_X86_SESSION_H */
