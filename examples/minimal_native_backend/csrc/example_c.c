/* A minimal eemicrogpt backend in portable C: scalar loops, every model shape, chosen at run time.
 * It supplies kernels only (forward, backward, AdamW); the shared layer emg_backend.h, included at the end,
 * adds every exported emg_* function with its checks. Readable rather than fast. One sequence is processed
 * at a time over its live positions t < T = length - 1 (padding is never read), position by position as
 * microgpt does; the activations of every layer are kept so that backward can run the layers in reverse. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "emg_backend.h"

typedef struct { /* one layer's activations of the current sequence, at every position t < C */
    float *h1, *r1;   /* [C][D], [C]: rms(x) of the layer's input x and its 1/rms */
    float *q, *k, *v; /* [C][D] */
    float *p;         /* [H][C][C] attention probabilities, row t over positions u <= t */
    float *att;       /* [C][D] attention output, before Wo */
    float *x_mid;     /* [C][D] x + Wo att: the residual between the two blocks */
    float *h2, *r2;   /* rms(x_mid) */
    float *hid;       /* [C][F] relu(Wf1 h2) */
} layer_acts;

struct emg_session {
    emg_core core;            /* shape, params, Adam moments, gradient, step: owned by the shared layer */
    int D, H, HD, F, V, C, L; /* the shape, spelt as the maths below uses it (F = 4D hidden units) */
    float *block;             /* every array below lives in this one allocation (see lay_out) */
    float *emb_r;             /* [C] 1/rms of tok_emb + pos_emb */
    float *x[EMG_MAX_LAYERS + 1]; /* [C][D] x[l]: the residual entering layer l; x[L] feeds the LM head */
    layer_acts layer[EMG_MAX_LAYERS];
    float *dlog;              /* [C][V] d(loss)/d(logits) */
    /* backward: d(loss)/d(x[l]) for the layer being undone, and per-layer and per-position scratch */
    float *dx, *dx_mid, *dq, *dk, *dv; /* [C][D] */
    float *dhid, *dh, *datt, *dp;      /* [F], [D], [D], [C] */
};

/* Layer l's tensor `name` (WQ, WK, WV, WO, WF1, WF2) in a flat buffer: params and grads share the layout. */
#define LAYER_W(s, buf, l, name) ((buf) + emg_layer_offset(&(s)->core.layout, (l)) + EMG_LAYER_##name((s)->D))

/* y[o] = sum_i W[o][i] x[i] */
static void matvec(float *y, const float *w, const float *x, int out, int in) {
    for (int o = 0; o < out; o++) {
        float acc = 0.0f;
        for (int i = 0; i < in; i++) acc += w[o * in + i] * x[i];
        y[o] = acc;
    }
}

/* dx[i] += sum_o W[o][i] dy[o]  and  dW[o][i] += dy[o] x[i] */
static void matvec_back(float *dx, float *dw, const float *w, const float *x, const float *dy, int out, int in) {
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) {
            dx[i] += w[o * in + i] * dy[o];
            dw[o * in + i] += dy[o] * x[i];
        }
}

/* y = x * r with r = 1/sqrt(mean(x^2) + eps) (no gain); returns r for the backward pass. */
static float rms(float *y, const float *x, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + EMG_RMS_EPS);
    for (int i = 0; i < n; i++) y[i] = x[i] * r;
    return r;
}

/* dx += r * (dy - y * mean(dy * y)): the chain rule through y = x * r(x). */
static void rms_back(float *dx, const float *dy, const float *y, float r, int n) {
    float dot = 0.0f;
    for (int i = 0; i < n; i++) dot += dy[i] * y[i];
    for (int i = 0; i < n; i++) dx[i] += r * (dy[i] - y[i] * dot / (float)n);
}

/* Layer l at positions 0..T-1: x[l+1] = x_mid + Wf2 relu(Wf1 rms(x_mid)), x_mid = x[l] + Wo attn(rms(x[l])).
 * Position t attends to s <= t only, so one pass in t order has every k and v it needs. */
