/* onnxruntime's float32 logistic and tanh, bit for bit (its CPU Sigmoid and Tanh ops, and the gates of
 * its LSTM / DynamicQuantizeLSTM, all call MLAS's MlasComputeLogistic / MlasComputeTanh).
 *
 * Why not any correctly rounded function: a quantized model rounds what these produce. A SiLU
 * (x * Sigmoid(x)) feeding DynamicQuantizeLinear, or an LSTM's h quantized for the next step's
 * product, sets a scale from the largest value; one ulp there moves the scale by one ulp, a weight
 * or bias quantized by it rounds to the next integer, and every later layer moves (issue 35: 0.26
 * at the logits of a captcha OCR model, whose first difference was a Sigmoid one ulp off).
 *
 * Both are the rational approximations MLAS evaluates (Eigen's coefficients): x clamped, then odd
 * polynomial p(x) over even q(x) in x^2, each step a fused multiply-add as MLAS's x86-64 FMA3
 * kernels (and its NEON ones) compute them; fmaf() is that instruction when -march has FMA and
 * an exact library call otherwise, so the bits are the same on every CPU. The logistic adds 1/2
 * and keeps the result >= 0 (the FMA3 kernel's only clamp); NaN stays NaN (the clamps' order
 * passes it through, as the x86 min / max instructions do). Checked against onnxruntime's own
 * Sigmoid and Tanh (tests/ops/test_ort_activations.py). */
#ifndef DYNASHAPE_ORT_MATH_H
#define DYNASHAPE_ORT_MATH_H
#include <math.h>

static inline float ort_logistic(float x) {
    float v = x < -18.0f ? -18.0f : x;
    v = v > 18.0f ? 18.0f : v;
    const float v2 = v * v;
    float p = fmaf(v2, 4.37031012579801e-11f, 1.15627324459942e-07f);
    p = fmaf(v2, p, 6.08574864600143e-05f);
    p = fmaf(v2, p, 8.51377133304701e-03f);
    p = fmaf(v2, p, 2.48287947061529e-01f);
    float q = fmaf(v2, 6.10247389755681e-13f, 5.76102136993427e-09f);
    q = fmaf(v2, q, 6.29106785017040e-06f);
    q = fmaf(v2, q, 1.70198817374094e-03f);
    q = fmaf(v2, q, 1.16817656904453e-01f);
    q = fmaf(v2, q, 9.93151921023180e-01f);
    const float r = (v * p) / q + 0.5f;
    return 0.0f > r ? 0.0f : r;
}

static inline float ort_tanh(float x) {
    float v = x < -9.0f ? -9.0f : x;
    v = v > 9.0f ? 9.0f : v;
    const float v2 = v * v;
    float p = fmaf(v2, -2.76076847742355e-16f, 2.00018790482477e-13f);
    p = fmaf(v2, p, -8.60467152213735e-11f);
    p = fmaf(v2, p, 5.12229709037114e-08f);
    p = fmaf(v2, p, 1.48572235717979e-05f);
    p = fmaf(v2, p, 6.37261928875436e-04f);
    p = fmaf(v2, p, 4.89352455891786e-03f);
    float q = fmaf(v2, 1.19825839466702e-06f, 1.18534705686654e-04f);
    q = fmaf(v2, q, 2.26843463243900e-03f);
    q = fmaf(v2, q, 4.89352518554385e-03f);
    return (v * p) / q;
}

#endif
