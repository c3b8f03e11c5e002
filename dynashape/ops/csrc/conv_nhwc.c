/* A dense 2-D convolution over channels-last float images, for any input size with nothing built per size.
 *
 * Why: torch's CPU convolution is oneDNN's, which builds a primitive (kernels JIT-compiled for the
 * shapes) for every input size a convolution meets (0.1-0.3 ms each) and then still costs ~30-90 us
 * a call before any arithmetic. A detection or OCR service sees a new image size on most calls, and
 * small images where that fixed cost is most of the work: YOLOv8n at 96x96 took 7.8 ms a call in
 * oneDNN's convolutions and torch ops against onnxruntime's 1.9 (its MLAS kernels take any shape).
 * This kernel is a register tile of output pixels x output channels fed by broadcast input values
 * (the form of MLAS's and XNNPACK's direct convolutions): per (kernel row, kernel column, input
 * channel) it loads VB vectors of weights and multiplies them by R broadcast input values into R x VB
 * accumulators; then bias and activation on the tile and one store. Any size, stride, padding and
 * dilation; one group.
 *
 * Layouts: x [n][h][w] pixels of ``xstride`` floats of which the first ``c`` are read (torch's
 * channels_last; a wider pixel: a channel slice of a larger image, as YOLO's C2f blocks split theirs),
 * y [n][ho][wo] pixels of ``ystride`` floats of which the first ``oc`` are written;
 * wp: the weight packed by conv_nhwc_pack: [oc / L][kh][kw][c][L] (L = 16 lanes, zero-filled past oc).
 * act: 0 none, 1 relu, 2 hardswish, 3 silu (x * sigmoid(x)), 4 sigmoid, 5 leaky relu (alpha); then, where
 * ``affine``, scale * y + shift (the learnable affine blocks PP-LCNetV3 puts after its activations).
 *
 * Written with GCC's vector extensions: 16 floats a vector, one AVX-512 register, two AVX2 ones.
 */
#include <math.h>
#include <stdint.h>
/* the accumulation is the kernel: let a * b + c be one fused multiply-add (native.py builds every
 * C file with -ffp-contract=off for bit-exact elementwise kernels; this one is compared with a
 * tolerance, as oneDNN's convolutions are) */
#pragma GCC optimize("fp-contract=fast")
#include <stdlib.h>
#include <string.h>
#include "subnormal.h"

#define L 16
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));

#ifdef __AVX512F__
#define RT 12  /* pixels a tile of two channel blocks: 2 x 12 accumulators + 2 weights of 32 registers */
#define RT1 24 /* of one block */
#else
#define RT 6
#define RT1 12
#endif

static inline v16 splat(float v) { return (v16){v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v}; }

static inline v16 vload(const float *p) {
    v16 r;
    memcpy(&r, p, sizeof r);
    return r;
}

/* m ? a : b lane by lane (m: a comparison's all-ones or zero lanes; C has no vector ?:) */
static inline v16 vsel(i16v m, v16 a, v16 b) {
    i16v ia, ib, r;
    memcpy(&ia, &a, sizeof a);
    memcpy(&ib, &b, sizeof b);
    r = (ia & m) | (ib & ~m);
    v16 out;
    memcpy(&out, &r, sizeof out);
    return out;
}
static inline v16 vmax(v16 a, v16 b) { return vsel(a > b, a, b); }
static inline v16 vmin(v16 a, v16 b) { return vsel(a < b, a, b); }

/* exp(x) for x in float range: 2^k * p(r), r = x - k ln2 in [-ln2/2, ln2/2], degree-6 polynomial
 * (relative error ~2e-7); inputs clamped to [-87.3, 88.7] (beyond: 0 or inf as expf gives) */
static inline v16 vexp(v16 x) {
    x = vmin(vmax(x, splat(-87.33654f)), splat(88.72283f));
    v16 k = x * splat(1.44269504f);
    k = __builtin_convertvector(__builtin_convertvector(k + vsel(k >= 0, splat(0.5f), splat(-0.5f)), i16v), v16);
    v16 r = x - k * splat(0.693145752f) - k * splat(1.42860677e-6f);
    v16 p = splat(1.0f / 720.0f);
    p = p * r + splat(1.0f / 120.0f);
    p = p * r + splat(1.0f / 24.0f);
    p = p * r + splat(1.0f / 6.0f);
    p = p * r + splat(0.5f);
    p = p * r + splat(1.0f);
    p = p * r + splat(1.0f);
    i16v e = (__builtin_convertvector(k, i16v) + 127) << 23;
    v16 scale;
    memcpy(&scale, &e, sizeof scale);
    /* k = 128 (x near 88.7) overflows the exponent field: split the scale in two halves */
    return vsel(k > splat(127.0f), p * splat(1.7014118e38f) * splat(2.0f), p * scale);
}

