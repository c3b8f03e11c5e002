/* Vectorizable float32 exp and tanh for the C kernels here (the C library's are scalar calls). */
#ifndef DYNASHAPE_FASTMATH_H
#define DYNASHAPE_FASTMATH_H
#include <math.h>
#include <stdint.h>

/* exp(x) = 2^k exp(r), r = x - k ln2 in two parts, |r| <= ln2 / 2; exp(r) by its Taylor series
 * to r^7 (error < 3e-9 relative). x is clamped to [-87, 88], where 2^k stays a normal number. */
static inline float exp_approx(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float k = nearbyintf(x * 1.44269504f);
    float r = x - k * 0.693145752f; /* ln2's first 16 bits: k * it is exact */
    r = r - k * 1.42860677e-06f;    /* the rest of ln2 */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int32_t i; float f; } two_k = {.i = ((int32_t)k + 127) << 23};
    return p * two_k.f;
}


static inline float sigmoid_approx(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

/* tanh within ~2 ulp (elementwise.c says how) */
static inline float tanh_approx(float x) {
    float a = fabsf(x), y = 2.0f * a;
    float e = 1.0f / 39916800.0f; /* expm1(y) = y (1 + y/2 + y^2/6 + ... + y^10/11!) */
    e = e * y + 1.0f / 3628800.0f;
    e = e * y + 1.0f / 362880.0f;
    e = e * y + 1.0f / 40320.0f;
    e = e * y + 1.0f / 5040.0f;
    e = e * y + 1.0f / 720.0f;
    e = e * y + 1.0f / 120.0f;
    e = e * y + 1.0f / 24.0f;
    e = e * y + 1.0f / 6.0f;
    e = e * y + 0.5f;
    e = e * y + 1.0f;
    e = e * y;
    float small = e / (e + 2.0f);
    float large = 1.0f - 2.0f / (exp_approx(y) + 1.0f);
    return copysignf(a < 0.55f ? small : large, x);
}

#endif
