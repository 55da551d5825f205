/* Linear layers of few rows (decode) on GGUF's Q8_0, Q4_0 and Q4_1 blocks with the activations
 * quantized to int8, as llama.cpp computes them: y = x @ w.T + bias with
 * w[n, k] = q[n, k] * scale[n, k / 32] + offset[n, k / 32] (group_quant.c's form, groups of 32).
 *
 * bits 8: qweight int8 [N, K]; bits 4: uint8 [N, K / 2], input 2j in the low nibble of byte j and
 * 2j + 1 in the high one, values 0..15. scale and offset (or NULL) [N, K / 32] of scale_dtype:
 * float16 as GGUF stores them (each step's two widened as read: the same float32 values, and
 * bits, as float32 scales give), or float32. K a multiple of 32. x [M, K] and y [M, N] rows with
 * a row stride, of type dtype (dtypes.h: float32 or bfloat16; bias too, or NULL).
 *
 * Each x row is cut into blocks of 32, each quantized to int8 with one scale d = max|x| / 127
 * (q = x / d rounded to nearest), so a block's product is an integer dot product times both
 * scales, plus the weight's offset times the block's sum of (quantized) x: no conversion of the
 * weight to float. 64 inputs (two blocks) a step, as 64 bytes of weight: Q8_0's as they are,
 * 4-bit ones as [low nibbles, high nibbles] of their 32 bytes, and x in the same order ([evens,
 * odds] of the 64 for 4 bits). Lane l of 16 (4 bytes each) then sums block lane_block(l).
 * With AVX-512 VNNI one vpdpbusd a step (unsigned by signed bytes: nibbles as they are; Q8_0's
 * weight as |q| with x taking q's sign: |q| of -128 is 128, and x, within +-127, negates safely);
 * with AVX2 maddubs and madd on each half (pairs within int16: 2 * 128 * 127); else scalar loops.
 * Threads take equal halves (static) of the weight rows: spans handed out as threads come free,
 * as in skinny_linear.c, measured here at 28 GB/s on 2 threads against 50 (the LM head, one row,
 * quiet cores): one stream per thread keeps the hardware's prefetcher on it.
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

enum { BLOCK = 32, STEP = 64, LANES = 16, ROWS = 4, PREFETCH_ROWS = 4 };

/* The block (0: the step's first, 1: its second) that lane l of a step sums. */
static inline int lane_block(int l, int bits) { return bits == 8 ? l / 8 : (l % 8) / 4; }

/* x rows quantized, in the weight's order: int8 values [M, width] (zeros past K), each step's
 * two block scales spread over its 16 lanes [M, steps, 16], and per block the sum of the
 * quantized values times their scale [M, blocks] (for the offsets). */
typedef struct {
    int8_t *q;
    float *lanes, *sums;
    int64_t width, steps, blocks;
} Quantized;

static void quantize_row(const void *x, int64_t offset, int dtype, int K, int bits, const Quantized *xq, int m) {
    int8_t *q = xq->q + m * xq->width;
    float *lanes = xq->lanes + m * xq->steps * LANES, *sums = xq->sums + m * xq->blocks;
    float d[2] = {0.0f, 0.0f};
    for (int b = 0; b < K / BLOCK; b++) {
        float v[BLOCK], amax = 0.0f;
        for (int j = 0; j < BLOCK; j++) {
            v[j] = load_one(x, offset + (int64_t)b * BLOCK + j, dtype, NULL);
            amax = fmaxf(amax, fabsf(v[j]));
        }
        const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        int sum = 0;
        for (int j = 0; j < BLOCK; j++) {
            const int8_t value = (int8_t)nearbyintf(v[j] * inverse);
            const int k = b * BLOCK + j, within = k % STEP; /* 4 bits: evens, then odds */
            q[bits == 8 ? k : k - within + (within % 2) * (STEP / 2) + within / 2] = value;
            sum += value;
        }
        sums[b] = scale * (float)sum;
        d[b % 2] = scale;
        if (b % 2 == 1 || b == K / BLOCK - 1) {
            for (int l = 0; l < LANES; l++) lanes[(b / 2) * LANES + l] = d[lane_block(l, bits)];
            d[0] = d[1] = 0.0f;
        }
    }
}

#if VNNI512
/* The 64 weight bytes of step s of a row: all of them, or only the first block's when `two` is 0. */
static inline __m512i step_bytes(const uint8_t *row, int64_t s, int two, const int bits) {
    if (bits == 8) return _mm512_maskz_loadu_epi8(two ? ~(__mmask64)0 : 0xffffffffu, row + s * STEP);
    const __m256i packed = _mm256_maskz_loadu_epi8(two ? ~(__mmask32)0 : 0xffffu, row + s * (STEP / 2));
    const __m256i mask = _mm256_set1_epi8(15);
    const __m256i low = _mm256_and_si256(packed, mask), high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);
    return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}