static inline v16 activate(v16 v, int64_t act, float alpha) {
    switch (act) {
    case 1: return vmax(v, splat(0.0f));
    case 2: return v * vmin(vmax(v + splat(3.0f), splat(0.0f)), splat(6.0f)) * splat(1.0f / 6.0f);
    case 3: return v / (splat(1.0f) + vexp(-v));
    case 4: return splat(1.0f) / (splat(1.0f) + vexp(-v));
    case 5: return vsel(v > 0, v, v * splat(alpha));
    default: return v;
    }
}

/* Pack w [oc][c][kh][kw] (ONNX's layout) into [oc / L][kh][kw][c][L]. */
void conv_nhwc_pack(const float *w, float *wp, int64_t oc, int64_t c, int64_t kh, int64_t kw) {
    const int64_t blocks = (oc + L - 1) / L;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t ky = 0; ky < kh; ky++)
            for (int64_t kx = 0; kx < kw; kx++)
                for (int64_t i = 0; i < c; i++) {
                    float *d = wp + (((b * kh + ky) * kw + kx) * c + i) * L;
                    for (int64_t l = 0; l < L; l++) {
                        const int64_t o = b * L + l;
                        d[l] = o < oc ? w[((o * c + i) * kh + ky) * kw + kx] : 0.0f;
                    }
                }
}

typedef struct {
    const float *x;
    float *y;
    const float *wp;
    const float *b;
    int64_t h, w, c, xstride, oc, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, ystride, act;
    float alpha, scale, shift; /* leaky relu's slope; scale * activation + shift where ``affine`` */
    int64_t affine;
} conv_t;

/* The tile: R pixels from ox0 of output row oy of image i, VB channel blocks from block ob; every
 * tap of these pixels is inside the image's columns (the caller's interior range). */
