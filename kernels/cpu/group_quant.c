/* Linear layers computed from group-quantized weights on the CPU: y = x @ w.T + bias with
 * w[n, k] = q[n, k] * scale[n, k / G] + offset[n, k / G] (the form of
 * runtime/model_executor/layers/quantization/group_quant.py).
 *
 * bits 4: qweight uint8 [N, K / 2], input 2j in the low nibble of byte j and 2j + 1 in the high
 * one; bits 8: int8 [N, K]. scale and offset [N, K / G] (offset may be NULL) of scale_dtype:
 * float32, or float16 as GGUF's blocks store them (a row's, or a pair's, widened before its
 * weights are read: dtypes.h's scales_f32). G is a multiple of 16 dividing K. x [M, K] rows with a
 * row stride, y [M, N] rows with a row stride, both of type x_dtype (dtypes.h: float32 or
 * bfloat16; bias too, or NULL).
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

/* Chunk c of a row dequantized: q * scale + offset of its group. */
static inline __attribute__((always_inline)) v16f chunk_w(const uint8_t *restrict q, const float *restrict scale,
                                                          const float *restrict offset, int64_t c, const int G,
                                                          const int bits) {
    const int64_t g = c / (G / CHUNK);
    return chunk_q(q, c, bits) * scale[g] + (offset ? offset[g] : 0.0f);
}

/* Whether 4-bit weights go 32 inputs per 16-byte load, each nibble looked up in a table of its
 * group's 16 dequantized values (a permute instead of a conversion and a multiply-add): AVX-512
 * and groups of whole 32s. x is then ordered [evens, odds] within each 32 inputs, not 16. */
#if defined(__AVX512F__)
#define TABLE_Q4(G, BITS) ((BITS) == 4 && (G) % 32 == 0)
#else
#define TABLE_Q4(G, BITS) 0
#endif

/* Inputs 32p .. 32p + 31 of a weight row dequantized, in x's order, as two vectors (zeros past
 * the row's last chunk). */
static inline __attribute__((always_inline)) void pair_w(const uint8_t *restrict q, const float *restrict scale,
                                                         const float *restrict offset, int64_t p, int chunks,
                                                         const int G, const int bits, v16f *lo, v16f *hi) {
#if defined(__AVX512F__)
    if (TABLE_Q4(G, bits)) {
        const int64_t g = p / (G / 32);
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512 table = _mm512_fmadd_ps(iota, _mm512_set1_ps(scale[g]), _mm512_set1_ps(offset ? offset[g] : 0.0f));
        const __m128i b = _mm_loadu_si128((const __m128i *)(q + 16 * p)), mask = _mm_set1_epi8(15);
        *lo = (v16f)_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, mask)), table);
        *hi = (v16f)_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), mask)), table);
        return;
    }
#endif
    *lo = chunk_w(q, scale, offset, 2 * p, G, bits);
    *hi = 2 * p + 1 < chunks ? chunk_w(q, scale, offset, 2 * p + 1, G, bits) : (v16f){0};
}

/* Dot products of one weight row w (in x's order) with R rows of x (R a constant, 1 to 4), a
 * vector each: every load of w serves R rows. K a multiple of 32 (rows are padded). (Pairs of
 * weight rows, as for bf16 below, measured slower in float32.) */
static inline __attribute__((always_inline)) void dots_f32(const float *restrict w, const float *restrict x,
                                                           int64_t x_stride, int K, float *out, const int R) {
    v16f acc[4][2] = {{{0}}};
    for (int c = 0; c < K; c += 2 * CHUNK)
        for (int u = 0; u < 2; u++) {
            const v16f wv = load16(w + c + u * CHUNK);
            for (int r = 0; r < R; r++) acc[r][u] += wv * load16(x + r * x_stride + c + u * CHUNK);
        }
    for (int r = 0; r < R; r++) out[r] = reduce(acc[r][0] + acc[r][1]);
}

