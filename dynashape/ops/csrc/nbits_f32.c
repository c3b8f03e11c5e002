/* MatMulNBits with 4-bit weights and float32 A on the CPU, at an accuracy level other than 4
 * (onnxruntime computes those in float32 over the dequantized weights): A times the packed weight,
 * read as it is stored, 4 rows of A on one unpack of a block's weights. The dequantized float32 copy the op made instead
 * is 8x the weight's bytes (a 1B model: 4.4 GB), and a decode step reads every weight once.
 *
 * Layout (nbits_f32.py packs it once a weight): 16 outputs side by side, wcol (chunks, blocks,
 * bytes a block, 16): byte j of a block holds its values 2j (low nibble) and 2j + 1 (high); the
 * scales and the zero points by chunk (chunks, blocks, 16), float32. Per output and block the sum
 * is scale * (sum over the block of q * x - zero point * sum of x), in float32; the blocks' order
 * is K's. Not onnxruntime's bits (its order is its own): within float32 rounding of it.
 *
 * Built with -ffp-contract=off (ops/native.py): the fused multiply-adds are the explicit ones. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

int nbits_f32_available(void) { return 1; }

/* y[m, n] (+ bias) for rows [0, m_count) of a (m_count, k) and the packed weight of n_count outputs
 * (n_pad a multiple of 16), nb blocks of bs values (bs even, bs / 2 bytes a block). zp_c NULL: every
 * zero point 8. threads: OpenMP's for this call. 0, or -1 without memory for A's padded copy. */
int nbits_f32_gemm(int64_t n_count, int64_t n_pad, int64_t nb, int64_t bs, const uint8_t* wcol,
                   const float* scale_c, const float* zp_c, int64_t k, int64_t m_count, const float* a,
                   const float* bias, float* y, int64_t threads) {
    int64_t kp = nb * bs, half = bs / 2, chunks = n_pad / 16;
    /* A zero-padded to whole blocks, and each block's sum (the zero points' term) */
    float* xp = calloc((size_t)(m_count * kp + m_count * nb), sizeof(float));
    if (!xp) return -1;
    float* xsum = xp + m_count * kp;
    for (int64_t m = 0; m < m_count; m++) {
        memcpy(xp + m * kp, a + m * k, sizeof(float) * (size_t)k);
        for (int64_t b = 0; b < nb; b++) {
            float s = 0.0f;
            for (int64_t j = 0; j < bs; j++) s += xp[m * kp + b * bs + j];
            xsum[m * nb + b] = s;
        }
    }
    const __m512i nib = _mm512_set1_epi32(15);
    const __m512 eight = _mm512_set1_ps(8.0f);
    const __m512i lane16 = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t n0 = 16 * c;
        __mmask16 live = _mm512_cmplt_epi32_mask(_mm512_add_epi32(lane16, _mm512_set1_epi32((int)n0)),
                                                 _mm512_set1_epi32((int)n_count));
        const uint8_t* w = wcol + c * nb * half * 16;
        const float* sc = scale_c + c * nb * 16;
        const float* zc = zp_c ? zp_c + c * nb * 16 : NULL;
        /* rows 4 at a time: a block's weights unpacked once for the 4; each row's sums as a row alone has them */
        for (int64_t m0 = 0; m0 < m_count; m0 += 4) {
            int r = m_count - m0 < 4 ? (int)(m_count - m0) : 4;
            const float* x[4];
            for (int i = 0; i < 4; i++) x[i] = xp + (m0 + (i < r ? i : 0)) * kp;
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t* wb = w + b * half * 16;
                _mm_prefetch((const char*)(wb + nb * half * 16), _MM_HINT_T0);  /* the next chunk's block */
                /* two chains a row: the even and the odd values */
                __m512 s0[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
                __m512 s1[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
                for (int64_t j = 0; j < half; j++) {
                    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wb + 16 * j)));
                    __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, nib));
                    __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
#pragma GCC unroll 4
                    for (int i = 0; i < 4; i++) {
                        if (i >= r) break;
                        s0[i] = _mm512_fmadd_ps(lo, _mm512_set1_ps(x[i][b * bs + 2 * j]), s0[i]);
                        s1[i] = _mm512_fmadd_ps(hi, _mm512_set1_ps(x[i][b * bs + 2 * j + 1]), s1[i]);
                    }
                }
                __m512 z = zc ? _mm512_loadu_ps(zc + 16 * b) : eight;
                __m512 sb = _mm512_loadu_ps(sc + 16 * b);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    if (i >= r) break;
                    /* scale * (sum q * x - zero point * sum x) */
                    __m512 blk = _mm512_fnmadd_ps(z, _mm512_set1_ps(xsum[(m0 + i) * nb + b]),
                                                  _mm512_add_ps(s0[i], s1[i]));
                    acc[i] = _mm512_fmadd_ps(sb, blk, acc[i]);
                }
            }
            for (int i = 0; i < r; i++) {
                __m512 o = bias ? _mm512_add_ps(acc[i], _mm512_maskz_loadu_ps(live, bias + n0)) : acc[i];
                _mm512_mask_storeu_ps(y + (m0 + i) * n_count + n0, live, o);
            }
        }
    }
    free(xp);
    return 0;
}
#else
int nbits_f32_available(void) { return 0; }
#endif
