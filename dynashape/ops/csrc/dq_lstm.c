/* The recurrence of com.microsoft DynamicQuantizeLSTM on the CPU.
 *
 * Why C: a step is ~25 small torch calls from Python (quantize h, the integer product, scale, add
 * the input projection and bias, the gates), 3-6 us each, so a step costs 150-250 us where its
 * arithmetic needs 10-30 us. This loop does all steps of all directions in one call; everything
 * around it (the input projection, the reverse order, the outputs' layout) stays in torch.
 *
 * It computes what contrib_rnn.py's torch path computes, in the same order and float32 rounding:
 * h_{t-1} quantized as DynamicQuantizeLinear (one scale over the direction's batch), the exact
 * integer product with R - R_zero_point, times float32(h_scale * R_scale), plus the step's input
 * projection, plus Wb + Rb, then the default gates (sigmoid, tanh, tanh). It is compiled with
 * -ffp-contract=off: a fused multiply-add would round differently from torch's separate kernels.
 * sigmoid and tanh are written here so that the compiler vectorizes them (the C library's are
 * scalar calls, which made them most of a step): exp by range reduction and a degree-7
 * polynomial, within ~2 ulp; tanh(x) = 1 - 2 / (exp(2|x|) + 1), within ~1e-7 absolute.
 *
 * R's layout (made once by contrib_rnn.py): blocks of 16 hidden units, each block the 64 columns
 * of those units' four gates (i, o, f, c: 16 each), so that a thread owns whole units: it computes
 * their columns and their gates, and the threads meet once per step. Within a block, k comes in
 * groups of G (2 for int16 weights: vpdpwssd / vpmaddwd; 4 for int8 weights: vpdpbusd) so that one
 * instruction multiplies G k's of 16 (8) columns and adds them to int32 (exact: |q|, |w| <= 255).
 * Each block is read sequentially (rows of the plain layout 4 KB apart all fell in the same L1 sets).
 *
 * Returns 0, or 1 when a step's range of h is not finite (or its scale underflows): the caller
 * then runs its torch path, which gives what onnxruntime's formula gives there.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define VNNI_512 1
#elif defined(__AVX2__)
#include <immintrin.h>
#define MADD_256 1
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#define UNITS 16          /* hidden units per block */
#define COLS (4 * UNITS)  /* columns per block */

/* 1 where int8 weights (zero point 0) take the u8 x s8 product: the caller lays them out for it */
int dq_lstm_int8_weights(void) {
#if defined(VNNI_512)
    return 1;
#else
    return 0;
#endif
}

/* DynamicQuantizeLinear's parameters of v[0:m] (ops/quant.py dynamic_qparams, in float32). */
static int qparams(const float *v, int64_t m, float *scale, float *zp) {
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < m; i++) {
        float x = v[i];
        if (!(x == x)) return 1; /* nan */
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
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

static inline float sigmoid(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

static inline float tanh_approx(float x) {
    float a = x < 0.0f ? -x : x;
    float t = 1.0f - 2.0f / (exp_approx(2.0f * a) + 1.0f);
    return x < 0.0f ? -t : t;
}

/* a[0:COLS] = the block's columns for one batch entry: q (kg, G values each, int16 or uint8) @ blk */
static void block_product(int64_t kg, int grp, const void *qv, const void *blk, int32_t *a) {
    if (grp == 4) { /* uint8 q x int8 w, 4 k's per instruction (the layout that VNNI builds ask for) */
#if defined(VNNI_512)
        const int32_t *q = (const int32_t *)qv;
        const int8_t *w = (const int8_t *)blk;
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t g = 0; g < kg; g++) {
            __m512i qq = _mm512_set1_epi32(q[g]);
            const int8_t *wp = w + g * COLS * 4;
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
        int32_t s[COLS] = {0};
        for (int64_t g = 0; g < kg; g++)
            for (int j = 0; j < COLS; j++)
                for (int i = 0; i < 4; i++) s[j] += (int32_t)q[4 * g + i] * w[(g * COLS + j) * 4 + i];
        memcpy(a, s, sizeof s);
#endif
        return;
    }
    const int32_t *q = (const int32_t *)qv; /* pairs of int16 */
    const int16_t *w = (const int16_t *)blk;
#if defined(VNNI_512)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t g = 0; g < kg; g++) {
        __m512i qq = _mm512_set1_epi32(q[g]);
        const int16_t *wp = w + g * COLS * 2;
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
        __m256i qq = _mm256_set1_epi32(q[g]);
        const __m256i *wp = (const __m256i *)(w + g * COLS * 2);
        for (int i = 0; i < 8; i++) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(qq, _mm256_loadu_si256(wp + i)));
    }
    for (int i = 0; i < 8; i++) _mm256_storeu_si256((__m256i *)(a + 8 * i), acc[i]);
#else
    const int16_t *q16 = (const int16_t *)qv;
    int32_t s[COLS] = {0};
    for (int64_t g = 0; g < kg; g++) {
        const int32_t q0 = q16[2 * g], q1 = q16[2 * g + 1];
        const int16_t *wp = w + g * COLS * 2;
        for (int j = 0; j < COLS; j++) s[j] += q0 * (int32_t)wp[2 * j] + q1 * (int32_t)wp[2 * j + 1];
    }
    memcpy(a, s, sizeof s);
#endif
}

