/* Element types shared by the CPU kernels, and float32 <-> storage conversions. */
#ifndef INFERNETES_CPU_DTYPES_H
#define INFERNETES_CPU_DTYPES_H
#include <stdint.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

enum { F32 = 0, BF16 = 1, F16 = 2, BYTE_LUT = 3 };

/* Round to nearest even; NaN stays NaN. Branch-free, so loops around it vectorise. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? (bits >> 16) | 0x40u : rounded);
}

/* Element `i` of `base` (type `dtype`) as float32; one-byte types go through `lut`. Always
 * inlined with a constant `dtype`, so loops around it vectorise. */
static inline __attribute__((always_inline)) float load_one(const void *restrict base, int64_t i, const int dtype,
                                                            const float *restrict lut) {
    if (dtype == F32) return ((const float *)base)[i];
    if (dtype == BF16) {
        const uint32_t bits = (uint32_t)((const uint16_t *)base)[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    if (dtype == F16) return (float)((const _Float16 *)base)[i];
    return lut[((const uint8_t *)base)[i]];
}

static inline __attribute__((always_inline)) void store_one(void *restrict base, int64_t i, float v, const int dtype) {
    if (dtype == F32) ((float *)base)[i] = v;
    else if (dtype == BF16) ((uint16_t *)base)[i] = f32_to_bf16(v);
    else ((_Float16 *)base)[i] = (_Float16)v;
}

/* Row of `n` elements of type `dtype` at `src` -> float32 `dst`, and back. */
static inline __attribute__((always_inline)) void load_row(const void *restrict src, const int dtype,
                                                           const float *restrict lut, float *restrict dst,
                                                           const int n) {
    if (dtype == F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    for (int i = 0; i < n; i++) dst[i] = load_one(src, i, dtype, lut);
}

static inline void store_row(const float *restrict src, int dtype, void *restrict dst, int n) {
    if (dtype == F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    for (int i = 0; i < n; i++) store_one(dst, i, src[i], dtype);
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
/* Elements first .. first + n of the scales (or offsets) at `base` of `dtype` (F32, or F16 as GGUF
 * stores them) as float32: those themselves when stored so, else widened (exactly) into `buf`.
 * NULL stays NULL. A row's scales are widened before its weights are read, so the arithmetic
 * after is the same code, and gives the same bits, for either dtype. */
static inline __attribute__((always_inline)) const float *scales_f32(const void *base, int64_t first, int64_t n,
                                                                    int dtype, float *restrict buf) {
    if (!base) return NULL;
    if (dtype == F32) return (const float *)base + first;
    const _Float16 *half = (const _Float16 *)base + first;
    int64_t i = 0;
    /* gcc leaves the plain loop scalar, a conversion per value; whole vectors instead (unmasked:
     * a masked store stalls the loads of the row's scales that follow it) */
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(buf + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(half + i))));
#endif
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(half + i))));
#endif
    for (; i < n; i++) buf[i] = (float)half[i];
    return buf;
}
#endif
