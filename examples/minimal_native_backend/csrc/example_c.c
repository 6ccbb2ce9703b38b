/* A minimal eemicrogpt backend in portable C: scalar loops, d_model 16 with 4 heads only.
 * It supplies kernels only (forward, backward, Adam); the shared layer emg_backend.h, included at the end,
 * adds every exported emg_* function with its checks. Readable rather than fast. One sequence is processed
 * at a time over its live positions t < T = length - 1 (padding is never read). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "emg_backend.h"

#define D 16
#define H 4
#define HD (D / H)
#define F (4 * D)
#define V EMG_VOCAB
#define S EMG_MAX_SEQ
#define T_MAX (S - 1)

/* Offsets of the tensors in the flat buffer (the shared layout). */
enum { O_TOK = EMG_OFF_TOK_EMB(D), O_POS = EMG_OFF_POS_EMB(D), O_WQ = EMG_OFF_WQ(D), O_WK = EMG_OFF_WK(D),
       O_WV = EMG_OFF_WV(D), O_WO = EMG_OFF_WO(D), O_WF1 = EMG_OFF_WF1(D), O_WF2 = EMG_OFF_WF2(D),
       O_WLM = EMG_OFF_WLM(D), N_PARAMS = EMG_N_PARAMS(D) };

typedef struct { /* activations of one sequence */
    float x0[T_MAX][D], r0[T_MAX], h1[T_MAX][D], r1[T_MAX], q[T_MAX][D], k[T_MAX][D], v[T_MAX][D];
    float p[H][T_MAX][T_MAX], att[T_MAX][D], x1[T_MAX][D], h2[T_MAX][D], r2[T_MAX];
    float hid[T_MAX][F], x2[T_MAX][D], dlog[T_MAX][V];
} acts;

struct emg_session {
    emg_core core; /* params, Adam moments, gradient, step: owned by the shared layer */
    acts a;
};

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
    for (int o = 0; o < out; o++) {
        if (dy[o] == 0.0f) continue;
        for (int i = 0; i < in; i++) {
            dx[i] += w[o * in + i] * dy[o];
            dw[o * in + i] += dy[o] * x[i];
        }
    }
}

static float rms(float *y, const float *x) {
    float ss = 0.0f;
    for (int i = 0; i < D; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / D + EMG_RMS_EPS);
    for (int i = 0; i < D; i++) y[i] = x[i] * r;
    return r;
}

/* dx += r * (dy - y * mean(dy * y)) */
static void rms_back(float *dx, const float *dy, const float *y, float r) {
    float dot = 0.0f;
    for (int i = 0; i < D; i++) dot += dy[i] * y[i];
    for (int i = 0; i < D; i++) dx[i] += r * (dy[i] - y[i] * dot / D);
}

static float forward(const float *p, acts *a, const uint8_t *tok, int T, float wgt) {
    const float scale = 1.0f / sqrtf((float)HD);
    float loss = 0.0f;
    for (int t = 0; t < T; t++) {
        float e[D];
        for (int i = 0; i < D; i++) e[i] = p[O_TOK + tok[t] * D + i] + p[O_POS + t * D + i];
        a->r0[t] = rms(a->x0[t], e);
        a->r1[t] = rms(a->h1[t], a->x0[t]);
        matvec(a->q[t], p + O_WQ, a->h1[t], D, D);
        matvec(a->k[t], p + O_WK, a->h1[t], D, D);
        matvec(a->v[t], p + O_WV, a->h1[t], D, D);
        for (int h = 0; h < H; h++) { /* causal softmax attention over positions s <= t */
            float *pr = a->p[h][t], mx = -INFINITY, sum = 0.0f;
            for (int s = 0; s <= t; s++) {
                float dot = 0.0f;
                for (int j = h * HD; j < (h + 1) * HD; j++) dot += a->q[t][j] * a->k[s][j];
                pr[s] = dot * scale;
                mx = fmaxf(mx, pr[s]);
            }
            for (int s = 0; s <= t; s++) sum += pr[s] = expf(pr[s] - mx);
            for (int s = 0; s <= t; s++) pr[s] /= sum;
            for (int j = h * HD; j < (h + 1) * HD; j++) {
                float acc = 0.0f;
                for (int s = 0; s <= t; s++) acc += pr[s] * a->v[s][j];
                a->att[t][j] = acc;
            }
        }
        matvec(a->x1[t], p + O_WO, a->att[t], D, D);
        for (int i = 0; i < D; i++) a->x1[t][i] += a->x0[t][i];
        a->r2[t] = rms(a->h2[t], a->x1[t]);
        matvec(a->hid[t], p + O_WF1, a->h2[t], F, D);
        for (int i = 0; i < F; i++) a->hid[t][i] = fmaxf(a->hid[t][i], 0.0f);
        matvec(a->x2[t], p + O_WF2, a->hid[t], D, F);
        for (int i = 0; i < D; i++) a->x2[t][i] += a->x1[t][i];
        float *lg = a->dlog[t], mx = -INFINITY, sum = 0.0f;
        matvec(lg, p + O_WLM, a->x2[t], V, D);
        for (int c = 0; c < V; c++) mx = fmaxf(mx, lg[c]);
        for (int c = 0; c < V; c++) sum += expf(lg[c] - mx);
        loss += (mx + logf(sum) - lg[tok[t + 1]]) * wgt;
        for (int c = 0; c < V; c++) lg[c] = expf(lg[c] - mx) / sum * wgt; /* now d(loss)/d(logits) */
        lg[tok[t + 1]] -= wgt;
    }
    return loss;
}

