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

/* The walk of two broadcasting operands over the output's shape: rows of the innermost dim, each
 * row's start in a and in b (strides in elements), the output contiguous. */
typedef struct {
    int64_t ndim, idx[8], outer, inner, ia, ib;
    const int64_t *shape, *sa, *sb;
} Walk;

static Walk walk_start(int64_t ndim, const int64_t *shape, const int64_t *sa, const int64_t *sb) {
    Walk w = {ndim, {0}, 1, ndim ? shape[ndim - 1] : 1, ndim ? sa[ndim - 1] : 0, ndim ? sb[ndim - 1] : 0,
              shape, sa, sb};
    for (int64_t d = 0; d + 1 < ndim; d++) w.outer *= shape[d];
    return w;
}

/* the current row's offsets in a and b, then the next row's index */
static void walk_row(Walk *w, int64_t *oa, int64_t *ob) {
    *oa = *ob = 0;
    for (int64_t d = 0; d + 1 < w->ndim; d++) {
        *oa += w->idx[d] * w->sa[d];
        *ob += w->idx[d] * w->sb[d];
    }
    for (int64_t d = w->ndim - 2; d >= 0; d--) {
        if (++w->idx[d] < w->shape[d]) break;
        w->idx[d] = 0;
    }
}

void lut2_u8(int64_t ndim, const int64_t *shape, const uint8_t *a, const int64_t *sa, const uint8_t *b,
             const int64_t *sb, const uint8_t *table, uint8_t *y)
{
    Walk w = walk_start(ndim, shape, sa, sb);
    const int64_t inner = w.inner, ia = w.ia, ib = w.ib;
    for (int64_t o = 0; o < w.outer; o++) {
        int64_t oa, ob;
        walk_row(&w, &oa, &ob);
        const uint8_t *ap = a + oa, *bp = b + ob;
        uint8_t *yp = y + o * inner;
        for (int64_t i = 0; i < inner; i++) yp[i] = table[((uint32_t)ap[i * ia] << 8) | bp[i * ib]];
    }
}

/* QLinearAdd / QLinearMul by their arithmetic, 16 values a vector instead of a table's lookups,
 * with the operands as lut2_u8 takes them. The arithmetic is exactly what qlinear_binary.py's
 * tables hold (the same float32 operations, fmaf a true fused multiply-add, nothing contracted):
 *   add (kind 0):  fma(a, ra, fma(b, rb, c0)), swapped (kind 1): fma(b, rb, fma(a, ra, c0));
 *   mul (kind 2):  float32((a - za) * (b - zb)) * ra, then + c0 (two roundings);
 * then round half to even, NaN and values beyond int32 to the lowest value, saturated to the type. */
static inline float qb_op(float a, float b, int kind, float ra, float rb, float c0, float za, float zb) {
    if (kind == 0) return fmaf(a, ra, fmaf(b, rb, c0));
    if (kind == 1) return fmaf(b, rb, fmaf(a, ra, c0));
    float r = ((a - za) * (b - zb)) * ra;
    return r + c0;
}

static inline int32_t qb_cvt(float r, float lo, float hi) {
    float v = nearbyintf(r);
    if (!(v >= -2147483648.0f && v < 2147483648.0f)) return (int32_t)lo; /* NaN too */
    return (int32_t)(v < lo ? lo : (v > hi ? hi : v));
}

#define QB_ROW(T)                                                                                       \
    do {                                                                                                \
        const T *ap = (const T *)a + oa, *bp = (const T *)b + ob;                                       \
        T *yp = (T *)y + o * inner;                                                                     \
        if (ia == 1 && ib == 1)                                                                         \
            for (int64_t i = 0; i < inner; i++)                                                         \
                yp[i] = (T)qb_cvt(qb_op((float)ap[i], (float)bp[i], k, ra, rb, c0, za, zb), lo, hi);    \
        else if (ia == 1 && ib == 0)                                                                    \
            for (int64_t i = 0; i < inner; i++)                                                         \
                yp[i] = (T)qb_cvt(qb_op((float)ap[i], (float)bp[0], k, ra, rb, c0, za, zb), lo, hi);    \
        else                                                                                            \
            for (int64_t i = 0; i < inner; i++)                                                         \
                yp[i] = (T)qb_cvt(qb_op((float)ap[i * ia], (float)bp[i * ib], k, ra, rb, c0, za, zb), lo, hi); \
    } while (0)

