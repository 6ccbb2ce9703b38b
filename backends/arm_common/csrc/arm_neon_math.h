/* Neon helpers shared by the ARM backends (neon's kernels, the SME2 backends' non-streaming step): forced
 * inlining, the vector exp, dot products and horizontal sums. Plain Armv8.0-A Advanced SIMD: never SVE, so
 * safe in the SME2 step (outside streaming mode, where Apple M4 has no SVE). */
#ifndef EMG_ARM_NEON_MATH_H
#define EMG_ARM_NEON_MATH_H

#include <arm_neon.h>
#include <math.h>

/* Helpers take their dimensions as arguments; forced inlining turns them into compile-time constants of
 * the caller (neon's width-specialised kernels), so loops over d_model unroll and accumulators stay in
 * registers. */
#define EMG_INLINE static inline __attribute__((always_inline))

/* e^x for four lanes of x <= 0 (softmax arguments after the max is subtracted): x = n ln2 + r with
 * |r| <= ln2/2 (ln2 split in two so r is exact), e^r by its Taylor polynomial of the given degree (a
 * constant: 6 has relative error <= 2e-7, about 1 ulp, the neon backend's; 7 truncates below 6e-9, so float
 * rounding, a few ulp, dominates, the SME2 backends'; degree 3 would give ~1e-4), 2^n built in the exponent
 * field. Inputs below -87 give e^-87 (a normal float ~1.6e-38, never a denormal): against a softmax sum >= 1
 * that is invisible; callers zero masked-out lanes themselves. */
EMG_INLINE float32x4_t exp_f32x4(float32x4_t x, const int degree) {
    x = vmaxq_f32(x, vdupq_n_f32(-87.0f));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f)); /* ln2, high bits: n * hi is exact */
    r = vfmsq_f32(r, n, vdupq_n_f32(1.42860682030941723e-6f));       /* ln2, the rest */
    float32x4_t p;
    if (degree >= 7) {
        p = vdupq_n_f32(1.0f / 5040.0f);
        p = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), p, r);
    } else {
        p = vdupq_n_f32(1.0f / 720.0f);
    }
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* sum_i a[i] * b[i] over n floats, in one of two summation orders (chains, a constant):
 * 1: one FMA chain from the first product (n a multiple of 4; the neon backend's);
 * 4: four independent accumulators, no FMA latency chain, one add tree at the end (n a multiple of 16; the
 *    SME2 backends'). */
EMG_INLINE float dot_f32(const float *a, const float *b, int n, const int chains) {
    if (chains == 1) {
        float32x4_t acc = vmulq_f32(vld1q_f32(a), vld1q_f32(b));
        for (int i = 4; i < n; i += 4) acc = vfmaq_f32(acc, vld1q_f32(a + i), vld1q_f32(b + i));
        return vaddvq_f32(acc);
    }
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    for (int i = 0; i < n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    return vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
}

/* [sum(a), sum(b), sum(c), sum(d)]: four dot products' accumulators reduced into one vector. */
EMG_INLINE float32x4_t sum4_f32x4(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
    return vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d));
}

#endif /* EMG_ARM_NEON_MATH_H */
