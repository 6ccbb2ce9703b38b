/* Causal multi-head attention over one packed sequence (L live rows, L <= 15).
 * qkv rows are [q | k | v] (3*D floats); att keeps the softmax rows, 16 floats per (row, head), zero past
 * the diagonal, for the backward pass. HD = D / H is a compile-time constant at every call site. */
#ifndef EMG_X86_ATTENTION_H
#define EMG_X86_ATTENTION_H

#include <math.h>
#include <string.h>

#include "expf.h"

#define ATT_ROW 16 /* floats per (row, head) softmax row: MAX_SEQ */

AI void attn_fwd(const int D, const int H, const float *qkv, float *o, float *att, int L) {
    const int HD = D / H, QS = 3 * D;
    const float scale = 1.0f / sqrtf((float)HD);
    for (int t = 0; t < L; t++) {
        for (int h = 0; h < H; h++) {
            float *s = att + (t * H + h) * ATT_ROW;
            const float *q = qkv + t * QS + h * HD;
            for (int u = 0; u <= t; u++) {
                const float *k = qkv + u * QS + D + h * HD;
                float acc = 0.0f;
                for (int j = 0; j < HD; j++) acc += q[j] * k[j];
                s[u] = acc * scale;
            }
            softmax_row(s, t + 1, ATT_ROW);
            float out[HD];
            for (int j = 0; j < HD; j++) out[j] = 0.0f;
            for (int u = 0; u <= t; u++) {
                const float *v = qkv + u * QS + 2 * D + h * HD;
                const float pu = s[u];
                for (int j = 0; j < HD; j++) out[j] += pu * v[j];
            }
            memcpy(o + t * D + h * HD, out, sizeof out);
        }
    }
}

/* dqkv (the sequence's L rows, all 3*D columns) = gradient of the attention output gradient dout. */
AI void attn_bwd(const int D, const int H, const float *qkv, const float *att, const float *dout, float *dqkv,
                 int L) {
    const int HD = D / H, QS = 3 * D;
    const float scale = 1.0f / sqrtf((float)HD);
    memset(dqkv, 0, sizeof(float) * (size_t)L * QS);
    for (int t = 0; t < L; t++) {
        for (int h = 0; h < H; h++) {
            const float *p = att + (t * H + h) * ATT_ROW;
            const float *g = dout + t * D + h * HD;
            const float *q = qkv + t * QS + h * HD;
            float ds[ATT_ROW], dot = 0.0f;
            for (int u = 0; u <= t; u++) {
                const float *v = qkv + u * QS + 2 * D + h * HD;
                float acc = 0.0f;
                for (int j = 0; j < HD; j++) acc += g[j] * v[j];
                ds[u] = acc;
                dot += p[u] * acc;
            }
            float dq[HD];
            for (int j = 0; j < HD; j++) dq[j] = 0.0f;
            for (int u = 0; u <= t; u++) {
                const float d = p[u] * (ds[u] - dot) * scale;
                const float *k = qkv + u * QS + D + h * HD;
                float *dk = dqkv + u * QS + D + h * HD, *dv = dqkv + u * QS + 2 * D + h * HD;
                for (int j = 0; j < HD; j++) {
                    dq[j] += d * k[j];
                    dk[j] += d * q[j];
                    dv[j] += p[u] * g[j];
                }
            }
            memcpy(dqkv + t * QS + h * HD, dq, sizeof dq);
        }
    }
}

#endif /* EMG_X86_ATTENTION_H */