/* The two block scales at i over the 16 lanes (0 for a second block that is not there). */
static inline __attribute__((always_inline)) __m512 step_scales(const void *p, int64_t i, int two, const int bits,
                                                                const int sd) {
    __m128 both;
    if (sd == F16) {
        uint32_t halves = 0;
        memcpy(&halves, (const uint16_t *)p + i, sizeof(uint16_t));
        if (two) memcpy(&halves, (const uint16_t *)p + i, sizeof halves);
        both = _mm_cvtph_ps(_mm_cvtsi32_si128((int)halves));
    } else {
        const float *f = (const float *)p + i;
        both = two ? _mm_castpd_ps(_mm_load_sd((const double *)f)) : _mm_load_ss(f);
    }
    const __m512i q8 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i q4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(bits == 8 ? q8 : q4, _mm512_castps128_ps512(both));
}

static inline __attribute__((always_inline)) void row_dots(const uint8_t *restrict w, const void *restrict ws,
                                                           const Quantized *xq, int m, const int bits, const int sd,
                                                           float *out, const int R) {
    __m512 acc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t s = 0; s < xq->steps; s++) {
        const int two = xq->blocks - 2 * s >= 2;
        __m512i wv = step_bytes(w, s, two, bits);
        __mmask64 negative = 0;
        if (bits == 8) negative = _mm512_movepi8_mask(wv), wv = _mm512_abs_epi8(wv);
        const __m512 wd = step_scales(ws, 2 * s, two, bits, sd);
        for (int r = 0; r < R; r++) {
            __m512i xv = _mm512_loadu_si512(xq->q + (m + r) * xq->width + s * STEP);
            if (bits == 8) xv = _mm512_mask_sub_epi8(xv, negative, zero, xv);
            const __m512 dots = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, wv, xv));
            const __m512 d = _mm512_mul_ps(wd, _mm512_loadu_ps(xq->lanes + ((m + r) * xq->steps + s) * LANES));
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

static inline __attribute__((always_inline)) void row_dots(const uint8_t *restrict w, const void *restrict ws,
                                                           const Quantized *xq, int m, const int bits, const int sd,
                                                           float *out, const int R) {
    __m256 acc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1), mask = _mm256_set1_epi8(15);
    for (int64_t s = 0; s < xq->steps; s++) {
        const int two = xq->blocks - 2 * s >= 2;
        __m256i half[2];
        __m256 wd[2];
        if (bits == 8) {
            half[0] = _mm256_loadu_si256((const __m256i *)(w + s * STEP));
            half[1] = two ? _mm256_loadu_si256((const __m256i *)(w + s * STEP + BLOCK)) : _mm256_setzero_si256();
            wd[0] = _mm256_set1_ps(load_one(ws, 2 * s, sd, NULL));
            wd[1] = _mm256_set1_ps(two ? load_one(ws, 2 * s + 1, sd, NULL) : 0.0f);
        } else {
            const __m128i first = _mm_loadu_si128((const __m128i *)(w + s * (STEP / 2)));
            const __m128i second = two ? _mm_loadu_si128((const __m128i *)(w + s * (STEP / 2) + 16)) : _mm_setzero_si128();
            const __m256i packed = _mm256_set_m128i(second, first);
            half[0] = _mm256_and_si256(packed, mask), half[1] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);
            const float d1 = two ? load_one(ws, 2 * s + 1, sd, NULL) : 0.0f;
            wd[0] = wd[1] = _mm256_set_m128(_mm_set1_ps(d1), _mm_set1_ps(load_one(ws, 2 * s, sd, NULL)));
        }
        for (int r = 0; r < R; r++) {
            const int8_t *x = xq->q + (m + r) * xq->width + s * STEP;
            const float *lanes = xq->lanes + ((m + r) * xq->steps + s) * LANES;
            for (int h = 0; h < 2; h++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x + h * BLOCK)), wv = half[h];
                if (bits == 8) xv = _mm256_sign_epi8(xv, wv), wv = _mm256_sign_epi8(wv, wv);
                const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones));
                acc[r] = _mm256_fmadd_ps(dots, _mm256_mul_ps(wd[h], _mm256_loadu_ps(lanes + 8 * h)), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = sum8(acc[r]);
}
#else
static inline __attribute__((always_inline)) void row_dots(const uint8_t *restrict w, const void *restrict ws,
                                                           const Quantized *xq, int m, const int bits, const int sd,
                                                           float *out, const int R) {
    for (int r = 0; r < R; r++) {
        const int8_t *x = xq->q + (m + r) * xq->width;
        float total = 0.0f;
        for (int64_t s = 0; s < xq->steps; s++) {
            const int blocks = xq->blocks - 2 * s >= 2 ? 2 : 1;
            int32_t dot[2] = {0, 0};
            for (int j = 0; j < STEP; j++) {
                const int l = j / 4, b = lane_block(l, bits);
                if (b >= blocks) continue;
                const int weight = bits == 8 ? ((const int8_t *)w)[s * STEP + j]
                                             : (w[s * (STEP / 2) + j % (STEP / 2)] >> (j < STEP / 2 ? 0 : 4)) & 15;
                dot[b] += weight * x[s * STEP + j];
            }
            for (int b = 0; b < blocks; b++)
                total += (float)dot[b] * (load_one(ws, 2 * s + b, sd, NULL) *
                                          xq->lanes[((m + r) * xq->steps + s) * LANES + (b ? 15 : 0)]);
        }
        out[r] = total;
    }
}
#endif

