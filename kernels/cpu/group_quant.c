/* Linear layers computed from group-quantized weights on the CPU: y = x @ w.T + bias with
 * w[n, k] = q[n, k] * scale[n, k / G] + offset[n, k / G] (the form of
 * runtime/model_executor/layers/quantization/group_quant.py).
 *
 * bits 4: qweight uint8 [N, K / 2], input 2j in the low nibble of byte j and 2j + 1 in the high
 * one; bits 8: int8 [N, K]. scale and offset float32 [N, K / G] (offset may be NULL). G is a
 * multiple of 16 dividing K. x [M, K] rows with a row stride, y [M, N] rows with a row stride,
 * both of type x_dtype (dtypes.h: float32 or bfloat16; bias too, or NULL).
 *
 * Decode is bound by reading the weight: each weight row is read once for all M rows, unpacked 16
 * inputs at a time into float32 vectors, and the rows are split between threads (OpenMP: the .so
 * links libgomp.so.1, which resolves to the copy torch has already loaded, so both share one
 * thread pool). A 4-bit row holds inputs in nibble order (evens, odds); rather than shuffle the
 * weights, x is copied once per call in the same order within each 16-input chunk.
 *
 * group_quant_dequantize writes rows of the dense weight (large batches multiply it with torch).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtypes.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
#endif

typedef float v16f __attribute__((vector_size(64)));

enum { CHUNK = 16 };

/* The 16 integers of chunk c of a row as float32, in the order x is permuted to. With AVX-512 or
 * AVX2 by intrinsics: gcc turns __builtin_convertvector of bytes loaded from memory into one
 * conversion per lane. */
