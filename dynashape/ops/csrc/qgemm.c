/* The exact product of an 8-bit (or dynamically quantized) A with a constant 8-bit weight B on
 * the CPU, with what quantized models put around it, in one call.
 *
 * Why C: in torch, onnxruntime's quantize_dynamic pattern (DynamicQuantizeLinear, MatMulInteger,
 * Cast, the scales' Mul, the bias' Add) is ~15 calls (range, quantize, shift to int8, _int_mm,
 * zero-point corrections, scale, bias), 3-6 us each: a small transformer's product costs ~100 us
 * where its arithmetic needs a few. Here: A's range and quantization (DynamicQuantizeLinear, as
 * ops/quant.py computes it), or A as it comes (uint8 / int8 with its zero point, or the centered
 * float32 values of a DynQuantize), the exact integer product with B's blocks (qblock.h), B's and
 * A's zero points taken back, and either the int32 sums or float32(sum) * float32(a_scale *
 * b_scale[n]) [+ bias[n]], rounded step by step as the unfused Cast, Mul and Add (-ffp-contract=off).
 *
 * Work: rows in tiles of four (each weight vector loaded once for the four, VNNI builds), blocks in
 * chunks that stay in L2 while every row tile passes over them; two threads share the blocks (or,
 * for one block, the row tiles). Returns 0, or 1 when A's range is not finite (the caller's torch
 * path then gives what the formula gives), or 2 when memory runs out.
 */
#include "qblock.h"
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { A_DYNAMIC = 0, A_CENTERED = 1, A_U8 = 2, A_S8 = 3 }; /* A's kinds */
/* the output: int32 sums; float32(sum) * mult [+ bias] rounded twice (the unfused Mul and Add);
 * or fused, fma(float32(sum), mult, bias) rounded once (torch.addcmul's kernel, what QAttention's
 * torch path computes its projection with); or requantized to uint8 / int8 as onnxruntime's
 * QLinearMatMul does (MlasRequantizeOutput): round-half-even(float32(sum) * mult) + zero point,
 * saturated (the zero point comes as the bias' one value) */
enum { OUT_I32 = 0, OUT_F32 = 1, OUT_F32_FMA = 2, OUT_U8 = 3, OUT_S8 = 4 };

static inline void requant_row(const int32_t *a, const float *mu, float zp, int64_t cols, int s8, void *out) {
    const float lo = s8 ? -128.0f : 0.0f, hi = s8 ? 127.0f : 255.0f;
    int32_t q[BLOCK_COLS]; /* cols <= BLOCK_COLS; three plain loops, which the compiler vectorizes */
    for (int64_t j = 0; j < cols; j++) {
        float v = nearbyintf((float)a[j] * mu[j]) + zp;
        q[j] = (int32_t)(v < lo ? lo : (v > hi ? hi : v));
    }
    if (s8)
        for (int64_t j = 0; j < cols; j++) ((int8_t *)out)[j] = (int8_t)q[j];
    else
        for (int64_t j = 0; j < cols; j++) ((uint8_t *)out)[j] = (uint8_t)q[j];
}

#define CHUNK_BYTES (192 * 1024) /* of blocks a thread passes all rows over before the next chunk */

int qgemm_int8_weights(void) { return vnni_int8_weights(); }

/* Row i of A as the operand of a weight of group grp (uint8 for 4, centered int16 for 2), and the
 * operand's zero point (what the uint8 values hold beyond A - za). */
static void operand_row(int kind, const void *a, int64_t i, int64_t k, float scale, float zp, int64_t grp,
                        void *out) {
    if (kind == A_DYNAMIC) {
        quantize_row((const float *)a + i * k, k, scale, zp, grp, out);
        return;
    }
    for (int64_t j = 0; j < k; j++) {
        float v; /* A - za, exact in float32 */
        if (kind == A_CENTERED) v = ((const float *)a)[i * k + j];
        else if (kind == A_U8) v = (float)((const uint8_t *)a)[i * k + j] - zp;
        else v = (float)((const int8_t *)a)[i * k + j] - zp;
        if (grp == 4) ((uint8_t *)out)[j] = (uint8_t)(int32_t)(v + (kind == A_S8 ? zp + 128.0f : zp));
        else ((int16_t *)out)[j] = (int16_t)v;
    }
}

