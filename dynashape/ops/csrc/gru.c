/* The ONNX GRU layer in float32 on the CPU, with the default gates (sigmoid, tanh; no clip), both
 * forms of the candidate (linear_before_reset 0 and 1), any direction, sequence_lens.
 *
 * Why C: at batch 1 and a short sequence a GRU layer is a few multiply-adds a step, and torch runs
 * it as ~10 calls a step (the loop in rnn.py: linear_before_reset 0, sequence_lens, reverse) or
 * through oneDNN, which builds a primitive for every new (T, batch). Small taggers and
 * diacritisers spent most of a call there. This runs a layer, its state carried, in one call.
 *
 * Layout (made once per weight by rnn.py): W and R transposed, (D, K, 3H) with K the input or
 * hidden size, so that a step is a sum of rows scaled by the input's elements: each output column's
 * sum runs over k in order (no reassociation: the compiler vectorises across columns, and
 * -ffp-contract=off keeps products and sums rounded one by one, as onnxruntime's GEMM-then-gates).
 * Gates in ONNX's order z, r, h. The gates' sigmoid and tanh are onnxruntime's (ort_math.h).
 * A reverse direction reads each sequence backwards within its own length; entries past their
 * length keep h and write zeros; an empty sequence ends with a zero state (onnxruntime's rule).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ort_math.h"

/* acc[0:cols] += sum over k of v[k] * m[k * stride + 0:cols] */
static void rows_fma(int64_t k, const float *v, const float *m, int64_t stride, int64_t cols, float *acc) {
    for (int64_t i = 0; i < k; i++) {
        const float vi = v[i];
        const float *row = m + i * stride;
        for (int64_t j = 0; j < cols; j++) acc[j] += vi * row[j];
    }
}

typedef struct {
    int64_t t, steps, batch, ni, n, nd, lbr;
    const float *x;          /* (T, batch, ni) */
    const float *wt, *rt;    /* (D, ni, 3n), (D, n, 3n) */
    const float *bias;       /* (D, 6n): Wb then Rb of each direction (ONNX's B), or NULL */
    const int64_t *lens;     /* (batch) or NULL */
    float *h;                /* (D, batch, n): initial in, final out */
    float *y;                /* (T, D, batch, n): zero-filled where lens leave steps out */
} Layer;

static void run_direction(const Layer *L, int64_t d, int reverse) {
    const int64_t n = L->n, ni = L->ni, g3 = 3 * n, batch = L->batch;
    const float *wt = L->wt + d * ni * g3, *rt = L->rt + d * n * g3;
    const float *wb = L->bias ? L->bias + d * 2 * g3 : NULL, *rb = wb ? wb + g3 : NULL;
    float *a = malloc((size_t)(2 * g3 + n) * sizeof(float));  /* input part, recurrent part, r * h */
    float *rec = a + g3, *rh = rec + g3;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = L->lens ? (L->lens[b] < L->t ? L->lens[b] : L->t) : L->t;
        float *h = L->h + (d * batch + b) * n;
        for (int64_t s = 0; s < len; s++) {
            const int64_t tt = reverse ? len - 1 - s : s;
            if (wb) memcpy(a, wb, (size_t)g3 * sizeof(float));
            else memset(a, 0, (size_t)g3 * sizeof(float));
            rows_fma(ni, L->x + (tt * batch + b) * ni, wt, g3, g3, a);
            memset(rec, 0, (size_t)g3 * sizeof(float));
            /* z and r: x W + h R + Wb + Rb */
            rows_fma(n, h, rt, g3, L->lbr ? g3 : 2 * n, rec);
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
                rows_fma(n, rh, rt + 2 * n, g3, n, hr);
                for (int64_t j = 0; j < n; j++) rh[j] = ort_tanh(a[2 * n + j] + (rb ? hr[j] + rb[2 * n + j] : hr[j]));
            }
            float *yv = L->y + ((tt * L->nd + d) * batch + b) * n;
            for (int64_t j = 0; j < n; j++) {  /* (1 - z) h~ + z h */
                const float hn = (1.0f - z[j]) * rh[j] + z[j] * h[j];
                h[j] = hn;
                yv[j] = hn;
            }
        }
        if (L->lens && len <= 0) memset(h, 0, (size_t)n * sizeof(float));
    }
    free(a);
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