/* One weight row against one x row, dequantizing in registers (decode's single row). */
static inline __attribute__((always_inline)) float row_dot_f32(const uint8_t *restrict q, const float *restrict scale,
                                                               const float *restrict offset, const float *restrict x,
                                                               int K, const int G, const int bits) {
    const int chunks = K / CHUNK;
    v16f acc[4] = {0};
    for (int64_t p = 0; p < (chunks + 1) / 2; p++) {
        v16f lo, hi;
        pair_w(q, scale, offset, p, chunks, G, bits, &lo, &hi);
        acc[2 * (p & 1)] += lo * load16(x + 32 * p);
        acc[2 * (p & 1) + 1] += hi * load16(x + 32 * p + CHUNK);
    }
    return reduce((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

/* One weight row dequantized into w (float32, x's order), for several x rows. */
static inline __attribute__((always_inline)) void dequantize_row_f32(const uint8_t *restrict q,
                                                                     const float *restrict scale,
                                                                     const float *restrict offset, float *restrict w,
                                                                     int K, const int G, const int bits) {
    const int chunks = K / CHUNK;
    for (int64_t p = 0; p < (chunks + 1) / 2; p++) {
        v16f lo, hi;
        pair_w(q, scale, offset, p, chunks, G, bits, &lo, &hi);
        memcpy(w + 32 * p, &lo, sizeof lo);
        memcpy(w + 32 * p + CHUNK, &hi, sizeof hi);
    }
}

#if defined(__AVX512BF16__)
/* bfloat16 activations: weights dequantized in float32, rounded to bfloat16 (as the reference's
 * dense weight is) and multiplied by the CPU's bf16 dot-product instruction, 32 products per
 * step summed in float32. */
#define HAVE_BF16_DOT 1

static inline __attribute__((always_inline)) __m512bh pair_bf16(const uint8_t *restrict q, const float *restrict scale,
                                                                const float *restrict offset, int64_t p, int chunks,
                                                                const int G, const int bits) {
    v16f lo, hi;
    pair_w(q, scale, offset, p, chunks, G, bits, &lo, &hi);
    return _mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo);
}

static inline __attribute__((always_inline)) float row_dot_bf16(const uint8_t *restrict q, const float *restrict scale,
                                                                const float *restrict offset,
                                                                const uint16_t *restrict x, int K, const int G,
                                                                const int bits) {
    const int chunks = K / CHUNK;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t p = 0; p < (chunks + 1) / 2; p++)
        acc[p & 3] = _mm512_dpbf16_ps(acc[p & 3], pair_bf16(q, scale, offset, p, chunks, G, bits),
                                      (__m512bh)_mm512_loadu_si512(x + 32 * p));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

static inline __attribute__((always_inline)) void dequantize_row_bf16(const uint8_t *restrict q,
                                                                      const float *restrict scale,
                                                                      const float *restrict offset, uint16_t *w,
                                                                      int K, const int G, const int bits) {
    const int chunks = K / CHUNK;
    for (int64_t p = 0; p < (chunks + 1) / 2; p++)
        _mm512_storeu_si512(w + 32 * p, (__m512i)pair_bf16(q, scale, offset, p, chunks, G, bits));
}

static inline __attribute__((always_inline)) void dots_bf16(const uint16_t *restrict w, int64_t w_stride,
                                                            const uint16_t *restrict x, int64_t x_stride, int K,
                                                            float out[2][4], const int NW, const int R) {
    __m512 acc[2][4];
    for (int i = 0; i < NW; i++)
        for (int r = 0; r < R; r++) acc[i][r] = _mm512_setzero_ps();
    for (int c = 0; c < K; c += 32) {
        __m512bh wv[2];
        for (int i = 0; i < NW; i++) wv[i] = (__m512bh)_mm512_loadu_si512(w + i * w_stride + c);
        for (int r = 0; r < R; r++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * x_stride + c);
            for (int i = 0; i < NW; i++) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], wv[i], xv);
        }
    }
    for (int i = 0; i < NW; i++)
        for (int r = 0; r < R; r++) out[i][r] = _mm512_reduce_add_ps(acc[i][r]);
}
#else
#define HAVE_BF16_DOT 0
#endif

typedef struct {
    const void *x; /* [M, width] permuted: float32, or bfloat16 for the bf16 dot product */
    int64_t width; /* K rounded up to 32 (zeros) */
    void *y;
    int64_t y_stride;
    int dtype, bf16_dot;
    const uint8_t *qweight;
    const void *scale, *offset; /* of scale_dtype */
    int scale_dtype;
    const void *bias;
    int M, N, K;
} Linear;

