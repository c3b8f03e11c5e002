/* Elementwise float32 kernels where torch's CPU kernel is far off the machine's speed.
 *
 * tanh: torch's CPU tanh took ~3 ns an element a thread here (its sigmoid 0.5; onnxruntime's tanh
 * ~8x faster than torch's), and attention-style models apply it to (batch, T, T, hidden) tensors.
 * fastmath.h's tanh_approx, written to vectorize, within ~2 ulp:
 *   |x| <  0.55: tanh = e / (e + 2), e = expm1(2|x|) by its Taylor series to degree 11 (relative
 *               error < 1e-8 for 2|x| <= 1.1): no cancellation near 0;
 *   |x| >= 0.55: tanh = 1 - 2 / (exp(2|x|) + 1), exp by range reduction and a degree-7 polynomial
 *               (|tanh| >= 0.5 there, so the absolute error of ~1e-7 is ~2 ulp);
 * the sign copied from x (tanh(-0) = -0); NaN stays NaN, +-inf gives +-1.
 */
#include <math.h>
#include "fastmath.h"
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

void tanh_f32(const float *x, float *y, int64_t n, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = tanh_approx(x[i]);
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
