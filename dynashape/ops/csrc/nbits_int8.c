/* MatMulNBits, accuracy_level 4, 4-bit weights in blocks of 32, float32 A: onnxruntime's
 * int8-activation kernel on x86-64 with AVX-512 VNNI, to the bit (the arithmetic and its order are
 * written out in ops/nbits_int8.py, whose torch path this is the fast form of).
 *
 * Built with -ffp-contract=off: the only fused multiply-adds are the explicit fmaf calls, where
 * onnxruntime has its own; every other product and sum rounds on its own, as there. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define BLK 32

/* lane j (0..15) of a group of 4 blocks: its block, and the 8 positions in that block it sums */
static int lane_block(int j) { return 2 * ((j % 4) / 2) + (j / 4) / 2; }

static int lane_pos(int j, int i) {
    int c = j / 4, p = j % 4;
    int r = 4 * (c % 2) + p % 2 + (i < 4 ? 0 : 2);
    return 4 * r + i % 4;
}

/* One row of A: q (int8 values, zeros past K), the block scales and scale * sum(q). */
static void quantize_row(const float* a, int64_t k, int64_t nb, int8_t* q, float* scale, float* asum) {
    for (int64_t b = 0; b < nb; b++) {
        int64_t n = k - b * BLK < BLK ? k - b * BLK : BLK;
        const float* x = a + b * BLK;
        float amax = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            float v = fabsf(x[i]);
            amax = v > amax ? v : amax;
        }
        float s = amax / 127.0f;
        float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int64_t i = 0; i < BLK; i++) {
            int32_t v = i < n ? (int32_t)nearbyintf(x[i] * inv) : 0;
            q[b * BLK + i] = (int8_t)v;
            sum += v;
        }
        scale[b] = s;
        asum[b] = s * (float)sum;
    }
}

/* y[m, n] for rows [0, m_count): raw (N, nb * 32) the 4-bit values 0..15 one per byte, bscale and
 * bsum (N, nb) the block scales and -(zero point * scale), bias (N) or NULL. 0, or -1 when
 * memory for A's int8 copy could not be had (y is then not written). */
int nbits_int8_gemm(int64_t m_count, int64_t n_count, int64_t k, int64_t nb, const float* a, const uint8_t* raw,
                     const float* bscale, const float* bsum, const float* bias, float* y) {
    int8_t* q = malloc((size_t)(m_count * nb * BLK));
    float* sa = malloc(sizeof(float) * (size_t)(m_count * nb * 2));
    if (!q || !sa) {
        free(q);
        free(sa);
        return -1;
    }
    float* asum = sa + m_count * nb;
    for (int64_t m = 0; m < m_count; m++)
        quantize_row(a + m * k, k, nb, q + m * nb * BLK, sa + m * nb, asum + m * nb);
    int pos[16][8], blk[16];
    for (int j = 0; j < 16; j++) {
        blk[j] = lane_block(j);
        for (int i = 0; i < 8; i++) pos[j][i] = lane_pos(j, i);
    }
    int64_t groups = nb / 4, n_full = n_count - n_count % 4;
    /* a decode step's product (one row) is a few microseconds of work: one thread. Waking a second
     * costs about as much, and where other processes load the machine its fixed share waits for a
     * descheduled thread (1.8 ms a product measured, against ~5 us) */
#pragma omp parallel for schedule(static) if (m_count * n_count * k >= (1 << 18))
    for (int64_t n = 0; n < n_count; n++) {
        const uint8_t* w = raw + n * nb * BLK;
        const float* sb = bscale + n * nb;
        for (int64_t m = 0; m < m_count; m++) {
            const int8_t* x = q + m * nb * BLK;
            const float* s_a = sa + m * nb;
            float acc16[16] = {0}, acc[8];
            for (int64_t g = 0; g < groups; g++) {
                for (int j = 0; j < 16; j++) {
                    int64_t b = 4 * g + blk[j];
                    const int8_t* xb = x + b * BLK;
                    const uint8_t* wb = w + b * BLK;
                    int32_t d = 0;
                    for (int i = 0; i < 8; i++) d += (int32_t)xb[pos[j][i]] * (int32_t)wb[pos[j][i]];
                    float s = s_a[b] * sb[b];
                    acc16[j] = fmaf((float)d, s, acc16[j]);
                }
            }
            for (int l = 0; l < 8; l++) acc[l] = acc16[l] + acc16[l + 8];
            for (int64_t b = 4 * groups; b < nb; b++) {
                float s = s_a[b] * sb[b];
                for (int l = 0; l < 8; l++) {
                    int32_t d = 0;
                    for (int t = 0; t < 4; t++) d += (int32_t)x[b * BLK + 4 * l + t] * (int32_t)w[b * BLK + 4 * l + t];
                    acc[l] = fmaf((float)d, s, acc[l]);
                }
            }
            float out;
            if (n < n_full) {
                float lo = ((acc[0] + acc[1]) + acc[2]) + acc[3];
                float hi = ((acc[4] + acc[5]) + acc[6]) + acc[7];
                out = lo + hi;
            } else {
                out = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
            }
            if (bias) out += bias[n];
            float extra = 0.0f;
            const float* bs = bsum + n * nb;
            const float* as = asum + m * nb;
            for (int64_t b = 0; b < nb; b++) extra = fmaf(as[b], bs[b], extra);
            y[m * n_count + n] = extra + out;
        }
    }
    free(q);
    free(sa);
    return 0;
}
