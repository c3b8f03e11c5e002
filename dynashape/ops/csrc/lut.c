/* Lookups in the tables of the quantized element-wise ops (QLinearAdd, QLinearMul: 65536 entries,
 * one per pair of bytes; QLinearSigmoid, QLinearLeakyRelu, ...: 256).
 *
 * Why C: the tables make those ops bit-exact with onnxruntime, and torch's lookup is six calls
 * (broadcast, widen both bytes to int64, shift, or, index: ~120 us on a tiny BERT's activations);
 * here it is one pass over the bytes. The operands may broadcast: their strides (in elements, 0
 * along a broadcast dim) over the output's shape, up to 8 dims; the output is contiguous.
 */
#include <math.h>
#include <stdint.h>

void lut2_u8(int64_t ndim, const int64_t *shape, const uint8_t *a, const int64_t *sa, const uint8_t *b,
             const int64_t *sb, const uint8_t *table, uint8_t *y)
{
    int64_t idx[8] = {0}, outer = 1;
    const int64_t inner = ndim ? shape[ndim - 1] : 1, ia = ndim ? sa[ndim - 1] : 0, ib = ndim ? sb[ndim - 1] : 0;
    for (int64_t d = 0; d + 1 < ndim; d++) outer *= shape[d];
    for (int64_t o = 0; o < outer; o++) {
        int64_t oa = 0, ob = 0;
        for (int64_t d = 0; d + 1 < ndim; d++) {
            oa += idx[d] * sa[d];
            ob += idx[d] * sb[d];
        }
        const uint8_t *ap = a + oa, *bp = b + ob;
        uint8_t *yp = y + o * inner;
        for (int64_t i = 0; i < inner; i++) yp[i] = table[((uint32_t)ap[i * ia] << 8) | bp[i * ib]];
        for (int64_t d = ndim - 2; d >= 0; d--) { /* the next index of the outer dims */
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
}

void lut1_u8(const uint8_t *x, int64_t n, const uint8_t *table, uint8_t *y) {
    for (int64_t i = 0; i < n; i++) y[i] = table[x[i]];
}

/* QLinearSoftmax over contiguous rows of d bytes (onnxruntime's uint32-table kernel, bit for bit):
 * each value's distance to its row's max picks exp_table[255 - dist] (float32), the row's sum is
 * taken left to right in float32, then y = round-half-even(e * y_inv / sum) + y_zp, clamped above
 * only (at 255, or 127 for int8), as onnxruntime does. */
void qsoftmax_u8(const uint8_t *x, int64_t rows, int64_t d, int64_t s8, const float *exp_table, double y_inv_d,
                 int64_t y_zp, uint8_t *y, float *scratch)
{
    const float y_inv = (float)y_inv_d, zp = (float)y_zp, hi = s8 ? 127.0f : 255.0f;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *xr = x + r * d;
        int32_t mx = -129;
        for (int64_t j = 0; j < d; j++) {
            const int32_t v = s8 ? (int32_t)(int8_t)xr[j] : (int32_t)xr[j];
            mx = v > mx ? v : mx;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < d; j++) {
            const int32_t v = s8 ? (int32_t)(int8_t)xr[j] : (int32_t)xr[j];
            scratch[j] = exp_table[255 - (mx - v)];
            sum += scratch[j];
        }
        for (int64_t j = 0; j < d; j++) {
            float q = nearbyintf((scratch[j] * y_inv) / sum) + zp;
            q = q > hi ? hi : q;
            if (s8) ((int8_t *)y)[r * d + j] = (int8_t)q;
            else y[r * d + j] = (uint8_t)q;
        }
    }
}
