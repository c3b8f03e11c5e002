/* A depthwise convolution over channels-last images, for a shape a convolution has not met before.
 *
 * Why: oneDNN builds a primitive (kernels JIT-compiled for the shapes) the first time a convolution
 * meets an input size, 0.1-0.3 ms a convolution on this project's CPU, more than the arithmetic of a
 * small depthwise layer. Traffic with a new image size on every call pays that on every call. This
 * loop needs nothing built. At a shape that comes back oneDNN serves (ops/cpu_conv.py).
 *
 * How: a block of 16 channels (one AVX-512 vector) of 4 neighbouring output pixels is summed in
 * registers over the taps, each tap's 16 weights loaded once for the 4 pixels; the first version
 * kept one row of sums per pixel in memory (a load and a store per multiply-add) and took 1.3-2x
 * oneDNN's warm kernel on PP-LCNet's layers. Each sum is still the bias, then the taps in (ky, kx)
 * order, a product and an add each (no contraction: -ffp-contract=off), so the results are the
 * first version's bit for bit. Channels past the last whole block take the per-pixel loop.
 *
 * x [n][h][w][c], y [n][ho][wo][c]; wt [kh][kw][c]; b [c] or NULL; act 0 none, 1 relu, 2 hardswish.
 */
#include <stdint.h>
#include <stdlib.h>
#include "subnormal.h"

#define CB 16 /* channels a block sums together */
#define PB 4  /* output pixels a block sums together */

static inline float activate(float a, int64_t act) {
    if (act == 1) return a > 0.0f ? a : 0.0f;
    if (act == 2) {
        float t = a + 3.0f;
        t = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t);
        return a * t / 6.0f;
    }
    return a;
}

#ifdef __AVX512F__
#include <immintrin.h>

/* activate() on 16 lanes, NaN and signed zeros as the scalar code treats them. */
static inline __m512 activate16(__m512 a, int64_t act) {
    const __m512 zero = _mm512_setzero_ps();
    if (act == 1) return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, zero, _CMP_GT_OQ), zero, a);
    if (act == 2) {
        const __m512 six = _mm512_set1_ps(6.0f);
        __m512 t = _mm512_add_ps(a, _mm512_set1_ps(3.0f));
        t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(t, zero, _CMP_LT_OQ), t, zero);
        t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(t, six, _CMP_GT_OQ), t, six);
        return _mm512_div_ps(_mm512_mul_ps(a, t), six);
    }
    return a;
}

/* ``block`` for PB whole pixels whose taps all fall inside the row: four sums of 16 channels in
   registers, a product and an add per tap (the scalar code's order). */
static inline void block_inside(const float *x, float *y, const float *wt, const float *b, int64_t i, int64_t oy,
                                int64_t ox0, int64_t c0, int64_t h, int64_t w, int64_t c, int64_t kh, int64_t kw,
                                int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho, int64_t wo, int64_t act) {
    const __m512 bv = b ? _mm512_loadu_ps(b + c0) : _mm512_setzero_ps();
    __m512 a0 = bv, a1 = bv, a2 = bv, a3 = bv;
    const int64_t step = sw * c;
    for (int64_t ky = 0; ky < kh; ky++) {
        const int64_t iy = oy * sh - ph + ky;
        if (iy < 0 || iy >= h) continue;
        const float *xp = x + ((i * h + iy) * w + ox0 * sw - pw) * c + c0;
        const float *wp = wt + ky * kw * c + c0;
        for (int64_t kx = 0; kx < kw; kx++, xp += c, wp += c) {
            const __m512 wv = _mm512_loadu_ps(wp);
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_loadu_ps(xp), wv));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_loadu_ps(xp + step), wv));
            a2 = _mm512_add_ps(a2, _mm512_mul_ps(_mm512_loadu_ps(xp + 2 * step), wv));
            a3 = _mm512_add_ps(a3, _mm512_mul_ps(_mm512_loadu_ps(xp + 3 * step), wv));
        }
    }
    float *yp = y + ((i * ho + oy) * wo + ox0) * c + c0;
    _mm512_storeu_ps(yp, activate16(a0, act));
    _mm512_storeu_ps(yp + c, activate16(a1, act));
    _mm512_storeu_ps(yp + 2 * c, activate16(a2, act));
    _mm512_storeu_ps(yp + 3 * c, activate16(a3, act));
}

/* One output pixel's 16 channels at the image's border: its taps checked one by one. */
static inline void pixel16(const float *x, float *y, const float *wt, const float *b, int64_t i, int64_t oy,
                           int64_t ox, int64_t c0, int64_t h, int64_t w, int64_t c, int64_t kh, int64_t kw, int64_t sh,
                           int64_t sw, int64_t ph, int64_t pw, int64_t ho, int64_t wo, int64_t act) {
    __m512 a = b ? _mm512_loadu_ps(b + c0) : _mm512_setzero_ps();
    for (int64_t ky = 0; ky < kh; ky++) {
        const int64_t iy = oy * sh - ph + ky;
        if (iy < 0 || iy >= h) continue;
        for (int64_t kx = 0; kx < kw; kx++) {
            const int64_t ix = ox * sw - pw + kx;
            if (ix < 0 || ix >= w) continue;
            a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_loadu_ps(x + ((i * h + iy) * w + ix) * c + c0),
                                               _mm512_loadu_ps(wt + (ky * kw + kx) * c + c0)));
        }
    }
    _mm512_storeu_ps(y + ((i * ho + oy) * wo + ox) * c + c0, activate16(a, act));
}
#endif

