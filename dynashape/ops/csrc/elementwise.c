/* Elementwise float32 kernels where torch's CPU kernel is far off the machine's speed.
 *
 * tanh: torch's CPU tanh took ~3 ns an element a thread here (its sigmoid 0.5; onnxruntime's tanh
 * ~8x faster than torch's), and attention-style models apply it to (batch, T, T, hidden) tensors.
 * fastmath.h's tanh_approx, written to vectorize, within ~2 ulp:
 *   |x| <  0.55: tanh = e / (e + 2), e = expm1(2|x|) by its Taylor series to degree 11 (relative
 *               error < 1e-8 for 2|x| <= 1.1): no cancellation near 0;
 *   |x| >= 0.55: tanh = 1 - 2 / (exp(2|x|) + 1), exp by range reduction and a degree-7 polynomial
 *               (|tanh| >= 0.5 there, so the absolute error of ~1e-7 is ~2 ulp);
 * the sign copied from x (tanh(-0) = -0); NaN stays NaN, +-inf gives +-1. The FastGelu pass
 * (bias_gelu_tanh_f32) still uses it.
 *
 * The Tanh and Sigmoid ops (tanh_f32, logistic_f32, silu_f32) compute onnxruntime's own functions
 * (ort_math.h: MLAS's rational approximations, bit for bit): a value a quantized model rounds next
 * must have onnxruntime's bits, and these are as fast (one division, no exp).
 */
#include <math.h>
#include "fastmath.h"
#include "ort_math.h"
#include <float.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Sums over a row of h floats in 16 lanes (another order than torch's: float32 rounding apart):
 * of the values and of their squared deviations from ``mean``. */
static float lane_sum(const float *v, int64_t h) {
    float acc[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= h; j += 16)
        for (int l = 0; l < 16; l++) acc[l] += v[j + l];
    float s = 0.0f;
    for (int l = 0; l < 16; l++) s += acc[l];
    for (; j < h; j++) s += v[j];
    return s;
}

static float lane_dev_sq(const float *v, int64_t h, float mean) {
    float dev[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= h; j += 16)
        for (int l = 0; l < 16; l++) dev[l] += (v[j + l] - mean) * (v[j + l] - mean);
    float var = 0.0f;
    for (int l = 0; l < 16; l++) var += dev[l];
    for (; j < h; j++) var += (v[j] - mean) * (v[j] - mean);
    return var;
}

/* onnxruntime's RMS normalization of one row of h floats, bit for bit (its CPU kernels, 1.32):
 *  - SkipSimplifiedLayerNormalization, and SimplifiedLayerNormalization of rows shorter than 16
 *    (``mlas`` 0, or h < 16): the sum of squares in order, one element after the other, each square
 *    rounded before it is added; rms = sqrt(sum / h + eps); y = x / rms * gamma (a division, then
 *    the product);
 *  - SimplifiedLayerNormalization of rows of 16 or more (``mlas`` 1, where onnxruntime calls MLAS's
 *    AVX2 LayerNorm kernel): the squares summed in 8 lanes by fused multiply-adds (element j into
 *    lane j % 8) over the whole chunks of 8, the lanes folded as ((l0 + l2) + (l1 + l3)) with
 *    l_i = lane i + lane i + 4; of the tail, the first multiple of 4 added in order as rounded
 *    squares and the rest by fused multiply-adds (the compiler's vectorized epilogue, then its
 *    scalar one); inv = 1 / sqrt(sum / h + eps); y = x * inv * gamma.
 * A value the next MatMulNBits quantizes to int8 needs those bits (issue 35). gamma NULL: 1.
 * inv_out: NULL, or where 1 / rms goes. x and y may be the same row. */
static void ort_rms_row(const float *x, const float *gamma, int64_t h, float eps, int mlas, float *y, float *inv_out) {
    if (mlas && h >= 16) {
        float acc[8] = {0};
        int64_t j = 0;
        for (; j + 8 <= h; j += 8)
            for (int l = 0; l < 8; l++) acc[l] = fmaf(x[j + l], x[j + l], acc[l]);
        float ss = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
        const int64_t j4 = j + ((h - j) / 4) * 4;
        for (; j < j4; j++) ss += x[j] * x[j];
        for (; j < h; j++) ss = fmaf(x[j], x[j], ss);
        const float inv = 1.0f / sqrtf(ss / (float)h + eps);
        if (inv_out) *inv_out = inv;
        for (int64_t k = 0; k < h; k++) y[k] = gamma ? x[k] * inv * gamma[k] : x[k] * inv;
        return;
    }
    float ss = 0.0f;
    for (int64_t k = 0; k < h; k++) ss += x[k] * x[k];
    const float rms = sqrtf(ss / (float)h + eps);
    if (inv_out) *inv_out = 1.0f / rms;
    for (int64_t k = 0; k < h; k++) y[k] = gamma ? x[k] / rms * gamma[k] : x[k] / rms;
}

void tanh_f32(const float *x, float *y, int64_t n, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = ort_tanh(x[i]);
}

