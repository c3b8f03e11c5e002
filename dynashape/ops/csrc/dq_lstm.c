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
 * sigmoid and tanh are onnxruntime's own (ort_math.h through lstm_cell.h), bit for bit: h is
 * quantized for the next step, and one ulp of a gate can move that scale; they vectorize (the C
 * library's are scalar calls, which made them most of a step).
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
#include "lstm_cell.h"
#include "qblock.h"
#include <stdlib.h>

#if COLS != BLOCK_COLS
#error "a block holds the four gates of UNITS units"
#endif

/* 1 where int8 weights (zero point 0) take the u8 x s8 product: the caller lays them out for it */
int dq_lstm_int8_weights(void) { return vnni_int8_weights(); }

/* A quantized weight in blocks (above) with what its product needs. */
typedef struct {
    int64_t grp, kg;       /* k's per group, groups (k padded with zeros) */
    const void *blocks;    /* (D, nblocks, kg, COLS, grp): W - W_zero_point */
    const int32_t *colsum; /* (D, nblocks * COLS): column sums, for a uint8 operand (grp 4), or NULL */
    const float *scale;    /* (D, 4n): the scale per column */
} QW;

/* block product of one operand row, the uint8 operand's zero point taken back */
static void product(const QW *w, int64_t d, int64_t nblocks, int64_t blk, const void *row, float zp, int32_t *a) {
    const size_t per_blk = (size_t)(w->kg * COLS * w->grp) * esize(w->grp);
    block_product(w->kg, (int)w->grp, row, (const char *)w->blocks + (size_t)(d * nblocks + blk) * per_blk, a);
    if (w->grp == 4) { /* sum (q + zp) w = sum q w + zp colsum(w) */
        const int32_t *cs = w->colsum + (d * nblocks + blk) * COLS;
        for (int j = 0; j < COLS; j++) a[j] -= (int32_t)zp * cs[j];
    }
}

typedef struct {
    int64_t t, steps, batch, n, nd, ni;
    const void *xq; float xscale, xzp; /* X's first `steps` steps quantized for W: (steps, batch, kpad) */
    QW w, r;
    const float *bias;    /* (D, 4n): Wb + Rb, or NULL */
    const int64_t *lens;  /* (batch): steps of each entry, or NULL */
    float *h, *c;         /* (D, batch, n): initial states in, final out */
    float *y;             /* (T, D, batch, n), zero-filled */
} Layer;

/* One direction's steps on `threads` threads, each owning a range of blocks; 0, or 1 when a step's
 * h has no finite range (all threads see the same h, so all leave at the same step). A reverse
 * direction reads (and writes) each sequence backwards within its own length, as onnxruntime's
 * ReverseSequence of the input and output does. */
static int run_direction(const Layer *L, int64_t d, int reverse, int threads) {
    const int64_t batch = L->batch, n = L->n, n4 = 4 * n, bn = batch * n, nd = L->nd;
    const int64_t nblocks = (n + UNITS - 1) / UNITS, kxpad = L->w.kg * L->w.grp, khpad = L->r.kg * L->r.grp;
    float *hd = L->h + d * bn, *cd = L->c + d * bn;
    float *hprev = malloc(2 * (size_t)bn * sizeof(float)); /* the step before's outputs, two by turns */
    memcpy(hprev, hd, (size_t)bn * sizeof(float));
    const float *bias = L->bias ? L->bias + d * n4 : NULL, *wsc = L->w.scale + d * n4, *rsc = L->r.scale + d * n4;
    int rc = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int64_t b0, b1;
        my_blocks(nblocks, &b0, &b1);
        void *hq = calloc(1, (size_t)(batch * khpad) * esize(L->r.grp) + 64); /* each thread its own: no wait */
        int32_t a[COLS], ax[COLS];
        float g[COLS];
        for (int64_t s = 0; s < L->steps; s++) {
            /* zeros past an entry's length, as onnxruntime's buffer holds */
            const float *hin = hprev + (s % 2) * bn;
            float *hout = hprev + ((s + 1) % 2) * bn;
            float scale, zp;
            if (qparams(hin, bn, &scale, &zp)) {
#pragma omp atomic write
                rc = 1;
                break;
            }
            for (int64_t b = 0; b < batch; b++)
                quantize_row(hin + b * n, n, scale, zp, L->r.grp, (char *)hq + (size_t)(b * khpad) * esize(L->r.grp));
            for (int64_t blk = b0; blk < b1; blk++) {
                const int64_t u0 = blk * UNITS, units = n - u0 < UNITS ? n - u0 : UNITS;
                for (int64_t b = 0; b < batch; b++) {
                    const int64_t len = L->lens ? L->lens[b] : L->t;
                    if (s >= len) { /* h, c kept; the output stays zero, and so does what the next step reads */
                        memset(hout + b * n + u0, 0, (size_t)units * sizeof(float));
                        continue;
                    }
                    const int64_t tt = reverse ? len - 1 - s : s; /* the time step this step is at */
                    product(&L->r, d, nblocks, blk, (const char *)hq + (size_t)(b * khpad) * esize(L->r.grp), zp, a);
                    product(&L->w, d, nblocks, blk,
                            (const char *)L->xq + (size_t)((tt * batch + b) * kxpad) * esize(L->w.grp), L->xzp, ax);
                    for (int gate = 0; gate < 4; gate++)
                        for (int64_t u = 0; u < units; u++) {
                            const int64_t col = gate * n + u0 + u, j = gate * UNITS + u; /* ONNX's column */
                            float v = (float)a[j] * (scale * rsc[col]);
                            v += (float)ax[j] * (L->xscale * wsc[col]); /* the input projection */
                            if (bias) v += bias[col];
                            g[j] = v;
                        }
                    cell_update(g, units, cd + b * n + u0, hd + b * n + u0, hout + b * n + u0,
                                L->y + ((tt * nd + d) * batch + b) * n + u0);
                }
            }
#pragma omp barrier
        }
        free(hq);
    }
    free(hprev);
    zero_empty_states(L->lens, batch, n, hd, cd);
    return rc;
}