#define DOTS_R(KIND, W, X, NW, R, OUT) dots_##KIND(W, p->width, X, p->width, (int)p->width, OUT, NW, R)
#define DOTS(KIND, W, X, NW, R, OUT)                                                                          \
    switch ((NW) * 4 + (R)) {                                                                               \
    case 5: DOTS_R(KIND, W, X, 1, 1, OUT); break;                                                           \
    case 6: DOTS_R(KIND, W, X, 1, 2, OUT); break;                                                           \
    case 7: DOTS_R(KIND, W, X, 1, 3, OUT); break;                                                           \
    case 8: DOTS_R(KIND, W, X, 1, 4, OUT); break;                                                           \
    case 9: DOTS_R(KIND, W, X, 2, 1, OUT); break;                                                           \
    case 10: DOTS_R(KIND, W, X, 2, 2, OUT); break;                                                          \
    case 11: DOTS_R(KIND, W, X, 2, 3, OUT); break;                                                          \
    default: DOTS_R(KIND, W, X, 2, 4, OUT); break;                                                          \
    }

/* Weight rows in pairs (each x load serves both) against every x row; one x row: each weight row
 * dequantized in registers. */
static inline __attribute__((always_inline)) void linear_rows(const Linear *p, void *restrict rows, const int G,
                                                              const int bits, const int bf16_dot) {
    const int64_t row_bytes = (int64_t)p->K * bits / 8, groups = p->K / G;
    const size_t element = bf16_dot ? sizeof(uint16_t) : sizeof(float);
#pragma omp for schedule(static)
    for (int pair = 0; pair < (p->N + 1) / 2; pair++) {
        const int n0 = 2 * pair, nw = n0 + 1 < p->N ? 2 : 1;
        /* the pair's scales widened at once: whole vectors for the common shapes */
        float widened[2][2 * groups];
        const float *scales = scales_f32(p->scale, n0 * groups, nw * groups, p->scale_dtype, widened[0]);
        const float *offsets = scales_f32(p->offset, n0 * groups, nw * groups, p->scale_dtype, widened[1]);
        float out[2][4];
        for (int i = 0; i < nw; i++) {
            const int n = n0 + i;
            const uint8_t *q = p->qweight + n * row_bytes;
            const float *s = scales + i * groups, *o = offsets ? offsets + i * groups : NULL;
            void *row = (char *)rows + element * i * p->width;
            if (p->M == 1) {
#if HAVE_BF16_DOT
                if (bf16_dot) out[i][0] = row_dot_bf16(q, s, o, p->x, p->K, G, bits);
                else
#endif
                    out[i][0] = row_dot_f32(q, s, o, p->x, p->K, G, bits);
                continue;
            }
#if HAVE_BF16_DOT
            if (bf16_dot) dequantize_row_bf16(q, s, o, row, p->K, G, bits);
            else
#endif
                dequantize_row_f32(q, s, o, row, p->K, G, bits);
        }
        for (int m = 0; m < p->M; m += 4) {
            const int count = p->M - m < 4 ? p->M - m : 4;
            if (p->M > 1) {
#if HAVE_BF16_DOT
                if (bf16_dot) DOTS(bf16, (const uint16_t *)rows, (const uint16_t *)p->x + m * p->width, nw, count, out)
                else
#endif
                    for (int i = 0; i < nw; i++) {
                        const float *w = (const float *)rows + i * p->width, *x = (const float *)p->x + m * p->width;
                        switch (count) {
                        case 4: dots_f32(w, x, p->width, (int)p->width, out[i], 4); break;
                        case 3: dots_f32(w, x, p->width, (int)p->width, out[i], 3); break;
                        case 2: dots_f32(w, x, p->width, (int)p->width, out[i], 2); break;
                        default: dots_f32(w, x, p->width, (int)p->width, out[i], 1); break;
                        }
                    }
            }
            for (int i = 0; i < nw; i++) {
                const float b = p->bias ? load_one(p->bias, n0 + i, p->dtype, NULL) : 0.0f;
                for (int r = 0; r < count; r++)
                    store_one(p->y, (m + r) * p->y_stride + n0 + i, out[i][r] + b, p->dtype);
            }
        }
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

/* Position in x of lane l of 32 inputs: the weights' order. 4-bit weights hold [evens, odds] of
 * each 32 inputs (TABLE_Q4) or of each 16. */
static inline int source_lane(int l, int span, int bits) {
    if (bits == 8) return l;
    const int within = l % span, half = span / 2;
    return l - within + (within < half ? 2 * within : 2 * (within - half) + 1);
}

/* x row -> the kernel's row (float32, or bfloat16 for the bf16 dot product), zeros up to `width`. */
static void permute_row(const void *x, int64_t offset, int dtype, void *out, int K, int64_t width, int span,
                        int bits, int bf16_dot) {
    for (int k = 0; k < K; k++) {
        const int64_t src = offset + source_lane(k, span, bits);
        if (bf16_dot) ((uint16_t *)out)[k] = ((const uint16_t *)x)[src];
        else ((float *)out)[k] = dtype == F32 ? ((const float *)x)[src] : load_one(x, src, BF16, NULL);
    }
    const size_t element = bf16_dot ? sizeof(uint16_t) : sizeof(float);
    memset((char *)out + element * K, 0, element * (size_t)(width - K));
}

#if HAVE_BF16_DOT
/* One row of bfloat16 x against 4-bit weights in groups of whole 32s (decode's common case, GGUF
 * Q4_0/Q4_1 among them), with no conversion to float32: a nibble n becomes the bfloat16 of 128 + n
 * by one OR (0x4300 | n, exact: 128 + n needs 7 bits of mantissa), so
 *   sum_k (n_k * s + o) * x_k = s * dot(128 + n, x) + (o - 128 * s) * sum_k x_k
 * per group: the bf16 dot product runs on the packed nibbles, and the second term is a short dot
 * over the groups with x's group sums. 64 inputs (32 bytes) per step, two groups wide (each
 * vector's lanes 0-7 sum the first group, 8-15 the second), about half the instructions of
 * converting each nibble to float32. x is ordered per 64 inputs as [evens, odds]; a last group of
 * 32 alone as [its evens, 16 zeros, its odds, 16 zeros]. */
static inline __attribute__((always_inline)) float q4_row_dot(const uint8_t *restrict q, const float *restrict scale,
                                                              const float *restrict offset, const uint16_t *restrict x,
                                                              const float *restrict xsum, int K, const int G) {
    const __m256i mask = _mm256_set1_epi8(15);
    const __m512i magic = _mm512_set1_epi16(0x4300);
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int base = 0; base < K; base += 64) {
        const int whole = K - base >= 64;
        const __m256i b = whole ? _mm256_loadu_si256((const __m256i *)(q + base / 2))
                                : _mm256_maskz_loadu_epi8(0xffff, q + base / 2);
        const __m256i lo = _mm256_and_si256(b, mask), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
        const __m512bh wlo = (__m512bh)_mm512_or_si512(_mm512_cvtepu8_epi16(lo), magic);
        const __m512bh whi = (__m512bh)_mm512_or_si512(_mm512_cvtepu8_epi16(hi), magic);
        __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), wlo, (__m512bh)_mm512_loadu_si512(x + base));
        t = _mm512_dpbf16_ps(t, whi, (__m512bh)_mm512_loadu_si512(x + base + 32));
        const float s0 = scale[base / G], s1 = whole ? scale[(base + 32) / G] : 0.0f;
        const __m512 s = _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1);
        acc[(base / 64) & 1] = _mm512_fmadd_ps(t, s, acc[(base / 64) & 1]);
    }
    float total = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
    for (int g = 0; g < K / G; g++) total += ((offset ? offset[g] : 0.0f) - 128.0f * scale[g]) * xsum[g];
    return total;
}