#define TILE(R, VB)                                                                                       \
    static void tile_##R##_##VB(const conv_t *p, int64_t i, int64_t oy, int64_t ox0, int64_t ob) {        \
        v16 acc[R][VB];                                                                                   \
        for (int64_t v = 0; v < VB; v++) {                                                                \
            v16 bias = splat(0.0f);                                                                       \
            if (p->b) {                                                                                   \
                float t[L];                                                                               \
                for (int64_t l = 0; l < L; l++) {                                                         \
                    const int64_t o = (ob + v) * L + l;                                                   \
                    t[l] = o < p->oc ? p->b[o] : 0.0f;                                                    \
                }                                                                                         \
                bias = vload(t);                                                                          \
            }                                                                                             \
            for (int64_t k = 0; k < R; k++) acc[k][v] = bias;                                             \
        }                                                                                                 \
        const int64_t c = p->c, wstep = p->kh * p->kw * c * L, px = p->xstride, xs = p->sw * px;          \
        for (int64_t ky = 0; ky < p->kh; ky++) {                                                          \
            const int64_t iy = oy * p->sh + ky * p->dh;                                                   \
            for (int64_t kx = 0; kx < p->kw; kx++) {                                                      \
                const float *xr = p->x + ((i * p->h + iy) * p->w + ox0 * p->sw + kx * p->dw) * px;           \
                const float *wr = p->wp + ((ob * p->kh + ky) * p->kw + kx) * c * L;                       \
                for (int64_t ci = 0; ci < c; ci++) {                                                      \
                    v16 wv[VB];                                                                           \
                    for (int64_t v = 0; v < VB; v++) wv[v] = vload(wr + v * wstep + ci * L);              \
                    for (int64_t k = 0; k < R; k++) {                                                     \
                        const v16 xv = splat(xr[k * xs + ci]);                                            \
                        for (int64_t v = 0; v < VB; v++) acc[k][v] += xv * wv[v];                         \
                    }                                                                                     \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        store(p, i, oy, ox0, ob, VB, R, &acc[0][0], VB);                                                  \
    }

static void store(const conv_t *p, int64_t i, int64_t oy, int64_t ox0, int64_t ob, int64_t vb, int64_t r,
                  const v16 *acc, int64_t row) {
    for (int64_t k = 0; k < r; k++) {
        float *yp = p->y + ((i * p->ho + oy) * p->wo + ox0 + k) * p->ystride;
        for (int64_t v = 0; v < vb; v++) {
            v16 a = activate(acc[k * row + v], p->act, p->alpha);
            if (p->affine) a = a * splat(p->scale) + splat(p->shift);
            const int64_t o = (ob + v) * L;
            if (o + L <= p->oc) {
                memcpy(yp + o, &a, sizeof a);
            } else {
                float t[L];
                memcpy(t, &a, sizeof t);
                for (int64_t l = 0; o + l < p->oc; l++) yp[o + l] = t[l];
            }
        }
    }
}

TILE(RT, 2)
TILE(8, 2)
TILE(6, 2)
TILE(4, 2)
TILE(3, 2)
TILE(2, 2)
TILE(1, 2)
TILE(RT1, 1)
TILE(8, 1)
TILE(4, 1)
TILE(2, 1)
TILE(1, 1)

/* Output row oy of image i, channel blocks ob .. ob + vb - 1 (vb 1 or 2): tiles of decreasing width
 * (a row of 20 pixels: 12 + 8, not 12 + 4 + 4 single pixels at a quarter of the speed). */
static void row(const conv_t *p, int64_t i, int64_t oy, int64_t ob, int64_t vb) {
    int64_t ox = 0;
    const int64_t wo = p->wo;
    if (vb == 2) {
        for (; ox + RT <= wo; ox += RT) tile_RT_2(p, i, oy, ox, ob);
        for (; ox + 8 <= wo; ox += 8) tile_8_2(p, i, oy, ox, ob);
        for (; ox + 6 <= wo; ox += 6) tile_6_2(p, i, oy, ox, ob);
        for (; ox + 4 <= wo; ox += 4) tile_4_2(p, i, oy, ox, ob);
        for (; ox + 3 <= wo; ox += 3) tile_3_2(p, i, oy, ox, ob);
        for (; ox + 2 <= wo; ox += 2) tile_2_2(p, i, oy, ox, ob);
        for (; ox < wo; ox++) tile_1_2(p, i, oy, ox, ob);
    } else {
        for (; ox + RT1 <= wo; ox += RT1) tile_RT1_1(p, i, oy, ox, ob);
        for (; ox + 8 <= wo; ox += 8) tile_8_1(p, i, oy, ox, ob);
        for (; ox + 4 <= wo; ox += 4) tile_4_1(p, i, oy, ox, ob);
        for (; ox + 2 <= wo; ox += 2) tile_2_1(p, i, oy, ox, ob);
        for (; ox < wo; ox++) tile_1_1(p, i, oy, ox, ob);
    }
}

/* x copied into a zero border of ph rows and pw columns before (and what the taps reach after): the
 * tiles then never test a tap against the image's edges. Returns the copy (malloc) and its size.
 * ``planar``: x is [n][c][h][w] (torch's default layout: a network's input image), its channels
 * gathered into pixels by this copy, where a separate transposition to channels-last took another
 * pass over the image (a first layer of 3 channels at 640x640: 0.46 ms of 2.2 on a 2-core EPYC). */
static float *padded(const float *x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t xstride, int64_t hp,
                     int64_t wp, int64_t ph, int64_t pw, int64_t cp, int64_t threads, int64_t planar) {
    /* pixels of cp floats: the c channels, then zeros (a depthwise tile reads whole blocks of 16) */
    float *xp = (float *)malloc(sizeof(float) * (size_t)(n * hp * wp * cp));
    if (!xp) return NULL;
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && n * hp * wp * cp > 65536)
    for (int64_t r = 0; r < n * hp; r++) {
        const int64_t i = r / hp, y = r % hp - ph;
        float *d = xp + r * wp * cp;
        if (y < 0 || y >= h) {
            memset(d, 0, sizeof(float) * (size_t)(wp * cp));
            continue;
        }
        const int64_t right = wp - pw - w > 0 ? wp - pw - w : 0;
        memset(d, 0, sizeof(float) * (size_t)(pw * cp));
        const int64_t cols = w < wp - pw ? w : wp - pw;
        const float *src = x + (i * h + y) * w * xstride;
        if (planar) {
            for (int64_t ci = 0; ci < c; ci++) {
                const float *plane = x + ((i * c + ci) * h + y) * w;
                for (int64_t k = 0; k < cols; k++) d[(pw + k) * cp + ci] = plane[k];
            }
            if (cp > c)
                for (int64_t k = 0; k < cols; k++) memset(d + (pw + k) * cp + c, 0, sizeof(float) * (size_t)(cp - c));
        } else if (xstride == c && cp == c) {
            memcpy(d + pw * c, src, sizeof(float) * (size_t)(cols * c));
        } else {
            for (int64_t k = 0; k < cols; k++) {
                memcpy(d + (pw + k) * cp, src + k * xstride, sizeof(float) * (size_t)c);
                if (cp > c) memset(d + (pw + k) * cp + c, 0, sizeof(float) * (size_t)(cp - c));
            }
        }
        if (right) memset(d + (pw + w) * cp, 0, sizeof(float) * (size_t)(right * cp));
    }
    return xp;
}

int64_t conv_nhwc_f32(const float *x, float *y, const float *wp, const float *b, int64_t n, int64_t h, int64_t w,
                      int64_t c, int64_t xstride, int64_t oc, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                      int64_t ph, int64_t pw,
                      int64_t dh, int64_t dw, int64_t ho, int64_t wo, int64_t ystride, int64_t act, double alpha,
                      int64_t threads, int64_t affine, double scale, double shift, int64_t planar) {
    /* the rows and columns the taps reach, from -ph / -pw */
    const int64_t hp = (ho - 1) * sh + (kh - 1) * dh + 1, wpx = (wo - 1) * sw + (kw - 1) * dw + 1;
    float *xpad = NULL;
    if (ph || pw || hp > h || wpx > w || planar) {
        const int64_t hh = hp > h + ph ? hp : h + ph, ww = wpx > w + pw ? wpx : w + pw;
        xpad = padded(x, n, h, w, c, xstride, hh, ww, ph, pw, c, threads, planar);
        if (!xpad) return -1;
        x = xpad, h = hh, w = ww, xstride = c;
    }
    const conv_t p = {x, y, wp, b, h, w, c, xstride, oc, kh, kw, sh, sw, 0, 0, dh, dw, ho, wo, ystride, act,
                      (float)alpha, (float)scale, (float)shift, affine};
    const int64_t blocks = (oc + L - 1) / L, pairs = (blocks + 1) / 2;
    const int64_t work = n * ho * pairs;
    const double macs = (double)n * ho * wo * oc * c * kh * kw;
    /* a thread's share of the work is a run of consecutive items: channel pairs within a row when the
     * image is the larger operand (its rows are read once), rows within a pair when the weight is
     * (a pair's weights, kh * kw * c * 128 bytes, stay in the core's cache over the rows) */
    const int weight_major = (double)blocks * kh * kw * c * L > (double)n * h * w * c;
    #pragma omp parallel num_threads(threads) if (threads > 1 && macs > 2e5)
    {
        const unsigned csr = flush_subnormals();
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < work; t++) {
            const int64_t rows = n * ho;
            const int64_t pr = weight_major ? t / rows : t % pairs, rowi = weight_major ? t % rows : t / pairs;
            const int64_t ob = pr * 2, vb = blocks - ob >= 2 ? 2 : 1;
            row(&p, rowi / ho, rowi % ho, ob, vb);
        }
        restore_subnormals(csr);
    }
    free(xpad);
    return 0;
}