static void backward(const float *p, float *g, const acts *a, const uint8_t *tok, int T) {
    const float scale = 1.0f / sqrtf((float)HD);
    float dq[T_MAX][D] = {{0}}, dk[T_MAX][D] = {{0}}, dv[T_MAX][D] = {{0}};
    float dx1[T_MAX][D] = {{0}};
    for (int t = 0; t < T; t++) {
        float dx2[D] = {0}, dhid[F] = {0}, dh2[D] = {0}, datt[D] = {0};
        matvec_back(dx2, g + O_WLM, p + O_WLM, a->x2[t], a->dlog[t], V, D);
        matvec_back(dhid, g + O_WF2, p + O_WF2, a->hid[t], dx2, D, F);
        for (int i = 0; i < F; i++) if (a->hid[t][i] <= 0.0f) dhid[i] = 0.0f; /* ReLU */
        matvec_back(dh2, g + O_WF1, p + O_WF1, a->h2[t], dhid, F, D);
        for (int i = 0; i < D; i++) dx1[t][i] = dx2[i];
        rms_back(dx1[t], dh2, a->h2[t], a->r2[t]);
        matvec_back(datt, g + O_WO, p + O_WO, a->att[t], dx1[t], D, D);
        for (int h = 0; h < H; h++) { /* softmax attention backward */
            const float *pr = a->p[h][t];
            float dp[T_MAX], rowdot = 0.0f;
            for (int s = 0; s <= t; s++) {
                dp[s] = 0.0f;
                for (int j = h * HD; j < (h + 1) * HD; j++) dp[s] += datt[j] * a->v[s][j];
                rowdot += pr[s] * dp[s];
            }
            for (int s = 0; s <= t; s++) {
                float ds = pr[s] * (dp[s] - rowdot) * scale;
                for (int j = h * HD; j < (h + 1) * HD; j++) {
                    dq[t][j] += ds * a->k[s][j];
                    dk[s][j] += ds * a->q[t][j];
                    dv[s][j] += pr[s] * datt[j];
                }
            }
        }
    }
    for (int t = 0; t < T; t++) { /* dk and dv of position t are complete only after every t' >= t */
        float dh1[D] = {0}, dx0[D], demb[D] = {0};
        matvec_back(dh1, g + O_WQ, p + O_WQ, a->h1[t], dq[t], D, D);
        matvec_back(dh1, g + O_WK, p + O_WK, a->h1[t], dk[t], D, D);
        matvec_back(dh1, g + O_WV, p + O_WV, a->h1[t], dv[t], D, D);
        memcpy(dx0, dx1[t], sizeof dx0);
        rms_back(dx0, dh1, a->h1[t], a->r1[t]);
        rms_back(demb, dx0, a->x0[t], a->r0[t]);
        for (int i = 0; i < D; i++) {
            g[O_TOK + tok[t] * D + i] += demb[i];
            g[O_POS + t * D + i] += demb[i];
        }
    }
}

/* The hooks the shared layer calls. */
static int supports(int d_model, int n_heads) { return d_model == D && n_heads == H; }
static int init(emg_session *s) { (void)s; return EMG_OK; } /* everything lives in the struct */
static void release(emg_session *s) { (void)s; }
static void params_changed(emg_session *s) { (void)s; } /* no derived copies of the weights */

/* Fills s->core.grads for the batch (always: computing it is the cheap part here) and returns the mean loss. */
static float loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths, int want_grads) {
    (void)want_grads;
    int n_live = 0;
    for (int b = 0; b < batch; b++) n_live += lengths[b] - 1;
    float wgt = 1.0f / (float)n_live, loss = 0.0f;
    memset(s->core.grads, 0, sizeof(float) * N_PARAMS);
    for (int b = 0; b < batch; b++) {
        const uint8_t *tok = tokens + (size_t)b * S;
        loss += forward(s->core.params, &s->a, tok, lengths[b] - 1, wgt);
        backward(s->core.params, s->core.grads, &s->a, tok, lengths[b] - 1);
    }
    return loss;
}

/* Adam, as the ABI header specifies; the layer has already counted the step. */
static void adam(emg_session *s, float lr) {
    emg_core *c = &s->core;
    float bc1 = (float)(1.0 - pow(EMG_ADAM_BETA1, (double)c->step));
    float bc2 = (float)(1.0 - pow(EMG_ADAM_BETA2, (double)c->step));
    for (int j = 0; j < N_PARAMS; j++) {
        float g = c->grads[j];
        c->adam_m[j] = EMG_ADAM_BETA1 * c->adam_m[j] + (1.0f - EMG_ADAM_BETA1) * g;
        c->adam_v[j] = EMG_ADAM_BETA2 * c->adam_v[j] + (1.0f - EMG_ADAM_BETA2) * g * g;
        c->params[j] -= lr * (c->adam_m[j] / bc1) / (sqrtf(c->adam_v[j] / bc2) + EMG_ADAM_EPS);
    }
}

/* Designated: the optional hooks (train_step, set_threads) stay NULL, and later hooks need no edit. */
const emg_backend emg_this_backend = {.supports = supports, .init = init, .release = release,
                                      .params_changed = params_changed, .loss_and_grad = loss_and_grad,
                                      .adam = adam};

#define EMG_BACKEND_IMPLEMENTATION
#include "emg_backend.h"
