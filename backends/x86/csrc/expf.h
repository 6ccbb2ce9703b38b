/* Vectorised exp, accurate to ~1e-7 relative: the softmax gradients must match float64 to 1e-5.
 * exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n*ln2 (Cody-Waite split so r is exact),
 * |r| <= ln2/2, exp(r) by its degree-7 Taylor polynomial (truncation <= 0.347^8/8! ~ 5e-9, so the error
 * is float32 rounding: < 2 ulp; degree 6 measured 2.2e-7). */
#ifndef EMG_X86_EXPF_H
#define EMG_X86_EXPF_H

#include <math.h>

#include "simd.h"

#define EXP_LO (-87.0f) /* below this the result is < 2^-125: treated as 0 */
#define EXP_HI 88.0f

AI vf v_exp(vf x) {
    vf xc = v_min(v_max(x, v_set1(EXP_LO)), v_set1(EXP_HI));
    vf n = v_round(v_mul(xc, v_set1(1.44269504088896341f)));
    vf r = v_fnma(n, v_set1(0.693145751953125f), xc);    /* ln2 high part: n*hi is exact */
    r = v_fnma(n, v_set1(1.428606765330187045e-06f), r); /* ln2 low part */
    vf p = v_set1(1.0f / 5040.0f);
    p = v_fma(p, r, v_set1(1.0f / 720.0f));
    p = v_fma(p, r, v_set1(1.0f / 120.0f));
    p = v_fma(p, r, v_set1(1.0f / 24.0f));
    p = v_fma(p, r, v_set1(1.0f / 6.0f));
    p = v_fma(p, r, v_set1(0.5f));
    p = v_fma(p, r, v_set1(1.0f));
    p = v_fma(p, r, v_set1(1.0f));
    vf y = v_scale2(p, n);
    /* Lanes far below the range (masked scores are -inf) become exactly 0. */
    return v_keep_pos(y, v_sub(x, v_set1(EXP_LO - 1.0f)));
}

#endif /* EMG_X86_EXPF_H */
