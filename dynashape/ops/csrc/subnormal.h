/* Subnormal floats as zero in a kernel's threads (the x86 flush-to-zero and denormals-are-zero modes,
 * set per thread and put back: OpenMP's threads each call both). An operand or a product below
 * 2^-126 otherwise takes a microcode assist, ~100x a normal multiply-add. PP-OCRv6 det's weights are
 * 10% subnormal (pruned to tiny values): its 768 -> 384 1x1 at 15x10 pixels took 14-34 ms a call
 * in conv_nhwc.c instead of 0.34. OpenVINO's CPU plugin flushes them too; a subnormal's contribution
 * is below 2^-126 of the output's scale. No-ops where the CPU is not x86. */
#ifndef DYNASHAPE_SUBNORMAL_H
#define DYNASHAPE_SUBNORMAL_H
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

static inline unsigned flush_subnormals(void) {
#if defined(__SSE__)
    const unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040); /* FTZ | DAZ */
    return old;
#else
    return 0;
#endif
}

static inline void restore_subnormals(unsigned old) {
#if defined(__SSE__)
    _mm_setcsr(old);
#else
    (void)old;
#endif
}
#endif