typedef struct {
    int64_t m, k, n, grp, kg, nblocks, kpad;
    const void *q;         /* A's operand rows: (m, kpad) of esize(grp) */
    int32_t qzp;           /* the uint8 operand's zero point (grp 4) */
    const void *blocks;    /* (nblocks, kg, BLOCK_COLS, grp) */
    const int32_t *colsum; /* (nblocks * BLOCK_COLS), grp 4 */
    int out_kind;
    const float *mult;     /* (n): float32(a_scale * b_scale[n]), OUT_F32 */
    const float *bias;     /* (n) or NULL */
    void *out;             /* (m, n) */
} Gemm;

#if defined(VNNI_512)
/* A full tile of 4 rows on VNNI: the sums stay in registers through the zero-point correction and
 * the finish (the store and reload of 16 accumulators cost as much as the product at small K). */
static void tile4_vnni(const Gemm *G, int64_t r0, int64_t blk) {
    const size_t qstride = (size_t)G->kpad * esize(G->grp);
    const char *q = (const char *)G->q + (size_t)r0 * qstride;
    /* sixteen named accumulators: an array of them was shuffled and spilled by the compiler */
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00,
            c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00;
    const char *q0 = q, *q1 = q + qstride, *q2 = q + 2 * qstride, *q3 = q + 3 * qstride;
#define ROW4(OP, R, QR)                                      \
    do {                                                     \
        __m512i qq = _mm512_set1_epi32(load_group(QR, g));  \
        c##R##0 = OP(c##R##0, qq, w0);                       \
        c##R##1 = OP(c##R##1, qq, w1);                       \
        c##R##2 = OP(c##R##2, qq, w2);                       \
        c##R##3 = OP(c##R##3, qq, w3);                       \
    } while (0)
    const int64_t vb = G->grp == 4 ? 64 : 32; /* values a vector: int8 or int16 */
    const size_t blk_bytes = (size_t)(G->kg * BLOCK_COLS * G->grp) * esize(G->grp);
    const char *w = (const char *)G->blocks + (size_t)blk * blk_bytes;
    for (int64_t g = 0; g < G->kg; g++) {
        const char *wp = w + g * 256; /* a group of every column: 256 bytes either way */
        __m512i w0 = _mm512_loadu_si512(wp), w1 = _mm512_loadu_si512(wp + 64);
        __m512i w2 = _mm512_loadu_si512(wp + 128), w3 = _mm512_loadu_si512(wp + 192);
        if (vb == 64) {
            ROW4(_mm512_dpbusd_epi32, 0, q0);
            ROW4(_mm512_dpbusd_epi32, 1, q1);
            ROW4(_mm512_dpbusd_epi32, 2, q2);
            ROW4(_mm512_dpbusd_epi32, 3, q3);
        } else {
            ROW4(_mm512_dpwssd_epi32, 0, q0);
            ROW4(_mm512_dpwssd_epi32, 1, q1);
            ROW4(_mm512_dpwssd_epi32, 2, q2);
            ROW4(_mm512_dpwssd_epi32, 3, q3);
        }
    }
#undef ROW4
    const __m512i c[4][4] = {{c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23}, {c30, c31, c32, c33}};
    const int64_t c0 = blk * BLOCK_COLS;
    for (int i = 0; i < 4; i++) {
        const int64_t j0 = c0 + 16 * i, left = G->n - j0;
        if (left <= 0) break;
        const __mmask16 mk = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        __m512i corr = _mm512_setzero_si512();
        if (G->grp == 4) /* sum (q + zp) w = sum q w + zp colsum(w) */
            corr = _mm512_mullo_epi32(_mm512_set1_epi32(G->qzp), _mm512_loadu_si512(G->colsum + j0));
        __m512 mu = _mm512_setzero_ps(), b = mu;
        if (G->out_kind != OUT_I32) {
            mu = _mm512_maskz_loadu_ps(mk, G->mult + j0);
            if (G->bias && G->out_kind < OUT_U8) b = _mm512_maskz_loadu_ps(mk, G->bias + j0);
        }
        for (int r = 0; r < 4; r++) {
            __m512i a = _mm512_sub_epi32(c[r][i], corr);
            if (G->out_kind >= OUT_U8) { /* requant_row's arithmetic, 16 at a time */
                const int s8 = G->out_kind == OUT_S8;
                __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), mu),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                v = _mm512_add_ps(v, _mm512_set1_ps(G->bias[0]));
                v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(s8 ? -128.0f : 0.0f)),
                                  _mm512_set1_ps(s8 ? 127.0f : 255.0f));
                const __m128i bytes = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)); /* in range: no saturation needed */
                _mm_mask_storeu_epi8((char *)G->out + (r0 + r) * G->n + j0, mk, bytes);
                continue;
            }
            if (G->out_kind == OUT_I32) {
                _mm512_mask_storeu_epi32((int32_t *)G->out + (r0 + r) * G->n + j0, mk, a);
                continue;
            }
            __m512 o;
            if (G->out_kind == OUT_F32_FMA) o = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), mu, b);
            else {
                o = _mm512_mul_ps(_mm512_cvtepi32_ps(a), mu);
                if (G->bias) o = _mm512_add_ps(o, b);
            }
            _mm512_mask_storeu_ps((float *)G->out + (r0 + r) * G->n + j0, mk, o);
        }
    }
}
#endif