void logistic_f32(const float *x, float *y, int64_t n, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = ort_logistic(x[i]);
}

/* x * Sigmoid(x), the product rounded after the logistic, as onnxruntime's two nodes compute it */
void silu_f32(const float *x, float *y, int64_t n, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * ort_logistic(x[i]);
}

/* A QuantizeLinear-DequantizeLinear pair of one scale and zero point (fused_quant.py FakeQuant):
 * clamp(round-half-even(x / s), lo, hi) * s, with lo, hi the type's range less the zero point:
 * the division, rounding, clamp and product are the unfused torch calls' own float32 operations,
 * so the result is theirs bit for bit (NaN stays NaN). One pass instead of four calls. */
void fake_quant_f32(const float *x, int64_t n, double scale_d, double lo_d, double hi_d, float *y, int64_t threads) {
    const float s = (float)scale_d, lo = (float)lo_d, hi = (float)hi_d;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float q = nearbyintf(x[i] / s);
        q = q < lo ? lo : (q > hi ? hi : q);
        y[i] = q * s;
    }
}

/* RMS normalization over the last axis (fused.py RMSNorm, what T5 and Llama exports decompose):
 * y = x * (1 / sqrt(mean(x^2) + eps)) [* w], rows of h contiguous floats. torch's F.rms_norm is a
 * composite of six kernels on the CPU (~11 us for a 12 x 64 tensor, against ~1 here); computed as
 * onnxruntime's SimplifiedLayerNormalization (ort_rms_row), which its optimizer makes of the same
 * decomposed nodes. w: NULL or h floats. */
void rms_norm_f32(const float *x, const float *w, int64_t rows, int64_t h, double eps_d, float *y, int64_t threads) {
    const float eps = (float)eps_d;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * h;
        float *yr = y + r * h;
        ort_rms_row(xr, w, h, eps, 1, yr, NULL);
    }
}

/* EmbedLayerNormalization (com.microsoft) over float32 tables, one token a row: the word, position
 * (0 .. S-1 for token j of a sequence) and optional segment rows added, then layer-normalized with
 * gamma and beta. torch needs ~8 calls (gathers, adds, layer_norm; ~45 us for a tiny BERT's
 * 1 x 64 tokens); here one pass. The statistics: mean, then the mean of squared deviations (two
 * passes over the row, in 16 lanes: float32 rounding apart from torch's). ids and seg: int32 or
 * int64 (ids64); seg NULL for no segment table. sum_out: NULL, or where the embedding sum goes.
 * Returns 0, or 1 for an id outside its table (nothing promised of the output then: the caller's
 * torch path says which). */

int embed_ln_f32(const void *ids, const void *seg, int64_t ids64, int64_t rows, int64_t s, int64_t h,
                 const float *word, int64_t vocab, const float *pos, int64_t npos, const float *segtab, int64_t nseg,
                 const float *gamma, const float *beta, double eps_d, float *out, float *sum_out, int64_t threads) {
    const float eps = (float)eps_d;
    int bad = 0;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static) reduction(| : bad)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t id = ids64 ? ((const int64_t *)ids)[r] : ((const int32_t *)ids)[r];
        const int64_t p = r % s;
        int64_t sg = 0;
        if (segtab) sg = ids64 ? ((const int64_t *)seg)[r] : ((const int32_t *)seg)[r];
        if (id < 0 || id >= vocab || p >= npos || (segtab && (sg < 0 || sg >= nseg))) {
            bad = 1;
            continue;
        }
        float *y = out + r * h;
        const float *w = word + id * h, *q = pos + p * h;
        for (int64_t k = 0; k < h; k++) y[k] = w[k] + q[k];
        if (segtab) {
            const float *t = segtab + sg * h;
            for (int64_t k = 0; k < h; k++) y[k] += t[k];
        }
        if (sum_out) for (int64_t k = 0; k < h; k++) sum_out[r * h + k] = y[k];
        const float mean = lane_sum(y, h) / (float)h;
        const float rstd = 1.0f / sqrtf(lane_dev_sq(y, h, mean) / (float)h + eps);
        for (int64_t k = 0; k < h; k++) y[k] = (y[k] - mean) * rstd * gamma[k] + beta[k];
    }
    return bad;
}

/* SimplifiedLayerNormalization (onnxruntime's, ``ort_rms_row``; mlas 1 where its CPU has AVX2 and
 * FMA, so that MLAS's kernel serves it) of rows of h floats; inv: NULL or one float a row (its
 * inv_std_var output). */
void ort_simplified_ln_f32(const float *x, const float *scale, int64_t rows, int64_t h, double eps_d, int64_t mlas,
                           float *y, float *inv, int64_t threads) {
    const float eps = (float)eps_d;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) ort_rms_row(x + r * h, scale, h, eps, (int)mlas, y + r * h, inv ? inv + r : NULL);
}