static void layer_forward(emg_session *s, int l, int T) {
    const int D = s->D, H = s->H, HD = s->HD, F = s->F, C = s->C;
    const float *p = s->core.params, scale = 1.0f / sqrtf((float)HD);
    layer_acts *a = &s->layer[l];
    for (int t = 0; t < T; t++) {
        const float *x = s->x[l] + t * D;
        float *h1 = a->h1 + t * D, *q = a->q + t * D, *att = a->att + t * D, *mid = a->x_mid + t * D;
        a->r1[t] = rms(h1, x, D);
        matvec(q, LAYER_W(s, p, l, WQ), h1, D, D);
        matvec(a->k + t * D, LAYER_W(s, p, l, WK), h1, D, D);
        matvec(a->v + t * D, LAYER_W(s, p, l, WV), h1, D, D);
        for (int h = 0; h < H; h++) { /* softmax(scale * q.k) over s <= t, then the weighted sum of v */
            float *pr = a->p + ((size_t)h * C + t) * C, mx = -INFINITY, sum = 0.0f;
            for (int u = 0; u <= t; u++) {
                float dot = 0.0f;
                for (int j = h * HD; j < (h + 1) * HD; j++) dot += q[j] * a->k[u * D + j];
                pr[u] = dot * scale;
                mx = fmaxf(mx, pr[u]);
            }
            for (int u = 0; u <= t; u++) sum += pr[u] = expf(pr[u] - mx);
            for (int u = 0; u <= t; u++) pr[u] /= sum;
            for (int j = h * HD; j < (h + 1) * HD; j++) {
                float acc = 0.0f;
                for (int u = 0; u <= t; u++) acc += pr[u] * a->v[u * D + j];
                att[j] = acc;
            }
        }
        matvec(mid, LAYER_W(s, p, l, WO), att, D, D);
        for (int i = 0; i < D; i++) mid[i] += x[i];

        float *h2 = a->h2 + t * D, *hid = a->hid + t * F, *out = s->x[l + 1] + t * D;
        a->r2[t] = rms(h2, mid, D);
        matvec(hid, LAYER_W(s, p, l, WF1), h2, F, D);
        for (int i = 0; i < F; i++) hid[i] = fmaxf(hid[i], 0.0f);
        matvec(out, LAYER_W(s, p, l, WF2), hid, D, F);
        for (int i = 0; i < D; i++) out[i] += mid[i];
    }
}

/* The sequence's loss, weighted by wgt = 1 / (live positions in the batch); leaves d(loss)/d(logits) in dlog. */
static float forward(emg_session *s, const uint8_t *tok, int T, float wgt) {
    const int D = s->D, V = s->V;
    const float *p = s->core.params;
    for (int t = 0; t < T; t++) { /* x[0] = rms(tok_emb[tok] + pos_emb[t]): the one norm before the layers */
        const float *tok_row = p + s->core.layout.tok_emb + tok[t] * D, *pos_row = p + s->core.layout.pos_emb + t * D;
        float *x = s->x[0] + t * D;
        for (int i = 0; i < D; i++) x[i] = tok_row[i] + pos_row[i];
        s->emb_r[t] = rms(x, x, D);
    }
    for (int l = 0; l < s->L; l++) layer_forward(s, l, T);
    float loss = 0.0f;
    for (int t = 0; t < T; t++) { /* logits = Wlm x[L] (no final norm), cross-entropy against tok[t + 1] */
        float *lg = s->dlog + t * V, mx = -INFINITY, sum = 0.0f;
        matvec(lg, p + s->core.layout.wlm, s->x[s->L] + t * D, V, D);
        for (int c = 0; c < V; c++) mx = fmaxf(mx, lg[c]);
        for (int c = 0; c < V; c++) sum += expf(lg[c] - mx);
        loss += (mx + logf(sum) - lg[tok[t + 1]]) * wgt;
        for (int c = 0; c < V; c++) lg[c] = expf(lg[c] - mx) / sum * wgt; /* now d(loss)/d(logits) */
        lg[tok[t + 1]] -= wgt;
    }
    return loss;
}

