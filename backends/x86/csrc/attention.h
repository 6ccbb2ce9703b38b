/* Causal multi-head attention over one packed sequence of L live rows (L <= EMG_MAX_CONTEXT), vectorised
 * along the query position t. The sequence's rows are laid out as lane rows of LW = att_lanes(L) lanes
 * (t = 0..LW-1; lanes t >= L are padding), and the queries are taken VW lanes at a time: for the query block
 * starting at lane c, each head's scores are the rows S^T[u][c..c+VW) (key u, lanes t) for the keys
 * u < min(L, c + VW) that block can see (causality: a long sequence costs about half its square), and the
 * softmax over u is element-wise across rows (max, exp, sum): no horizontal reductions. Row-major q/k/v/out
 * rows are transposed into [feature][LW] lane rows in registers. With VW = 16 every sequence of at most 16
 * rows (the default context) is one query block.
 *
 * att keeps P^T per (head, key row) for the backward pass: att[(h * L + u) * LW + t], written for the query
 * blocks key u reaches (t >= u - u % VW), zero where t < u. The scratch (attention_scratch floats) holds the
 * lane rows of one sequence. D (and, on the fast paths, H) are compile-time constants at every call site;
 * head_dim = D / H need not be a multiple of 4. With AVX-512, short sequences at head size 4 or 8 and an
 * even head count take attention_pairs.h's path instead: two heads per vector, the same results. */
#ifndef EMG_X86_ATTENTION_H
#define EMG_X86_ATTENTION_H

#include <math.h>

#include "attention_lanes.h"
#include "attention_pairs.h"
#include "simd.h"

/* Floats of scratch attention_forward and attention_backward need for sequences of up to LW lanes. */
AI long attention_scratch(int D, int H, int LW) {
    const long one_head = 4L * D * LW + (long)(H + 2) * LW * LW;
#if VW == 16
    const long pairs = attention_pairs_scratch(D, H);
    return pairs > one_head ? pairs : one_head;
#else
    return one_head;
#endif
}

/* out[i * LW] (VW lanes, i < n <= 8) = sum over rows r0 <= r < r1 of w[r * ldw + i] * rows[r * LW]: n
 * independent register accumulators, so no load-add-store chain through memory. Eight chains cover the FMA
 * latency of two FMA units (four left one idle: backends/x86/README.md, "nanoGPT's shapes on an Intel Xeon"). */