/* Layer normalization over the last axis with onnxruntime's Skip* inputs folded in
 * (SkipLayerNormalization, SkipSimplifiedLayerNormalization, and LayerNormalization itself with
 * skip NULL): s = x + skip [+ bias] row by row (skip's row r % skip_rows: a skip without the batch
 * dim), written to sum_out when it is not NULL, then y = (s - mean) * rstd * gamma [+ beta], or
 * for ``simplified`` onnxruntime's RMS normalization of s (ort_rms_row: 1 its
 * SkipSimplifiedLayerNormalization's order, 2 its SimplifiedLayerNormalization's). One pass of C
 * where torch took three to six calls (~15 us a call for a tiny GPT-2's rows); the layer norm's
 * statistics in 16 lanes as embed_ln_f32's (float32 rounding apart from torch's). */
void skip_ln_f32(const float *x, const float *skip, int64_t skip_rows, const float *bias, const float *gamma,
                 const float *beta, int64_t rows, int64_t h, double eps_d, int64_t simplified, float *y,
                 float *sum_out, int64_t threads) {
    const float eps = (float)eps_d;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * h;
        float *yr = y + r * h;
        if (skip) {
            const float *sr = skip + (r % skip_rows) * h;
            for (int64_t k = 0; k < h; k++) yr[k] = xr[k] + sr[k];
        } else {
            for (int64_t k = 0; k < h; k++) yr[k] = xr[k];
        }
        if (bias) for (int64_t k = 0; k < h; k++) yr[k] += bias[k];
        if (sum_out) for (int64_t k = 0; k < h; k++) sum_out[r * h + k] = yr[k];
        if (simplified) {
            ort_rms_row(yr, gamma, h, eps, simplified == 2, yr, NULL);
            continue;
        }
        const float mean = lane_sum(yr, h) / (float)h;
        const float rstd = 1.0f / sqrtf(lane_dev_sq(yr, h, mean) / (float)h + eps);
        if (beta) {
            for (int64_t k = 0; k < h; k++) yr[k] = (yr[k] - mean) * rstd * gamma[k] + beta[k];
        } else {
            for (int64_t k = 0; k < h; k++) yr[k] = (yr[k] - mean) * rstd * gamma[k];
        }
    }
}

/* onnxruntime's FastGelu (and BiasGelu's tanh form): y = 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715
 * v^3))), v = x + bias[column] (bias NULL: none), rows of h contiguous floats; tanh_approx as
 * tanh_f32's. One pass where torch took an add and a gelu (two calls, ~7 us at a tiny GPT-2's). */
