/* MatMulNBits, accuracy_level 4, 4-bit weights in blocks of 32, float32 A: onnxruntime's
 * int8-activation kernel on x86-64 with AVX-512 VNNI, to the bit (the arithmetic and its order are
 * written out in ops/nbits_int8.py, whose torch path this is the fast form of).
 *
 * Built with -ffp-contract=off: the only fused multiply-adds are the explicit fmaf calls, where
 * onnxruntime has its own; every other product and sum rounds on its own, as there. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLK 32

/* lane j (0..15) of a group of 4 blocks: its block, and the 8 positions in that block it sums */
static int lane_block(int j) { return 2 * ((j % 4) / 2) + (j / 4) / 2; }

static int lane_pos(int j, int i) {
    int c = j / 4, p = j % 4;
    int r = 4 * (c % 2) + p % 2 + (i < 4 ? 0 : 2);
    return 4 * r + i % 4;
}

/* The 8 lanes of an output summed: MLAS's order for the columns in groups of 4 (``full``), its
 * one-column horizontal sum for the N % 4 columns left. */
static inline float fold8(const float* a, int full) {
    if (full) return (((a[0] + a[1]) + a[2]) + a[3]) + (((a[4] + a[5]) + a[6]) + a[7]);
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
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
            float out = fold8(acc, n < n_full);
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

/* ---- the same bits with AVX-512 VNNI, over weights packed in the lanes' order ----------------
 * The integer sums of a lane are exact in any order, so the weights are stored as each lane reads
 * them: per output and group of 4 blocks, 64 bytes whose low nibbles are the lanes' first 4
 * positions and high nibbles their last 4 (lane j: bytes 4j..4j+3); the activations are put in
 * the same order once per row. Two dpbusd give the 16 lanes' sums, and the float side is the
 * scalar kernel's, lane by lane: s = scale_a * scale_b rounded, then one fused multiply-add into
 * the lane; the folds are scalar in the scalar kernel's order, and the block sums' chain
 * (fused multiply-adds in block order) runs 16 outputs at a time. */

int nbits_int8_has_lanes(void) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
    return 1;
#else
    return 0;
#endif
}

/* lanes (N, groups, 64) from raw (N, nb * 32) one value a byte */
void nbits_int8_pack_lanes(int64_t n_count, int64_t nb, const uint8_t* raw, uint8_t* lanes) {
    int64_t groups = nb / 4;
    for (int64_t n = 0; n < n_count; n++)
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t* w = raw + n * nb * BLK;
            uint8_t* o = lanes + (n * groups + g) * 64;
            for (int j = 0; j < 16; j++) {
                int64_t b = 4 * g + lane_block(j);
                for (int t = 0; t < 4; t++)
                    o[4 * j + t] = (uint8_t)((w[b * BLK + lane_pos(j, t)] & 15) | ((w[b * BLK + lane_pos(j, t + 4)] & 15) << 4));
            }
        }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>

