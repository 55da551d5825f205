/* Element types shared by the CPU kernels, and float32 <-> storage conversions. */
#ifndef INFERNETES_CPU_DTYPES_H
#define INFERNETES_CPU_DTYPES_H
#include <stdint.h>
#include <string.h>

enum { F32 = 0, BF16 = 1, F16 = 2, BYTE_LUT = 3 };

/* Round to nearest even; NaN stays NaN. Branch-free, so loops around it vectorise. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? (bits >> 16) | 0x40u : rounded);
}

/* Row of `n` elements of type `dtype` at `src` -> float32 `dst`. Always inlined with a constant
 * `dtype`, so each instantiation is one straight loop the compiler vectorises. */
static inline __attribute__((always_inline)) void load_row(const void *restrict src, const int dtype,
                                                           const float *restrict lut, float *restrict dst,
                                                           const int n) {
    if (dtype == F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == BF16) {
        const uint16_t *restrict s = (const uint16_t *)src;
        uint32_t *restrict d = (uint32_t *)dst;
        for (int i = 0; i < n; i++) d[i] = (uint32_t)s[i] << 16;
    } else if (dtype == F16) {
        const _Float16 *restrict s = (const _Float16 *)src;
        for (int i = 0; i < n; i++) dst[i] = (float)s[i];
    } else {
        const uint8_t *restrict s = (const uint8_t *)src;
        for (int i = 0; i < n; i++) dst[i] = lut[s[i]];
    }
}

static inline void store_row(const float *restrict src, int dtype, void *restrict dst, int n) {
    if (dtype == F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == BF16) {
        uint16_t *restrict d = (uint16_t *)dst;
        for (int i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
    } else {
        _Float16 *restrict d = (_Float16 *)dst;
        for (int i = 0; i < n; i++) d[i] = (_Float16)src[i];
    }
}

static inline size_t element_size(int dtype) { return dtype == F32 ? 4 : dtype == BYTE_LUT ? 1 : 2; }

/* `v` rounded to `dtype` and back: torch rounds after every elementwise op in bf16/fp16, and the
 * kernels that must give torch's bits do the same. */
static inline __attribute__((always_inline)) float round_to(float v, const int dtype) {
    if (dtype == BF16) {
        uint32_t bits = (uint32_t)f32_to_bf16(v) << 16;
        memcpy(&v, &bits, sizeof v);
    } else if (dtype == F16) {
        v = (float)(_Float16)v;
    }
    return v;
}
#endif
