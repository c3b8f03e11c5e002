/* The ONNX GRU layer in float32 on the CPU, with the default gates (sigmoid, tanh; no clip), both
 * forms of the candidate (linear_before_reset 0 and 1), any direction, sequence_lens.
 *
 * Why C: at batch 1 and a short sequence a GRU layer is a few multiply-adds a step, and torch runs
 * it as ~10 calls a step (the loop in rnn.py: linear_before_reset 0, sequence_lens, reverse) or
 * through oneDNN, which builds a primitive for every new (T, batch). Small taggers and
 * diacritisers spent most of a call there. This runs a layer, its state carried, in one call.
 *
 * Layout (made once per weight by rnn.py): W and R transposed, (D, K, 3H) with K the input or
 * hidden size, so that a product is a sum of rows scaled by the input's elements: each output
 * column's sum runs over k in order (no reassociation: vectorised across columns, products and sums
 * rounded one by one, not fused; -ffp-contract=off keeps the compiler's loops so).
 *
 * Work order: the input's part of the gates for every step and row first (rows independent: four
 * at a time, each weight vector loaded once for the four), then step by step the recurrent part of
 * every row still inside its sequence, four at a time; each in tiles of 64 columns whose sums stay in
 * registers over k. Row by row and step by step, with the sums in memory, re-read the weights once a
 * row and step from L2 (a 256-in, 128-hidden bidirectional layer at 12 steps x 8 rows: 943 us).
 * Each column's arithmetic is the same in either order, so are the results, bit for bit.
 * Gates in ONNX's order z, r, h. The gates' sigmoid and tanh are onnxruntime's (ort_math.h).
 * A reverse direction reads each sequence backwards within its own length; entries past their
 * length keep h and write zeros; an empty sequence ends with a zero state (onnxruntime's rule).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ort_math.h"
#include "rows_fma.h"

typedef struct {
    int64_t t, steps, batch, ni, n, nd, lbr;
    const float *x;          /* (T, batch, ni) */
    const float *wt, *rt;    /* (D, ni, 3n), (D, n, 3n) */
    const float *bias;       /* (D, 6n): Wb then Rb of each direction (ONNX's B), or NULL */
    const int64_t *lens;     /* (batch) or NULL */
    float *h;                /* (D, batch, n): initial in, final out */
    float *y;                /* (T, D, batch, n): zero-filled where lens leave steps out */
} Layer;

static int64_t row_len(const Layer *L, int64_t b) {
    return L->lens ? (L->lens[b] < L->t ? L->lens[b] : L->t) : L->t;
}

/* One row's gates and new state at step tt: a = its input part (overwritten), rec = its recurrent
 * part (z and r, and h's product for the candidate where linear_before_reset), rh scratch of n. */
static void gates(const Layer *L, int64_t d, const float *rt, const float *rb, float *a, float *rec, float *rh,
                  float *h, int64_t tt, int64_t b) {
    const int64_t n = L->n, g3 = 3 * n;
    for (int64_t j = 0; j < 2 * n; j++) {
        const float v = a[j] + (rb ? rec[j] + rb[j] : rec[j]);
        a[j] = ort_logistic(v);
    }
    const float *z = a, *r = a + n;
    if (L->lbr) {  /* h~ = tanh(x Wh + Wbh + r * (h Rh + Rbh)) */
        for (int64_t j = 0; j < n; j++) {
            const float hr = rb ? rec[2 * n + j] + rb[2 * n + j] : rec[2 * n + j];
            rh[j] = ort_tanh(a[2 * n + j] + r[j] * hr);
        }
    } else {  /* h~ = tanh(x Wh + Wbh + (r * h) Rh + Rbh) */
        float *hr = rec + 2 * n;
        for (int64_t j = 0; j < n; j++) rh[j] = r[j] * h[j];
        memset(hr, 0, (size_t)n * sizeof(float));
        const float *v[1] = {rh};
        float *o[1] = {hr};
        rows_fma1(n, v, rt + 2 * n, g3, n, o);
        for (int64_t j = 0; j < n; j++) rh[j] = ort_tanh(a[2 * n + j] + (rb ? hr[j] + rb[2 * n + j] : hr[j]));
    }
    float *yv = L->y + ((tt * L->nd + d) * L->batch + b) * n;
    for (int64_t j = 0; j < n; j++) {  /* (1 - z) h~ + z h */
        const float hn = (1.0f - z[j]) * rh[j] + z[j] * h[j];
        h[j] = hn;
        yv[j] = hn;
    }
}

