/* The ONNX LSTM layer in float32 on the CPU, with the default gates (sigmoid, tanh, tanh; no
 * peepholes, clip or coupled input-forget).
 *
 * Why C: torch runs an LSTM through oneDNN, which builds a primitive for every new (T, batch) (a
 * small model's first call at a new shape paid 1-3 ms for it) and reorders the weights on every
 * call, or through aten's loop of a few calls a step. Small recurrent models (G2P, VAD) spent most
 * of a call there. This does a layer in one call, the weights laid out once.
 *
 * Layout (made once by rnn.py): as dq_lstm.c's, blocks of 16 hidden units, each the 64 columns of
 * their four gates (i, o, f, c), rows k one after the other: (D, blocks, K, 64) for W (K = input)
 * and for R (K = hidden), so that a thread owns whole units and a block is read sequentially.
 * Per step and block: g = bias + x_t W + h R (float32 sums over k in order), the gates
 * (lstm_cell.h), c = f c + i g~, h = o tanh(c); a reverse direction reads each sequence backwards
 * within its own length; entries past their length keep h and c and write zeros.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "lstm_cell.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif


/* a_r[0:COLS] += v_r[0:k] @ blk for the first nr rows r (k rows of COLS floats in blk), each weight
 * vector loaded once for four rows (a batch re-read the block once a row: 2.3x slower at 4); one
 * row on its own (four where one is asked made a step 1.6x slower) */