void bias_gelu_tanh_f32(const float *x, const float *bias, int64_t rows, int64_t h, float *y, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * h;
        float *yr = y + r * h;
        for (int64_t k = 0; k < h; k++) {
            const float v = bias ? xr[k] + bias[k] : xr[k];
            yr[k] = 0.5f * v * (1.0f + tanh_approx(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        }
    }
}

/* onnxruntime's Softmax of rows of d floats, bit for bit, where it runs MLAS's AVX-512F kernels (a
 * CPU with AVX-512F: -march=native defines __AVX512F__ exactly where MLAS picks them). Per row:
 * the maximum; e = exp(x - max) by MLAS's exp (x clamped below at -150 ln 2, m = round(x / ln 2)
 * through the 1.5 * 2^23 bias, x - m ln 2 in two fused steps, a degree-6 polynomial in fused
 * multiply-adds, times 2^m rounded once: vscalefps); the sum in 16 lanes, element j into lane
 * j % 16 in order, the lanes folded as its reduction does ((t0 + t1) + (t2 + t3)) + ((t4 + t5) +
 * (t6 + t7)), t_l = lane l + lane l + 8; then each e times 1 / sum. A softmax read by a
 * quantization (an attention's probabilities before DynamicQuantizeLinear) needs those bits: one
 * ulp can move a quantized value by a step. A row with a NaN or +inf, or of only -inf, is all NaN
 * (in MLAS that element's exp is NaN, so its sum, so every output). Returns 2 where this build has
 * no AVX-512F (other CPUs run other MLAS kernels, which sum in another order: torch's softmax
 * serves there), else 0. */
#if defined(__AVX512F__)
#include <immintrin.h>
/* 16 lanes of MLAS's exp of (x + neg), in its instructions' order (vscalefps: p * 2^m rounded once) */
static inline __m512 ort_exp16(__m512 x, __m512 neg) {
    const __m512 bias = _mm512_set1_ps(12582912.0f);
    __m512 v = _mm512_max_ps(_mm512_set1_ps(-103.9720840454f), _mm512_add_ps(neg, x));
    const __m512 m = _mm512_sub_ps(_mm512_fmadd_ps(v, _mm512_set1_ps(1.44269504088896341f), bias), bias);
    v = _mm512_fmadd_ps(m, _mm512_set1_ps(-6.93145752e-1f), v);
    v = _mm512_fmadd_ps(m, _mm512_set1_ps(-1.42860677e-6f), v);
    __m512 p = _mm512_set1_ps(0x1.694000p-10f);
    p = _mm512_fmadd_ps(p, v, _mm512_set1_ps(0x1.125edcp-7f));
    p = _mm512_fmadd_ps(p, v, _mm512_set1_ps(0x1.555b5ap-5f));
    p = _mm512_fmadd_ps(p, v, _mm512_set1_ps(0x1.555450p-3f));
    p = _mm512_fmadd_ps(p, v, _mm512_set1_ps(0x1.fffff6p-2f));
    p = _mm512_fmadd_ps(p, v, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, v, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, m);
}
/* MLAS's ComputeSumExpF32Kernel: y = exp(x + negmax) and their sum (16 lanes, folded) */
static float ort_sumexp(const float *x, float *y, int64_t d, float negmax) {
    const __m512 neg = _mm512_set1_ps(negmax);
    __m512 acc = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
        const __m512 e = ort_exp16(_mm512_loadu_ps(x + j), neg);
        _mm512_storeu_ps(y + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (j < d) {
        const __mmask16 k = (__mmask16)((1u << (d - j)) - 1);
        const __m512 e = ort_exp16(_mm512_maskz_loadu_ps(k, x + j), neg);
        _mm512_mask_storeu_ps(y + j, k, e);
        acc = _mm512_mask_add_ps(acc, k, acc, e);
    }
    float a[16], t[8];
    _mm512_storeu_ps(a, acc);
    for (int l = 0; l < 8; l++) t[l] = a[l] + a[l + 8];
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
#endif

int64_t softmax_f32(const float *x, float *y, int64_t rows, int64_t d, int64_t threads) {
#if defined(__AVX512F__)
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        /* the maximum (exact in any order) and whether the row has a NaN or +inf (a -inf, a
         * mask's, is clamped below as MLAS clamps it) */
        __m512 m16 = _mm512_set1_ps(-INFINITY);
        __mmask16 badk = 0;
        int64_t i = 0;
        for (; i + 16 <= d; i += 16) {
            const __m512 v = _mm512_loadu_ps(xr + i);
            badk |= _mm512_cmp_ps_mask(v, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ); /* NaN or +inf */
            m16 = _mm512_max_ps(m16, v);
        }
        float mx = _mm512_reduce_max_ps(m16);
        int ok = badk == 0;
        for (; i < d; i++) {
            ok &= (xr[i] == xr[i]) & (xr[i] != INFINITY);
            mx = xr[i] > mx ? xr[i] : mx;
        }
        if (!ok || mx == -INFINITY) { /* MLAS: that element's exp, the sum, the row all NaN */
            for (int64_t j = 0; j < d; j++) yr[j] = NAN;
            continue;
        }
        const float s = ort_sumexp(xr, yr, d, -mx); /* lane l sums elements l, l + 16, ... in order */
        const __m512 scale = _mm512_set1_ps(1.0f / s);
        int64_t j = 0;
        for (; j + 16 <= d; j += 16) _mm512_storeu_ps(yr + j, _mm512_mul_ps(scale, _mm512_loadu_ps(yr + j)));
        for (; j < d; j++) yr[j] = (1.0f / s) * yr[j];
    }
    return 0;
#else
    (void)x; (void)y; (void)rows; (void)d; (void)threads;
    return 2;
#endif
}

/* ---- onnxruntime's GroupQueryAttention (float32, CPU), bit for bit ----------------------------
 *
 * What onnxruntime 1.32 computes on an AVX-512F CPU, in its order (the next MatMulNBits of an int4
 * model quantizes the attention's output to int8: one ulp can move a value by a step, issue 35):
 *
 * Rotary (ort_rope_f32, its MLAS kernel, not interleaved): with x1 the first and x2 the second
 * half of the rotated dims, x1' = fma(x1, cos, -(x2 sin)) and x2' = fma(x1, sin, x2 cos), each
 * product in the fused step exact and the other rounded first.
 *
 * Attention (ort_gqa_attn_f32), for every (batch, head):
 *  - decode (one new token, more than one key): scores[t] = (sum of q.k in 8 lanes, lane j taking
 *    dims j, j + 8, ... as rounded products, folded ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 +
 *    a7)), then the rest of the dims one by one) * scale; keys before the local window get float's
 *    lowest; e = MLAS's exp of (score - max) and their sum (the 16-lane kernel of softmax_f32);
 *    o[h] = sum over t, in order, of the rounded products e[t] v[t, h]; out = o * (1 / sum);
 *  - prefill (several new tokens, "flash"): queries in blocks of min(kv_block, 2 head size) rows,
 *    keys in blocks of kv_block = L2 size / (32 head size); per block, scores = its SGEMM (fused
 *    multiply-adds along the head dims in order, split into its K slices, times scale), keys after
 *    the query's position or before its window at lowest, then an online softmax (running max,
 *    MLAS's exp and sum, earlier blocks rescaled by expf of the max's change) and o += e V by its
 *    SGEMM (a block of one query row: its M = 1 AVX kernel, products summed four at a time
 *    without fused steps); out = o * (1 / l);
 *  - decode where onnxruntime's threads (ort_threads: its intra-op thread count, which our caller
 *    equates with torch's) outnumber the batch x heads, every row has the same length and that
 *    length is over kv_block: its "flash decoding" (decode_split): the keys in blocks of kv_block,
 *    each block's softmax and products on their own, merged in block order (its thread count
 *    decides whether it splits, never how the blocks combine: the bits follow from the count);
 *  - one key in all: the value row (probability 1).
 * Returns 0; 2 where this build has no AVX-512F (another MLAS softmax kernel: the caller's torch
 * path serves); 3 for a scale of exactly 1 (another SGEMM path, not followed). */
void ort_rope_f32(const float *x, int64_t x_row, int64_t rows, int64_t heads, int64_t hd, int64_t rd,
                  const float *cos_c, const float *sin_c, int64_t half_c, const int64_t *pos, float *y) {
    const int64_t half = rd / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos_c + pos[r] * half_c, *s = sin_c + pos[r] * half_c;
        for (int64_t n = 0; n < heads; n++) {
            const float *xi = x + r * x_row + n * hd;
            float *yi = y + (r * heads + n) * hd;
            for (int64_t i = 0; i < half; i++) {
                const float x1 = xi[i], x2 = xi[i + half];
                yi[i] = fmaf(x1, c[i], -(x2 * s[i]));
                yi[i + half] = fmaf(x1, s[i], x2 * c[i]);
            }
            for (int64_t i = rd; i < hd; i++) yi[i] = xi[i];
        }
    }
}

#if defined(__AVX512F__)
/* a[u] = sum over t in [k0, k1) of r[u][t] * col[t * stride .. + 16] (masked lanes), fused steps in
 * t's order: the 4-row slice of the GQA prefill's two products (MLAS's SGEMM kernel's order) */
static inline void fma4_slice(const float *const r[4], const float *col, int64_t stride, int64_t k0, int64_t k1,
                              __mmask16 mk, __m512 a[4]) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = k0; t < k1; t++) {
        const __m512 v = _mm512_maskz_loadu_ps(mk, col + t * stride);
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(r[0][t]), v, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(r[1][t]), v, a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(r[2][t]), v, a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(r[3][t]), v, a3);
    }
    a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3;
}

