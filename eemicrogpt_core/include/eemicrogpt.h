/*
 * eemicrogpt native backend ABI, version 1.
 *
 * A native backend is a plain shared library exporting the functions below. The Python core loads it
 * with cffi (ABI mode, see eemicrogpt_core/native.py), validates every array before the call, and turns
 * non-zero return codes into exceptions. Functions never abort and never print. Backends do not write these
 * functions themselves: emg_backend.h (next to this header) implements all of them over a backend's kernels.
 *
 * Parameter buffer (the ABI every backend shares): one contiguous float32 array, tensors in this order,
 * each row-major W[out][in]:
 *   tok_emb [VOCAB][D]   pos_emb [MAX_SEQ][D]
 *   Wq [D][D]  Wk [D][D]  Wv [D][D]  Wo [D][D]
 *   Wf1 [4D][D]  Wf2 [D][4D]  Wlm [VOCAB][D]
 * n_params = 2*VOCAB*D + MAX_SEQ*D + 12*D*D  (4,192 / 14,528 / 53,632 / 205,568 at D = 16/32/64/128).
 * Gradients and the Adam moments m and v use the same layout.
 *
 * Batches: tokens uint8 [batch][MAX_SEQ] (BOUNDARY, chars..., BOUNDARY, then padding of any value < VOCAB),
 * lengths uint8 [batch] in [2, MAX_SEQ]. Position t of sequence b is live when t <= lengths[b] - 2 and
 * predicts tokens[b][t+1]; the loss is the mean cross-entropy over all live positions of the batch.
 * For n steps, tokens is [n][batch][MAX_SEQ], lengths [n][batch], lrs [n], losses [n] (loss before update).
 *
 * Step (one call of emg_train_steps does n of these): forward, backward, then Adam:
 *   step += 1; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
 *   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
 * with b1 = 0.85, b2 = 0.99, eps = 1e-8 and lr taken from lrs[i].
 */
#ifndef EEMICROGPT_H
#define EEMICROGPT_H

#include <stdint.h>

#define EMG_ABI_VERSION 1
#define EMG_VOCAB 27
#define EMG_BOUNDARY 26
#define EMG_MAX_SEQ 16
#define EMG_MAX_BATCH 256 /* the largest max_batch emg_create accepts (native.py reads it from here) */
#define EMG_ADAM_BETA1 0.85f
#define EMG_ADAM_BETA2 0.99f
#define EMG_ADAM_EPS 1e-8f
#define EMG_RMS_EPS 1e-5f

#ifdef __cplusplus
extern "C" {
#endif

/* The block between CDEF-BEGIN and CDEF-END is read by cffi: keep it free of preprocessor lines. */
/* CDEF-BEGIN */
enum emg_status {
    EMG_OK = 0,
    EMG_ERR_ARGUMENT = 1,     /* a NULL pointer, n <= 0, batch outside [1, max_batch], bad token/length */
    EMG_ERR_UNSUPPORTED = 2,  /* this library cannot run that (d_model, n_heads), or max_batch > MAX_BATCH */
    EMG_ERR_NOMEM = 3,        /* allocation failed */
    EMG_ERR_NONFINITE = 4     /* a loss, gradient or updated parameter is NaN/Inf. A non-finite loss or
                                 gradient stops before its update (the state is as after the last finite
                                 step); an update that overflows leaves the state it produced */
};

typedef struct emg_session emg_session;

/* The ABI version this library was built for (EMG_ABI_VERSION). */
int emg_abi_version(void);

/* 1 when this library has kernels for (d_model, n_heads), else 0. Pure: runs no ISA-specific code. */
int emg_supports(int d_model, int n_heads);

/* Create a session with zeroed parameters, moments and step. */
int emg_create(int d_model, int n_heads, int max_batch, emg_session **out);
void emg_destroy(emg_session *s);

/* Copy the full training state in or out. Each buffer holds n_params floats. */
int emg_set_state(emg_session *s, const float *params, const float *adam_m, const float *adam_v,
                  int64_t step);
int emg_get_state(const emg_session *s, float *params, float *adam_m, float *adam_v, int64_t *step);

/* Run n_steps full training steps (forward, backward, Adam) on caller-owned arrays. Every batch and lr
 * (which must be finite) is checked before any update. losses[i] is the loss before step i's update, written
 * even when it is not finite; losses of steps that did not run are NaN. */
int emg_train_steps(emg_session *s, int n_steps, int batch, const uint8_t *tokens,
                    const uint8_t *lengths, const float *lrs, float *losses);

/* Loss (and, when grads is not NULL, the n_params gradient) of one batch; the state is not changed. */
int emg_loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths,
                      float *loss, float *grads);

/* Optional (added after version 1 without changing it; a library may lack it and the loader calls it only
 * when exported): run each step of this session on n_threads threads. A session starts with 1 (no extra
 * threads). For a given n_threads the results are bit-for-bit reproducible; different counts sum in a
 * different order. Returns EMG_ERR_ARGUMENT for n_threads < 1, EMG_ERR_UNSUPPORTED above the library's
 * maximum, EMG_ERR_NOMEM when the threads cannot be started (the session then runs on one thread). */
int emg_set_threads(emg_session *s, int n_threads);
/* CDEF-END */

/* The batch rule every backend enforces (the core checks it too, but C must not trust its caller): the
 * pointers are set, 1 <= batch <= max_batch, every length is in [2, MAX_SEQ] and every token, padding
 * included, is below VOCAB. Returns EMG_OK or EMG_ERR_ARGUMENT. */
static inline int emg_check_batch(int batch, int max_batch, const uint8_t *tokens, const uint8_t *lengths) {
    if (tokens == 0 || lengths == 0 || batch < 1 || batch > max_batch) return EMG_ERR_ARGUMENT;
    for (int b = 0; b < batch; b++)
        if (lengths[b] < 2 || lengths[b] > EMG_MAX_SEQ) return EMG_ERR_ARGUMENT;
    for (long i = 0; i < (long)batch * EMG_MAX_SEQ; i++)
        if (tokens[i] >= EMG_VOCAB) return EMG_ERR_ARGUMENT;
    return EMG_OK;
}

#ifdef __cplusplus
}
#endif

#endif /* EEMICROGPT_H */
