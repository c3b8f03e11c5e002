/* What the two LSTM kernels (lstm.c, dq_lstm.c) share: the blocks' geometry, a block's gates and
 * state update, and the final states of empty sequences. */
#ifndef DYNASHAPE_LSTM_CELL_H
#define DYNASHAPE_LSTM_CELL_H
#include <stdint.h>
#include <string.h>
#include "ort_math.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define UNITS 16          /* hidden units per block */
#define COLS (4 * UNITS)  /* columns per block: the units' gates i, o, f, c */

/* g: a block's pre-activations (i, o, f, c; UNITS each) -> the gates (sigmoid, tanh), then
 * c = f c + i g~ and h = o tanh(c) of its first `units` units, h also into hout (what the next
 * step reads) and y. Products and sums rounded one by one, as onnxruntime's LSTM does; its
 * sigmoid and tanh (ort_math.h) bit for bit: DynamicQuantizeLSTM quantizes h for the next step,
 * and one ulp there can move its scale and every quantized value of the step. */
static inline void cell_update(float *g, int64_t units, float *c, float *h, float *hout, float *y) {
    for (int j = 0; j < 3 * UNITS; j++) g[j] = ort_logistic(g[j]);
    for (int j = 3 * UNITS; j < COLS; j++) g[j] = ort_tanh(g[j]);
    for (int64_t u = 0; u < units; u++) {
        float fc = g[2 * UNITS + u] * c[u], ig = g[u] * g[3 * UNITS + u];
        float cn = fc + ig;
        float hn = g[UNITS + u] * ort_tanh(cn);
        c[u] = cn;
        h[u] = hn;
        hout[u] = hn;
        y[u] = hn;
    }
}

/* The blocks [b0, b1) of this OpenMP thread: the threads of a direction share its units. */
static inline void my_blocks(int64_t nblocks, int64_t *b0, int64_t *b1) {
    int tid = 0, nt = 1;
#ifdef _OPENMP
    tid = omp_get_thread_num();
    nt = omp_get_num_threads();
#endif
    *b0 = nblocks * tid / nt;
    *b1 = nblocks * (tid + 1) / nt;
}

/* onnxruntime: an empty sequence has zero final states */
static inline void zero_empty_states(const int64_t *lens, int64_t batch, int64_t n, float *h, float *c) {
    if (!lens)
        return;
    for (int64_t b = 0; b < batch; b++)
        if (lens[b] <= 0) {
            memset(h + b * n, 0, (size_t)n * sizeof(float));
            memset(c + b * n, 0, (size_t)n * sizeof(float));
        }
}

#endif
