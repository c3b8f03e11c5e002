/* Exact products of 8-bit operands with a weight laid out in blocks, shared by dq_lstm.c and
 * qgemm.c: DynamicQuantizeLinear's parameters, a row quantized into an operand row, and the
 * product of one operand row with a block.
 *
 * A weight (K, N) is laid out once (by the Python side) in blocks of BLOCK_COLS columns; within a
 * block, k comes in groups of G: (blocks, K / G, BLOCK_COLS, G), zero-padded. G is 4 for int8
 * weights without zero point on AVX-512 VNNI builds (uint8 operand x int8 weight, vpdpbusd: 4 k's
 * of 16 columns an instruction), 2 otherwise (int16 pairs of the centered operand and W - W_zp:
 * vpdpwssd, AVX2 vpmaddwd, or plain C). Every sum is exact in int32 (|q|, |w| <= 255).
 */
#ifndef DYNASHAPE_QBLOCK_H
#define DYNASHAPE_QBLOCK_H
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define VNNI_512 1
#elif defined(__AVX2__)
#include <immintrin.h>
#define MADD_256 1
#endif

#define BLOCK_COLS 64 /* columns per block: four 16-lane int32 accumulators a row */

/* 1 where int8 weights (zero point 0) take the u8 x s8 product: the caller lays them out for it */
static inline int vnni_int8_weights(void) {
#if defined(VNNI_512)
    return 1;
#else
    return 0;
#endif
}

static inline size_t esize(int64_t grp) { return grp == 4 ? 1 : 2; }

/* DynamicQuantizeLinear's parameters of v[0:m] (ops/quant.py dynamic_qparams, in float32);
 * 1 when the range is not finite or the scale underflows (the caller's torch path then gives
 * what onnxruntime's formula gives). */
