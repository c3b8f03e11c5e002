/* A depthwise convolution over channels-last images, for a shape a convolution has not met before.
 *
 * Why: oneDNN builds a primitive (kernels JIT-compiled for the shapes) the first time a convolution
 * meets an input size, 0.1-0.3 ms a convolution on this project's CPU, more than the arithmetic of a
 * small depthwise layer. Traffic with a new image size on every call pays that on every call. This
 * loop needs nothing built: per output pixel, the taps' rows of channels multiplied into a row of
 * sums (the channel loop vectorises), then the bias and the activation. At a shape that comes back
 * oneDNN serves (ops/cpu_conv.py): on large layers its kernels are faster.
 *
 * x [n][h][w][c], y [n][ho][wo][c]; wt [kh][kw][c]; b [c] or NULL; act 0 none, 1 relu, 2 hardswish.
 */
#include <stdint.h>
#include <stdlib.h>
#include "subnormal.h"

void dw_conv_nhwc(const float *x, float *y, const float *wt, const float *b, int64_t n, int64_t h, int64_t w,
                  int64_t c, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                  int64_t wo, int64_t act, int64_t threads) {
    #pragma omp parallel num_threads(threads) if (threads > 1 && n * ho * wo * c * kh * kw > 262144)
    {
        const unsigned csr = flush_subnormals();
        float *acc = (float *)malloc(sizeof(float) * (size_t)c);
        #pragma omp for collapse(2)
        for (int64_t i = 0; i < n; i++) {
            for (int64_t oy = 0; oy < ho; oy++) {
                for (int64_t ox = 0; ox < wo; ox++) {
                    for (int64_t k = 0; k < c; k++) acc[k] = b ? b[k] : 0.0f;
                    for (int64_t ky = 0; ky < kh; ky++) {
                        const int64_t iy = oy * sh - ph + ky;
                        if (iy < 0 || iy >= h) continue;
                        for (int64_t kx = 0; kx < kw; kx++) {
                            const int64_t ix = ox * sw - pw + kx;
                            if (ix < 0 || ix >= w) continue;
                            const float *xp = x + ((i * h + iy) * w + ix) * c;
                            const float *wp = wt + (ky * kw + kx) * c;
                            for (int64_t k = 0; k < c; k++) acc[k] += xp[k] * wp[k];
                        }
                    }
                    float *yp = y + ((i * ho + oy) * wo + ox) * c;
                    if (act == 1) {
                        for (int64_t k = 0; k < c; k++) yp[k] = acc[k] > 0.0f ? acc[k] : 0.0f;
                    } else if (act == 2) {
                        for (int64_t k = 0; k < c; k++) {
                            float t = acc[k] + 3.0f;
                            t = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t);
                            yp[k] = acc[k] * t / 6.0f;
                        }
                    } else {
                        for (int64_t k = 0; k < c; k++) yp[k] = acc[k];
                    }
                }
            }
        }
        free(acc);
        restore_subnormals(csr);
    }
}