#define ROWS 4
static void block_fma(int64_t k, int nr, const float *const v[ROWS], const float *blk, float a[ROWS][COLS]) {
#if defined(__AVX512F__)
    if (nr == 1) {
        __m512 a0 = _mm512_loadu_ps(a[0]), a1 = _mm512_loadu_ps(a[0] + 16), a2 = _mm512_loadu_ps(a[0] + 32),
               a3 = _mm512_loadu_ps(a[0] + 48);
        for (int64_t i = 0; i < k; i++) {
            const float *w = blk + i * COLS;
            __m512 vv = _mm512_set1_ps(v[0][i]);
            a0 = _mm512_fmadd_ps(vv, _mm512_loadu_ps(w), a0);
            a1 = _mm512_fmadd_ps(vv, _mm512_loadu_ps(w + 16), a1);
            a2 = _mm512_fmadd_ps(vv, _mm512_loadu_ps(w + 32), a2);
            a3 = _mm512_fmadd_ps(vv, _mm512_loadu_ps(w + 48), a3);
        }
        _mm512_storeu_ps(a[0], a0);
        _mm512_storeu_ps(a[0] + 16, a1);
        _mm512_storeu_ps(a[0] + 32, a2);
        _mm512_storeu_ps(a[0] + 48, a3);
        return;
    }
    __m512 acc[ROWS][4];
    for (int r = 0; r < ROWS; r++)
        for (int q = 0; q < 4; q++) acc[r][q] = _mm512_loadu_ps(a[r] + 16 * q);
    for (int64_t i = 0; i < k; i++) {
        const float *w = blk + i * COLS;
        __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32),
               w3 = _mm512_loadu_ps(w + 48);
        for (int r = 0; r < ROWS; r++) {
            __m512 vv = _mm512_set1_ps(v[r][i]);
            acc[r][0] = _mm512_fmadd_ps(vv, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(vv, w1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(vv, w2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(vv, w3, acc[r][3]);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int q = 0; q < 4; q++) _mm512_storeu_ps(a[r] + 16 * q, acc[r][q]);
#else
    for (int64_t i = 0; i < k; i++) {
        const float *w = blk + i * COLS;
        for (int r = 0; r < nr; r++) {
            const float vi = v[r][i];
            for (int j = 0; j < COLS; j++) a[r][j] += vi * w[j];
        }
    }
#endif
}

typedef struct {
    int64_t t, steps, batch, ni, n, nd;
    const float *x;       /* (T, batch, ni) */
    const float *w, *r;   /* blocks (above) of W and R: (D, blocks, ni, 64), (D, blocks, n, 64) */
    const float *bias;    /* (D, blocks * 64): Wb + Rb in the blocks' column order, or NULL */
    const int64_t *lens;  /* (batch) or NULL */
    float *h, *c;         /* (D, batch, n): initial in, final out */
    float *y;             /* (T, D, batch, n), zero-filled */
} Layer;

static void run_direction(const Layer *L, int64_t d, int reverse, int threads) {
    const int64_t batch = L->batch, n = L->n, bn = batch * n, nd = L->nd, ni = L->ni;
    const int64_t nblocks = (n + UNITS - 1) / UNITS;
    float *hd = L->h + d * bn, *cd = L->c + d * bn;
    float *hprev = malloc(2 * (size_t)bn * sizeof(float)); /* the step before's outputs, two by turns */
    memcpy(hprev, hd, (size_t)bn * sizeof(float));
    const float *wd = L->w + d * nblocks * ni * COLS, *rd = L->r + d * nblocks * n * COLS;
    const float *bias = L->bias ? L->bias + d * nblocks * COLS : NULL;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int64_t b0, b1;
        my_blocks(nblocks, &b0, &b1);
        float g[ROWS][COLS];
        int64_t rows[ROWS], tts[ROWS];
        const float *xv[ROWS], *hv[ROWS];
        for (int64_t s = 0; s < L->steps; s++) {
            const float *hin = hprev + (s % 2) * bn;
            float *hout = hprev + ((s + 1) % 2) * bn;
            for (int64_t blk = b0; blk < b1; blk++) {
                const int64_t u0 = blk * UNITS, units = n - u0 < UNITS ? n - u0 : UNITS;
                int nr = 0;
                for (int64_t b = 0; b <= batch; b++) {
                    if (b < batch) {
                        const int64_t len = L->lens ? L->lens[b] : L->t;
                        if (s >= len) { /* h, c kept; the output stays zero, and so does what the next step reads */
                            memset(hout + b * n + u0, 0, (size_t)units * sizeof(float));
                            continue;
                        }
                        rows[nr] = b;
                        tts[nr] = reverse ? len - 1 - s : s;
                        xv[nr] = L->x + (tts[nr] * batch + b) * ni;
                        hv[nr] = hin + b * n;
                        nr++;
                        if (nr < ROWS) continue;
                    }
                    if (!nr) break;
                    for (int q = nr; q < ROWS; q++) { /* rows short of four: the first one again, unused */
                        xv[q] = xv[0];
                        hv[q] = hv[0];
                    }
                    for (int q = 0; q < ROWS; q++) {
                        if (bias) memcpy(g[q], bias + blk * COLS, sizeof g[q]);
                        else memset(g[q], 0, sizeof g[q]);
                    }
                    block_fma(ni, nr, xv, wd + blk * ni * COLS, g);
                    block_fma(n, nr, hv, rd + blk * n * COLS, g);
                    for (int q = 0; q < nr; q++) {
                        const int64_t b = rows[q];
                        cell_update(g[q], units, cd + b * n + u0, hd + b * n + u0, hout + b * n + u0,
                                    L->y + ((tts[q] * nd + d) * batch + b) * n + u0);
                    }
                    nr = 0;
                }
            }
#pragma omp barrier
        }
    }
    free(hprev);
    zero_empty_states(L->lens, batch, n, hd, cd);
}

/* The layer; threads as dq_lstm.c's (a direction a thread for two, else units shared). */
void lstm_f32(int64_t nd, int64_t threads, int64_t t, int64_t steps, int64_t batch, int64_t ni, int64_t n,
              const float *x, const float *w, const float *r, const float *bias, const int64_t *lens,
              const int64_t *reverse, float *h, float *c, float *y)
{
    Layer L = {t, steps, batch, ni, n, nd, x, w, r, bias, lens, h, c, y};
    if (nd == 2 && threads >= 2) {
#pragma omp parallel for num_threads(2) schedule(static, 1)
        for (int64_t d = 0; d < 2; d++) run_direction(&L, d, (int)reverse[d], 1);
    } else {
        for (int64_t d = 0; d < nd; d++) run_direction(&L, d, (int)reverse[d], (int)threads);
    }
}