/* the sums of rows r0 .. r0 + rows - 1 (rows <= 4) in block blk, finished into out */
static void tile(const Gemm *G, int64_t r0, int64_t rows, int64_t blk) {
#if defined(VNNI_512)
    if (rows == 4) {
        tile4_vnni(G, r0, blk);
        return;
    }
#endif
    const size_t per_blk = (size_t)(G->kg * BLOCK_COLS * G->grp) * esize(G->grp);
    const size_t qstride = (size_t)G->kpad * esize(G->grp);
    const void *w = (const char *)G->blocks + (size_t)blk * per_blk;
    const char *q = (const char *)G->q + (size_t)r0 * qstride;
    int32_t acc[4 * BLOCK_COLS];
    for (int64_t r = 0; r < rows; r++) block_product(G->kg, (int)G->grp, q + r * qstride, w, acc + r * BLOCK_COLS);
    const int64_t c0 = blk * BLOCK_COLS, cols = G->n - c0 < BLOCK_COLS ? G->n - c0 : BLOCK_COLS;
    const int32_t *cs = G->grp == 4 ? G->colsum + c0 : NULL;
    for (int64_t r = 0; r < rows; r++) {
        int32_t *a = acc + r * BLOCK_COLS;
        if (cs) /* sum (q + zp) w = sum q w + zp colsum(w) */
            for (int64_t j = 0; j < cols; j++) a[j] -= G->qzp * cs[j];
        if (G->out_kind == OUT_I32) {
            memcpy((int32_t *)G->out + (r0 + r) * G->n + c0, a, (size_t)cols * sizeof(int32_t));
            continue;
        }
        if (G->out_kind >= OUT_U8) {
            requant_row(a, G->mult + c0, G->bias[0], cols, G->out_kind == OUT_S8, (char *)G->out + (r0 + r) * G->n + c0);
            continue;
        }
        float *o = (float *)G->out + (r0 + r) * G->n + c0;
        const float *mu = G->mult + c0;
        if (G->out_kind == OUT_F32_FMA) {
            for (int64_t j = 0; j < cols; j++) o[j] = fmaf((float)a[j], mu[j], G->bias[c0 + j]);
        } else if (G->bias) {
            const float *b = G->bias + c0;
            for (int64_t j = 0; j < cols; j++) o[j] = (float)a[j] * mu[j] + b[j];
        } else {
            for (int64_t j = 0; j < cols; j++) o[j] = (float)a[j] * mu[j];
        }
    }
}