/* conv_nhwc_f32 with its integer arguments in one array, in its order (n, h, w, c, xstride, oc, kh, kw,
 * sh, sw, ph, pw, dh, dw, ho, wo, ystride, act, threads, affine, planar) and its float ones in another
 * (alpha, scale, shift): two foreign arguments where there were 24 (ops/cpu_conv_dense.py keeps the
 * arrays). */
int64_t conv_nhwc_run(const float *x, float *y, const float *wp, const float *b, const int64_t *a, const double *f) {
    return conv_nhwc_f32(x, y, wp, b, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12],
                         a[13], a[14], a[15], a[16], a[17], f[0], a[18], a[19], f[1], f[2], a[20]);
}

/* ---- depthwise: one group per channel, y[c] = sum over the taps of x[c] * w[tap][c] ----
 * Channels are the vector lanes (16 a block) and a tile is R pixels of one block: per tap, one
 * weight vector and R input vectors into R accumulators. The input is copied into a zero border
 * with its pixels widened to whole blocks (cp = c rounded up to 16; the copy is skipped where
 * nothing pads and c is whole blocks). wd: [kh][kw][cp] (dw_nhwc_pack). */
#ifdef __AVX512F__
#define RD 8
#else
#define RD 4
#endif

void dw_nhwc_pack(const float *w, float *wd, int64_t c, int64_t kh, int64_t kw) {
    const int64_t cp = (c + L - 1) / L * L;
    for (int64_t t = 0; t < kh * kw; t++)
        for (int64_t k = 0; k < cp; k++) wd[t * cp + k] = k < c ? w[k * kh * kw + t] : 0.0f;
}