AI void accumulate_lanes(const int n, const float *w, int ldw, const float *rows, int LW, int r0, int r1, float *out) {
    vf a[8];
#pragma GCC unroll 8
    for (int i = 0; i < n; i++) a[i] = v_zero();
    for (int r = r0; r < r1; r++) {
        const vf x = v_load(rows + r * LW);
        const float *wr = w + r * ldw;
#pragma GCC unroll 8
        for (int i = 0; i < n; i++) a[i] = v_fma(v_set1(wr[i]), x, a[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < n; i++) v_store(out + i * LW, a[i]);
}

/* accumulate_lanes for features j0..j0+n of a head, n = 1..7: the part of a head_dim that is not a multiple of
 * 8 (n may be a run-time count). */
AI void accumulate_rest(const int n, const float *w, int ldw, const float *rows, int LW, int r0, int r1, float *out) {
    switch (n) {
    case 1: accumulate_lanes(1, w, ldw, rows, LW, r0, r1, out); break;
    case 2: accumulate_lanes(2, w, ldw, rows, LW, r0, r1, out); break;
    case 3: accumulate_lanes(3, w, ldw, rows, LW, r0, r1, out); break;
    case 4: accumulate_lanes(4, w, ldw, rows, LW, r0, r1, out); break;
    case 5: accumulate_lanes(5, w, ldw, rows, LW, r0, r1, out); break;
    case 6: accumulate_lanes(6, w, ldw, rows, LW, r0, r1, out); break;
    case 7: accumulate_lanes(7, w, ldw, rows, LW, r0, r1, out); break;
    }
}

/* out^T[j][lanes] = sum_r w[r][j] rows[r][lanes] for the HD features j of one head, eight at a time. */
AI void accumulate_head(const int HD, const float *w, int ldw, const float *rows, int LW, int r0, int r1, float *out) {
    int j = 0;
    for (; j + 8 <= HD; j += 8) accumulate_lanes(8, w + j, ldw, rows, LW, r0, r1, out + j * LW);
    if (j < HD) accumulate_rest(HD - j, w + j, ldw, rows, LW, r0, r1, out + j * LW);
}

/* Keys per dot_keys call: the scores (forward) and dP (backward) of a long sequence take KEY_BLOCK keys at
 * a time, so that many FMA chains run side by side sharing each lane-row load; each key's chain over the
 * head's features is the one a key alone would run, in the same order. */
#define KEY_BLOCK 8

/* s[i] (VW lanes) = sum_j w[i * ldw + j] * rows[j * LW] for the KEY_BLOCK keys i, over j < HD. */
AI void dot_keys(const float *w, int ldw, const float *rows, int LW, int HD, vf *s) {
    for (int i = 0; i < KEY_BLOCK; i++) s[i] = v_zero();
    for (int j = 0; j < HD; j++) {
        const vf x = v_load(rows + j * LW);
#pragma GCC unroll 8
        for (int i = 0; i < KEY_BLOCK; i++) s[i] = v_fma(v_set1(w[i * ldw + j]), x, s[i]);
    }
}

/* o (the sequence's L rows, D columns) from qkv (L rows of q, k, v; 3 * D columns). Within a query block each
 * phase (scores, exp, normalisation, weighted sum) runs over every head before the next starts: the heads'
 * chains (max over keys -> exp -> sum -> division) are independent, so short sequences keep the vector units
 * busy instead of waiting on one head's latencies (measured at d16: see the README). */
AI void attention_forward(const int D, const int H, const float *qkv, float *o, float *att, int L, const int LW,
                          float *restrict scratch) {
    const int HD = D / H, QS = 3 * D;
    const float scale = 1.0f / sqrtf((float)HD);
    float *restrict qt = scratch, *restrict ot = scratch + D * LW; /* q^T, out^T: [feature][t] */
    vf mx[H];                                                      /* per head, for one query block */
#if VW == 16
    if (attention_pairs(D, H, L)) {
        attention_forward_pairs(D, H, qkv, o, att, L, scratch);
        return;
    }
#endif
    to_lanes(D, qkv, QS, L, LW, qt);
    for (int c = 0; c < LW; c += VW) {
        const int keys = L < c + VW ? L : c + VW;
        for (int h = 0; h < H; h++) mx[h] = v_set1(-INFINITY);
        int u = 0;
        for (; u + KEY_BLOCK <= keys; u += KEY_BLOCK) /* KEY_BLOCK keys at once: independent chains, shared loads */
            for (int h = 0; h < H; h++) {
                vf s[KEY_BLOCK];
                dot_keys(qkv + u * QS + D + h * HD, QS, qt + h * HD * LW + c, LW, HD, s);
                for (int i = 0; i < KEY_BLOCK; i++) {
                    const vf si = v_from_n_or(v_mul(s[i], v_set1(scale)), u + i - c, -INFINITY);
                    mx[h] = v_max(mx[h], si);
                    v_store(att + (h * L + u + i) * LW + c, si);
                }
            }
        for (; u < keys; u++) /* scores of key u against the block's queries t (valid for t >= u) */
            for (int h = 0; h < H; h++) {
                const float *k = qkv + u * QS + D + h * HD;
                vf s = v_zero();
                for (int j = 0; j < HD; j++) s = v_fma(v_set1(k[j]), v_load(qt + (h * HD + j) * LW + c), s);
                s = v_from_n_or(v_mul(s, v_set1(scale)), u - c, -INFINITY);
                mx[h] = v_max(mx[h], s);
                v_store(att + (h * L + u) * LW + c, s);
            }
        softmax_keys(H, att, L, LW, c, keys, mx);
        for (int h = 0; h < H; h++) /* out^T[j][t] = sum_u v[u][j] P^T[u][t] */
            accumulate_head(HD, qkv + 2 * D + h * HD, QS, att + h * L * LW + c, LW, 0, keys,
                            ot + h * HD * LW + c);
    }
    from_lanes(D, ot, L, LW, o, D);
}

/* dqkv (the sequence's L rows, all 3 * D columns) from the attention output gradient dout. As in
 * attention_forward, the softmax backward runs each phase over every head. */
AI void attention_backward(const int D, const int H, const float *qkv, const float *att, const float *dout,
                           float *dqkv, int L, const int LW, float *restrict scratch) {
    const int HD = D / H, QS = 3 * D;
    const float scale = 1.0f / sqrtf((float)HD);
    float *restrict dot = scratch;            /* dout^T: [feature][t] */
    float *restrict dqt = dot + D * LW;       /* dq^T:   [feature][t] */
    float *restrict dkt = dqt + D * LW;       /* dk^T:   [feature][u] */
    float *restrict dvt = dkt + D * LW;       /* dv^T:   [feature][u] */
    float *restrict ds_t = dvt + D * LW;      /* per head: dS^T[u][t], laid out as att */
    float *restrict p_r = ds_t + H * L * LW;  /* one head's P[t][u] */
    float *restrict ds_r = p_r + LW * LW;     /* one head's dS[t][u] */
    vf rowdot[H];                             /* per head, for one query block: sum_u P dP */
#if VW == 16
    if (attention_pairs(D, H, L)) {
        attention_backward_pairs(D, H, qkv, att, dout, dqkv, L, scratch);
        return;
    }
#endif
    to_lanes(D, dout, D, L, LW, dot);
    for (int c = 0; c < LW; c += VW) {
        const int keys = L < c + VW ? L : c + VW;
        for (int h = 0; h < H; h++) rowdot[h] = v_zero();
        int u = 0;
        for (; u + KEY_BLOCK <= keys; u += KEY_BLOCK)
            for (int h = 0; h < H; h++) {
                vf dp[KEY_BLOCK];
                dot_keys(qkv + u * QS + 2 * D + h * HD, QS, dot + h * HD * LW + c, LW, HD, dp);
                for (int i = 0; i < KEY_BLOCK; i++) {
                    rowdot[h] = v_fma(v_load(att + (h * L + u + i) * LW + c), dp[i], rowdot[h]);
                    v_store(ds_t + (h * L + u + i) * LW + c, dp[i]);
                }
            }
        for (; u < keys; u++) /* dP^T[u][t] = dout[t] . v[u] (per head) */
            for (int h = 0; h < H; h++) {
                const float *v = qkv + u * QS + 2 * D + h * HD;
                vf dp = v_zero();
                for (int j = 0; j < HD; j++) dp = v_fma(v_set1(v[j]), v_load(dot + (h * HD + j) * LW + c), dp);
                rowdot[h] = v_fma(v_load(att + (h * L + u) * LW + c), dp, rowdot[h]);
                v_store(ds_t + (h * L + u) * LW + c, dp);
            }
        softmax_keys_backward(H, att, ds_t, L, LW, c, keys, rowdot, scale);
        for (int h = 0; h < H; h++) /* dq^T[j][t] = sum_u k[u][j] dS^T[u][t] */
            accumulate_head(HD, qkv + D + h * HD, QS, ds_t + h * L * LW + c, LW, 0, keys, dqt + h * HD * LW + c);
    }
    for (int h = 0; h < H; h++) {
        /* dk and dv sum over queries t: switch P and dS to lanes u (lanes u >= L come out zero; rows t >= L
         * are never read). */
        transpose_causal(att + h * L * LW, L, LW, p_r);
        transpose_causal(ds_t + h * L * LW, L, LW, ds_r);
        for (int c = 0; c < LW; c += VW) { /* keys u in lanes c..c+VW see the queries t >= c */
            /* lanes u: dk^T = sum_t q[t] dS[t], dv^T = sum_t dout[t] P[t] */
            accumulate_head(HD, qkv + h * HD, QS, ds_r + c, LW, c, L, dkt + h * HD * LW + c);
            accumulate_head(HD, dout + h * HD, D, p_r + c, LW, c, L, dvt + h * HD * LW + c);
        }
    }
    from_lanes(D, dqt, L, LW, dqkv, QS);
    from_lanes(D, dkt, L, LW, dqkv + D, QS);
    from_lanes(D, dvt, L, LW, dqkv + 2 * D, QS);
}

#endif /* EMG_X86_ATTENTION_H */