static void run_direction(const Layer *L, int64_t d, int reverse) {
    const int64_t n = L->n, ni = L->ni, g3 = 3 * n, batch = L->batch, rows = L->t * batch;
    const float *wt = L->wt + d * ni * g3, *rt = L->rt + d * n * g3;
    const float *wb = L->bias ? L->bias + d * 2 * g3 : NULL, *rb = wb ? wb + g3 : NULL;
    /* the input's part of every step and row; ROWS rows of the recurrent part; r * h; a dropped row */
    float *xa = malloc((size_t)(rows * g3 + ROWS * g3 + n + g3) * sizeof(float));
    float *rec = xa + rows * g3, *rh = rec + ROWS * g3, *drop = rh + n;
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
        const int nr = rows - r0 < ROWS ? (int)(rows - r0) : ROWS;
        const float *v[ROWS];
        float *a[ROWS];
        for (int r = 0; r < nr; r++) {
            v[r] = L->x + (r0 + r) * ni;
            a[r] = xa + (r0 + r) * g3;
            if (wb) memcpy(a[r], wb, (size_t)g3 * sizeof(float));
            else memset(a[r], 0, (size_t)g3 * sizeof(float));
        }
        rows_fma(ni, nr, v, wt, g3, g3, a, drop);
    }
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = row_len(L, b);
        if (len > longest) longest = len;
        if (L->lens && len <= 0) memset(L->h + (d * batch + b) * n, 0, (size_t)n * sizeof(float));
    }
    /* z and r: x W + h R + Wb + Rb; h's product for the candidate too where linear_before_reset */
    const int64_t rcols = L->lbr ? g3 : 2 * n;
    for (int64_t s = 0; s < longest; s++) {
        int64_t at[ROWS];
        int nr = 0;
        for (int64_t b = 0; b <= batch; b++) {
            if (b < batch) {
                if (s >= row_len(L, b)) continue;  /* past its sequence: h kept, its y rows stay zero */
                at[nr++] = b;
                if (nr < ROWS) continue;
            }
            if (nr == 0) break;
            const float *v[ROWS];
            float *a[ROWS];
            for (int r = 0; r < nr; r++) {
                v[r] = L->h + (d * batch + at[r]) * n;
                a[r] = rec + r * g3;
                memset(a[r], 0, (size_t)rcols * sizeof(float));
            }
            rows_fma(n, nr, v, rt, g3, rcols, a, drop);
            for (int r = 0; r < nr; r++) {
                const int64_t bb = at[r], len = row_len(L, bb), tt = reverse ? len - 1 - s : s;
                gates(L, d, rt, rb, xa + (tt * batch + bb) * g3, rec + r * g3, rh, L->h + (d * batch + bb) * n, tt, bb);
            }
            nr = 0;
        }
    }
    free(xa);
}

/* The layer: a bidirectional one's directions on two threads where asked (threads >= 2). */
void gru_f32(int64_t nd, int64_t threads, int64_t t, int64_t batch, int64_t ni, int64_t n, int64_t lbr,
             const float *x, const float *wt, const float *rt, const float *bias,
             const int64_t *lens, const int64_t *reverse, float *h, float *y)
{
    Layer L = {t, t, batch, ni, n, nd, lbr, x, wt, rt, bias, lens, h, y};
    if (nd == 2 && threads >= 2) {
#pragma omp parallel for num_threads(2) schedule(static, 1)
        for (int64_t d = 0; d < 2; d++) run_direction(&L, d, (int)reverse[d]);
    } else {
        for (int64_t d = 0; d < nd; d++) run_direction(&L, d, (int)reverse[d]);
    }
}