#define DWTILE(R)                                                                                         \
    static void dw_tile_##R(const conv_t *p, int64_t i, int64_t oy, int64_t ox0, int64_t cb) {            \
        v16 acc[R];                                                                                       \
        float t[L];                                                                                       \
        for (int64_t l = 0; l < L; l++) t[l] = p->b && cb * L + l < p->oc ? p->b[cb * L + l] : 0.0f;       \
        for (int64_t k = 0; k < R; k++) acc[k] = vload(t);                                                \
        const int64_t px = p->xstride, xs = p->sw * px;                                                    \
        for (int64_t ky = 0; ky < p->kh; ky++) {                                                          \
            const int64_t iy = oy * p->sh + ky * p->dh;                                                   \
            for (int64_t kx = 0; kx < p->kw; kx++) {                                                      \
                const float *xr = p->x + ((i * p->h + iy) * p->w + ox0 * p->sw + kx * p->dw) * px + cb * L; \
                const v16 wv = vload(p->wp + (ky * p->kw + kx) * px + cb * L);                            \
                for (int64_t k = 0; k < R; k++) acc[k] += vload(xr + k * xs) * wv;                        \
            }                                                                                             \
        }                                                                                                 \
        store(p, i, oy, ox0, cb, 1, R, acc, 1);                                                           \
    }

DWTILE(RD)
DWTILE(4)
DWTILE(2)
DWTILE(1)

static void dw_row(const conv_t *p, int64_t i, int64_t oy, int64_t cb) {
    int64_t ox = 0;
    for (; ox + RD <= p->wo; ox += RD) dw_tile_RD(p, i, oy, ox, cb);
    for (; ox + 4 <= p->wo; ox += 4) dw_tile_4(p, i, oy, ox, cb);
    for (; ox + 2 <= p->wo; ox += 2) dw_tile_2(p, i, oy, ox, cb);
    for (; ox < p->wo; ox++) dw_tile_1(p, i, oy, ox, cb);
}

/* conv_nhwc_run's arguments (oc = c, the weight from dw_nhwc_pack). */
int64_t dw_nhwc_run(const float *x, float *y, const float *wd, const float *b, const int64_t *a, const double *f) {
    const int64_t n = a[0], c = a[3], xstride = a[4], kh = a[6], kw = a[7], sh = a[8], sw = a[9], ph = a[10],
                  pw = a[11], dh = a[12], dw = a[13], ho = a[14], wo = a[15], threads = a[18];
    int64_t h = a[1], w = a[2];
    const int64_t cp = (c + L - 1) / L * L;
    const int64_t hp = (ho - 1) * sh + (kh - 1) * dh + 1, wpx = (wo - 1) * sw + (kw - 1) * dw + 1;
    float *xpad = NULL;
    int64_t px = xstride;
    if (ph || pw || hp > h || wpx > w || cp != c || xstride != c) {
        const int64_t hh = hp > h + ph ? hp : h + ph, ww = wpx > w + pw ? wpx : w + pw;
        xpad = padded(x, n, h, w, c, xstride, hh, ww, ph, pw, cp, threads, 0);
        if (!xpad) return -1;
        x = xpad, h = hh, w = ww, px = cp;
    }
    const conv_t p = {x, y, wd, b, h, w, c, px, c, kh, kw, sh, sw, 0, 0, dh, dw, ho, wo, a[16], a[17],
                      (float)f[0], (float)f[1], (float)f[2], a[19]};
    const int64_t blocks = cp / L, work = n * ho * blocks;
    const double macs = (double)n * ho * wo * c * kh * kw;
    #pragma omp parallel num_threads(threads) if (threads > 1 && macs > 2e5)
    {
        const unsigned csr = flush_subnormals();
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < work; t++) dw_row(&p, (t / blocks) / ho, (t / blocks) % ho, t % blocks);
        restore_subnormals(csr);
    }
    free(xpad);
    return 0;
}