static inline __attribute__((always_inline)) v16f chunk_q(const uint8_t *restrict row, int64_t c, const int bits) {
#if defined(__AVX512F__) || defined(__AVX2__)
    __m128i b;
    if (bits == 8) {
        b = _mm_loadu_si128((const __m128i *)(row + c * CHUNK));
    } else {
        const __m128i packed = _mm_loadl_epi64((const __m128i *)(row + c * (CHUNK / 2))), mask = _mm_set1_epi8(15);
        b = _mm_unpacklo_epi64(_mm_and_si128(packed, mask), _mm_and_si128(_mm_srli_epi16(packed, 4), mask));
    }
#if defined(__AVX512F__)
    return (v16f)_mm512_cvtepi32_ps(bits == 8 ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
#else
    const __m128i upper = _mm_unpackhi_epi64(b, b);
    const __m256 lo = _mm256_cvtepi32_ps(bits == 8 ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
    const __m256 hi = _mm256_cvtepi32_ps(bits == 8 ? _mm256_cvtepi8_epi32(upper) : _mm256_cvtepu8_epi32(upper));
    v16f v;
    memcpy(&v, &lo, sizeof lo);
    memcpy((float *)&v + 8, &hi, sizeof hi);
    return v;
#endif
#else
    v16f v;
    for (int l = 0; l < CHUNK; l++) {
        const int k = l < CHUNK / 2 ? 2 * l : 2 * (l - CHUNK / 2) + 1; /* evens in the low nibbles */
        v[l] = bits == 8 ? (float)((const int8_t *)row)[c * CHUNK + l]
                         : (float)((row[c * (CHUNK / 2) + k / 2] >> (4 * (k & 1))) & 15);
    }
    return v;
#endif
}

static inline float reduce(v16f v) {
    float s = 0.0f;
    for (int l = 0; l < CHUNK; l++) s += v[l];
    return s;
}

static inline v16f load16(const float *restrict p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* One weight row against one x row, dequantizing in registers (decode's single row). */
static inline __attribute__((always_inline)) float row_dot(const uint8_t *restrict q, const float *restrict scale,
                                                           const float *restrict offset, const float *restrict x,
                                                           int K, const int G, const int bits) {
    v16f acc[4] = {0};
    const int per_group = G / CHUNK;
    for (int g = 0; g < K / G; g++) {
        const float s = scale[g], o = offset ? offset[g] : 0.0f;
        for (int j = 0; j < per_group; j++) {
            const int64_t c = (int64_t)g * per_group + j;
            const v16f w = chunk_q(q, c, bits) * s + o;
            acc[j & 3] += w * load16(x + c * CHUNK);
        }
    }
    return reduce((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

/* One weight row dequantized into w (float32, x's permuted order), for several x rows. */
static inline __attribute__((always_inline)) void dequantize_row(const uint8_t *restrict q, const float *restrict scale,
                                                                 const float *restrict offset, float *restrict w,
                                                                 int K, const int G, const int bits) {
    const int per_group = G / CHUNK;
    for (int g = 0; g < K / G; g++) {
        const float s = scale[g], o = offset ? offset[g] : 0.0f;
        for (int j = 0; j < per_group; j++) {
            const int64_t c = (int64_t)g * per_group + j;
            const v16f v = chunk_q(q, c, bits) * s + o;
            memcpy(w + c * CHUNK, &v, sizeof v);
        }
    }
}

static inline float dot(const float *restrict a, const float *restrict b, int K) {
    v16f acc[4] = {0};
    int c = 0;
    for (; c + 4 * CHUNK <= K; c += 4 * CHUNK)
        for (int u = 0; u < 4; u++) acc[u] += load16(a + c + u * CHUNK) * load16(b + c + u * CHUNK);
    for (; c < K; c += CHUNK) acc[0] += load16(a + c) * load16(b + c);
    return reduce((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

typedef struct {
    const float *x; /* [M, K] float32, permuted */
    void *y;
    int64_t y_stride;
    int dtype;
    const uint8_t *qweight;
    const float *scale, *offset;
    const void *bias;
    int M, N, K;
} Linear;

static inline __attribute__((always_inline)) void linear_rows(const Linear *p, float *restrict w, const int G,
                                                              const int bits) {
    const int64_t row_bytes = (int64_t)p->K * bits / 8, groups = p->K / G;
#pragma omp for schedule(static)
    for (int n = 0; n < p->N; n++) {
        const uint8_t *q = p->qweight + n * row_bytes;
        const float *s = p->scale + n * groups, *o = p->offset ? p->offset + n * groups : NULL;
        const float b = p->bias ? load_one(p->bias, n, p->dtype, NULL) : 0.0f;
        if (p->M == 1) {
            store_one(p->y, n, row_dot(q, s, o, p->x, p->K, G, bits) + b, p->dtype);
            continue;
        }
        dequantize_row(q, s, o, w, p->K, G, bits);
        for (int m = 0; m < p->M; m++)
            store_one(p->y, m * p->y_stride + n, dot(w, p->x + (int64_t)m * p->K, p->K) + b, p->dtype);
    }
}

/* Group sizes as constants for the common ones: the group loop then unrolls into whole chunks. */
#define FOR_GROUP(CALL, G_VAR, BITS)                                  \
    switch (G_VAR) {                                                  \
    case 16: CALL(16, BITS); break;                                   \
    case 32: CALL(32, BITS); break;                                   \
    case 64: CALL(64, BITS); break;                                   \
    case 128: CALL(128, BITS); break;                                 \
    default: CALL(G_VAR, BITS); break;                                \
    }

/* x row -> float32, each 16-input chunk as [evens, odds] for 4-bit weights. */
static void permute_row(const void *x, int64_t offset, int dtype, float *restrict out, int K, int bits) {
    for (int c = 0; c < K; c += CHUNK)
        for (int l = 0; l < CHUNK; l++) {
            const int src = bits == 8 ? l : l < CHUNK / 2 ? 2 * l : 2 * (l - CHUNK / 2) + 1;
            out[c + l] = dtype == F32 ? ((const float *)x)[offset + c + src] : load_one(x, offset + c + src, BF16, NULL);
        }
}

/* Returns 0, or -1 when scratch memory cannot be allocated. */
int group_quant_linear(const void *x, int64_t x_stride, int dtype, void *y, int64_t y_stride,
                       const uint8_t *qweight, const float *scale, const float *offset, const void *bias,
                       int M, int N, int K, int group, int bits, int threads) {
    float *xf = malloc(sizeof(float) * (size_t)M * K);
    float *rows = M > 1 ? malloc(sizeof(float) * (size_t)threads * K) : NULL; /* a row per thread */
    if (!xf || (M > 1 && !rows)) {
        free(xf), free(rows);
        return -1;
    }
    const Linear p = {xf, y, y_stride, dtype, qweight, scale, offset, bias, M, N, K};
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) permute_row(x, (int64_t)m * x_stride, dtype, xf + (int64_t)m * K, K, bits);
        float *w = rows ? rows + (int64_t)omp_get_thread_num() * K : NULL;
#define LINEAR(G, BITS) linear_rows(&p, w, G, BITS)
        if (bits == 4) FOR_GROUP(LINEAR, group, 4) else FOR_GROUP(LINEAR, group, 8)
#undef LINEAR
    }
    free(xf), free(rows);
    return 0;
}

typedef uint32_t v16u32 __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));

/* 16 float32 to out[i ..] of out_dtype; bfloat16 rounded to nearest even (NaN stays NaN), as
 * f32_to_bf16 in dtypes.h, on whole vectors. */
static inline __attribute__((always_inline)) void store16(void *restrict out, int64_t i, v16f v, const int out_dtype) {
    if (out_dtype == F32) {
        memcpy((float *)out + i, &v, sizeof v);
        return;
    }
    const v16u32 bits = (v16u32)v;
    const v16u32 rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const v16u32 nan = (bits >> 16) | 0x40u;
    const v16u32 is_nan = (v16u32)((bits & 0x7fffffffu) > 0x7f800000u); /* all ones where NaN */
    const v16u16 half = __builtin_convertvector((nan & is_nan) | (rounded & ~is_nan), v16u16);
    memcpy((uint16_t *)out + i, &half, sizeof half);
}

/* Rows n0 .. n1 of the dense weight, in natural input order, into out [n1 - n0, K] of out_dtype. */
static inline __attribute__((always_inline)) void dequantize_rows(const uint8_t *qweight, const float *scale,
                                                                  const float *offset, void *out, int n0, int n1,
                                                                  int K, const int G, const int bits,
                                                                  const int out_dtype) {
    const int64_t row_bytes = (int64_t)K * bits / 8, groups = K / G;
    const int per_group = G / CHUNK;
#pragma omp for schedule(static)
    for (int n = n0; n < n1; n++) {
        const uint8_t *q = qweight + n * row_bytes;
        const int64_t dst = (int64_t)(n - n0) * K;
        for (int g = 0; g < groups; g++) {
            const float s = scale[n * groups + g], o = offset ? offset[n * groups + g] : 0.0f;
            for (int j = 0; j < per_group; j++) {
                const int64_t c = (int64_t)g * per_group + j;
                v16f v = chunk_q(q, c, bits) * s + o;
                if (bits == 4) /* [evens, odds] back to input order */
                    v = __builtin_shufflevector(v, v, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
                store16(out, dst + c * CHUNK, v, out_dtype);
            }
        }
    }
}

int group_quant_dequantize(const uint8_t *qweight, const float *scale, const float *offset, void *out, int out_dtype,
                           int n0, int n1, int K, int group, int bits, int threads) {
#pragma omp parallel num_threads(threads)
    {
#define DEQUANT(G, BITS)                                                                                        \
    (out_dtype == F32 ? dequantize_rows(qweight, scale, offset, out, n0, n1, K, G, BITS, F32)                   \
                      : dequantize_rows(qweight, scale, offset, out, n0, n1, K, G, BITS, BF16))
        if (bits == 4) FOR_GROUP(DEQUANT, group, 4) else FOR_GROUP(DEQUANT, group, 8)
#undef DEQUANT
    }
    return 0;
}
