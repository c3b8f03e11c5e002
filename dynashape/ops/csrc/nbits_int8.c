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
#ifndef PF
#define PF 16
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0
#endif

/* y as nbits_int8_gemm computes it. tail (N, (nb % 4) * 32): the blocks after the last group, one
 * value a byte; bsum_t (nb, N): the block sums' factors, block-major, or NULL where every zero
 * point is 8: the factor -(8 * scale) is then exact and made from the scales (a quarter less to
 * read: a decode step's products are bound by memory). The weight's arguments come first: Python
 * binds them once a weight (PackedB.call). */
int nbits_int8_gemm_lanes(int64_t n_count, int64_t nb, const uint8_t* lanes, const uint8_t* tail,
                          const float* bscale, const float* bsum_t, int64_t k, int64_t m_count, const float* a,
                          const float* bias, float* y) {
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
    for (int64_t m = 0; m < m_count; m++) {
        const int8_t* x = q + m * nb * BLK;
        quantize_row(a + m * k, k, nb, q + m * nb * BLK, sa + m * nb, asum + m * nb);
        for (int64_t g = 0; g < groups; g++) {
            int8_t* o = ql + (m * groups + g) * 128;
            for (int j = 0; j < 16; j++) {
                int64_t b = 4 * g + lane_block(j);
                for (int t = 0; t < 4; t++) {
                    o[4 * j + t] = x[b * BLK + lane_pos(j, t)];
                    o[64 + 4 * j + t] = x[b * BLK + lane_pos(j, t + 4)];
                }
            }
        }
    }
    const __m512i lane_blk = _mm512_set_epi32(3, 3, 1, 1, 3, 3, 1, 1, 2, 2, 0, 0, 2, 2, 0, 0);
    const __m512i nib = _mm512_set1_epi8(15);
    const __m512i col = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(8));
    /* scale_a of each lane's block, per row and group: the same for every output */
    float* sa16 = aligned_alloc(64, sizeof(float) * (size_t)(m_count * groups * 16 + 16));
    if (!sa16) {
        free(q);
        free(ql);
        free(sa);
        return -1;
    }
    for (int64_t m = 0; m < m_count; m++)
        for (int64_t g = 0; g < groups; g++)
            _mm512_store_ps(sa16 + (m * groups + g) * 16,
                            _mm512_permutexvar_ps(lane_blk, _mm512_castps128_ps512(_mm_loadu_ps(sa + m * nb + 4 * g))));
    int64_t chunks = (n_count + 15) / 16, n_full = n_count - n_count % 4;
