/*
 * eemicrogpt native backend ABI, version 2.
 *
 * A native backend is a plain shared library exporting the functions below. The Python core loads it
 * with cffi (ABI mode, see eemicrogpt_core/backends/native.py), validates every array before the call, and turns
 * non-zero return codes into exceptions. Functions never abort and never print. Backends do not write these
 * functions themselves: emg_backend.h (next to this header) implements all of them over a backend's kernels.
 *
 * A model's shape is an emg_shape: width D = d_model, H = n_heads, L = n_layers, V = vocab (the data's
 * symbols plus the boundary token, which is the last one, V - 1) and C = context (predictions per sequence;
 * a sequence holds at most C + 1 tokens). The ABI's own bounds are below (EMG_MAX_*); emg_supports says what
 * a library has kernels for.
 *
 * Parameter buffer (the ABI every backend shares): one contiguous float32 array, tensors in this order,
 * each row-major W[out][in]:
 *   tok_emb [V][D]   pos_emb [C][D]
 *   then per layer l = 0..L-1:  Wq [D][D]  Wk [D][D]  Wv [D][D]  Wo [D][D]  Wf1 [4D][D]  Wf2 [D][4D]
 *   Wlm [V][D]
 * n_params = 2*V*D + C*D + 12*L*D*D. Gradients and the Adam moments m and v use the same layout. With L = 1,
 * V = 27 and C = 16 this is version 1's layout exactly.
 *
 * Model (microgpt's loop): x = rms(tok_emb[tok] + pos_emb[t]); per layer x += Wo attn(rms(x)), then
 * x += Wf2 relu(Wf1 rms(x)); logits = Wlm x (no final norm). rms has no gain; attention is causal with
 * scale 1/sqrt(D/H).
 *
 * Batches: tokens uint8 [batch][C + 1] (BOUNDARY, symbols..., BOUNDARY, then padding of any value < V),
 * lengths uint8 [batch] in [2, C + 1]. Position t of sequence b is live when t <= lengths[b] - 2 and
 * predicts tokens[b][t+1]; the loss is the mean cross-entropy over all live positions of the batch.
 * For n steps, tokens is [n][batch][C + 1], lengths [n][batch], lrs [n], losses [n] (loss before update).
 *
 * Step (one call of emg_train_steps does n of these): forward, backward, then Adam:
 *   step += 1; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
 *   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
 * with b1 = 0.85, b2 = 0.99, eps = 1e-8 and lr taken from lrs[i].
 */
#ifndef EEMICROGPT_H
#define EEMICROGPT_H

#include <stdint.h>

#define EMG_ABI_VERSION 2
#define EMG_MIN_VOCAB 2     /* the boundary token and one symbol */
#define EMG_MAX_VOCAB 256   /* tokens are uint8 */
#define EMG_MAX_CONTEXT 64  /* predictions per sequence */
#define EMG_MAX_LAYERS 8
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
    EMG_ERR_UNSUPPORTED = 2,  /* this library cannot run that shape, or max_batch > MAX_BATCH */
    EMG_ERR_NOMEM = 3,        /* allocation failed */
    EMG_ERR_NONFINITE = 4     /* a loss, gradient or updated parameter is NaN/Inf. A non-finite loss or
                                 gradient stops before its update (the state is as after the last finite
                                 step); an update that overflows leaves the state it produced */
};

/* A model's shape (see the top of this file). */
typedef struct emg_shape {
    int32_t d_model;  /* D */
    int32_t n_heads;  /* H: divides D, D / H >= 4 */
    int32_t n_layers; /* L: 1..EMG_MAX_LAYERS */
    int32_t vocab;    /* V: EMG_MIN_VOCAB..EMG_MAX_VOCAB, boundary token V - 1 */
    int32_t context;  /* C: 1..EMG_MAX_CONTEXT */
} emg_shape;

typedef struct emg_session emg_session;

/* The ABI version this library was built for (EMG_ABI_VERSION). */
int emg_abi_version(void);

/* 1 when this library has kernels for the shape (and the shape is valid), else 0. Pure: runs no
 * ISA-specific code. A NULL shape is 0. */
int emg_supports(const emg_shape *shape);

/* Create a session with zeroed parameters, moments and step. The shape is copied. */
int emg_create(const emg_shape *shape, int max_batch, emg_session **out);
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

/* Optional (a library may lack it and the loader calls it only when exported): run each step of this
 * session on n_threads threads. A session starts with 1 (no extra
 * threads). For a given n_threads the results are bit-for-bit reproducible; different counts sum in a
 * different order. Returns EMG_ERR_ARGUMENT for n_threads < 1, EMG_ERR_UNSUPPORTED above the library's
 * maximum, EMG_ERR_NOMEM when the threads cannot be started (the session then runs on one thread). */
int emg_set_threads(emg_session *s, int n_threads);
/* CDEF-END */

/* The shape rules (model.py's ModelShape checks the same): positive sizes, heads divide d_model,
 * head_dim >= 4, and layers, vocabulary and context within the ABI's bounds. */
static inline int emg_shape_valid(const emg_shape *s) {
    return s != 0 && s->d_model >= 1 && s->n_heads >= 1 && s->d_model % s->n_heads == 0
        && s->d_model / s->n_heads >= 4 && s->n_layers >= 1 && s->n_layers <= EMG_MAX_LAYERS
        && s->vocab >= EMG_MIN_VOCAB && s->vocab <= EMG_MAX_VOCAB && s->context >= 1
        && s->context <= EMG_MAX_CONTEXT;
}

/* Tokens per sequence row of a batch: the context plus the first input (the boundary). */
static inline int emg_seq_len(const emg_shape *s) { return s->context + 1; }

/* The batch rule every backend enforces (the core checks it too, but C must not trust its caller): the
 * pointers are set, 1 <= batch <= max_batch, every length is in [2, context + 1] and every token, padding
 * included, is below vocab. Returns EMG_OK or EMG_ERR_ARGUMENT. */
static inline int emg_check_batch(const emg_shape *s, int batch, int max_batch, const uint8_t *tokens,
                                  const uint8_t *lengths) {
    if (tokens == 0 || lengths == 0 || batch < 1 || batch > max_batch) return EMG_ERR_ARGUMENT;
    const int seq = emg_seq_len(s);
    for (int b = 0; b < batch; b++)
        if (lengths[b] < 2 || lengths[b] > seq) return EMG_ERR_ARGUMENT;
    for (long i = 0; i < (long)batch * seq; i++)
        if (tokens[i] >= s->vocab) return EMG_ERR_ARGUMENT;
    return EMG_OK;
}

#ifdef __cplusplus
}
#endif

#endif /* EEMICROGPT_H */
