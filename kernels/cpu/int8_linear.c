/* Linear layers of few rows (decode) on Q8_0 weights with the activations quantized to int8, as
 * llama.cpp computes them: y = x @ w.T + bias with w[n, k] = q[n, k] * scale[n, k / 32].
 *
 * qweight int8 [N, K] and scale float32 [N, K / 32] (GGUF's Q8_0 blocks as group_quant.c holds
 * them, K a multiple of 32); x [M, K] and y [M, N] rows with a row stride, of type dtype (dtypes.h:
 * float32 or bfloat16; bias too, or NULL).
 *
 * Each x row is cut into blocks of 32, each quantized to int8 with one scale d = max|x| / 127
 * (q = x / d rounded to nearest), so a block's product is one integer dot product times both
 * scales: 32 products per 32 bytes of weight, no conversion of the weight to float. With
 * AVX-512 VNNI two blocks a step (vpdpbusd multiplies unsigned by signed bytes, so the weight goes
 * in as |q| and x takes q's sign: |q| of -128 is 128, and x's values, within +-127, negate
 * safely); with AVX2 one block by maddubs (pairs of products within int16: 2 * 128 * 127) and
 * madd; else scalar loops. Threads take spans of weight rows, as in skinny_linear.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtypes.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define VNNI512 1
#elif defined(__AVX2__)
#include <immintrin.h>
#define AVX2 1
#endif

enum { BLOCK = 32, ROWS = 4, SPAN = 32, PREFETCH_ROWS = 4 };

/* x rows quantized: int8 values [M, width] (zeros past K) and a scale per block [M, blocks]. */
typedef struct {
    int8_t *q;
    float *d;
    int64_t width, blocks;
} Quantized;

static void quantize_row(const void *x, int64_t offset, int dtype, int K, int8_t *q, float *d) {
    for (int b = 0; b < K / BLOCK; b++) {
        float v[BLOCK], amax = 0.0f;
        for (int j = 0; j < BLOCK; j++) {
            v[j] = load_one(x, offset + (int64_t)b * BLOCK + j, dtype, NULL);
            amax = fmaxf(amax, fabsf(v[j]));
        }
        const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        for (int j = 0; j < BLOCK; j++) q[b * BLOCK + j] = (int8_t)nearbyintf(v[j] * inverse);
        d[b] = scale;
    }
}

#if VNNI512
/* Lanes 0-7 the first float at p, lanes 8-15 the second (0 when only one block is left). */
static inline __m512 pair_scales(const float *p, int two) {
    const __m128 both = two ? _mm_castpd_ps(_mm_load_sd((const double *)p)) : _mm_load_ss(p);
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(both));
}

static inline __attribute__((always_inline)) void row_dots(const int8_t *restrict w, const float *restrict ws,
                                                           const Quantized *xq, int m, int blocks, float *out,
                                                           const int R) {
    __m512 acc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    for (int b = 0; b < blocks; b += 2) {
        const int two = blocks - b >= 2;
        const __mmask64 bytes = two ? ~(__mmask64)0 : 0xffffffffu;
        const __m512i wv = _mm512_maskz_loadu_epi8(bytes, w + (int64_t)b * BLOCK);
        const __mmask64 negative = _mm512_movepi8_mask(wv);
        const __m512i magnitude = _mm512_abs_epi8(wv);
        const __m512 wd = pair_scales(ws + b, two);
        for (int r = 0; r < R; r++) {
            const int8_t *x = xq->q + (m + r) * xq->width + (int64_t)b * BLOCK;
            __m512i xv = _mm512_maskz_loadu_epi8(bytes, x);
            xv = _mm512_mask_sub_epi8(xv, negative, zero, xv);
            const __m512 dots = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, magnitude, xv));
            const __m512 d = _mm512_mul_ps(wd, pair_scales(xq->d + (m + r) * xq->blocks + b, two));
            acc[r] = _mm512_fmadd_ps(dots, d, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}
#elif AVX2
static inline float sum8(__m256 v) {
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

static inline __attribute__((always_inline)) void row_dots(const int8_t *restrict w, const float *restrict ws,
                                                           const Quantized *xq, int m, int blocks, float *out,
                                                           const int R) {
    __m256 acc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int b = 0; b < blocks; b++) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + (int64_t)b * BLOCK));
        const __m256i magnitude = _mm256_sign_epi8(wv, wv);
        for (int r = 0; r < R; r++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq->q + (m + r) * xq->width + (int64_t)b * BLOCK));
            const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xv, wv));
            const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            acc[r] = _mm256_fmadd_ps(dots, _mm256_set1_ps(ws[b] * xq->d[(m + r) * xq->blocks + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = sum8(acc[r]);
}
#else
static inline __attribute__((always_inline)) void row_dots(const int8_t *restrict w, const float *restrict ws,
                                                           const Quantized *xq, int m, int blocks, float *out,
                                                           const int R) {
    for (int r = 0; r < R; r++) {
        const int8_t *x = xq->q + (m + r) * xq->width;
        float total = 0.0f;
        for (int b = 0; b < blocks; b++) {
            int32_t dot = 0;
            for (int j = b * BLOCK; j < (b + 1) * BLOCK; j++) dot += (int32_t)w[j] * x[j];
            total += (float)dot * (ws[b] * xq->d[(m + r) * xq->blocks + b]);
        }
        out[r] = total;
    }
}
#endif

/* Returns 0, or -1 when scratch memory cannot be allocated. */
int int8_linear(const void *x, int64_t x_stride, int dtype, void *y, int64_t y_stride, const int8_t *qweight,
                const float *scale, const void *bias, int M, int N, int K, int threads) {
    const int blocks = K / BLOCK;
    /* whole 64-byte steps: the last odd block's second half is read as zeros */
    Quantized xq = {NULL, NULL, (int64_t)(blocks + 1) / 2 * 2 * BLOCK, blocks};
    xq.q = calloc((size_t)M * xq.width, 1);
    xq.d = malloc(sizeof(float) * (size_t)M * blocks);
    if (!xq.q || !xq.d) {
        free(xq.q), free(xq.d);
        return -1;
    }
    for (int m = 0; m < M; m++) quantize_row(x, (int64_t)m * x_stride, dtype, K, xq.q + m * xq.width, xq.d + m * blocks);
#pragma omp parallel for schedule(dynamic, SPAN) num_threads(threads)
    for (int n = 0; n < N; n++) {
        const int8_t *w = qweight + (int64_t)n * K;
        /* the rows a few on: short rows end before the hardware's prefetcher ramps up */
        if (n + PREFETCH_ROWS < N)
            for (int k = 0; k < K; k += 64) __builtin_prefetch(w + (int64_t)PREFETCH_ROWS * K + k, 0, 0);
        const float *ws = scale + (int64_t)n * blocks;
        const float b = bias ? load_one(bias, n, dtype, NULL) : 0.0f;
        for (int m = 0; m < M; m += ROWS) {
            float out[ROWS];
            switch (M - m < ROWS ? M - m : ROWS) {
            case 4: row_dots(w, ws, &xq, m, blocks, out, 4); break;
            case 3: row_dots(w, ws, &xq, m, blocks, out, 3); break;
            case 2: row_dots(w, ws, &xq, m, blocks, out, 2); break;
            default: row_dots(w, ws, &xq, m, blocks, out, 1); break;
            }
            for (int r = 0; r < ROWS && m + r < M; r++) store_one(y, (int64_t)(m + r) * y_stride + n, out[r] + b, dtype);
        }
    }
    free(xq.q), free(xq.d);
    return 0;
}