static int qparams(const float *v, int64_t m, float *scale, float *zp) {
    float lo = 0.0f, hi = 0.0f;
    int nan = 0;
    int64_t i = 0;
#if defined(VNNI_512)
    /* (a reduction into one float does not vectorize without -ffast-math) min / max take the
     * second operand for NaN and for equal zeros, as the scalar loop below keeps lo / hi */
    __m512 l16 = _mm512_setzero_ps(), h16 = l16;
    __mmask16 bad = 0;
    for (; i + 16 <= m; i += 16) {
        __m512 x = _mm512_loadu_ps(v + i);
        bad |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        l16 = _mm512_min_ps(x, l16);
        h16 = _mm512_max_ps(x, h16);
    }
    float l[16], h[16];
    _mm512_storeu_ps(l, l16);
    _mm512_storeu_ps(h, h16);
    for (int j = 0; j < 16; j++) {
        lo = l[j] < lo ? l[j] : lo;
        hi = h[j] > hi ? h[j] : hi;
    }
    nan = bad != 0;
#elif defined(MADD_256)
    __m256 l8 = _mm256_setzero_ps(), h8 = l8, bad = l8;
    for (; i + 8 <= m; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        l8 = _mm256_min_ps(x, l8);
        h8 = _mm256_max_ps(x, h8);
    }
    float l[8], h[8];
    _mm256_storeu_ps(l, l8);
    _mm256_storeu_ps(h, h8);
    for (int j = 0; j < 8; j++) {
        lo = l[j] < lo ? l[j] : lo;
        hi = h[j] > hi ? h[j] : hi;
    }
    nan = _mm256_movemask_ps(bad) != 0;
#endif
    for (; i < m; i++) {
        float x = v[i];
        nan |= !(x == x);
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
    if (nan) return 1;
    if (hi == lo) { *scale = 1.0f; *zp = 0.0f; return 0; }
    if (!((double)hi - (double)lo <= (double)FLT_MAX)) return 1;
    float s = (hi - lo) / 255.0f;
    if (s == 0.0f) return 1;
    float z = 0.0f - lo / s;
    z = z < 0.0f ? 0.0f : (z > 255.0f ? 255.0f : z);
    *scale = s;
    *zp = nearbyintf(z); /* half to even, as Python's round() */
    return 0;
}

/* DynamicQuantizeLinear's value of v less its zero point: round-half-even(v / scale) clamped to
 * [-zp, 255 - zp] (MlasQuantizeLinear's arithmetic) */
static inline float quantized_centered(float v, float scale, float zp) {
    const float q = nearbyintf(v / scale);
    return q < -zp ? -zp : (q > 255.0f - zp ? 255.0f - zp : q);
}

/* v quantized (scale, zp) into a row of the operand of a weight of group grp: uint8 q + zp for
 * grp 4, int16 q (centered) for grp 2 */
static void quantize_row(const float *v, int64_t m, float scale, float zp, int64_t grp, void *out) {
    for (int64_t i = 0; i < m; i++) {
        const float q = quantized_centered(v[i], scale, zp);
        if (grp == 4) ((uint8_t *)out)[i] = (uint8_t)(q + zp);
        else ((int16_t *)out)[i] = (int16_t)q;
    }
}

static inline int32_t load_group(const void *q, int64_t g) { /* G operand values as one lane */
    int32_t v;
    memcpy(&v, (const char *)q + 4 * g, 4);
    return v;
}

/* a[0:BLOCK_COLS] = one operand row q (kg groups of G values, uint8 or int16) @ the block blk */
static void block_product(int64_t kg, int grp, const void *qv, const void *blk, int32_t *a) {
    if (grp == 4) { /* uint8 q x int8 w, 4 k's per instruction (the layout that VNNI builds ask for) */
#if defined(VNNI_512)
        const int8_t *w = (const int8_t *)blk;
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t g = 0; g < kg; g++) {
            __m512i qq = _mm512_set1_epi32(load_group(qv, g));
            const int8_t *wp = w + g * BLOCK_COLS * 4;
            a0 = _mm512_dpbusd_epi32(a0, qq, _mm512_loadu_si512(wp));
            a1 = _mm512_dpbusd_epi32(a1, qq, _mm512_loadu_si512(wp + 64));
            a2 = _mm512_dpbusd_epi32(a2, qq, _mm512_loadu_si512(wp + 128));
            a3 = _mm512_dpbusd_epi32(a3, qq, _mm512_loadu_si512(wp + 192));
        }
        _mm512_storeu_si512(a, a0);
        _mm512_storeu_si512(a + 16, a1);
        _mm512_storeu_si512(a + 32, a2);
        _mm512_storeu_si512(a + 48, a3);
#else
        const uint8_t *q = (const uint8_t *)qv;
        const int8_t *w = (const int8_t *)blk;
        int32_t s[BLOCK_COLS] = {0};
        for (int64_t g = 0; g < kg; g++)
            for (int j = 0; j < BLOCK_COLS; j++)
                for (int i = 0; i < 4; i++) s[j] += (int32_t)q[4 * g + i] * w[(g * BLOCK_COLS + j) * 4 + i];
        memcpy(a, s, sizeof s);
#endif
        return;
    }
    const int16_t *w = (const int16_t *)blk;
#if defined(VNNI_512)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t g = 0; g < kg; g++) {
        __m512i qq = _mm512_set1_epi32(load_group(qv, g));
        const int16_t *wp = w + g * BLOCK_COLS * 2;
        a0 = _mm512_dpwssd_epi32(a0, qq, _mm512_loadu_si512(wp));
        a1 = _mm512_dpwssd_epi32(a1, qq, _mm512_loadu_si512(wp + 32));
        a2 = _mm512_dpwssd_epi32(a2, qq, _mm512_loadu_si512(wp + 64));
        a3 = _mm512_dpwssd_epi32(a3, qq, _mm512_loadu_si512(wp + 96));
    }
    _mm512_storeu_si512(a, a0);
    _mm512_storeu_si512(a + 16, a1);
    _mm512_storeu_si512(a + 32, a2);
    _mm512_storeu_si512(a + 48, a3);
#elif defined(MADD_256)
    __m256i acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_si256();
    for (int64_t g = 0; g < kg; g++) {
        __m256i qq = _mm256_set1_epi32(load_group(qv, g));
        const __m256i *wp = (const __m256i *)(w + g * BLOCK_COLS * 2);
        for (int i = 0; i < 8; i++) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(qq, _mm256_loadu_si256(wp + i)));
    }
    for (int i = 0; i < 8; i++) _mm256_storeu_si256((__m256i *)(a + 8 * i), acc[i]);
#else
    const int16_t *q16 = (const int16_t *)qv;
    int32_t s[BLOCK_COLS] = {0};
    for (int64_t g = 0; g < kg; g++) {
        const int32_t q0 = q16[2 * g], q1 = q16[2 * g + 1];
        const int16_t *wp = w + g * BLOCK_COLS * 2;
        for (int j = 0; j < BLOCK_COLS; j++) s[j] += q0 * (int32_t)wp[2 * j] + q1 * (int32_t)wp[2 * j + 1];
    }
    memcpy(a, s, sizeof s);
#endif
}

#endif