/* blocks [b0, b1) over every row, in chunks that stay in cache */
static void run_blocks(const Gemm *G, int64_t b0, int64_t b1, int64_t t0, int64_t t1) {
    const size_t per_blk = (size_t)(G->kg * BLOCK_COLS * G->grp) * esize(G->grp);
    int64_t chunk = (int64_t)(CHUNK_BYTES / per_blk);
    chunk = chunk < 1 ? 1 : chunk;
    for (int64_t c0 = b0; c0 < b1; c0 += chunk) {
        const int64_t c1 = c0 + chunk < b1 ? c0 + chunk : b1;
        for (int64_t t = t0; t < t1; t++) {
            const int64_t r0 = 4 * t, rows = G->m - r0 < 4 ? G->m - r0 : 4;
            for (int64_t blk = c0; blk < c1; blk++) tile(G, r0, rows, blk);
        }
    }
}

/* A (m, k) of kind a_kind (float32 for A_DYNAMIC / A_CENTERED, else uint8 / int8), its zero point
 * a_zp (A_CENTERED: the uint8 zero point its values had) and scale a_scale (both computed for
 * A_DYNAMIC) times B's blocks; out (m, n) int32 sums or float32 (sum * float32(a_scale *
 * b_scale[n * bs_step]) [+ bias[n]], out_kind says how rounded; OUT_F32_FMA needs a bias), or
 * uint8 / int8 requantized (OUT_U8 / OUT_S8: bias[0] the output's zero point). */
int qgemm(int64_t m, int64_t k, int64_t n, int64_t threads, int64_t a_kind, const void *a, double a_scale,
          int64_t a_zp, int64_t grp, int64_t kg, const void *blocks, const int32_t *colsum, int64_t out_kind,
          const float *b_scale, int64_t bs_step, const float *bias, void *out)
{
    float scale = (float)a_scale, zp = (float)a_zp;
    if (a_kind == A_DYNAMIC && qparams((const float *)a, m * k, &scale, &zp)) return 1;
    const int64_t kpad = kg * grp, nblocks = (n + BLOCK_COLS - 1) / BLOCK_COLS;
    void *q = calloc(1, (size_t)(m * kpad) * esize(grp) + 64);
    float *mult = out_kind != OUT_I32 ? malloc((size_t)n * sizeof(float)) : NULL;
    if (!q || (out_kind != OUT_I32 && !mult)) {
        free(q);
        free(mult);
        return 2;
    }
    if (mult)
        for (int64_t j = 0; j < n; j++) mult[j] = scale * b_scale[j * bs_step]; /* Mul(a_scale, b_scale) */
    /* the operand's zero point: uint8 values hold A - za + qzp */
    const float qzp = a_kind == A_S8 ? zp + 128.0f : zp;
#pragma omp parallel for num_threads(threads) if (threads > 1 && m * k >= 32768)
    for (int64_t i = 0; i < m; i++)
        operand_row((int)a_kind, a, i, k, scale, zp, grp, (char *)q + (size_t)(i * kpad) * esize(grp));
    Gemm G = {m, k, n, grp, kg, nblocks, kpad, q, (int32_t)qzp, blocks, colsum, (int)out_kind, mult, bias, out};
    const int64_t tiles = (m + 3) / 4;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int tid = 0, nt = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        if (nblocks >= nt) /* each thread its blocks: half the weight each */
            run_blocks(&G, nblocks * tid / nt, nblocks * (tid + 1) / nt, 0, tiles);
        else
            run_blocks(&G, 0, nblocks, tiles * tid / nt, tiles * (tid + 1) / nt);
    }
    free(q);
    free(mult);
    return 0;
}

/* qgemm with what depends on B, its scales and bias alone in c[0..9] (k, n, grp, kg, blocks,
 * colsum, out_kind, b_scale, bs_step, bias: addresses as integers, 0 for none), worked out once
 * per bound node: eight arguments a call through ctypes where seventeen cost ~1 us more. */
int qgemm_bound(const int64_t *c, int64_t m, int64_t threads, int64_t a_kind, const void *a, double a_scale,
                int64_t a_zp, void *out)
{
    return qgemm(m, c[0], c[1], threads, a_kind, a, a_scale, a_zp, c[2], c[3], (const void *)(intptr_t)c[4],
                 (const int32_t *)(intptr_t)c[5], c[6], (const float *)(intptr_t)c[7], c[8],
                 (const float *)(intptr_t)c[9], out);
}