static float row_max_f32(const float *x, int64_t n) {
    float m = -FLT_MAX;
    for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

/* a decode score before the scale: q.k in 8 lanes (lane j the dims j, j + 8, ... as rounded
 * products), folded ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), then the other dims in order */
static inline float decode_dot(const float *qi, const float *kr, int64_t H) {
    float a[8] = {0};
    int64_t h = 0;
    for (; h + 8 <= H; h += 8)
        for (int j = 0; j < 8; j++) a[j] += qi[h + j] * kr[h + j];
    float sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (; h < H; h++) sum += qi[h] * kr[h];
    return sum;
}

/* onnxruntime's flash decoding for one (batch, head): each block of kvb keys on its own (its
 * scores, keys before the window at lowest, its max m_c, MLAS's exp and sum l_c, o_c = the
 * rounded products e v summed in key order), then the blocks merged in order: M = max m_c,
 * r_c = expf(m_c - M), l = sum of r_c l_c, o = sum of r_c o_c (a block all masked skipped),
 * out = o * (1 / l). The blocks are onnxruntime's tasks; the merge reads them in block order
 * whichever thread computed them, so the bits do not depend on its schedule. */
static void decode_split(const float *qi, const float *kh, const float *vh, int64_t total, int64_t H, int64_t kvb,
                         int64_t ws, float scale, float *sc, float *part, float *o) {
    const int64_t chunks = (total + kvb - 1) / kvb, stride = H + 2;
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t ir = c * kvb, rk = total - ir < kvb ? total - ir : kvb;
        float *pc = part + c * stride, *oc = pc + 2;
        for (int64_t j = 0; j < rk; j++) sc[j] = ir + j < ws ? -FLT_MAX : decode_dot(qi, kh + (ir + j) * H, H) * scale;
        const float mx = row_max_f32(sc, rk);
        for (int64_t h = 0; h < H; h++) oc[h] = 0.0f;
        if (mx == -FLT_MAX) {
            pc[0] = -FLT_MAX, pc[1] = 0.0f;
            continue;
        }
        pc[0] = mx;
        pc[1] = ort_sumexp(sc, sc, rk, -mx);
        for (int64_t t = 0; t < rk; t++) {
            const float pt = sc[t], *vr = vh + (ir + t) * H;
            for (int64_t h = 0; h < H; h++) oc[h] += pt * vr[h];
        }
    }
    float gm = -FLT_MAX;
    for (int64_t c = 0; c < chunks; c++) gm = part[c * stride] > gm ? part[c * stride] : gm;
    for (int64_t h = 0; h < H; h++) o[h] = 0.0f;
    if (gm == -FLT_MAX) return;
    float gl = 0.0f;
    for (int64_t c = 0; c < chunks; c++) {
        const float *pc = part + c * stride;
        if (pc[1] <= 0.0f) continue;
        const float r = expf(pc[0] - gm);
        gl += r * pc[1];
        for (int64_t h = 0; h < H; h++) o[h] += r * pc[2 + h];
    }
    const float inv = gl > 0.0f ? 1.0f / gl : 0.0f;
    for (int64_t h = 0; h < H; h++) o[h] *= inv;
}