/* Output pixels ox0 .. ox0 + np - 1 (np <= PB) of row oy, channels c0 .. c0 + CB - 1. */
static inline void block(const float *x, float *y, const float *wt, const float *b, int64_t i, int64_t oy,
                         int64_t ox0, int64_t np, int64_t c0, int64_t h, int64_t w, int64_t c, int64_t kh,
                         int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho, int64_t wo,
                         int64_t act) {
    float a[PB][CB];
    for (int64_t p = 0; p < PB; p++)
        for (int64_t k = 0; k < CB; k++) a[p][k] = b ? b[c0 + k] : 0.0f;
    for (int64_t ky = 0; ky < kh; ky++) {
        const int64_t iy = oy * sh - ph + ky;
        if (iy < 0 || iy >= h) continue;
        const float *xrow = x + (i * h + iy) * w * c + c0;
        for (int64_t kx = 0; kx < kw; kx++) {
            const float *wp = wt + (ky * kw + kx) * c + c0;
            float wv[CB];
            for (int64_t k = 0; k < CB; k++) wv[k] = wp[k];
            for (int64_t p = 0; p < PB; p++) {
                const int64_t ix = (ox0 + p) * sw - pw + kx;
                if (p >= np || ix < 0 || ix >= w) continue;
                const float *xp = xrow + ix * c;
                for (int64_t k = 0; k < CB; k++) a[p][k] += xp[k] * wv[k];
            }
        }
    }
    for (int64_t p = 0; p < np; p++) {
        float *yp = y + ((i * ho + oy) * wo + ox0 + p) * c + c0;
        for (int64_t k = 0; k < CB; k++) yp[k] = activate(a[p][k], act);
    }
}

void dw_conv_nhwc(const float *x, float *y, const float *wt, const float *b, int64_t n, int64_t h, int64_t w,
                  int64_t c, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                  int64_t wo, int64_t act, int64_t threads) {
    const int64_t whole = c / CB * CB; /* channels in whole blocks */
    #pragma omp parallel num_threads(threads) if (threads > 1 && n * ho * wo * c * kh * kw > 262144)
    {
        const unsigned csr = flush_subnormals();
        float *acc = whole < c ? (float *)malloc(sizeof(float) * (size_t)(c - whole)) : NULL;
        #pragma omp for collapse(2)
        for (int64_t i = 0; i < n; i++) {
            for (int64_t oy = 0; oy < ho; oy++) {
                for (int64_t c0 = 0; c0 < whole; c0 += CB)
                    for (int64_t ox = 0; ox < wo; ox += PB) {
#ifdef __AVX512F__
                        if (ox + PB <= wo && ox * sw - pw >= 0 && (ox + PB - 1) * sw - pw + kw <= w) {
                            block_inside(x, y, wt, b, i, oy, ox, c0, h, w, c, kh, kw, sh, sw, ph, pw, ho, wo, act);
                            continue;
                        }
                        for (int64_t q = ox; q < ox + PB && q < wo; q++)
                            pixel16(x, y, wt, b, i, oy, q, c0, h, w, c, kh, kw, sh, sw, ph, pw, ho, wo, act);
                        continue;
#endif
                        block(x, y, wt, b, i, oy, ox, wo - ox < PB ? wo - ox : PB, c0, h, w, c, kh, kw, sh, sw, ph,
                              pw, ho, wo, act);
                    }
                if (acc == NULL) continue;
                for (int64_t ox = 0; ox < wo; ox++) { /* the channels past the whole blocks, pixel by pixel */
                    for (int64_t k = whole; k < c; k++) acc[k - whole] = b ? b[k] : 0.0f;
                    for (int64_t ky = 0; ky < kh; ky++) {
                        const int64_t iy = oy * sh - ph + ky;
                        if (iy < 0 || iy >= h) continue;
                        for (int64_t kx = 0; kx < kw; kx++) {
                            const int64_t ix = ox * sw - pw + kx;
                            if (ix < 0 || ix >= w) continue;
                            const float *xp = x + ((i * h + iy) * w + ix) * c;
                            const float *wp = wt + (ky * kw + kx) * c;
                            for (int64_t k = whole; k < c; k++) acc[k - whole] += xp[k] * wp[k];
                        }
                    }
                    float *yp = y + ((i * ho + oy) * wo + ox) * c;
                    for (int64_t k = whole; k < c; k++) yp[k] = activate(acc[k - whole], act);
                }
            }
        }
        free(acc);
        restore_subnormals(csr);
    }
}