/* DynamicQuantizeLinear of x[0:n] handed on centered, as float32 q - zp (fused_quant's DynQuantize,
 * whose values several products then read): scale_zp[0..1] its scale and zero point; 0, or 1 for
 * a non-finite range (the caller's torch path then). */
int dq_centered(const float *x, int64_t n, float *out, float *scale_zp) {
    float scale, zp;
    if (qparams(x, n, &scale, &zp)) return 1;
    for (int64_t i = 0; i < n; i++) out[i] = quantized_centered(x[i], scale, zp);
    scale_zp[0] = scale;
    scale_zp[1] = zp;
    return 0;
}

/* DynamicQuantizeLinear of x[0:n] as it is written: uint8 q (dq_centered's q + zp, qblock.h's
 * uint8 operand row); 0, or 1 for a non-finite range. */
int dq_u8(const float *x, int64_t n, uint8_t *out, float *scale_zp) {
    float scale, zp;
    if (qparams(x, n, &scale, &zp)) return 1;
    quantize_row(x, n, scale, zp, 4, out);
    scale_zp[0] = scale;
    scale_zp[1] = zp;
    return 0;
}

/* A batch of products of two 8-bit operands that both change every call (QLinearMatMul's
 * attention scores and weighted sums: no weight to lay out once): a (batch, m, k) and b (batch, k,
 * n) contiguous, uint8 or int8 each (a_s8, b_s8), per-tensor zero points; out (batch, m, n) int32
 * sums (OUT_I32) or requantized as requant_row does (OUT_U8 / OUT_S8 with mult and y_zp). Both are
 * centered into float32 first (B's columns padded to QB_COLS); tiles of 4 rows x 32 columns sum
 * float32 products in eight registers (independent chains: one chain's latency bound the loop
 * otherwise) over chunks of 256 k's, exact (|a - za|, |b - zb| <= 255: 256 * 255^2 < 2^24), each
 * chunk then added in int32. Returns 0, or 2 when memory runs out. */
#define QB_CHUNK 256
#define QB_COLS 32

static inline float qb_value(const void *p, int64_t i, int s8) {
    return s8 ? (float)((const int8_t *)p)[i] : (float)((const uint8_t *)p)[i];
}

static void qb_store(int32_t *s, int64_t cols, int out_kind, float mu, float zy, void *out, int64_t at) {
    if (out_kind == OUT_I32) {
        for (int64_t j = 0; j < cols; j++) ((int32_t *)out)[at + j] = s[j];
        return;
    }
    const float lo = out_kind == OUT_S8 ? -128.0f : 0.0f, hi = out_kind == OUT_S8 ? 127.0f : 255.0f;
    for (int64_t j = 0; j < cols; j++) {
        float v = nearbyintf((float)s[j] * mu) + zy;
        s[j] = (int32_t)(v < lo ? lo : (v > hi ? hi : v));
    }
    if (out_kind == OUT_S8)
        for (int64_t j = 0; j < cols; j++) ((int8_t *)out)[at + j] = (int8_t)s[j];
    else
        for (int64_t j = 0; j < cols; j++) ((uint8_t *)out)[at + j] = (uint8_t)s[j];
}

/* y[0:len] = x[at:at + len] - z as float32, then zeros up to padded (loops the compiler vectorizes) */
static void qb_center(const void *x, int64_t at, int64_t len, int s8, float z, float *y, int64_t padded) {
    if (s8) {
        const int8_t *p = (const int8_t *)x + at;
        for (int64_t j = 0; j < len; j++) y[j] = (float)p[j] - z;
    } else {
        const uint8_t *p = (const uint8_t *)x + at;
        for (int64_t j = 0; j < len; j++) y[j] = (float)p[j] - z;
    }
    for (int64_t j = len; j < padded; j++) y[j] = 0.0f;
}