typedef struct {
    int64_t steps, batch, n, grp, kg; /* kg: groups of grp k's (k padded with zeros) */
    const float *proj;    /* (steps, batch, 4n): the scaled input projection, gates in ONNX order */
    const float *bias;    /* (4n): Wb + Rb, or NULL */
    const void *wb;       /* R - R_zero_point in blocks (above): (nblocks, kg, COLS, grp) */
    const int32_t *colsum;/* (nblocks * COLS): R's column sums, for the uint8 q of the int8 product */
    const float *wscale;  /* (4n): R's scale per column */
    const int64_t *lens;  /* (batch): steps of each entry, or NULL */
    float *h, *c;         /* (batch, n): initial states in, final out */
    float *y;             /* (steps, batch, n), zero-filled: the outputs in step order */
    float *h0;            /* scratch (batch, n): the initial h, read by step 0 while h is written */
} Dir;

/* Steps of one direction on `threads` threads (each owns a range of blocks); 0 or 1 (above). */
static int run_direction(const Dir *D, int threads) {
    const int64_t steps = D->steps, batch = D->batch, n = D->n, n4 = 4 * n, bn = batch * n;
    const int64_t nblocks = (n + UNITS - 1) / UNITS, kpad = D->kg * D->grp;
    const size_t qbytes = (size_t)(batch * kpad) * (D->grp == 4 ? 1 : 2);
    memcpy(D->h0, D->h, (size_t)bn * sizeof(float));
    int rc = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int tid = 0, nt = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        const int64_t b0 = nblocks * tid / nt, b1 = nblocks * (tid + 1) / nt;
        void *qbuf = calloc(1, qbytes + 64); /* each thread quantizes h for itself: no wait for that */
        int32_t a[COLS];
        float g[COLS];
        for (int64_t s = 0; s < steps; s++) {
            /* the previous output: zeros past an entry's length, as onnxruntime's buffer holds */
            const float *hin = s == 0 ? D->h0 : D->y + (s - 1) * bn;
            float scale, zp;
            if (qparams(hin, bn, &scale, &zp)) { /* the same answer on every thread: all leave here */
#pragma omp atomic write
                rc = 1;
                break;
            }
            {
                for (int64_t b = 0; b < batch; b++)
                    for (int64_t i = 0; i < n; i++) {
                        float v = nearbyintf(hin[b * n + i] / scale);
                        v = v < -zp ? -zp : (v > 255.0f - zp ? 255.0f - zp : v);
                        if (D->grp == 4) ((uint8_t *)qbuf)[b * kpad + i] = (uint8_t)(v + zp);
                        else ((int16_t *)qbuf)[b * kpad + i] = (int16_t)v;
                    }
                const float *ps = D->proj + s * batch * n4;
                float *ys = D->y + s * bn;
                for (int64_t blk = b0; blk < b1; blk++) {
                    const int64_t u0 = blk * UNITS, units = n - u0 < UNITS ? n - u0 : UNITS;
                    const char *wblk = (const char *)D->wb + (size_t)(blk * D->kg * COLS * D->grp) * (D->grp == 4 ? 1 : 2);
                    for (int64_t b = 0; b < batch; b++) {
                        const char *qb = (const char *)qbuf + (size_t)(b * kpad) * (D->grp == 4 ? 1 : 2);
                        block_product(D->kg, (int)D->grp, qb, wblk, a);
                        if (D->grp == 4) /* sum (q + zp) w = sum q w + zp colsum(w) */
                            for (int j = 0; j < COLS; j++) a[j] -= (int32_t)zp * D->colsum[blk * COLS + j];
                        if (D->lens && s >= D->lens[b]) continue; /* h, c kept; the output stays zero */
                        const float *p = ps + b * n4;
                        for (int gate = 0; gate < 4; gate++)
                            for (int64_t u = 0; u < units; u++) {
                                const int64_t col = gate * n + u0 + u; /* ONNX's column of this unit's gate */
                                float v = (float)a[gate * UNITS + u] * (scale * D->wscale[col]);
                                v += p[col];
                                if (D->bias) v += D->bias[col];
                                g[gate * UNITS + u] = v;
                            }
                        for (int j = 0; j < 3 * UNITS; j++) g[j] = sigmoid(g[j]); /* i, o, f */
                        for (int j = 3 * UNITS; j < COLS; j++) g[j] = tanh_approx(g[j]);
                        float *hb = D->h + b * n + u0, *cb = D->c + b * n + u0, *yb = ys + b * n + u0;
                        for (int64_t u = 0; u < units; u++) {
                            float fc = g[2 * UNITS + u] * cb[u], ig = g[u] * g[3 * UNITS + u];
                            float cn = fc + ig;
                            float hn = g[UNITS + u] * tanh_approx(cn);
                            cb[u] = cn;
                            hb[u] = hn;
                            yb[u] = hn;
                        }
                    }
                }
            }
#pragma omp barrier
        }
        free(qbuf);
    }
    return rc;
}

