/* Attention for short sequences (L <= SHORT_SEQ = 8 rows) with head size 4 or 8 and an even head count,
 * AVX-512 only: two heads share each vector, head 2hp in lanes 0-7 and head 2hp + 1 in lanes 8-15 (8
 * positions each), where the one-head-per-vector layout of attention.h leaves lanes 8-15 idle. The softmax,
 * the weighted sums and the transposes then run on half as many vectors; the dot products cost the same (a
 * permute of one row's vector feeds each FMA where attention.h broadcasts from memory, which is why the two
 * heads' features must share a 16-float window). Per lane every value is the same chain of the same float
 * operations, in the same order, as attention.h's: the results are bit-identical.
 *
 * Measured against one head per vector (avx512, one thread, batch 16, Zen 5, interleaved): head size 4
 * 1.04x (d16, 4 heads) and 1.05x (d32, 8 heads), head size 8 1.02x (d32 4 heads, d64 8 heads). A version
 * that paired any head size through two-source permutes measured 1.00x at head sizes 5 and 6 and 0.98x at
 * 16 (half as many dependent FMA chains, each as long), hence the rule.
 *
 * Layouts (W = 16 floats per lane row): a paired operand holds, for pair hp and feature j < HD = D / H, the
 * row (hp * HD + j) = [head 2hp's feature j over positions 0-7 | head 2hp + 1's]; att keeps P^T per pair
 * and key row, att[(hp * L + u) * W + lane], masked lanes 0. */
#ifndef EMG_X86_ATTENTION_PAIRS_H
#define EMG_X86_ATTENTION_PAIRS_H

#include <math.h>

#include "attention_lanes.h"
#include "simd.h"

#if VW == 16

/* Whether attention_forward and attention_backward take the paired path. */
AI int attention_pairs(int D, int H, int L) { return H % 2 == 0 && VW % (2 * (D / H)) == 0 && L <= SHORT_SEQ; }

/* Floats of scratch the paired forward and backward need (attention_scratch takes the larger). */
AI long attention_pairs_scratch(int D, int H) { return (7L * D / 2 + 4L * H + 16) * VW; }

/* Lanes 0-7 of row a, then lanes 0-7 of row b. */
AI vf pair_rows(const float *a, const float *b) { return _mm512_insertf32x8(v_load(a), _mm256_loadu_ps(b), 1); }

/* Lanes 0-7 of y to row a (its lanes 8-15 are never read) and lanes 8-15 to lanes 0-7 of row b. */
AI void unpair_rows(vf y, float *a, float *b) {
    v_store(a, y);
    _mm256_storeu_ps(b, _mm512_extractf32x8_ps(y, 1));
}

/* (row[a] x 8, row[b] x 8): two features of one row, in the same VW-float window, each broadcast over a
 * half. */
AI vf pair_bcast(const float *row, int a, int b) {
    const __m512i index = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(a & 15), _mm512_set1_epi32(b & 15));
    return _mm512_permutexvar_ps(index, v_load(row + (a & ~15)));
}

/* The lanes at positions >= n in both halves (the queries key n may see). */
AI __mmask16 pair_from(int n) {
    const unsigned half = (0xFFu << n) & 0xFFu;
    return (__mmask16)(half | half << 8);
}

/* dst (D / 2 paired lane rows, positions 0-7) from the L rows of src (row stride ld, D columns): lane rows
 * through tmp. */
AI void pair_operand(const int D, const int H, const float *src, int ld, int L, float *restrict tmp,
                     float *restrict dst) {
    const int HD = D / H;
    to_lanes(D, src, ld, L, VW, tmp);
    for (int hp = 0; hp < H / 2; hp++)
        for (int j = 0; j < HD; j++)
            v_store(dst + (hp * HD + j) * VW,
                    pair_rows(tmp + (2 * hp * HD + j) * VW, tmp + ((2 * hp + 1) * HD + j) * VW));
}

/* For head pair hp and feature j (features a = 2hp * HD + j and b = a + HD of rows w, row stride ldw):
 * sum over r < n of (w[r][a] | w[r][b]) * rows[r], unpaired into the lane rows a and b of dst.
 * attention.h's accumulate_lanes, one feature of two heads per FMA. */
AI void accumulate_pair(const float *w, int ldw, int a, int b, const float *rows, int n, float *dst) {
    vf acc = v_zero();
    for (int r = 0; r < n; r++) acc = v_fma(pair_bcast(w + r * ldw, a, b), v_load(rows + r * VW), acc);
    unpair_rows(acc, dst + a * VW, dst + b * VW);
}