static int q4_decode(const uint16_t *x, void *y, const uint8_t *qweight, const void *scale, const void *offset,
                     int scale_dtype, const void *bias, int N, int K, int G, int threads) {
    const int64_t width = (K + 63) / 64 * 64, groups = K / G;
    uint16_t *xs = malloc(sizeof(uint16_t) * width);
    float *xsum = malloc(sizeof(float) * groups);
    if (!xs || !xsum) {
        free(xs), free(xsum);
        return -1;
    }
    for (int base = 0; base < K; base += 64) {
        const int half = (K - base >= 64 ? 64 : 32) / 2;
        for (int j = 0; j < 32; j++) {
            xs[base + j] = j < half ? x[base + 2 * j] : 0;
            xs[base + 32 + j] = j < half ? x[base + 2 * j + 1] : 0;
        }
    }
    for (int g = 0; g < groups; g++) {
        float sum = 0.0f;
        for (int k = g * G; k < (g + 1) * G; k++) sum += load_one(x, k, BF16, NULL);
        xsum[g] = sum;
    }
    /* spans of rows handed out as threads come free, as in skinny_linear.c */
#pragma omp parallel for schedule(dynamic, 64) num_threads(threads)
    for (int n = 0; n < N; n++) {
        const uint8_t *q = qweight + (int64_t)n * K / 2;
        float widened[2][groups];
        const float *s = scales_f32(scale, n * groups, groups, scale_dtype, widened[0]);
        const float *o = scales_f32(offset, n * groups, groups, scale_dtype, widened[1]);
        float v;
        switch (G) {
        case 32: v = q4_row_dot(q, s, o, xs, xsum, K, 32); break;
        case 64: v = q4_row_dot(q, s, o, xs, xsum, K, 64); break;
        case 128: v = q4_row_dot(q, s, o, xs, xsum, K, 128); break;
        default: v = q4_row_dot(q, s, o, xs, xsum, K, G); break;
        }
        store_one(y, n, v + (bias ? load_one(bias, n, BF16, NULL) : 0.0f), BF16);
    }
    free(xs), free(xsum);
    return 0;
}
#endif

