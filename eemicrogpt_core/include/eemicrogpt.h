/*
 * eemicrogpt native backend ABI, version 3 (version 2 had uint8 lengths, context <= 64, 8 layers and fixed
 * Adam constants; version 1 had one fixed shape).
 *
 * A native backend is a plain shared library exporting the functions below. The Python core loads it
 * with cffi (ABI mode, see eemicrogpt_core/backends/native.py), validates every array before the call, and turns
 * non-zero return codes into exceptions. Functions never abort and never print. Backends do not write these
 * functions themselves: emg_backend.h (next to this header) implements all of them over a backend's kernels.
 *
 * A model's shape is an emg_shape: width D = d_model, H = n_heads, L = n_layers, V = vocab (the data's
 * symbols plus the boundary token, which is the last one, V - 1) and C = context (predictions per sequence;
 * a sequence holds at most C + 1 tokens). The ABI's own bounds are below (EMG_MAX_*); emg_supports says what
 * a library has kernels for (native libraries run widths that are multiples of EMG_D_MODEL_STEP; each
 * library's supports() and its README say which of them it has kernels for).
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
 * lengths uint16 [batch] in [2, C + 1]. Position t of sequence b is live when t <= lengths[b] - 2 and
 * predicts tokens[b][t+1]; the loss is the mean cross-entropy over all live positions of the batch.
 * For n steps, tokens is [n][batch][C + 1], lengths [n][batch], lrs [n], losses [n] (loss before update).
 *
 * Step (one call of emg_train_steps does n of these): forward, backward, then AdamW with the session's
 * emg_optimizer (b1, b2, eps, wd, clip; set by emg_set_optimizer, EMG_ADAM_* and no decay or clipping until
 * then) and lr taken from lrs[i]:
 *   if clip > 0: norm = sqrt(sum of g*g over all n_params gradients, accumulated in double);
 *                when norm > clip, g *= (float)(clip / norm)             (global-norm clipping, as torch's)
 *   step += 1;
 *   if wd > 0:   p *= 1 - lr*wd                                            (decoupled decay, every tensor:
 *                                                   all of this model's tensors are matrices, as nanoGPT
 *                                                   decays every 2-D tensor; torch's AdamW does the same)
 *   m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
 *   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
 * The finiteness gate (EMG_ERR_NONFINITE) judges the gradient before clipping. With the defaults (no clip,
 * no decay) a step is version 2's to the bit.
 */
#ifndef EEMICROGPT_H
#define EEMICROGPT_H

#include <stdint.h>

#define EMG_ABI_VERSION 3
#define EMG_MIN_VOCAB 2     /* the boundary token and one symbol */
#define EMG_MAX_VOCAB 256   /* tokens are uint8 */
#define EMG_MAX_CONTEXT 256 /* predictions per sequence (a length, C + 1 <= 257, needs uint16) */
#define EMG_MAX_LAYERS 12
#define EMG_MAX_D_MODEL 1024
#define EMG_D_MODEL_STEP 16 /* native libraries run widths that are multiples of this (or of a larger step) */
#define EMG_MAX_BATCH 256 /* the largest max_batch emg_create accepts (native.py reads it from here) */
/* The optimiser a session starts with (emg_set_optimizer changes it). */
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

/* The optimiser's settings for every later step of a session (see "Step" at the top of this file). */
typedef struct emg_optimizer {
    float beta1;        /* [0, 1) */
    float beta2;        /* [0, 1) */
    float eps;          /* > 0 */
    float weight_decay; /* >= 0; 0 is none (decoupled, AdamW) */
    float grad_clip;    /* >= 0; 0 is none (the largest global L2 norm of the gradient) */
} emg_optimizer;

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
                    const uint16_t *lengths, const float *lrs, float *losses);

/* Loss (and, when grads is not NULL, the n_params gradient) of one batch; the state is not changed. */
int emg_loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths,
                      float *loss, float *grads);

/* Set the optimiser for every later step (the state is not changed). EMG_ERR_ARGUMENT for a NULL pointer or
 * a value outside the ranges in emg_optimizer (NaN included), with nothing changed. */
int emg_set_optimizer(emg_session *s, const emg_optimizer *opt);

/* Optional (a library may lack it and the loader calls it only when exported): run each step of this
 * session on n_threads threads. A session starts with 1 (no extra
 * threads). For a given n_threads the results are bit-for-bit reproducible; different counts sum in a
 * different order. Returns EMG_ERR_ARGUMENT for n_threads < 1, EMG_ERR_UNSUPPORTED above the library's
 * maximum, EMG_ERR_NOMEM when the threads cannot be started (the session then runs on one thread). */
int emg_set_threads(emg_session *s, int n_threads);
/* CDEF-END */

/* The shape rules (model.py's ModelShape checks the same): positive sizes, heads divide d_model,
 * head_dim >= 4, and width, layers, vocabulary and context within the ABI's bounds. */
static inline int emg_shape_valid(const emg_shape *s) {
    return s != 0 && s->d_model >= 1 && s->d_model <= EMG_MAX_D_MODEL && s->n_heads >= 1 && s->d_model % s->n_heads == 0
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
                                  const uint16_t *lengths) {
    if (tokens == 0 || lengths == 0 || batch < 1 || batch > max_batch) return EMG_ERR_ARGUMENT;
    const int seq = emg_seq_len(s);
    for (int b = 0; b < batch; b++)
        if (lengths[b] < 2 || lengths[b] > seq) return EMG_ERR_ARGUMENT;
    for (long i = 0; i < (long)batch * seq; i++)
        if (tokens[i] >= s->vocab) return EMG_ERR_ARGUMENT;
    return EMG_OK;
}

/* The rules emg_set_optimizer enforces (the Python core checks the same): the ranges in emg_optimizer, every
 * value below EMG_OPTIMIZER_MAX (so finite; each comparison is false for NaN). */
#define EMG_OPTIMIZER_MAX 1e30f
static inline int emg_optimizer_valid(const emg_optimizer *o) {
    return o != 0 && o->beta1 >= 0.0f && o->beta1 < 1.0f && o->beta2 >= 0.0f && o->beta2 < 1.0f
        && o->eps > 0.0f && o->eps < EMG_OPTIMIZER_MAX && o->weight_decay >= 0.0f
        && o->weight_decay < EMG_OPTIMIZER_MAX && o->grad_clip >= 0.0f && o->grad_clip < EMG_OPTIMIZER_MAX;
}

#ifdef __cplusplus
}
#endif

#endif /* EEMICROGPT_H */