/* attention_forward for L <= SHORT_SEQ and an even H. */
AI void attention_forward_pairs(const int D, const int H, const float *qkv, float *o, float *att, int L,
                                float *restrict scratch) {
    const int HD = D / H, HP = H / 2, QS = 3 * D;
    const float scale = 1.0f / sqrtf((float)HD);
    float *restrict lanes = scratch, *restrict qp = lanes + D * VW; /* lane rows; q paired (positions t) */
    vf mx[HP];
    pair_operand(D, H, qkv, QS, L, lanes, qp);
    for (int hp = 0; hp < HP; hp++) mx[hp] = v_set1(-INFINITY);
    for (int u = 0; u < L; u++) {
        const float *k = qkv + u * QS + D;
        for (int hp = 0; hp < HP; hp++) {
            vf s = v_zero();
            for (int j = 0; j < HD; j++) {
                const int a = 2 * hp * HD + j;
                s = v_fma(pair_bcast(k, a, a + HD), v_load(qp + (hp * HD + j) * VW), s);
            }
            s = _mm512_mask_mov_ps(v_set1(-INFINITY), pair_from(u), v_mul(s, v_set1(scale)));
            mx[hp] = v_max(mx[hp], s);
            v_store(att + (hp * L + u) * VW, s);
        }
    }
    softmax_keys(HP, att, L, VW, 0, L, mx);
    for (int hp = 0; hp < HP; hp++) /* out^T[j][t] = sum_u v[u][j] P^T[u][t] */
        for (int j = 0; j < HD; j++) {
            const int a = 2 * hp * HD + j;
            accumulate_pair(qkv + 2 * D, QS, a, a + HD, att + hp * L * VW, L, lanes);
        }
    from_lanes(D, lanes, L, VW, o, D);
}

/* attention_backward for L <= SHORT_SEQ and an even H. */
AI void attention_backward_pairs(const int D, const int H, const float *qkv, const float *att, const float *dout,
                                 float *dqkv, int L, float *restrict scratch) {
    const int HD = D / H, HP = H / 2, QS = 3 * D;
    const float scale = 1.0f / sqrtf((float)HD);
    float *restrict dqt = scratch;                                    /* dq^T; first dout's lane rows */
    float *restrict dkt = dqt + D * VW, *restrict dvt = dkt + D * VW; /* dk^T, dv^T: [feature][u] */
    float *restrict dop = dvt + D * VW;                               /* dout paired (positions t) */
    float *restrict ds = dop + D / 2 * VW;                            /* dS^T per pair, laid out as att */
    float *restrict p_r = ds + HP * SHORT_SEQ * VW, *restrict ds_r = p_r + SHORT_SEQ * VW; /* lanes u */
    vf rowdot[HP];
    pair_operand(D, H, dout, D, L, dqt, dop);
    for (int hp = 0; hp < HP; hp++) rowdot[hp] = v_zero();
    for (int u = 0; u < L; u++) { /* dP^T[u][t] = dout[t] . v[u] */
        const float *v = qkv + u * QS + 2 * D;
        for (int hp = 0; hp < HP; hp++) {
            vf dp = v_zero();
            for (int j = 0; j < HD; j++) {
                const int a = 2 * hp * HD + j;
                dp = v_fma(pair_bcast(v, a, a + HD), v_load(dop + (hp * HD + j) * VW), dp);
            }
            rowdot[hp] = v_fma(v_load(att + (hp * L + u) * VW), dp, rowdot[hp]);
            v_store(ds + (hp * L + u) * VW, dp);
        }
    }
    softmax_keys_backward(HP, att, ds, L, VW, 0, L, rowdot, scale);
    for (int hp = 0; hp < HP; hp++) {
        for (int j = 0; j < HD; j++) { /* dq^T[j][t] = sum_u k[u][j] dS^T[u][t] */
            const int a = 2 * hp * HD + j;
            accumulate_pair(qkv + D, QS, a, a + HD, ds + hp * L * VW, L, dqt);
        }
        /* dk and dv sum over queries t: P and dS to lanes u (rows u >= L read as zero) */
        vf r[8], g[8];
        for (int i = 0; i < 8; i++) {
            r[i] = i < L ? v_load(att + (hp * L + i) * VW) : v_zero();
            g[i] = i < L ? v_load(ds + (hp * L + i) * VW) : v_zero();
        }
        v_transpose_halves(r);
        v_transpose_halves(g);
        for (int i = 0; i < 8; i++) v_store(p_r + i * VW, r[i]), v_store(ds_r + i * VW, g[i]);
        for (int j = 0; j < HD; j++) {
            const int a = 2 * hp * HD + j;
            accumulate_pair(qkv, QS, a, a + HD, ds_r, L, dkt); /* dk^T[j][u] = sum_t q[t][j] dS[t][u] */
            accumulate_pair(dout, D, a, a + HD, p_r, L, dvt);  /* dv^T[j][u] = sum_t dout[t][j] P[t][u] */
        }
    }
    from_lanes(D, dqt, L, VW, dqkv, QS);
    from_lanes(D, dkt, L, VW, dqkv + D, QS);
    from_lanes(D, dvt, L, VW, dqkv + 2 * D, QS);
}

#endif /* VW == 16 */
#endif /* EMG_X86_ATTENTION_PAIRS_H */