/* MLAS's SGEMM K slice for an (N, K) product whose A is not transposed */
static int64_t sgemm_stride_k(int64_t n, int64_t k) {
    int64_t sn = 128, sk = 128;
    if (n >= k) {
        while (sk / 2 >= k) { sn *= 2; sk /= 2; }
    } else {
        while (sn > 16 && sn / 2 >= n) { sk *= 2; sn /= 2; }
    }
    return sk;
}
#endif

/* p: B, N, Nk, S, H, P (present length), first_prompt, local_window, kv_block, threads (ours),
 * ort_threads (the onnxruntime intra-op thread count whose results to give);
 * q (B, S, N, H), k and v (B, Nk, P, H) the present caches, lens (B) each row's total length,
 * out (B, S, N, H) */
int64_t ort_gqa_attn_f32(const int64_t *p, const float *q, const float *k, const float *v, const int64_t *lens,
                         double scale_d, float *out) {
#if defined(__AVX512F__)
    const int64_t B = p[0], N = p[1], Nk = p[2], S = p[3], H = p[4], P = p[5], first = p[6], lws = p[7];
    const int64_t kvb_in = p[8], threads = p[9], ort_threads = p[10];
    const float scale = (float)scale_d;
    if (scale == 1.0f) return 3;
    const int64_t group = N / Nk;
    int64_t maxlen = 1, common = 1;
    for (int64_t b = 0; b < B; b++) maxlen = lens[b] > maxlen ? lens[b] : maxlen;
    for (int64_t b = 0; b < B; b++) common &= lens[b] == lens[0];
    /* onnxruntime's flash decoding: its threads outnumber the (batch, head) pairs, every row has
     * the same length, and that length spans more than one key block */
    const int64_t kvbs = kvb_in < 1 ? 1 : kvb_in;
    const int split = S == 1 && common && B * N < ort_threads && maxlen > kvbs;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const int64_t kvb0 = kvb_in < 1 ? 1 : kvb_in;
        const int64_t qb0 = kvb0 < 2 * H ? kvb0 : 2 * H;
        const int64_t qcap = qb0 < S ? qb0 : S;
        const int64_t kcap = kvb0 < maxlen ? kvb0 : maxlen;
        float *buf = malloc((size_t)(qcap * (maxlen + H) + maxlen + H + 2 * qcap + 16) * sizeof(float));
        float *kt = malloc((size_t)(kcap * H + 16) * sizeof(float)); /* a key block, transposed */
        /* flash decoding's partials: (max, sum, H outputs) per key block */
        float *part = split ? malloc((size_t)((maxlen + kvb0 - 1) / kvb0 * (H + 2)) * sizeof(float)) : NULL;
#pragma omp for schedule(static)
        for (int64_t bn = 0; bn < B * N; bn++) {
            const int64_t b = bn / N, n = bn % N;
            const int64_t total = lens[b];
            const float *kh = k + (b * Nk + n / group) * P * H, *vh = v + (b * Nk + n / group) * P * H;
            if (maxlen <= 1) { /* not the flash path: one key, a probability of 1 */
                float *o = out + ((b * S) * N + n) * H;
                for (int64_t h = 0; h < H; h++) o[h] = vh[h] + 0.0f;
                continue;
            }
            if (S == 1) { /* decode */
                float *sc = buf, *tmp = buf + total;
                const int64_t ws = (lws >= 0 && total > lws) ? total - lws : 0;
                if (split) {
                    decode_split(q + (b * N + n) * H, kh, vh, total, H, kvb0, ws, scale, sc, part,
                                 out + (b * N + n) * H);
                    continue;
                }
                for (int64_t t = 0; t < total; t++) sc[t] = decode_dot(q + (b * N + n) * H, kh + t * H, H) * scale;
                for (int64_t t = 0; t < ws; t++) sc[t] = -FLT_MAX;
                float *o = out + (b * N + n) * H;
                const float mx = row_max_f32(sc, total);
                if (mx == -FLT_MAX) {
                    for (int64_t h = 0; h < H; h++) o[h] = 0.0f;
                    continue;
                }
                const float l = ort_sumexp(sc, sc, total, -mx);
                for (int64_t h = 0; h < H; h++) tmp[h] = 0.0f;
                for (int64_t t = 0; t < total; t++) {
                    const float pt = sc[t], *vr = vh + t * H;
                    for (int64_t h = 0; h < H; h++) tmp[h] += pt * vr[h];
                }
                const float inv = l > 0.0f ? 1.0f / l : 0.0f;
                for (int64_t h = 0; h < H; h++) o[h] = tmp[h] * inv;
                continue;
            }
            /* prefill: the tiled online softmax */
            const int64_t past = first ? 0 : total - S;
            const int64_t kvb = kvb0 < total ? kvb0 : total;
            float *lsum = buf, *mrun = buf + qcap, *sc = buf + 2 * qcap, *acc = sc + qcap * kvb;
            for (int64_t i0 = 0; i0 < S; i0 += qcap) {
                const int64_t rq = S - i0 < qcap ? S - i0 : qcap;
                for (int64_t r = 0; r < rq; r++) { mrun[r] = -FLT_MAX; lsum[r] = 0.0f; }
                for (int64_t e = 0; e < rq * H; e++) acc[e] = 0.0f;
                const int64_t limit = past + i0 + rq;
                for (int64_t ir = 0; ir < total && ir < limit; ir += kvb) {
                    const int64_t rk = total - ir < kvb ? total - ir : kvb;
                    /* scores: SGEMM (M rq, N rk, K H, B transposed), alpha = scale: 16 keys a
                     * vector (each lane its own chain of fused steps along the head dims, in
                     * order), four query rows at once */
                    const int64_t sk = sgemm_stride_k(rk, H);
                    for (int64_t j = 0; j < rk; j++)
                        for (int64_t d = 0; d < H; d++) kt[d * rk + j] = kh[(ir + j) * H + d];
                    const __m512 vscale = _mm512_set1_ps(scale);
                    for (int64_t r0 = 0; r0 < rq; r0 += 4) {
                        const int64_t nr = rq - r0 < 4 ? rq - r0 : 4;
                        const float *qr[4];
                        for (int64_t u = 0; u < 4; u++)
                            qr[u] = q + ((b * S + i0 + r0 + (u < nr ? u : 0)) * N + n) * H;
                        for (int64_t j0 = 0; j0 < rk; j0 += 16) {
                            const int64_t left = rk - j0;
                            const __mmask16 mk = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
                            __m512 c[4];
                            for (int64_t k0 = 0; k0 < H; k0 += sk) {
                                const int64_t k1 = k0 + sk < H ? k0 + sk : H;
                                __m512 a[4];
                                fma4_slice(qr, kt + j0, rk, k0, k1, mk, a);
                                for (int u = 0; u < 4; u++)
                                    c[u] = k0 == 0 ? _mm512_mul_ps(a[u], vscale) : _mm512_fmadd_ps(a[u], vscale, c[u]);
                            }
                            for (int64_t u = 0; u < nr; u++) _mm512_mask_storeu_ps(sc + (r0 + u) * rk + j0, mk, c[u]);
                        }
                    }
                    for (int64_t r = 0; r < rq; r++) {
                        float *pr = sc + r * rk;
                        const int64_t climit = past + i0 + r + 1;
                        for (int64_t j = 0; j < rk; j++)
                            if (ir + j >= climit) pr[j] = -FLT_MAX;
                        if (lws >= 0) {
                            const int64_t wstart = climit > lws ? climit - lws : 0;
                            for (int64_t j = 0; j < rk; j++)
                                if (ir + j < wstart) pr[j] = -FLT_MAX;
                        }
                        const float rmax = row_max_f32(pr, rk);
                        if (rmax == -FLT_MAX) {
                            for (int64_t j = 0; j < rk; j++) pr[j] = 0.0f;
                            continue;
                        }
                        const float mold = mrun[r];
                        mrun[r] = mrun[r] > rmax ? mrun[r] : rmax;
                        const float mdiff = mold - mrun[r];
                        const float rs = ort_sumexp(pr, pr, rk, -mrun[r]);
                        if (ir != 0) {
                            const float ed = expf(mdiff);
                            const float scaled = ed * lsum[r];
                            lsum[r] = scaled + rs;
                            for (int64_t h = 0; h < H; h++) acc[r * H + h] *= ed;
                        } else {
                            lsum[r] = rs;
                        }
                    }
                    /* o += e V: SGEMM (M rq, N H, K rk), alpha 1, beta 0 for the first block */
                    const float *vb = vh + ir * H;
                    if (rq == 1) { /* its M = 1 AVX kernel */
                        float *c = acc;
                        const float *pr = sc;
                        int zero = ir == 0;
                        int64_t t = 0;
                        for (; t + 4 <= rk; t += 4) {
                            for (int64_t h = 0; h < H; h++) {
                                float s4 = pr[t] * vb[t * H + h];
                                s4 = s4 + pr[t + 1] * vb[(t + 1) * H + h];
                                s4 = s4 + pr[t + 2] * vb[(t + 2) * H + h];
                                s4 = s4 + pr[t + 3] * vb[(t + 3) * H + h];
                                c[h] = s4 + (zero ? 0.0f : c[h]);
                            }
                            zero = 0;
                        }
                        if ((rk - t) & 2) {
                            for (int64_t h = 0; h < H; h++) {
                                const float s2 = pr[t] * vb[t * H + h] + pr[t + 1] * vb[(t + 1) * H + h];
                                c[h] = s2 + (zero ? 0.0f : c[h]);
                            }
                            zero = 0;
                            t += 2;
                        }
                        if ((rk - t) & 1) {
                            for (int64_t h = 0; h < H; h++) c[h] = pr[t] * vb[t * H + h] + (zero ? 0.0f : c[h]);
                        }
                    } else { /* 16 output dims a vector, four query rows at once */
                        const int64_t sk2 = sgemm_stride_k(H, rk);
                        const __m512 one = _mm512_set1_ps(1.0f);
                        for (int64_t r0 = 0; r0 < rq; r0 += 4) {
                            const int64_t nr = rq - r0 < 4 ? rq - r0 : 4;
                            const float *pr[4];
                            for (int64_t u = 0; u < 4; u++) pr[u] = sc + (r0 + (u < nr ? u : 0)) * rk;
                            for (int64_t h0 = 0; h0 < H; h0 += 16) {
                                const int64_t left = H - h0;
                                const __mmask16 mk = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
                                __m512 c[4];
                                for (int64_t u = 0; u < 4; u++) c[u] = _mm512_maskz_loadu_ps(mk, acc + (r0 + (u < nr ? u : 0)) * H + h0);
                                for (int64_t k0 = 0; k0 < rk; k0 += sk2) {
                                    const int64_t k1 = k0 + sk2 < rk ? k0 + sk2 : rk;
                                    __m512 a[4];
                                    fma4_slice(pr, vb + h0, H, k0, k1, mk, a);
                                    for (int u = 0; u < 4; u++)
                                        c[u] = (ir == 0 && k0 == 0) ? a[u] : _mm512_fmadd_ps(a[u], one, c[u]);
                                }
                                for (int64_t u = 0; u < nr; u++) _mm512_mask_storeu_ps(acc + (r0 + u) * H + h0, mk, c[u]);
                            }
                        }
                    }
                }
                for (int64_t r = 0; r < rq; r++) {
                    const float inv = lsum[r] > 0.0f ? 1.0f / lsum[r] : 0.0f;
                    float *o = out + ((b * S + i0 + r) * N + n) * H;
                    for (int64_t h = 0; h < H; h++) o[h] = acc[r * H + h] * inv;
                }
            }
        }
        free(buf);
        free(kt);
        free(part);
    }
    return 0;
