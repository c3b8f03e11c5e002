/* softmax(q k^T * scale + bias) v on the CPU for the small heads of small transformers.
 *
 * Why C: torch's CPU scaled_dot_product_attention (its flash kernel) costs 60-120 us a call for a
 * tiny BERT's attention (batch 8, 4 heads of 16, 32 tokens: 1M multiply-adds), the unfused
 * matmul-softmax-matmul about as much: both are call and threading overhead at this size. Here a
 * head's K is transposed once into a scratch row block, then each query row's scores are one
 * vectorized pass over the keys per head dim, the softmax uses fastmath.h's exp (~2 ulp), and the
 * row's output is the probability-weighted sum of V's rows; (batch, head) pairs are shared by the
 * threads. The sums run in another order than torch's (float32 rounding apart).
 *
 * Layouts: q (B, N, S, D), k (B, Nk, T, D), v (B, Nk, T, Dv), out (B, N, S, Dv), each with its own
 * strides in elements for the first three dims and its last dim contiguous (k: any strides, a
 * transposed K is read as it lies); query head n reads
 * key/value head n / group (grouped-query attention). bias: additive, (B, N, S, T) strides, 0 for
 * a broadcast dim, or NULL. lens: NULL, or (with no bias) one key length per batch row, keys from
 * it on getting ``fill`` added as a (B, 1, 1, T) bias of 0 and fill would add it (a right-padded
 * batch's mask_index, without building that bias: ~20 us of torch calls for a tiny BERT's layer;
 * the same expression as the bias' below, so the same float32 results). Returns 0, or 1 when a row's scores are all -inf or NaN (torch's
 * kernel then decides what that row gives; nothing is written to such a row here).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "fastmath.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* sc[0:T] = q . K^T's columns (kt: (D, T)), one accumulator a chunk of 16 keys kept in a register
 * over the head dims (through memory, each dim's update waited for the last one's store) */
static void scores(const float *qi, const float *kt, int64_t D, int64_t T, float *sc) {
    int64_t j0 = 0;
#if defined(__AVX512F__)
    for (; j0 < T; j0 += 16) {
        const int64_t left = T - j0;
        const __mmask16 mk = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        __m512 a = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(qi[d]), _mm512_maskz_loadu_ps(mk, kt + d * T + j0), a);
        _mm512_mask_storeu_ps(sc + j0, mk, a);
    }
#endif
    for (int64_t j = j0; j < T; j++) {
        float a = 0.0f;
        for (int64_t d = 0; d < D; d++) a = fmaf(qi[d], kt[d * T + j], a);
        sc[j] = a;
    }
}

/* out[0:Dv] = sum_j p[j] v[j, :] * inv, a chunk of 16 output dims in a register over the keys */
static void weighted(const float *p, const float *v, int64_t vt, int64_t T, int64_t Dv, float inv, float *out) {
    int64_t e0 = 0;
#if defined(__AVX512F__)
    for (; e0 < Dv; e0 += 16) {
        const int64_t left = Dv - e0;
        const __mmask16 mk = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        __m512 a = _mm512_setzero_ps();
        for (int64_t j = 0; j < T; j++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(mk, v + j * vt + e0), a);
        _mm512_mask_storeu_ps(out + e0, mk, _mm512_mul_ps(a, _mm512_set1_ps(inv)));
    }
#endif
    for (int64_t e = e0; e < Dv; e++) {
        float a = 0.0f;
        for (int64_t j = 0; j < T; j++) a = fmaf(p[j], v[j * vt + e], a);
        out[e] = a * inv;
    }
}

#if defined(__AVX512F__)
/* scores and weighted sums of 4 query rows at once: four independent chains of fused
 * multiply-adds (one row's chain waits ~4 cycles an FMA: at head dim 16, most of a row's time) */
static void scores4(const float *q0, int64_t qs, const float *kt, int64_t D, int64_t T, float *sc) {
    for (int64_t j0 = 0; j0 < T; j0 += 16) {
        const int64_t left = T - j0;
        const __mmask16 mk = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t d = 0; d < D; d++) {
            const __m512 kv = _mm512_maskz_loadu_ps(mk, kt + d * T + j0);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[d]), kv, a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(q0[qs + d]), kv, a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(q0[2 * qs + d]), kv, a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(q0[3 * qs + d]), kv, a3);
        }
        _mm512_mask_storeu_ps(sc + j0, mk, a0);
        _mm512_mask_storeu_ps(sc + T + j0, mk, a1);
        _mm512_mask_storeu_ps(sc + 2 * T + j0, mk, a2);
        _mm512_mask_storeu_ps(sc + 3 * T + j0, mk, a3);
    }
}