void qbinary_u8(int64_t ndim, const int64_t *shape, const void *a, const int64_t *sa, const void *b,
                const int64_t *sb, int64_t s8, int64_t kind, double ra_d, double rb_d, double c0_d, int64_t za_i,
                int64_t zb_i, void *y)
{
    const float ra = (float)ra_d, rb = (float)rb_d, c0 = (float)c0_d, za = (float)za_i, zb = (float)zb_i;
    const float lo = s8 ? -128.0f : 0.0f, hi = s8 ? 127.0f : 255.0f;
    const int k = (int)kind;
    Walk w = walk_start(ndim, shape, sa, sb);
    const int64_t inner = w.inner, ia = w.ia, ib = w.ib;
    for (int64_t o = 0; o < w.outer; o++) {
        int64_t oa, ob;
        walk_row(&w, &oa, &ob);
        if (s8) QB_ROW(int8_t);
        else QB_ROW(uint8_t);
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

/* DequantizeLinear of one scale and zero point: y = float32(x - zp) * scale, x 8- or 16-bit (kind:
 * 0 uint8, 1 int8, 2 uint16, 3 int16). x - zp is exact in float32 (|x - zp| < 2^17), so this is
 * the torch path's float32 product bit for bit, in one pass instead of three. */
void dequant_small(const void *x, int64_t n, int64_t kind, int64_t zp, double scale_d, float *y) {
    const float s = (float)scale_d;
    const int32_t z = (int32_t)zp;
    switch (kind) {
    case 0: for (int64_t i = 0; i < n; i++) y[i] = (float)((int32_t)((const uint8_t *)x)[i] - z) * s; break;
    case 1: for (int64_t i = 0; i < n; i++) y[i] = (float)((int32_t)((const int8_t *)x)[i] - z) * s; break;
    case 2: for (int64_t i = 0; i < n; i++) y[i] = (float)((int32_t)((const uint16_t *)x)[i] - z) * s; break;
    default: for (int64_t i = 0; i < n; i++) y[i] = (float)((int32_t)((const int16_t *)x)[i] - z) * s; break;
    }
}

/* QuantizeLinear of one scale and zero point to uint8 / int8 (s8): round-half-even(x / scale) +
 * zp, saturated, in float32 as the torch path's steps (NaN to 0, as its conversion gives). */
void quant_small(const float *x, int64_t n, int64_t s8, double scale_d, int64_t zp, void *y) {
    const float s = (float)scale_d, z = (float)zp, lo = s8 ? -128.0f : 0.0f, hi = s8 ? 127.0f : 255.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = nearbyintf(x[i] / s) + z;
        v = v != v ? 0.0f : (v < lo ? lo : (v > hi ? hi : v));
        if (s8) ((int8_t *)y)[i] = (int8_t)(int32_t)v;
        else ((uint8_t *)y)[i] = (uint8_t)(int32_t)v;
    }
}

/* A Gather of rows of an 8-bit table (axis 0) and their DequantizeLinear of one scale and zero
 * point, in one pass: out[i, :] = float32(table[id_i, :] - zp) * scale, ids int64 (ids64) or
 * int32, a negative id counted from the end (ONNX's Gather). A quantized model's embedding lookup,
 * where torch took an index_select and a dequantization. Returns 1 for an id outside the table
 * (nothing promised of out then: the caller's op raises its error). kind: 0 uint8, 1 int8. */
int gather_dequant_small(const void *table, int64_t rows, int64_t h, const void *ids, int64_t n, int64_t ids64,
                         int64_t kind, int64_t zp, double scale_d, float *out) {
    const float s = (float)scale_d;
    const int32_t z = (int32_t)zp;
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids64 ? ((const int64_t *)ids)[i] : ((const int32_t *)ids)[i];
        if (id < 0) id += rows;
        if (id < 0 || id >= rows) return 1;
        float *y = out + i * h;
        if (kind == 0) {
            const uint8_t *r = (const uint8_t *)table + id * h;
            for (int64_t k = 0; k < h; k++) y[k] = (float)((int32_t)r[k] - z) * s;
        } else {
            const int8_t *r = (const int8_t *)table + id * h;
            for (int64_t k = 0; k < h; k++) y[k] = (float)((int32_t)r[k] - z) * s;
        }
    }
    return 0;
}
