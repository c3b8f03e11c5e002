/* A small dense 1-D convolution (NCL), float32: the convolutions of audio front ends at a few output
 * positions (silero-vad's STFT as a 258-filter convolution over 4 windows, its encoder's 3-tap layers
 * over 1-4 positions).
 *
 * Why: torch's CPU convolution costs 10-60 us per call before its arithmetic at these sizes (oneDNN's
 * primitive, or the unfold-and-product form of ops/conv.py: 5-8 torch calls), where the arithmetic is
 * ~0.01-0.3M multiply-adds. silero-vad's six took 240 us of a 670 us call at batch 1, against
 * onnxruntime's 150 us for the whole call. Per output position, each input tap's value times the
 * weight's row for it (the weight packed [c * k][o] once, ops/conv.py) is added into a row of o sums
 * (rows_fma.h: four positions at a time, their taps gathered first, taps beyond the input as 0; the
 * output channels vectorised, the sums in registers). The sums run in (channel, tap) order per output,
 * products and sums unfused; a padding tap adds 0 * w where the plain loop skipped it (the same sum).
 *
 * One thread: at these sizes (up to ~1M multiply-adds, ~60 us) a second OpenMP thread cost more than
 * it saved: openwakeword's silero-vad v4, 14 such convolutions a call, took 1.85 ms a call with an
 * OpenMP team for its largest one and 0.75 ms without (this project's 2-core CPU).
 *
 * x [n][c][l] (contiguous), wp [c * k][o], b [o] or NULL, y [n][o][lo]; stride s, pad p (both sides
 * the same, taps beyond the input read as 0), dilation d; ``relu``: max(y, 0) as it is stored (a Conv
 * and the Relu after it, compile/fuse_conv_activation.py: a torch call fewer).
 */
#include <stdint.h>
#include <stdlib.h>
#include "rows_fma.h"
#include "subnormal.h"

void conv1d_ncl(const float *x, float *y, const float *wp, const float *b, int64_t n, int64_t c, int64_t l,
                int64_t o, int64_t k, int64_t s, int64_t p, int64_t d, int64_t lo, int64_t relu) {
    const unsigned csr = flush_subnormals();
    const int64_t ck = c * k;
    /* ROWS positions' input taps (zeros beyond the input), their ROWS rows of sums, a dropped row */
    float *taps = (float *)malloc(sizeof(float) * (size_t)(ROWS * ck + ROWS * o + o));
    float *sums = taps + ROWS * ck, *drop = sums + ROWS * o;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t t0 = 0; t0 < lo; t0 += ROWS) {
            const int nr = lo - t0 < ROWS ? (int)(lo - t0) : ROWS;
            const float *v[ROWS];
            float *a[ROWS];
            for (int r = 0; r < nr; r++) {
                float *tr = taps + r * ck;
                for (int64_t ci = 0; ci < c; ci++) {
                    const float *xr = x + (i * c + ci) * l;
                    for (int64_t j = 0; j < k; j++) {
                        const int64_t pos = (t0 + r) * s - p + j * d;
                        tr[ci * k + j] = pos < 0 || pos >= l ? 0.0f : xr[pos];
                    }
                }
                v[r] = tr;
                a[r] = sums + r * o;
                for (int64_t q = 0; q < o; q++) a[r][q] = b ? b[q] : 0.0f;
            }
            rows_fma(ck, nr, v, wp, o, o, a, drop);
            for (int r = 0; r < nr; r++) {
                float *yp = y + i * o * lo + t0 + r;
                const float *acc = a[r];
                if (relu)
                    for (int64_t q = 0; q < o; q++) yp[q * lo] = acc[q] > 0.0f ? acc[q] : 0.0f;
                else
                    for (int64_t q = 0; q < o; q++) yp[q * lo] = acc[q];
            }
        }
    }
    free(taps);
    restore_subnormals(csr);
}

/* The depthwise form (one filter per channel, silero-vad v4's 5-tap layers over 1-8 positions): torch's
 * kernel costs ~50 us however small the input, the unfold-and-sum form of ops/conv.py 15-37 us there.
 * w [c][k] (the weight [c][1][k] as it lies), b [c] or NULL, y [n][c][lo]; taps beyond the input read
 * as 0. The sums run over the taps in order. */
void dw_conv1d_ncl(const float *x, float *y, const float *w, const float *b, int64_t n, int64_t c, int64_t l,
                   int64_t k, int64_t s, int64_t p, int64_t lo, int64_t relu) {
    const unsigned csr = flush_subnormals();
    for (int64_t i = 0; i < n * c; i++) {
        const float *xr = x + i * l;
        const float *wr = w + (i % c) * k;
        const float bias = b ? b[i % c] : 0.0f;
        float *yr = y + i * lo;
        for (int64_t t = 0; t < lo; t++) {
            float acc = bias;
            for (int64_t j = 0; j < k; j++) {
                const int64_t pos = t * s - p + j;
                if (pos >= 0 && pos < l) acc += xr[pos] * wr[j];
            }
            yr[t] = relu && acc < 0.0f ? 0.0f : acc;
        }
    }
    restore_subnormals(csr);
}

/* The two with their integer arguments in one array (ops/conv.py ``bound_conv1d`` keeps one per input
 * shape): five foreign arguments where there were 13 and 11, ~0.3 us of ctypes' conversion each.
 * a: n, c, l, o, k, s, p, d, lo, relu (dense); n, c, l, k, s, p, lo, relu (depthwise). */
void conv1d_run(const float *x, float *y, const float *wp, const float *b, const int64_t *a) {
    conv1d_ncl(x, y, wp, b, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
}

void dw_conv1d_run(const float *x, float *y, const float *w, const float *b, const int64_t *a) {
    dw_conv1d_ncl(x, y, w, b, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
}
