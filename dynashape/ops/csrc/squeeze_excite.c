/* A squeeze-and-excitation block in one pass pair: y = x * gate(W2 act(W1 mean(x) + b1) + b2).
 *
 * Why C: MobileNetV3 and PP-LCNet end most blocks with one (PaddleOCR's direction classifier has
 * nine). In torch it is five kernels (the mean, two 1x1 convolutions of a 1x1 image, the gate,
 * the product) and a dozen small calls around them; at a small image the calls, not the
 * arithmetic, are the block's time. Here: per image, the channel means in one read of x, the two
 * small matrix-vector products and the gate, then y = x * scale in one read and one write.
 *
 * x, y: n images of p pixels and c channels, element (i, q, k) at i*sn + q*sp + k*sc (channels-last
 * has sc = 1, sp = c; NCHW sp = 1, sc = p). w1 [cr][c], w2 [c][cr] (the 1x1 weights); b1, b2 may be
 * NULL. act1: 0 none, 1 relu. gate: 0 max(0, min(1, alpha v + beta)), 1 sigmoid. scratch: n*(2c+cr).
 */
#include <math.h>
#include <stdint.h>

static void scales(const float *x, int64_t p, int64_t c, int64_t cr, int64_t sp, int64_t sc,
                   const float *w1, const float *b1, const float *w2, const float *b2,
                   int64_t act1, int64_t gate, float alpha, float beta, float *sum, float *hid, float *scale) {
    for (int64_t k = 0; k < c; k++) sum[k] = 0.0f;
    if (sc == 1) {
        for (int64_t q = 0; q < p; q++) {
            const float *row = x + q * sp;
            for (int64_t k = 0; k < c; k++) sum[k] += row[k];
        }
    } else {
        for (int64_t k = 0; k < c; k++) {
            const float *col = x + k * sc;
            float s = 0.0f;
            for (int64_t q = 0; q < p; q++) s += col[q * sp];
            sum[k] = s;
        }
    }
    const float inv = 1.0f / (float)p;
    for (int64_t k = 0; k < c; k++) sum[k] *= inv;
    for (int64_t j = 0; j < cr; j++) {
        const float *w = w1 + j * c;
        float v = 0.0f;
        for (int64_t k = 0; k < c; k++) v += w[k] * sum[k];
        v += b1 ? b1[j] : 0.0f;
        hid[j] = (act1 == 1 && v < 0.0f) ? 0.0f : v;
    }
    for (int64_t k = 0; k < c; k++) {
        const float *w = w2 + k * cr;
        float v = 0.0f;
        for (int64_t j = 0; j < cr; j++) v += w[j] * hid[j];
        v += b2 ? b2[k] : 0.0f;
        if (gate == 1) {
            scale[k] = 1.0f / (1.0f + expf(-v));
        } else {
            float g = alpha * v + beta;
            scale[k] = g < 0.0f ? 0.0f : (g > 1.0f ? 1.0f : g);
        }
    }
}

void se_forward(const float *x, float *y, int64_t n, int64_t p, int64_t c, int64_t cr,
                int64_t sn, int64_t sp, int64_t sc, const float *w1, const float *b1, const float *w2,
                const float *b2, int64_t act1, int64_t gate, double alpha, double beta, float *scratch,
                int64_t threads) {
    const int64_t per = 2 * c + cr;
    #pragma omp parallel for num_threads(threads) if (threads > 1 && n > 1)
    for (int64_t i = 0; i < n; i++) {
        float *s = scratch + i * per;
        scales(x + i * sn, p, c, cr, sp, sc, w1, b1, w2, b2, act1, gate, (float)alpha, (float)beta, s, s + c,
               s + c + cr);
    }
    if (sc == 1) {  /* channels-last: a pixel's channels are contiguous */
        #pragma omp parallel for collapse(2) num_threads(threads) if (threads > 1 && n * p * c > 65536)
        for (int64_t i = 0; i < n; i++) {
            for (int64_t q = 0; q < p; q++) {
                const float *scale = scratch + i * per + c + cr;
                const float *xr = x + i * sn + q * sp;
                float *yr = y + i * sn + q * sp;
                for (int64_t k = 0; k < c; k++) yr[k] = xr[k] * scale[k];
            }
        }
    } else {  /* a channel's pixels at stride sp (1 in NCHW) */
        #pragma omp parallel for collapse(2) num_threads(threads) if (threads > 1 && n * p * c > 65536)
        for (int64_t i = 0; i < n; i++) {
            for (int64_t k = 0; k < c; k++) {
                const float f = scratch[i * per + c + cr + k];
                const float *xc = x + i * sn + k * sc;
                float *yc = y + i * sn + k * sc;
                for (int64_t q = 0; q < p; q++) yc[q * sp] = xc[q * sp] * f;
            }
        }
    }
}