/* 4 int8 values as one int (a lane's 4 values of A, broadcast to every output's lane) */
static inline int32_t load4(const int8_t* p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One row of A quantized (quantize_row), and its values of each group of 4 blocks in the lanes' order
 * (ql, 128 a group): lane j's 4 values for the low nibbles at 4j, for the high ones at 64 + 4j. */
static void quantize_and_order(const float* a, int64_t k, int64_t nb, int64_t groups, int8_t* q, int8_t* ql,
                               float* scale, float* asum) {
    quantize_row(a, k, nb, q, scale, asum);
    for (int64_t g = 0; g < groups; g++) {
        int8_t* o = ql + g * 128;
        for (int j = 0; j < 16; j++) {
            int64_t b = 4 * g + lane_block(j);
            for (int t = 0; t < 4; t++) {
                o[4 * j + t] = q[b * BLK + lane_pos(j, t)];
                o[64 + 4 * j + t] = q[b * BLK + lane_pos(j, t + 4)];
            }
        }
    }
}

/* y as nbits_int8_gemm computes it (MLAS's VNNI kernel's lanes: lane j of a group of 4 blocks sums the
 * positions lane_pos gives, low nibbles against A's first 4 of them, high against the next 4), each
 * lane's arithmetic as there, with 16 outputs side by side in a vector (where a kernel holding one
 * output's 16 lanes a vector, measured 4x slower than onnxruntime on a 32,000 x 256 LM head, had to
 * transpose its lanes through memory and gather the scales by output): the weights read as
 * cols (chunks of 16 outputs, groups, 16 lanes, 16 outputs, 4 bytes: the lanes' bytes of 16 outputs
 * together) and tcols (chunks, rest, 8 lanes, 16 outputs, 4 bytes: the blocks after the last group,
 * one value a byte), A's 4 bytes of a lane broadcast to all 16. The scales and the block sums'
 * factors as (chunks, nb, 16): a chunk's together, so that the weights and the scales are two streams
 * read in order (block-major rows of N were nb streams; bsum_c NULL: every zero point 8, the factors
 * -8 * scale). The
 * lanes' halves, the folds (MLAS's order for the columns in groups of 4, its one-column order for the
 * N % 4 left), the bias and the block sums are then the same operations on vectors of outputs, where
 * computed for 16 outputs at once. threads: OpenMP's for this call (1: the caller's thread only). */
int nbits_int8_gemm_cols(int64_t n_count, int64_t n_pad, int64_t nb, const uint8_t* cols, const uint8_t* tcols,
                         const float* scale_c, const float* bsum_c, int64_t k, int64_t m_count, const float* a,
                         const float* bias, float* y, int64_t threads) {
    int64_t groups = nb / 4, rest = nb - 4 * groups;
    int8_t* q = malloc((size_t)(m_count * nb * BLK));
    int8_t* ql = malloc((size_t)(m_count * groups * 128 + 64));
    float* sa = malloc(sizeof(float) * (size_t)(m_count * nb * 2));
    if (!q || !ql || !sa) {
        free(q);
        free(ql);
        free(sa);
        return -1;
    }
    float* asum = sa + m_count * nb;
    for (int64_t m = 0; m < m_count; m++)
        quantize_and_order(a + m * k, k, nb, groups, q + m * nb * BLK, ql + m * groups * 128, sa + m * nb,
                           asum + m * nb);
    int64_t chunks = n_pad / 16, n_full = n_count - n_count % 4;
    const __m512i nib = _mm512_set1_epi8(15);
    const __m512 minus8 = _mm512_set1_ps(-8.0f);
    const __m512i lane16 = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
/* threads: the caller's count (torch's), named here: a thread that is not the process's first runs an
     * unnamed parallel region on one thread (a decode step's LM head 78 us on the first thread, 160 on another) */
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t n0 = 16 * c;
        const float* sc = scale_c + c * nb * 16;  /* the chunk's scales, block by block */
        __m512i idx = _mm512_add_epi32(lane16, _mm512_set1_epi32((int)n0));
        __mmask16 live = _mm512_cmplt_epi32_mask(idx, _mm512_set1_epi32((int)n_count));
        __mmask16 full = _mm512_cmplt_epi32_mask(idx, _mm512_set1_epi32((int)n_full));
        for (int64_t m = 0; m < m_count; m++) {
            const int8_t* x = q + m * nb * BLK;
            const int8_t* xl = ql + m * groups * 128;
            const float* s_a = sa + m * nb;
            __m512 acc[16];
            for (int l = 0; l < 16; l++) acc[l] = _mm512_setzero_ps();
            for (int64_t g = 0; g < groups; g++) {
                const uint8_t* w = cols + (c * groups + g) * 1024;
                _mm_prefetch((const char*)(w + 1024 * groups), _MM_HINT_T0);  /* the next chunk's group */
#pragma GCC unroll 16
                for (int l = 0; l < 16; l++) {
                    int64_t b = 4 * g + lane_block(l);
                    __m512i packed = _mm512_loadu_si512((const void*)(w + 64 * l));
                    __m512i lo = _mm512_and_si512(packed, nib);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nib);
                    __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_set1_epi32(load4(xl + 128 * g + 4 * l)));
                    d = _mm512_dpbusd_epi32(d, hi, _mm512_set1_epi32(load4(xl + 128 * g + 64 + 4 * l)));
                    __m512 s = _mm512_mul_ps(_mm512_set1_ps(s_a[b]), _mm512_loadu_ps(sc + 16 * b));
                    acc[l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc[l]);
                }
            }
            __m512 a8[8];
            for (int l = 0; l < 8; l++) a8[l] = _mm512_add_ps(acc[l], acc[l + 8]);
            for (int64_t r = 0; r < rest; r++) {  /* the blocks after the last group */
                int64_t b = 4 * groups + r;
                __m512 s = _mm512_mul_ps(_mm512_set1_ps(s_a[b]), _mm512_loadu_ps(sc + 16 * b));
                const uint8_t* w = tcols + (c * rest + r) * 512;
                for (int l = 0; l < 8; l++) {
                    __m512i dd = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512((const void*)(w + 64 * l)),
                                                     _mm512_set1_epi32(load4(x + b * BLK + 4 * l)));
                    a8[l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dd), s, a8[l]);
                }
            }
            __m512 by4 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8[0], a8[1]), a8[2]), a8[3]),
                                       _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8[4], a8[5]), a8[6]), a8[7]));
            __m512 by1 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8[0], a8[4]), _mm512_add_ps(a8[2], a8[6])),
                                       _mm512_add_ps(_mm512_add_ps(a8[1], a8[5]), _mm512_add_ps(a8[3], a8[7])));
            __m512 o = _mm512_mask_blend_ps(full, by1, by4);
            if (bias) o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(live, bias + n0));
            const float* as = asum + m * nb;
            __m512 e = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                __m512 f = bsum_c ? _mm512_loadu_ps(bsum_c + (c * nb + b) * 16)
                                  : _mm512_mul_ps(minus8, _mm512_loadu_ps(sc + 16 * b));
                e = _mm512_fmadd_ps(_mm512_set1_ps(as[b]), f, e);
            }
            _mm512_mask_storeu_ps(y + m * n_count + n0, live, _mm512_add_ps(e, o));
        }
    }
    free(q);
    free(ql);
    free(sa);
    return 0;
}
#endif