/* All directions: with two threads and two directions, one direction per thread (no meeting per
 * step); otherwise each direction's blocks shared by the threads. Built with -fopenmp, the library
 * needs libgomp.so.1, which the dynamic linker finds already loaded by torch: the work runs on
 * torch's own OpenMP threads (another pool's threads would wait for torch's, still spinning after
 * its last kernel, on the same cores). Per-direction arrays follow each other in memory. */
int dq_lstm(int64_t nd, int64_t threads, int64_t steps, int64_t batch, int64_t n, int64_t grp, int64_t kg,
            const float *proj, const float *bias, const void *wb, const int32_t *colsum, const float *wscale,
            const int64_t *lens, float *h, float *c, float *y, int64_t y_stride, float *h0)
{
    const int64_t n4 = 4 * n, nblocks = (n + UNITS - 1) / UNITS;
    const size_t wbytes = (size_t)(nblocks * kg * COLS * grp) * (grp == 4 ? 1 : 2);
    Dir dirs[2];
    for (int64_t d = 0; d < nd && d < 2; d++) {
        Dir D = {steps, batch, n, grp, kg, proj + d * steps * batch * n4, bias ? bias + d * n4 : NULL,
                 (const char *)wb + d * wbytes, colsum ? colsum + d * nblocks * COLS : NULL, wscale + d * n4,
                 lens, h + d * batch * n, c + d * batch * n, y + d * y_stride, h0 + d * batch * n};
        dirs[d] = D;
    }
    int rc = 0;
    if (nd == 2 && threads >= 2) {
#pragma omp parallel for num_threads(2) reduction(| : rc) schedule(static, 1)
        for (int64_t d = 0; d < 2; d++) rc |= run_direction(&dirs[d], 1);
    } else {
        for (int64_t d = 0; d < nd && d < 2; d++) rc |= run_direction(&dirs[d], (int)threads);
    }
    return rc;
}