#else
    (void)p; (void)q; (void)k; (void)v; (void)lens; (void)scale_d; (void)out;
    return 2;
#endif
}

/* A decode step of GroupQueryAttention in one call (contrib_gqa.py's bound kernel): every row has
 * the same past length P and one new token. The rotary of q and k (ort_rope_f32, at position P),
 * the presents (the past's P positions, then the new key and value), then ort_gqa_attn_f32 over
 * them: the calls the op's Python made one by one, the same bits.
 * p: B, N, Nk, H, P, rotary (0/1), rotary dim, cos/sin half width, then ort_gqa_attn_f32's
 * first_prompt, local_window, kv_block, threads, ort_threads; q, k, v rows (B) with row strides
 * qs, ks, vs (elements); past_k/past_v (B, Nk, P, H); present_k/present_v (B, Nk, P + 1, H);
 * qrot (B, N * H) scratch; out (B, N * H). Returns ort_gqa_attn_f32's code (0: done). */
int64_t ort_gqa_decode_f32(const int64_t *p, const float *q, int64_t qs, const float *k, int64_t ks,
                           const float *v, int64_t vs, const float *past_k, const float *past_v,
                           const float *cos_c, const float *sin_c, float *present_k, float *present_v,
                           float *qrot, double scale, float *out) {
    const int64_t B = p[0], N = p[1], Nk = p[2], H = p[3], P = p[4], rotary = p[5], rd = p[6], half_c = p[7];
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)(2 * B));
    float *krot = malloc(sizeof(float) * (size_t)(B * Nk * H + 1));
    if (!pos || !krot) {
        free(pos);
        free(krot);
        return 4;
    }
    int64_t *lens = pos + B;
    for (int64_t b = 0; b < B; b++) {
        pos[b] = P;
        lens[b] = P + 1;
    }
    /* q goes to the attention as (B, N * H) rows: rotated into qrot, or copied there */
    const float *kr = k;
    int64_t krow = ks;
    if (rotary) {
        ort_rope_f32(q, qs, B, N, H, rd, cos_c, sin_c, half_c, pos, qrot);
        ort_rope_f32(k, ks, B, Nk, H, rd, cos_c, sin_c, half_c, pos, krot);
        kr = krot, krow = Nk * H;
    } else {
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < N * H; i++) qrot[b * N * H + i] = q[b * qs + i];
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < Nk; j++) {
            const size_t past = (size_t)(P * H), head = (size_t)((b * Nk + j) * (P + 1) * H);
            const float *pk = past_k + (b * Nk + j) * P * H, *pv = past_v + (b * Nk + j) * P * H;
            for (size_t i = 0; i < past; i++) {
                present_k[head + i] = pk[i];
                present_v[head + i] = pv[i];
            }
            for (int64_t h = 0; h < H; h++) {
                present_k[head + past + h] = kr[b * krow + j * H + h];
                present_v[head + past + h] = v[b * vs + j * H + h];
            }
        }
    int64_t ap[11] = {B, N, Nk, 1, H, P + 1, p[8], p[9], p[10], p[11], p[12]};
    int64_t rc = ort_gqa_attn_f32(ap, qrot, present_k, present_v, lens, scale, out);
    free(pos);
    free(krot);
    return rc;
}
