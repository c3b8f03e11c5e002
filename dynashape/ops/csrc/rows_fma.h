/* Sums of rows scaled by vectors, the inner loop of the C kernels that multiply a few rows by a
 * weight laid out [k][cols] (gru.c's gates, conv1d.c's output positions):
 *
 *     a[r][0:cols] += sum over i < k, in order, of v[r][i] * m[i * stride + 0:cols]    for r < nr
 *
 * Each column's sum runs over i in order, each product and sum rounded on its own (not fused): the
 * same arithmetic as the plain loop, vectorised across columns. Tiles of 64 columns (16 where fewer
 * are left; with AVX but not AVX-512, 16) by 1, 2 or 4 rows keep their sums in registers over i, each
 * weight vector loaded once for the tile's rows; the plain loop kept the sums in memory and read the weight again for every row
 * (gru.c: a 256-in, 128-hidden bidirectional layer at 12 steps x 8 rows 943 -> 445 us).
 */
#ifndef DYNASHAPE_ROWS_FMA_H
#define DYNASHAPE_ROWS_FMA_H
#include <stdint.h>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

/* a[r][0:cols] += sum over i < k, in order, of v[r][i] * m[i * stride + 0:cols], for r < R: tiles
 * of 64 columns (16 with fewer left) whose R rows of sums stay in registers over k, each weight
 * vector loaded once for the R rows. One body per R (1, 2, 4): a tile's shape is the compiler's. */
#if defined(__AVX512F__)
#define ROWS_FMA(NAME, R)                                                                                   \
static void NAME(int64_t k, const float *const *v, const float *m, int64_t stride, int64_t cols,           \
                 float *const *a) {                                                                         \
    int64_t j = 0;                                                                                          \
    for (; j + 64 <= cols; j += 64) {                                                                       \
        __m512 acc[R][4];                                                                                   \
        for (int r = 0; r < R; r++)                                                                         \
            for (int q = 0; q < 4; q++) acc[r][q] = _mm512_loadu_ps(a[r] + j + 16 * q);                   \
        for (int64_t i = 0; i < k; i++) {                                                                   \
            const float *w = m + i * stride + j;                                                            \
            const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16),                             \
                         w2 = _mm512_loadu_ps(w + 32), w3 = _mm512_loadu_ps(w + 48);                        \
            for (int r = 0; r < R; r++) {                                                                   \
                const __m512 vv = _mm512_set1_ps(v[r][i]);                                                  \
                acc[r][0] = _mm512_add_ps(acc[r][0], _mm512_mul_ps(vv, w0));                                \
                acc[r][1] = _mm512_add_ps(acc[r][1], _mm512_mul_ps(vv, w1));                                \
                acc[r][2] = _mm512_add_ps(acc[r][2], _mm512_mul_ps(vv, w2));                                \
                acc[r][3] = _mm512_add_ps(acc[r][3], _mm512_mul_ps(vv, w3));                                \
            }                                                                                               \
        }                                                                                                   \
        for (int r = 0; r < R; r++)                                                                         \
            for (int q = 0; q < 4; q++) _mm512_storeu_ps(a[r] + j + 16 * q, acc[r][q]);                    \
    }                                                                                                       \
    for (; j + 16 <= cols; j += 16) {                                                                       \
        __m512 acc[R];                                                                                      \
        for (int r = 0; r < R; r++) acc[r] = _mm512_loadu_ps(a[r] + j);                                     \
        for (int64_t i = 0; i < k; i++) {                                                                   \
            const __m512 w0 = _mm512_loadu_ps(m + i * stride + j);                                          \
            for (int r = 0; r < R; r++)                                                                     \
                acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_set1_ps(v[r][i]), w0));                 \
        }                                                                                                   \
        for (int r = 0; r < R; r++) _mm512_storeu_ps(a[r] + j, acc[r]);                                     \
    }                                                                                                       \
    rows_rest(k, R, v, m, stride, j, cols, a);                                                              \
}
#elif defined(__AVX__)
#define ROWS_FMA(NAME, R)                                                                                   \
static void NAME(int64_t k, const float *const *v, const float *m, int64_t stride, int64_t cols,           \
                 float *const *a) {                                                                         \
    int64_t j = 0;                                                                                          \
    for (; j + 16 <= cols; j += 16) {                                                                       \
        __m256 acc[R][2];                                                                                   \
        for (int r = 0; r < R; r++)                                                                         \
            for (int q = 0; q < 2; q++) acc[r][q] = _mm256_loadu_ps(a[r] + j + 8 * q);                     \
        for (int64_t i = 0; i < k; i++) {                                                                   \
            const float *w = m + i * stride + j;                                                            \
            const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);                              \
            for (int r = 0; r < R; r++) {                                                                   \
                const __m256 vv = _mm256_set1_ps(v[r][i]);                                                  \
                acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_mul_ps(vv, w0));                                \
                acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_mul_ps(vv, w1));                                \
            }                                                                                               \
        }                                                                                                   \
        for (int r = 0; r < R; r++)                                                                         \
            for (int q = 0; q < 2; q++) _mm256_storeu_ps(a[r] + j + 8 * q, acc[r][q]);                     \
    }                                                                                                       \
    rows_rest(k, R, v, m, stride, j, cols, a);                                                              \
}
#else
#define ROWS_FMA(NAME, R)                                                                                   \
static void NAME(int64_t k, const float *const *v, const float *m, int64_t stride, int64_t cols,           \
                 float *const *a) {                                                                         \
    rows_rest(k, R, v, m, stride, 0, cols, a);                                                              \
}
#endif

/* columns j0..cols of rows_fma (without AVX, all of them): tiles of 16 columns, sums in memory */
static void rows_rest(int64_t k, int nr, const float *const *v, const float *m, int64_t stride, int64_t j0,
                      int64_t cols, float *const *a) {
    for (int64_t j = j0; j < cols; j += 16) {
        const int64_t w = cols - j < 16 ? cols - j : 16;
        for (int r = 0; r < nr; r++) {
            float *acc = a[r] + j;
            for (int64_t i = 0; i < k; i++) {
                const float vi = v[r][i];
                const float *row = m + i * stride + j;
                for (int64_t c = 0; c < w; c++) acc[c] += vi * row[c];
            }
        }
    }
}

ROWS_FMA(rows_fma1, 1)
ROWS_FMA(rows_fma2, 2)
ROWS_FMA(rows_fma4, 4)

#define ROWS 4
/* rows_fma for nr (1 to ROWS) rows: three rows as four, the fourth a scratch row ``drop`` of cols */
static inline void rows_fma(int64_t k, int nr, const float **v, const float *m, int64_t stride, int64_t cols,
                     float **a, float *drop) {
    if (nr == 1) rows_fma1(k, v, m, stride, cols, a);
    else if (nr == 2) rows_fma2(k, v, m, stride, cols, a);
    else {
        if (nr == 3) {
            v[3] = v[0];
            a[3] = drop;
        }
        rows_fma4(k, v, m, stride, cols, a);
    }
}

#endif
