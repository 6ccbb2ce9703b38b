/* Small Neon helpers shared by every kernel: force-inlining, the fast exp and horizontal sums. */
#ifndef EMG_NEON_MATH_H
#define EMG_NEON_MATH_H

#include <arm_neon.h>
#include <math.h>

/* Helpers take their dimensions as arguments; forced inlining turns them into compile-time constants of
 * the width-specialised kernel, so loops over d_model unroll and accumulators stay in registers. */
#define EMG_INLINE static inline __attribute__((always_inline))

/* exp(x) for a vector of x <= 88 (softmax feeds x <= 0). Range reduction x = n ln2 + r with |r| <= ln2/2
 * (ln2 split in two so r is exact), then a degree-6 Taylor polynomial for e^r: relative error <= 2e-7,
 * about 1 ulp (a degree-3 polynomial has ~1e-4). Inputs below -87 are clamped (the result
 * stays a normal float ~1.6e-38 instead of going denormal); callers zero masked-out lanes themselves. */
EMG_INLINE float32x4_t exp_f32x4(float32x4_t x) {
    x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(88.0f)), vdupq_n_f32(-87.0f));
    float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504089f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f));
    r = vfmsq_f32(r, n, vdupq_n_f32(1.428606765330187e-06f));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), r, vdupq_n_f32(1.0f / 720.0f));
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), r, p);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), r, p);
    p = vfmaq_f32(vdupq_n_f32(0.5f), r, p);
    p = vfmaq_f32(vdupq_n_f32(1.0f), r, p);
    p = vfmaq_f32(vdupq_n_f32(1.0f), r, p);
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* In place: x[0..n) = softmax(x[0..n)); x must have room for n rounded up to a multiple of 4, and those
 * extra lanes are left at exactly 0 so they can be summed or multiplied without masking. When lse is not
 * NULL it receives log(sum(exp(x))) of the input (for the cross-entropy loss). */
EMG_INLINE void softmax_inplace(float *x, int n, float *lse) {
    int nv = (n + 3) / 4;
    for (int i = n; i < nv * 4; i++) x[i] = -1e30f;
    float32x4_t mx = vld1q_f32(x);
    for (int i = 1; i < nv; i++) mx = vmaxq_f32(mx, vld1q_f32(x + 4 * i));
    float m = vmaxvq_f32(mx);
    float32x4_t sum = vdupq_n_f32(0.0f);
    for (int i = 0; i < nv; i++) {
        float32x4_t e = exp_f32x4(vsubq_f32(vld1q_f32(x + 4 * i), vdupq_n_f32(m)));
        vst1q_f32(x + 4 * i, e);
    }
    for (int i = n; i < nv * 4; i++) x[i] = 0.0f;
    for (int i = 0; i < nv; i++) sum = vaddq_f32(sum, vld1q_f32(x + 4 * i));
    float total = vaddvq_f32(sum);
    float32x4_t inv = vdupq_n_f32(1.0f / total);
    for (int i = 0; i < nv; i++) vst1q_f32(x + 4 * i, vmulq_f32(vld1q_f32(x + 4 * i), inv));
    if (lse) *lse = m + logf(total);
}

EMG_INLINE float dot_f32(const float *a, const float *b, int n) {
    float32x4_t acc = vmulq_f32(vld1q_f32(a), vld1q_f32(b));
    for (int i = 4; i < n; i += 4) acc = vfmaq_f32(acc, vld1q_f32(a + i), vld1q_f32(b + i));
    return vaddvq_f32(acc);
}

/* [sum(a), sum(b), sum(c), sum(d)]: four dot products' accumulators reduced into one vector. */
EMG_INLINE float32x4_t sum4_f32x4(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
    return vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d));
}

#endif