#pragma omp parallel for schedule(static) if (m_count * n_count * k >= (1 << 18))
    for (int64_t c = 0; c < chunks; c++) {
        int64_t n0 = 16 * c, cnt = n_count - n0 < 16 ? n_count - n0 : 16;
        for (int64_t m = 0; m < m_count; m++) {
            const float* s_a = sa + m * nb;
            const float* s16 = sa16 + m * groups * 16;
            const int8_t* xl = ql + m * groups * 128;
            const int8_t* x = q + m * nb * BLK;
            float acc8[16][8], out[16];
            /* four outputs at a time: four independent chains of fused multiply-adds */
            for (int64_t i0 = 0; i0 < cnt; i0 += 4) {
                int u = cnt - i0 < 4 ? (int)(cnt - i0) : 4;
                __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
                for (int64_t g = 0; g < groups; g++) {
                    __m512i x1 = _mm512_loadu_si512((const void*)(xl + g * 128));
                    __m512i x2 = _mm512_loadu_si512((const void*)(xl + g * 128 + 64));
                    __m512 sag = _mm512_load_ps(s16 + g * 16);
#pragma GCC unroll 4
                    for (int v = 0; v < 4; v++) {
                        if (v >= u) break;
                        int64_t n = n0 + i0 + v;
                        __m512i packed = _mm512_loadu_si512((const void*)(lanes + (n * groups + g) * 64));
                        /* the weights stream from memory once a step: ask for them PF outputs ahead */
                        _mm_prefetch((const char*)(lanes + ((n + PF) * groups + g) * 64), PF_HINT);
                        if (g < (nb + 15) / 16)  /* the scales: a cache line for every 16 blocks */
                            _mm_prefetch((const char*)(bscale + (n + PF) * nb + 16 * g), _MM_HINT_T0);
                        __m512i lo = _mm512_and_si512(packed, nib);
                        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nib);
                        __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x1);
                        d = _mm512_dpbusd_epi32(d, hi, x2);
                        __m512 s4b = _mm512_castps128_ps512(_mm_loadu_ps(bscale + n * nb + 4 * g));
                        __m512 s = _mm512_mul_ps(sag, _mm512_permutexvar_ps(lane_blk, s4b));
                        acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc[v]);
                    }
                }
                for (int v = 0; v < u; v++)
                    _mm256_storeu_ps(acc8[i0 + v], _mm256_add_ps(_mm512_castps512_ps256(acc[v]),
                                                                  _mm512_extractf32x8_ps(acc[v], 1)));
            }
            for (int64_t i = 0; i < cnt && rest; i++) {  /* the blocks after the last group */
                int64_t n = n0 + i;
                const uint8_t* wt = tail + n * rest * BLK;
                for (int64_t r = 0; r < rest; r++) {
                    int64_t b = 4 * groups + r;
                    float s = s_a[b] * bscale[n * nb + b];
                    for (int l = 0; l < 8; l++) {
                        int32_t dd = 0;
                        for (int t = 0; t < 4; t++)
                            dd += (int32_t)x[b * BLK + 4 * l + t] * (int32_t)wt[r * BLK + 4 * l + t];
                        acc8[i][l] = fmaf((float)dd, s, acc8[i][l]);
                    }
                }
            }
            const float* as = asum + m * nb;
            float* yr = y + m * n_count + n0;
            if (cnt == 16 && n0 + 16 <= n_full) {  /* the folds, 16 outputs at a time, in the scalar order */
                const float* base = &acc8[0][0];
                __m512 a0 = _mm512_i32gather_ps(col, base + 0, 4), a1 = _mm512_i32gather_ps(col, base + 1, 4);
                __m512 a2 = _mm512_i32gather_ps(col, base + 2, 4), a3 = _mm512_i32gather_ps(col, base + 3, 4);
                __m512 a4 = _mm512_i32gather_ps(col, base + 4, 4), a5 = _mm512_i32gather_ps(col, base + 5, 4);
                __m512 a6 = _mm512_i32gather_ps(col, base + 6, 4), a7 = _mm512_i32gather_ps(col, base + 7, 4);
                __m512 lo4 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), a2), a3);
                __m512 hi4 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), a6), a7);
                __m512 o = _mm512_add_ps(lo4, hi4);
                if (bias) o = _mm512_add_ps(o, _mm512_loadu_ps(bias + n0));
                __m512 e = _mm512_setzero_ps();
                if (bsum_t) {
                    for (int64_t b = 0; b < nb; b++)
                        e = _mm512_fmadd_ps(_mm512_set1_ps(as[b]), _mm512_loadu_ps(bsum_t + b * n_count + n0), e);
                } else {
                    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4,
                                                                             3, 2, 1, 0), _mm512_set1_epi32((int)nb));
                    const __m512 minus8 = _mm512_set1_ps(-8.0f);
                    for (int64_t b = 0; b < nb; b++) {
                        __m512 sb = _mm512_i32gather_ps(rows, bscale + n0 * nb + b, 4);
                        e = _mm512_fmadd_ps(_mm512_set1_ps(as[b]), _mm512_mul_ps(minus8, sb), e);
                    }
                }
                _mm512_storeu_ps(yr, _mm512_add_ps(e, o));
                continue;
            }
            for (int64_t i = 0; i < cnt; i++) {
                int64_t n = n0 + i;
                float o = fold8(acc8[i], n < n_full);
                out[i] = bias ? o + bias[n] : o;
                float e = 0.0f;
                for (int64_t b = 0; b < nb; b++)
                    e = fmaf(as[b], bsum_t ? bsum_t[b * n_count + n] : -8.0f * bscale[n * nb + b], e);
                yr[i] = e + out[i];
            }
        }
    }
    free(sa16);
    free(q);
    free(ql);
    free(sa);
    return 0;
}
#endif