/* Undo layer l: s->dx holds d(loss)/d(x[l+1]) on entry and d(loss)/d(x[l]) on return; adds to the grads. */
static void layer_backward(emg_session *s, int l, int T) {
    const int D = s->D, H = s->H, HD = s->HD, F = s->F, C = s->C;
    const float *p = s->core.params, scale = 1.0f / sqrtf((float)HD);
    float *g = s->core.grads;
    const layer_acts *a = &s->layer[l];
    memset(s->dq, 0, sizeof(float) * (size_t)T * D);
    memset(s->dk, 0, sizeof(float) * (size_t)T * D);
    memset(s->dv, 0, sizeof(float) * (size_t)T * D);
    for (int t = 0; t < T; t++) {
        /* MLP block: x[l+1] = x_mid + Wf2 relu(Wf1 h2), h2 = rms(x_mid) */
        const float *dout = s->dx + t * D, *hid = a->hid + t * F, *h2 = a->h2 + t * D;
        float *dmid = s->dx_mid + t * D;
        memset(s->dhid, 0, sizeof(float) * F);
        matvec_back(s->dhid, LAYER_W(s, g, l, WF2), LAYER_W(s, p, l, WF2), hid, dout, D, F);
        for (int i = 0; i < F; i++) if (hid[i] <= 0.0f) s->dhid[i] = 0.0f; /* ReLU */
        memset(s->dh, 0, sizeof(float) * D);
        matvec_back(s->dh, LAYER_W(s, g, l, WF1), LAYER_W(s, p, l, WF1), h2, s->dhid, F, D);
        memcpy(dmid, dout, sizeof(float) * D); /* the residual path */
        rms_back(dmid, s->dh, h2, a->r2[t], D);

        /* attention block: x_mid = x[l] + Wo att */
        memset(s->datt, 0, sizeof(float) * D);
        matvec_back(s->datt, LAYER_W(s, g, l, WO), LAYER_W(s, p, l, WO), a->att + t * D, dmid, D, D);
        for (int h = 0; h < H; h++) { /* through att = sum_u p[u] v[u] and p = softmax(scale * q.k[u]) */
            const float *pr = a->p + ((size_t)h * C + t) * C;
            float rowdot = 0.0f;
            for (int u = 0; u <= t; u++) {
                s->dp[u] = 0.0f;
                for (int j = h * HD; j < (h + 1) * HD; j++) s->dp[u] += s->datt[j] * a->v[u * D + j];
                rowdot += pr[u] * s->dp[u];
            }
            for (int u = 0; u <= t; u++) {
                float dscore = pr[u] * (s->dp[u] - rowdot) * scale;
                for (int j = h * HD; j < (h + 1) * HD; j++) {
                    s->dq[t * D + j] += dscore * a->k[u * D + j];
                    s->dk[u * D + j] += dscore * a->q[t * D + j];
                    s->dv[u * D + j] += pr[u] * s->datt[j];
                }
            }
        }
    }
    for (int t = 0; t < T; t++) { /* dk and dv of position t are complete only after every t' >= t */
        const float *h1 = a->h1 + t * D;
        memset(s->dh, 0, sizeof(float) * D);
        matvec_back(s->dh, LAYER_W(s, g, l, WQ), LAYER_W(s, p, l, WQ), h1, s->dq + t * D, D, D);
        matvec_back(s->dh, LAYER_W(s, g, l, WK), LAYER_W(s, p, l, WK), h1, s->dk + t * D, D, D);
        matvec_back(s->dh, LAYER_W(s, g, l, WV), LAYER_W(s, p, l, WV), h1, s->dv + t * D, D, D);
        float *dx = s->dx + t * D;
        memcpy(dx, s->dx_mid + t * D, sizeof(float) * D); /* the residual path */
        rms_back(dx, s->dh, h1, a->r1[t], D);
    }
}

/* Adds the sequence's gradient to s->core.grads, from the activations forward left. */
static void backward(emg_session *s, const uint8_t *tok, int T) {
    const int D = s->D, V = s->V;
    const float *p = s->core.params;
    float *g = s->core.grads;
    const emg_layout *lay = &s->core.layout;
    memset(s->dx, 0, sizeof(float) * (size_t)T * D);
    for (int t = 0; t < T; t++)
        matvec_back(s->dx + t * D, g + lay->wlm, p + lay->wlm, s->x[s->L] + t * D, s->dlog + t * V, V, D);
    for (int l = s->L - 1; l >= 0; l--) layer_backward(s, l, T);
    for (int t = 0; t < T; t++) { /* through x[0] = rms(tok_emb[tok] + pos_emb[t]) into both tables */
        memset(s->dh, 0, sizeof(float) * D);
        rms_back(s->dh, s->dx + t * D, s->x[0] + t * D, s->emb_r[t], D);
        for (int i = 0; i < D; i++) {
            g[lay->tok_emb + tok[t] * D + i] += s->dh[i];
            g[lay->pos_emb + t * D + i] += s->dh[i];
        }
    }
}

/* ---- the hooks the shared layer calls ---- */

/* Every valid shape: the int indexing above cannot overflow, as even the ABI's largest model (its bounds on
 * width, layers, vocabulary and context at once) has fewer parameters than an int counts, and the largest
 * activation array (a layer's attention probabilities, H = D / 4 heads of C x C) is smaller still. */
_Static_assert(2LL * EMG_MAX_VOCAB * EMG_MAX_D_MODEL + (long long)EMG_MAX_CONTEXT * EMG_MAX_D_MODEL
                       + 12LL * EMG_MAX_LAYERS * EMG_MAX_D_MODEL * EMG_MAX_D_MODEL <= INT_MAX,
               "the largest valid model's parameters are int-indexable");