/* The whole layer: X (T, batch, ni) quantized once (its first `steps` steps, one scale, as the torch
 * path), then every direction's steps, the input product done per step beside the recurrent one.
 * With two threads and two directions, one direction per thread (no meeting per step); otherwise
 * each direction's blocks are shared by the threads. Built with -fopenmp, the library needs
 * libgomp.so.1, which the dynamic linker finds already loaded by torch: the work runs on torch's
 * own OpenMP threads (another pool's threads would wait for torch's, still spinning after its last
 * kernel, on the same cores). reverse[d]: whether direction d runs backwards. */
int dq_lstm(int64_t nd, int64_t threads, int64_t t, int64_t steps, int64_t batch, int64_t ni, int64_t n,
            const float *x, int64_t wgrp, int64_t wkg, const void *wblocks, const int32_t *wcolsum,
            const float *wscale, int64_t rgrp, int64_t rkg, const void *rblocks, const int32_t *rcolsum,
            const float *rscale, const float *bias, const int64_t *lens, const int64_t *reverse,
            float *h, float *c, float *y)
{
    const int64_t rows = steps * batch, kxpad = wkg * wgrp;
    float xscale, xzp;
    if (qparams(x, rows * ni, &xscale, &xzp)) return 1;
    void *xq = calloc(1, (size_t)(rows * kxpad) * esize(wgrp) + 64);
    if (!xq) return 1;
#pragma omp parallel for num_threads(threads) if (threads > 1 && rows * ni >= 65536)
    for (int64_t i = 0; i < rows; i++)
        quantize_row(x + i * ni, ni, xscale, xzp, wgrp, (char *)xq + (size_t)(i * kxpad) * esize(wgrp));
    Layer L = {t, steps, batch, n, nd, ni, xq, xscale, xzp, {wgrp, wkg, wblocks, wcolsum, wscale},
               {rgrp, rkg, rblocks, rcolsum, rscale}, bias, lens, h, c, y};
    int rc = 0;
    if (nd == 2 && threads >= 2) {
#pragma omp parallel for num_threads(2) reduction(| : rc) schedule(static, 1)
        for (int64_t d = 0; d < 2; d++) rc |= run_direction(&L, d, (int)reverse[d], 1);
    } else {
        for (int64_t d = 0; d < nd; d++) rc |= run_direction(&L, d, (int)reverse[d], (int)threads);
    }
    free(xq);
    return rc;
}