/* s[i][0:QB_COLS] += sum over k in [c0, c1) of a4[i][k] * bb[k][0:QB_COLS], for four rows */
static void qb_tile(const float *const a4[4], const float *bb, int64_t np, int64_t c0, int64_t c1,
                    int32_t s[4][QB_COLS]) {
#if defined(__AVX512F__)
    __m512 x00 = _mm512_setzero_ps(), x01 = x00, x10 = x00, x11 = x00, x20 = x00, x21 = x00, x30 = x00, x31 = x00;
    for (int64_t kk = c0; kk < c1; kk++) {
        const __m512 w0 = _mm512_loadu_ps(bb + kk * np), w1 = _mm512_loadu_ps(bb + kk * np + 16);
        __m512 v = _mm512_set1_ps(a4[0][kk]);
        x00 = _mm512_fmadd_ps(v, w0, x00), x01 = _mm512_fmadd_ps(v, w1, x01);
        v = _mm512_set1_ps(a4[1][kk]);
        x10 = _mm512_fmadd_ps(v, w0, x10), x11 = _mm512_fmadd_ps(v, w1, x11);
        v = _mm512_set1_ps(a4[2][kk]);
        x20 = _mm512_fmadd_ps(v, w0, x20), x21 = _mm512_fmadd_ps(v, w1, x21);
        v = _mm512_set1_ps(a4[3][kk]);
        x30 = _mm512_fmadd_ps(v, w0, x30), x31 = _mm512_fmadd_ps(v, w1, x31);
    }
    const __m512 xs[4][2] = {{x00, x01}, {x10, x11}, {x20, x21}, {x30, x31}};
    for (int i = 0; i < 4; i++)
        for (int h = 0; h < 2; h++) { /* whole numbers: the conversion is exact */
            __m512i acc = _mm512_loadu_si512(s[i] + 16 * h);
            _mm512_storeu_si512(s[i] + 16 * h, _mm512_add_epi32(acc, _mm512_cvtps_epi32(xs[i][h])));
        }
#else
    float c[4][QB_COLS] = {{0}};
    for (int64_t kk = c0; kk < c1; kk++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < QB_COLS; j++) c[i][j] = fmaf(a4[i][kk], bb[kk * np + j], c[i][j]);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < QB_COLS; j++) s[i][j] += (int32_t)c[i][j];
#endif
}

int qbmm(int64_t batch, int64_t m, int64_t k, int64_t n, int64_t threads, const void *a, int64_t a_s8,
         int64_t za, const void *b, int64_t b_s8, int64_t zb, int64_t out_kind, double mult, int64_t y_zp,
         void *out)
{
    const int64_t np = (n + QB_COLS - 1) / QB_COLS * QB_COLS;
    float *bf = malloc((size_t)(batch * k * np + batch * m * k) * sizeof(float) + 64);
    if (!bf) return 2;
    float *af = bf + batch * k * np;
    const float fzb = (float)zb, fza = (float)za, mu = (float)mult, zy = (float)y_zp;
    const int big = threads > 1 && batch * k * (n + m) >= 65536;
#pragma omp parallel num_threads(threads) if (big)
    {
#pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < batch * k; i++)
            qb_center(b, i * n, n, (int)b_s8, fzb, bf + i * np, np);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < batch * m; i++)
            qb_center(a, i * k, k, (int)a_s8, fza, af + i * k, k);
    }
    const int64_t row_tiles = (m + 3) / 4, col_tiles = np / QB_COLS;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t t = 0; t < batch * row_tiles * col_tiles; t++) {
        const int64_t bi = t / (row_tiles * col_tiles), rt = t / col_tiles % row_tiles, ct = t % col_tiles;
        const int64_t r0 = bi * m + 4 * rt, rows = m - 4 * rt < 4 ? m - 4 * rt : 4, j0 = ct * QB_COLS;
        const float *a4[4]; /* rows past m read row r0 again: their sums are not stored */
        for (int i = 0; i < 4; i++) a4[i] = af + (r0 + (i < rows ? i : 0)) * k;
        int32_t s[4][QB_COLS] = {{0}};
        for (int64_t c0 = 0; c0 < k; c0 += QB_CHUNK)
            qb_tile(a4, bf + bi * k * np + j0, np, c0, c0 + QB_CHUNK < k ? c0 + QB_CHUNK : k, s);
        const int64_t cols = n - j0 < QB_COLS ? n - j0 : QB_COLS;
        for (int i = 0; i < rows; i++) qb_store(s[i], cols, (int)out_kind, mu, zy, out, (r0 + i) * n + j0);
    }
    free(bf);
    return 0;
}