_Static_assert((long long)EMG_MAX_D_MODEL / 4 * EMG_MAX_CONTEXT * EMG_MAX_CONTEXT <= INT_MAX,
               "the largest attention array is int-indexable");
static int supports(const emg_shape *sh) {
    (void)sh;
    return 1;
}

/* Points every activation array into one block at base, in order, and returns the floats they take. init
 * calls it twice, with base NULL to measure and then with the block: one list, so size and use agree. */
static size_t lay_out(emg_session *s, float *base) {
    const size_t D = s->D, H = s->H, F = s->F, V = s->V, C = s->C;
    size_t used = 0;
#define TAKE(ptr, n) ((ptr) = base ? base + used : NULL, used += (n))
    TAKE(s->emb_r, C);
    for (int l = 0; l <= s->L; l++) TAKE(s->x[l], C * D);
    for (int l = 0; l < s->L; l++) {
        layer_acts *a = &s->layer[l];
        TAKE(a->h1, C * D); TAKE(a->r1, C); TAKE(a->q, C * D); TAKE(a->k, C * D); TAKE(a->v, C * D);
        TAKE(a->p, H * C * C); TAKE(a->att, C * D); TAKE(a->x_mid, C * D); TAKE(a->h2, C * D);
        TAKE(a->r2, C); TAKE(a->hid, C * F);
    }
    TAKE(s->dlog, C * V);
    TAKE(s->dx, C * D); TAKE(s->dx_mid, C * D); TAKE(s->dq, C * D); TAKE(s->dk, C * D); TAKE(s->dv, C * D);
    TAKE(s->dhid, F); TAKE(s->dh, D); TAKE(s->datt, D); TAKE(s->dp, C);
#undef TAKE
    return used;
}

static int init(emg_session *s) {
    const emg_shape *sh = &s->core.shape;
    s->D = sh->d_model, s->H = sh->n_heads, s->HD = sh->d_model / sh->n_heads, s->F = 4 * sh->d_model;
    s->V = sh->vocab, s->C = sh->context, s->L = sh->n_layers;
    s->block = calloc(lay_out(s, NULL), sizeof(float));
    if (s->block == NULL) return EMG_ERR_NOMEM;
    lay_out(s, s->block);
    return EMG_OK;
}

static void release(emg_session *s) { free(s->block); } /* also after a failed init: block is NULL or ours */
static void params_changed(emg_session *s) { (void)s; } /* no derived copies of the weights */

/* Returns the mean loss and fills s->core.grads, even when not asked to: one code path (the layer ignores it). */
static float loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths, int want_grads) {
    (void)want_grads;
    int n_live = 0;
    for (int b = 0; b < batch; b++) n_live += lengths[b] - 1;
    float wgt = 1.0f / (float)n_live, loss = 0.0f;
    memset(s->core.grads, 0, sizeof(float) * (size_t)s->core.layout.n_params);
    for (int b = 0; b < batch; b++) {
        const uint8_t *tok = tokens + (size_t)b * emg_seq_len(&s->core.shape);
        loss += forward(s, tok, lengths[b] - 1, wgt);
        backward(s, tok, lengths[b] - 1);
    }
    return loss;
}

/* AdamW with the session's optimiser, as the ABI header specifies; the layer has already clipped the gradient
 * and counted the step. */
static void adam(emg_session *s, float lr) {
    emg_core *c = &s->core;
    const float b1 = c->opt.beta1, b2 = c->opt.beta2, eps = c->opt.eps;
    const float bc1 = (float)(1.0 - pow(b1, (double)c->step)), bc2 = (float)(1.0 - pow(b2, (double)c->step));
    const float decay = (float)(1.0 - (double)lr * c->opt.weight_decay); /* exactly 1 without decay */
    for (long j = 0; j < c->layout.n_params; j++) {
        float g = c->grads[j];
        c->adam_m[j] = b1 * c->adam_m[j] + (1.0f - b1) * g;
        c->adam_v[j] = b2 * c->adam_v[j] + (1.0f - b2) * g * g;
        c->params[j] = c->params[j] * decay - lr * (c->adam_m[j] / bc1) / (sqrtf(c->adam_v[j] / bc2) + eps);
    }
}

/* Designated: the optional hooks (train_step, set_threads) stay NULL, and later hooks need no edit. */
const emg_backend emg_this_backend = {.supports = supports, .init = init, .release = release,
                                      .params_changed = params_changed, .loss_and_grad = loss_and_grad,
                                      .adam = adam};

#define EMG_BACKEND_IMPLEMENTATION
#include "emg_backend.h"