/* sum_g offset[g] * sums[g] over a row's n blocks, offset of dtype (F32 or F16): one order of
 * sums for both, so float16 offsets give the bits of their float32 values. */
static inline float offset_dot(const void *offset, int dtype, const float *sums, int n) {
#if VNNI512
    __m512 acc = _mm512_setzero_ps();
    for (int g = 0; g < n; g += 16) {
        const __mmask16 lanes = n - g >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - g)) - 1);
        const __m512 o = dtype == F16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, (const uint16_t *)offset + g))
                                      : _mm512_maskz_loadu_ps(lanes, (const float *)offset + g);
        acc = _mm512_fmadd_ps(o, _mm512_maskz_loadu_ps(lanes, sums + g), acc);
    }
    return _mm512_reduce_add_ps(acc);
#elif AVX2
    __m256 acc = _mm256_setzero_ps();
    int g = 0;
    for (; g + 8 <= n; g += 8) {
        const __m256 o = dtype == F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)offset + g)))
                                      : _mm256_loadu_ps((const float *)offset + g);
        acc = _mm256_fmadd_ps(o, _mm256_loadu_ps(sums + g), acc);
    }
    float total = sum8(acc);
    for (; g < n; g++) total += load_one(offset, g, dtype, NULL) * sums[g];
    return total;
#else
    float total = 0.0f;
    for (int g = 0; g < n; g++) total += load_one(offset, g, dtype, NULL) * sums[g];
    return total;
#endif
}

/* Returns 0, or -1 when scratch memory cannot be allocated. */
int int8_linear(const void *x, int64_t x_stride, int dtype, void *y, int64_t y_stride, const uint8_t *qweight,
                const void *scale, const void *offset, const void *bias, int scale_dtype, int M, int N, int K,
                int bits, int threads) {
    const int blocks = K / BLOCK;
    Quantized xq = {NULL, NULL, NULL, 0, (blocks + 1) / 2, blocks};
    xq.width = xq.steps * STEP;
    xq.q = calloc((size_t)M * xq.width, 1);
    xq.lanes = malloc(sizeof(float) * (size_t)M * xq.steps * LANES);
    xq.sums = malloc(sizeof(float) * (size_t)M * blocks);
    if (!xq.q || !xq.lanes || !xq.sums) {
        free(xq.q), free(xq.lanes), free(xq.sums);
        return -1;
    }
    for (int m = 0; m < M; m++) quantize_row(x, (int64_t)m * x_stride, dtype, K, bits, &xq, m);
    const int64_t row_bytes = (int64_t)K * bits / 8, scale_bytes = blocks * element_size(scale_dtype);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int n = 0; n < N; n++) {
        const uint8_t *w = qweight + n * row_bytes;
        /* the rows a few on: short rows end before the hardware's prefetcher ramps up */
        if (n + PREFETCH_ROWS < N)
            for (int64_t k = 0; k < row_bytes; k += 64) __builtin_prefetch(w + PREFETCH_ROWS * row_bytes + k, 0, 0);
        const void *ws = (const char *)scale + n * scale_bytes; /* each step's two widened as read */
        const void *wo = offset ? (const char *)offset + n * scale_bytes : NULL;
        const float b = bias ? load_one(bias, n, dtype, NULL) : 0.0f;
        for (int m = 0; m < M; m += ROWS) {
            float out[ROWS];
#define DOTS_SD(R, SD) (bits == 8 ? row_dots(w, ws, &xq, m, 8, SD, out, R) : row_dots(w, ws, &xq, m, 4, SD, out, R))
#define DOTS(R) (scale_dtype == F16 ? DOTS_SD(R, F16) : DOTS_SD(R, F32))
            switch (M - m < ROWS ? M - m : ROWS) {
            case 4: DOTS(4); break;
            case 3: DOTS(3); break;
            case 2: DOTS(2); break;
            default: DOTS(1); break;
            }
#undef DOTS
#undef DOTS_SD
            for (int r = 0; r < ROWS && m + r < M; r++) {
                float v = out[r] + b;
                if (wo) v += offset_dot(wo, scale_dtype, xq.sums + (m + r) * blocks, blocks);
                store_one(y, (int64_t)(m + r) * y_stride + n, v, dtype);
            }
        }
    }
    free(xq.q), free(xq.lanes), free(xq.sums);
    return 0;
}