static void weighted4(const float *p, const float *v, int64_t vt, int64_t T, int64_t Dv, const float *inv,
                      float *o0, int64_t os) {
    for (int64_t e0 = 0; e0 < Dv; e0 += 16) {
        const int64_t left = Dv - e0;
        const __mmask16 mk = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t j = 0; j < T; j++) {
            const __m512 vv = _mm512_maskz_loadu_ps(mk, v + j * vt + e0);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), vv, a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(p[T + j]), vv, a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(p[2 * T + j]), vv, a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(p[3 * T + j]), vv, a3);
        }
        _mm512_mask_storeu_ps(o0 + e0, mk, _mm512_mul_ps(a0, _mm512_set1_ps(inv[0])));
        _mm512_mask_storeu_ps(o0 + os + e0, mk, _mm512_mul_ps(a1, _mm512_set1_ps(inv[1])));
        _mm512_mask_storeu_ps(o0 + 2 * os + e0, mk, _mm512_mul_ps(a2, _mm512_set1_ps(inv[2])));
        _mm512_mask_storeu_ps(o0 + 3 * os + e0, mk, _mm512_mul_ps(a3, _mm512_set1_ps(inv[3])));
    }
}
#define ROWS 4
#else
#define ROWS 1
#endif

/* a row's max and sum: a reduction into one float does not vectorize without -ffast-math */
static float row_max(const float *x, int64_t n) {
    float mx = -INFINITY;
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 m16 = _mm512_set1_ps(-INFINITY);
    for (; j + 16 <= n; j += 16) m16 = _mm512_max_ps(_mm512_loadu_ps(x + j), m16);
    mx = _mm512_reduce_max_ps(m16);
#endif
    for (; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

static float row_sum(const float *x, int64_t n) {
    float sum = 0.0f;
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 s16 = _mm512_setzero_ps();
    for (; j + 16 <= n; j += 16) s16 = _mm512_add_ps(_mm512_loadu_ps(x + j), s16);
    sum = _mm512_reduce_add_ps(s16);
#endif
    for (; j < n; j++) sum += x[j];
    return sum;
}

/* p: B, N, S, T, D, Dv, group, q's strides (3), k's (4), v's (3), bias' (4), out's (3), threads
 * (one array: a call's arguments cost ctypes ~0.2 us each) */
int attention_f32(const int64_t *p, const float *q, const float *k, const float *v, const float *m, double scale_d,
                  float *o, const int32_t *lens, double fill_d)
{
    const int64_t B = p[0], N = p[1], S = p[2], T = p[3], D = p[4], Dv = p[5], group = p[6];
    const int64_t qb = p[7], qn = p[8], qs = p[9], kb = p[10], kn = p[11], kt = p[12], kd = p[13];
    const int64_t vb = p[14], vn = p[15], vt = p[16], mb = p[17], mn = p[18], ms = p[19], mt = p[20];
    const int64_t ob = p[21], on = p[22], os = p[23], threads = p[24];
    const float scale = (float)scale_d, fill = (float)fill_d;
    int bad = 0;
#pragma omp parallel num_threads(threads) if (threads > 1) reduction(| : bad)
    {
        float *ktr = malloc((size_t)(D * T + ROWS * T) * sizeof(float)); /* K^T (D, T), rows' scores */
        float *sc = ktr + D * T;
#pragma omp for schedule(static)
        for (int64_t bn = 0; bn < B * N; bn++) {
            const int64_t b = bn / N, n = bn % N, nk = n / group;
            const float *kh = k + b * kb + nk * kn, *vh = v + b * vb + nk * vn;
            for (int64_t j = 0; j < T; j++)
                for (int64_t d = 0; d < D; d++) ktr[d * T + j] = kh[j * kt + d * kd];
            for (int64_t i0 = 0; i0 < S; i0 += ROWS) {
                const int64_t rows = S - i0 < ROWS ? S - i0 : ROWS;
                const float *qi = q + b * qb + n * qn + i0 * qs;
                float *oi = o + b * ob + n * on + i0 * os;
#if defined(__AVX512F__)
                if (rows == 4) scores4(qi, qs, ktr, D, T, sc);
                else
#endif
                    for (int64_t r = 0; r < rows; r++) scores(qi + r * qs, ktr, D, T, sc + r * T);
                float inv[ROWS];
                int ok = 1;
                for (int64_t r = 0; r < rows; r++) {
                    float *sr = sc + r * T;
                    if (m) {
                        const float *mi = m + b * mb + n * mn + (i0 + r) * ms;
                        for (int64_t j = 0; j < T; j++) sr[j] = sr[j] * scale + mi[j * mt];
                    } else if (lens) {
                        const int64_t len = lens[b];
                        for (int64_t j = 0; j < T; j++) sr[j] = sr[j] * scale + (j < len ? 0.0f : fill);
                    } else {
                        for (int64_t j = 0; j < T; j++) sr[j] = sr[j] * scale;
                    }
                    const float mx = row_max(sr, T);
                    if (!(mx > -INFINITY) || mx != mx || isinf(mx)) { /* all masked, NaN or +inf: torch decides */
                        ok = 0;
                        break;
                    }
                    for (int64_t j = 0; j < T; j++) sr[j] = exp_approx(sr[j] - mx);
                    inv[r] = 1.0f / row_sum(sr, T);
                }
                if (!ok) {
                    bad = 1;
                    continue;
                }
#if defined(__AVX512F__)
                if (rows == 4) weighted4(sc, vh, vt, T, Dv, inv, oi, os);
                else
#endif
                    for (int64_t r = 0; r < rows; r++) weighted(sc + r * T, vh, vt, T, Dv, inv[r], oi + r * os);
            }
        }
        free(ktr);
    }
    return bad;
}