/* Returns 0, or -1 when scratch memory cannot be allocated. */
int group_quant_linear(const void *x, int64_t x_stride, int dtype, void *y, int64_t y_stride,
                       const uint8_t *qweight, const void *scale, const void *offset, const void *bias,
                       int scale_dtype, int M, int N, int K, int group, int bits, int threads) {
    const int bf16_dot = HAVE_BF16_DOT && dtype == BF16;
#if HAVE_BF16_DOT
    if (bf16_dot && M == 1 && bits == 4 && group % 32 == 0 && x_stride >= 0)
        return q4_decode(x, y, qweight, scale, offset, scale_dtype, bias, N, K, group, threads);
#endif
    const int64_t width = (K + 31) / 32 * 32;
    int span = CHUNK;
#define SPAN(G, BITS) span = TABLE_Q4(G, BITS) ? 32 : CHUNK
    if (bits == 4) FOR_GROUP(SPAN, group, 4)
#undef SPAN
    const size_t element = bf16_dot ? sizeof(uint16_t) : sizeof(float);
    char *xs = malloc(element * (size_t)M * width);
    char *rows = M > 1 ? malloc(element * (size_t)threads * 2 * width) : NULL; /* two rows per thread */
    if (!xs || (M > 1 && !rows)) {
        free(xs), free(rows);
        return -1;
    }
    const Linear p = {xs, width, y, y_stride, dtype, bf16_dot, qweight, scale, offset, scale_dtype, bias, M, N, K};
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++)
            permute_row(x, (int64_t)m * x_stride, dtype, xs + element * m * width, K, width, span, bits, bf16_dot);
        void *row = rows ? rows + element * omp_get_thread_num() * 2 * width : NULL;
#define LINEAR(G, BITS) bf16_dot ? linear_rows(&p, row, G, BITS, 1) : linear_rows(&p, row, G, BITS, 0)
        if (bits == 4) FOR_GROUP(LINEAR, group, 4) else FOR_GROUP(LINEAR, group, 8)
#undef LINEAR
    }
    free(xs), free(rows);
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
static inline __attribute__((always_inline)) void dequantize_rows(const uint8_t *qweight, const void *scale,
                                                                  const void *offset, int scale_dtype, void *out,
                                                                  int n0, int n1, int K, const int G, const int bits,
                                                                  const int out_dtype) {
    const int64_t row_bytes = (int64_t)K * bits / 8, groups = K / G;
    const int per_group = G / CHUNK;
#pragma omp for schedule(static)
    for (int n = n0; n < n1; n++) {
        const uint8_t *q = qweight + n * row_bytes;
        const int64_t dst = (int64_t)(n - n0) * K;
        float widened[2][groups];
        const float *row_scale = scales_f32(scale, n * groups, groups, scale_dtype, widened[0]);
        const float *row_offset = scales_f32(offset, n * groups, groups, scale_dtype, widened[1]);
        for (int g = 0; g < groups; g++) {
            const float s = row_scale[g], o = row_offset ? row_offset[g] : 0.0f;
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

int group_quant_dequantize(const uint8_t *qweight, const void *scale, const void *offset, int scale_dtype,
                           void *out, int out_dtype, int n0, int n1, int K, int group, int bits, int threads) {
#pragma omp parallel num_threads(threads)
    {
#define DEQUANT(G, BITS)                                                                                        \
    (out_dtype == F32 ? dequantize_rows(qweight, scale, offset, scale_dtype, out, n0, n1, K, G, BITS, F32)      \
                      : dequantize_rows(qweight, scale, offset, scale_dtype, out, n0, n1, K, G, BITS, BF16))
        if (bits == 4) FOR_GROUP(DEQUANT, group, 4) else FOR_GROUP(DEQUANT, group, 8)
#undef DEQUANT
    }
    return 0;
}
