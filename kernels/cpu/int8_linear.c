/* Linear layers of few rows (decode) on GGUF blocks in groups of 32 (8-bit or 4-bit codes: Q8_0,
 * Q4_0, Q4_1, and Q5_0, Q5_1, Q4_K, Q5_K as the loader holds them) or of 16 (8-bit codes: Q6_K, and
 * layers joining it with other types) with the activations quantized to int8, as llama.cpp
 * computes Q8_0/Q4_0/Q4_1: y = x @ w.T + bias with w[n, k] = q[n, k] * scale[n, k / group] +
 * offset[n, k / group] (group_quant.c's form).
 *
 * bits 8: qweight int8 [N, K]; bits 4: uint8 [N, K / 2], input 2j in the low nibble of byte j and
 * 2j + 1 in the high one, values 0..15. scale and offset (or NULL) [N, K / group] of scale_dtype:
 * float16 as GGUF stores them (each step's widened as read: the same float32 values, and
 * bits, as float32 scales give), or float32. K a multiple of 32. x [M, K] and y [M, N] rows with
 * a row stride, of type dtype (dtypes.h: float32 or bfloat16; bias too, or NULL).
 *
 * Each x row is cut into blocks of 32, each quantized to int8 with one scale d = max|x| / 127
 * (q = x / d rounded to nearest), so a block's product is an integer dot product times both
 * scales, plus the weight's offset times the block's sum of (quantized) x: no conversion of the
 * weight to float. A step takes 64 bytes of weight: two Q8_0 blocks as they are, or (AVX-512) four
 * 4-bit blocks whose [low nibbles, high nibbles] each meet x in the same order, both summed into
 * the same lanes; without AVX-512, 4-bit steps take two blocks' 32 bytes as [low, high] nibbles.
 * Lane l of 16 (4 bytes each) then sums block lane_block(l) of its step.
 * With AVX-512 VNNI one vpdpbusd per 64 bytes (unsigned by signed bytes: nibbles by x; Q8_0's q by
 * x + 128, each lane starting from -128 times its weights' sum, once per weight row and step);
 * with AVX2 maddubs and madd on each half (pairs within int16: 2 * 128 * 127); else scalar loops.
 * Threads take equal halves (static) of the weight rows: spans handed out as threads come free,
 * as in skinny_linear.c, measured here at 28 GB/s on 2 threads against 50 (the LM head, one row,
 * quiet cores): one stream per thread keeps the hardware's prefetcher on it.
 * Where the CPU has Intel's tile unit (AMX), 8-bit weights times 16 x rows or more take it
 * (amx_linear): one tile instruction per group of a 16 x 16 tile of outputs.
 */
#define _GNU_SOURCE /* syscall(), for the tiles' permission */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtypes.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VBMI__)
#include <immintrin.h>
#define VNNI512 1 /* with vpermb, for x's 4-bit order */
#define BLOCKS4 4
#elif defined(__AVX2__)
#include <immintrin.h>
#define AVX2 1
#endif
#ifndef BLOCKS4
#define BLOCKS4 2
#endif
#ifndef VNNI512
#define VNNI512 0
#endif
#if VNNI512 && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define AMX 1 /* Intel's tile unit: many rows (amx_linear) */
#else
#define AMX 0
#endif

enum { BLOCK = 32, STEP = 64, LANES = 16, ROWS = 4, TILE = 4, SHORT_ROW = 1024, PREFETCH_BYTES = 6144 };

/* Blocks a step takes: two of Q8_0 (64 bytes), and of 4 bits two (32 bytes), or four with
 * AVX-512 (64 bytes: [low, high] nibbles, each summed by one vpdpbusd into the same lanes). */
static inline int step_blocks(int bits) { return bits == 8 ? 2 : BLOCKS4; }

/* The block of its step (0 to step_blocks - 1) that lane l of a step sums. */
static inline int lane_block(int l, int bits) { return bits == 8 ? l / 8 : BLOCKS4 == 4 ? l / 4 : (l % 8) / 4; }

/* x rows quantized, in the weight's order: int8 values [M, width] (zeros past K), each step's
 * block scales spread over its 16 lanes as lane_block says [M, steps, 16], and per weight group
 * (32 inputs, or 16) the sum of the quantized values times their block's scale [M, groups] (for
 * the offsets). */
typedef struct {
    int8_t *q;
    float *lanes, *sums;
    int64_t width, steps, blocks, groups;
} Quantized;

#if !VNNI512
static void quantize_row(const void *x, int64_t offset, int dtype, int K, int bits, const Quantized *xq, int m) {
    int8_t *q = xq->q + m * xq->width;
    float *lanes = xq->lanes + m * xq->steps * LANES, *sums = xq->sums + m * xq->groups;
    float d[2] = {0.0f, 0.0f};
    for (int b = 0; b < K / BLOCK; b++) {
        float v[BLOCK], amax = 0.0f;
        for (int j = 0; j < BLOCK; j++) {
            v[j] = load_one(x, offset + (int64_t)b * BLOCK + j, dtype, NULL);
            amax = fmaxf(amax, fabsf(v[j]));
        }
        const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        int sum[2] = {0, 0}; /* of each half: groups of 16 take one each */
        for (int j = 0; j < BLOCK; j++) {
            const int8_t value = (int8_t)nearbyintf(v[j] * inverse);
            const int k = b * BLOCK + j, within = k % STEP; /* 4 bits: evens, then odds */
            q[bits == 8 ? k : k - within + (within % 2) * (STEP / 2) + within / 2] = value;
            sum[j / (BLOCK / 2)] += value;
        }
        if (xq->groups == xq->blocks) sums[b] = scale * (float)(sum[0] + sum[1]);
        else sums[2 * b] = scale * (float)sum[0], sums[2 * b + 1] = scale * (float)sum[1];
        d[b % 2] = scale;
        if (b % 2 == 1 || b == K / BLOCK - 1) {
            for (int l = 0; l < LANES; l++) lanes[(b / 2) * LANES + l] = d[lane_block(l, bits)];
            d[0] = d[1] = 0.0f;
        }
    }
}
#endif

#if VNNI512
/* 16 elements of x (float32 or bfloat16) from i on, as float32. */
static inline __m512 load16(const void *x, int64_t i, int dtype) {
    if (dtype == F32) return _mm512_loadu_ps((const float *)x + i);
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* Quantizes x row m (elements from `offset`) into xq, with scalar code's scale, quotient and
 * rounding (to nearest even, as nearbyintf): scalar, a row of the MLP's down projection took
 * longer than its Q4_1 weight took to stream. 64 inputs (two blocks) a pass; for 4 bits a step
 * (128 inputs) holds [evens of its first 64, of its second 64, odds of the first, of the second],
 * the order of its weight bytes' [low nibbles, high nibbles]. Lanes of absent blocks stay 0. */
static void quantize_row_vector(const void *x, int64_t offset, int dtype, int K, int bits, const Quantized *xq,
                                int m) {
    int8_t *q = xq->q + m * xq->width;
    float *lanes = xq->lanes + m * xq->steps * LANES, *sums = xq->sums + m * xq->groups;
    uint8_t order[STEP]; /* byte j of a 4-bit pass takes input (j % 32) * 2 + j / 32 */
    for (int j = 0; j < STEP; j++) order[j] = (uint8_t)((j % (STEP / 2)) * 2 + j / (STEP / 2));
    const __m512i evens_odds = _mm512_loadu_si512(order);
    const int halves = step_blocks(bits) / 2, blocks = K / BLOCK;
    for (int64_t pass = 0; pass < (blocks + 1) / 2; pass++) {
        __m128i part[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
        float d[2] = {0.0f, 0.0f};
        for (int h = 0; h < 2 && 2 * pass + h < blocks; h++) {
            const int64_t b = 2 * pass + h, at = offset + b * BLOCK;
            const __m512 v0 = load16(x, at, dtype), v1 = load16(x, at + 16, dtype);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
            const __m512 by = _mm512_set1_ps(inverse);
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, by)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, by));
            if (xq->groups == xq->blocks) sums[b] = scale * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            else
                sums[2 * b] = scale * (float)_mm512_reduce_add_epi32(q0),
                sums[2 * b + 1] = scale * (float)_mm512_reduce_add_epi32(q1);
            part[2 * h] = _mm512_cvtsepi32_epi8(q0), part[2 * h + 1] = _mm512_cvtsepi32_epi8(q1);
            d[h] = scale;
        }
        __m512i values = _mm512_castsi128_si512(part[0]);
        values = _mm512_inserti32x4(values, part[1], 1);
        values = _mm512_inserti32x4(values, part[2], 2);
        values = _mm512_inserti32x4(values, part[3], 3);
        const int64_t s = pass / halves, half = pass % halves;
        if (bits == 8) { /* as unsigned bytes x + 128: vpdpbusd's unsigned side (tile_step) */
            _mm512_storeu_si512(q + s * STEP, _mm512_xor_si512(values, _mm512_set1_epi8((char)0x80)));
        } else {
            values = _mm512_permutexvar_epi8(evens_odds, values);
            int8_t *at = q + s * 2 * STEP + half * (STEP / 2);
            _mm256_storeu_si256((__m256i *)at, _mm512_castsi512_si256(values));
            _mm256_storeu_si256((__m256i *)(at + STEP), _mm512_extracti64x4_epi64(values, 1));
        }
        for (int l = 0; l < LANES; l++)
            if (lane_block(l, bits) / 2 == half) lanes[s * LANES + l] = d[lane_block(l, bits) % 2];
    }
}

/* Step s's 64 weight bytes of a row, or the first nb blocks' (zeros after) in a short last step. */
static inline __attribute__((always_inline)) __m512i step_bytes(const uint8_t *row, int64_t s, int nb,
                                                                const int bits) {
    const int bytes = nb * (bits == 8 ? BLOCK : BLOCK / 2);
    return _mm512_maskz_loadu_epi8(bytes >= STEP ? ~(__mmask64)0 : ((__mmask64)1 << bytes) - 1, row + s * STEP);
}

/* Weight groups a step takes: its blocks, or twice as many groups of 16 (8 bits only). */
static inline int step_groups(int bits, int group) { return step_blocks(bits) * (BLOCK / group); }

/* Step s's group scales (those of its nb blocks; 0 for absent ones) over the 16 lanes: a lane's 4
 * bytes lie in one group of 32, or of 16. */
static inline __attribute__((always_inline)) __m512 step_scales(const void *p, int64_t s, int nb, const int bits,
                                                                const int sd, const int group) {
    const __mmask8 present = (__mmask8)((1u << (nb * (BLOCK / group))) - 1);
    const int64_t i = s * step_groups(bits, group);
    const __m128 scales = sd == F16 ? _mm_cvtph_ps(_mm_maskz_loadu_epi16(present, (const uint16_t *)p + i))
                                    : _mm_maskz_loadu_ps(present, (const float *)p + i);
    const __m512i q8 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i q4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(step_groups(bits, group) == 2 ? q8 : q4, _mm512_castps128_ps512(scales));
}

/* One step of an NR x R tile: each weight row's bytes and scales are read once for the R x rows,
 * each x row's once for the NR weight rows. nb is a constant where inlined but in the last step. */
static inline __attribute__((always_inline)) void tile_step(const uint8_t *restrict w, int64_t row_bytes,
                                                            const void *restrict ws, int64_t scale_stride,
                                                            const Quantized *xq, int m, int64_t s, int nb,
                                                            const int bits, const int sd, const int group, __m512 *acc,
                                                            const int NR, const int R, int64_t ahead) {
    const __m512i zero = _mm512_setzero_si512(), nibble = _mm512_set1_epi8(15);
    __m512i xv[ROWS], xh[ROWS];
    __m512 xd[ROWS];
    for (int r = 0; r < R; r++) {
        const int8_t *x = xq->q + (m + r) * xq->width + s * step_blocks(bits) * BLOCK;
        xv[r] = _mm512_loadu_si512(x);
        if (bits == 4) xh[r] = _mm512_loadu_si512(x + STEP);
        xd[r] = _mm512_loadu_ps(xq->lanes + ((m + r) * xq->steps + s) * LANES);
    }
    for (int i = 0; i < NR; i++) {
        if (ahead) {
            __builtin_prefetch(w + (ahead + i) * row_bytes + s * STEP, 0, 3);
            __builtin_prefetch((const char *)ws + (ahead + i) * scale_stride + s * step_groups(bits, group) * element_size(sd),
                               0, 3);
        }
        __m512i wv = step_bytes(w + i * row_bytes, s, nb, bits), high = zero, start = zero;
        /* 8 bits: x is stored as x + 128 (unsigned), so each lane's sum starts at -128 times the
         * lane's weights, once a weight row for all R x rows: a pair is one vpdpbusd. */
        if (bits == 8) start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8((char)0x80), wv));
        else high = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nibble), wv = _mm512_and_si512(wv, nibble);
        const __m512 wd = step_scales((const char *)ws + i * scale_stride, s, nb, bits, sd, group);
        for (int r = 0; r < R; r++) {
            const __m512i dots = bits == 8 ? _mm512_dpbusd_epi32(start, xv[r], wv)
                                           : _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, wv, xv[r]), high, xh[r]);
            acc[i * R + r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), _mm512_mul_ps(wd, xd[r]), acc[i * R + r]);
        }
    }
}

/* out[i * R + r]: weight row i of the NR at w (row_bytes apart, scales scale_stride bytes apart)
 * times x row m + r. One row's sum alone is a chain of dependent fmadds, which held a thread to
 * 18 GB/s of Q4_1 (four cycles a step): a tile sums NR x R chains, and fewer than four take
 * turns over `chains` sets of accumulators, step by step. */
static inline __attribute__((always_inline)) void tile_dots(const uint8_t *restrict w, int64_t row_bytes,
                                                            const void *restrict ws, int64_t scale_stride,
                                                            const Quantized *xq, int m, const int bits, const int sd,
                                                            const int group, float *out, const int NR, const int R,
                                                            int64_t ahead) {
    const int sums = NR * R, chains = sums >= 4 ? 1 : 4 / sums, per = step_blocks(bits);
    __m512 acc[TILE * ROWS];
    for (int a = 0; a < sums * chains; a++) acc[a] = _mm512_setzero_ps();
    const int64_t full = xq->blocks / per, turns = full - full % chains;
    for (int64_t s = 0; s < turns; s += chains)
        for (int c = 0; c < chains; c++)
            tile_step(w, row_bytes, ws, scale_stride, xq, m, s + c, per, bits, sd, group, acc + c * sums, NR, R, ahead);
    for (int64_t s = turns; s < full; s++)
        tile_step(w, row_bytes, ws, scale_stride, xq, m, s, per, bits, sd, group, acc, NR, R, ahead);
    if (xq->blocks % per)
        tile_step(w, row_bytes, ws, scale_stride, xq, m, full, (int)(xq->blocks % per), bits, sd, group, acc, NR, R,
                  ahead);
    for (int c = 1; c < chains; c++)
        for (int a = 0; a < sums; a++) acc[a] = _mm512_add_ps(acc[a], acc[c * sums + a]);
    for (int a = 0; a < sums; a++) out[a] = _mm512_reduce_add_ps(acc[a]);
}
#elif AVX2
static inline float sum8(__m256 v) {
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

static inline __attribute__((always_inline)) void row_dots(const uint8_t *restrict w, const void *restrict ws,
                                                           const Quantized *xq, int m, const int bits, const int sd,
                                                           const int group, float *out, const int R) {
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
            if (group == BLOCK) {
                wd[0] = _mm256_set1_ps(load_one(ws, 2 * s, sd, NULL));
                wd[1] = _mm256_set1_ps(two ? load_one(ws, 2 * s + 1, sd, NULL) : 0.0f);
            } else { /* groups of 16: a half's lanes 0-3 take its first, 4-7 its second */
                for (int h = 0; h < 2; h++) {
                    const int64_t g = 4 * s + 2 * h;
                    const float first = h < 1 + two ? load_one(ws, g, sd, NULL) : 0.0f;
                    const float second = h < 1 + two ? load_one(ws, g + 1, sd, NULL) : 0.0f;
                    wd[h] = _mm256_set_m128(_mm_set1_ps(second), _mm_set1_ps(first));
                }
            }
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
/* The scalar build sums a row in this one function for both scale types, from scales widened
 * first: reassociation vectorised float32 scales' loop and not float16's (a library call each),
 * which summed them in different orders, and float16 scales must give their float32 values' bits. */
static __attribute__((noinline)) void row_dots_wide(const uint8_t *restrict w, const float *restrict ws,
                                                     const Quantized *xq, int m, int bits, int group, float *out,
                                                     int R) {
    const int per = BLOCK / group; /* weight groups in a block of x */
    for (int r = 0; r < R; r++) {
        const int8_t *x = xq->q + (m + r) * xq->width;
        float total = 0.0f;
        for (int64_t s = 0; s < xq->steps; s++) {
            const int blocks = xq->blocks - 2 * s >= 2 ? 2 : 1;
            int32_t dot[4] = {0, 0, 0, 0}; /* per group of the step */
            for (int j = 0; j < STEP; j++) {
                const int l = j / 4, b = lane_block(l, bits);
                if (b >= blocks) continue;
                const int weight = bits == 8 ? ((const int8_t *)w)[s * STEP + j]
                                             : (w[s * (STEP / 2) + j % (STEP / 2)] >> (j < STEP / 2 ? 0 : 4)) & 15;
                dot[bits == 8 ? j / group : b] += weight * x[s * STEP + j];
            }
            for (int g = 0; g < blocks * per; g++)
                total += (float)dot[g] *
                         (ws[2 * per * s + g] * xq->lanes[((m + r) * xq->steps + s) * LANES + (g / per ? 15 : 0)]);
        }
        out[r] = total;
    }
}

static inline __attribute__((always_inline)) void row_dots(const uint8_t *restrict w, const void *restrict ws,
                                                           const Quantized *xq, int m, const int bits, const int sd,
                                                           const int group, float *out, const int R) {
    float wide[xq->groups];
    for (int64_t g = 0; g < xq->groups; g++) wide[g] = load_one(ws, g, sd, NULL);
    row_dots_wide(w, wide, xq, m, bits, group, out, R);
}

/* offset_dot's sum, one function for both offset types (as row_dots_wide). */
static __attribute__((noinline)) float dot_wide(const float *restrict a, const float *restrict b, int n) {
    float total = 0.0f;
    for (int g = 0; g < n; g++) total += a[g] * b[g];
    return total;
}
#endif

#if !VNNI512
static inline __attribute__((always_inline)) void tile_dots(const uint8_t *restrict w, int64_t row_bytes,
                                                            const void *restrict ws, int64_t scale_stride,
                                                            const Quantized *xq, int m, const int bits, const int sd,
                                                            const int group, float *out, const int NR, const int R,
                                                            int64_t ahead) {
    (void)ahead; /* prefetched a tile at a time by the caller */
    for (int i = 0; i < NR; i++) {
        float rows[ROWS];
        row_dots(w + i * row_bytes, (const char *)ws + i * scale_stride, xq, m, bits, sd, group, rows, R);
        for (int r = 0; r < R; r++) out[i * R + r] = rows[r];
    }
}
#endif

/* Weight rows [n, n + nr) of a tile times x rows [m, m + R) into out[i * R + r]: four weight rows
 * at once where the registers hold their accumulators (R of 1 or 2), else two and two. */
static inline __attribute__((always_inline)) void tile_rows(const uint8_t *restrict w, int64_t row_bytes,
                                                            const void *restrict ws, int64_t scale_stride,
                                                            const Quantized *xq, int m, const int bits, const int sd,
                                                            const int group, float *out, int nr, int R, int64_t ahead) {
#define TILE_DOTS(I, NR, R_)                                                                                           \
    tile_dots(w + (I) * row_bytes, row_bytes, (const char *)ws + (I) * scale_stride, scale_stride, xq, m, bits, sd,  \
              group, out + (I) * (R_), NR, R_, ahead)
    if (nr == TILE) {
        switch (R) {
        case 1: TILE_DOTS(0, TILE, 1); return;
        case 2: TILE_DOTS(0, TILE, 2); return;
        case 3: TILE_DOTS(0, 2, 3), TILE_DOTS(2, 2, 3); return;
        default: TILE_DOTS(0, 2, 4), TILE_DOTS(2, 2, 4); return;
        }
    }
    for (int i = 0; i < nr; i++) {
        switch (R) {
        case 1: TILE_DOTS(i, 1, 1); break;
        case 2: TILE_DOTS(i, 1, 2); break;
        case 3: TILE_DOTS(i, 1, 3); break;
        default: TILE_DOTS(i, 1, 4); break;
        }
    }
#undef TILE_DOTS
}

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
    float wide[n];
    for (int g = 0; g < n; g++) wide[g] = load_one(offset, g, dtype, NULL);
    return dot_wide(wide, sums, n);
#endif
}

/* x's M rows quantized into xq, in the layout of `bits`' steps (free_quantized frees it).
 * Returns -1 when scratch memory cannot be allocated. */
static int quantize_rows(const void *x, int64_t x_stride, int dtype, int M, int K, int bits, int group,
                         Quantized *xq) {
    const int blocks = K / BLOCK, per = step_blocks(bits);
    *xq = (Quantized){NULL, NULL, NULL, 0, (blocks + per - 1) / per, blocks, K / group};
    xq->width = xq->steps * per * BLOCK;
    xq->q = calloc((size_t)M * xq->width, 1);
    xq->lanes = calloc((size_t)M * xq->steps * LANES, sizeof(float));
    xq->sums = malloc(sizeof(float) * (size_t)M * xq->groups);
    if (!xq->q || !xq->lanes || !xq->sums) return -1;
    for (int m = 0; m < M; m++) {
#if VNNI512
        quantize_row_vector(x, (int64_t)m * x_stride, dtype, K, bits, xq, m);
#else
        quantize_row(x, (int64_t)m * x_stride, dtype, K, bits, xq, m);
#endif
    }
    return 0;
}

static void free_quantized(Quantized *xq) { free(xq->q), free(xq->lanes), free(xq->sums); }

/* y[m, n] = sum + bias[n] + weight row n's offsets (scale_bytes a row) times x row m's group sums. */
static inline __attribute__((always_inline)) void store_output(void *y, int64_t y_stride, int dtype,
                                                               const void *offset, const void *bias, int scale_dtype,
                                                               int64_t scale_bytes, const Quantized *xq, int n, int m,
                                                               float sum) {
    float v = sum + (bias ? load_one(bias, n, dtype, NULL) : 0.0f);
    if (offset)
        v += offset_dot((const char *)offset + n * scale_bytes, scale_dtype, xq->sums + (int64_t)m * xq->groups,
                        xq->groups);
    store_one(y, (int64_t)m * y_stride + n, v, dtype);
}

/* Weight rows [0, N) by the vector kernels, x quantized in xq for `bits`. */
static void vector_rows(const Quantized *xq, int dtype, void *y, int64_t y_stride, const uint8_t *qweight,
                        const void *scale, const void *offset, const void *bias, int scale_dtype, int M, int N, int K,
                        int bits, int group, int threads) {
    const int64_t row_bytes = (int64_t)K * bits / 8, scale_bytes = xq->groups * element_size(scale_dtype);
    /* Short rows a tile of TILE at once; long ones singly, one stream per thread: tiles of long
     * rows ran several streams a thread, and read Q4_1's MLP down at 23 GB/s against 29. */
    const int ahead = row_bytes < PREFETCH_BYTES ? (int)(PREFETCH_BYTES / row_bytes) : 1;
    const int tile = row_bytes < SHORT_ROW ? TILE : 1, tiles = (N + tile - 1) / tile;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < tiles; t++) {
        const int n = t * tile, nr = N - n < tile ? N - n : tile;
        const uint8_t *w = qweight + n * row_bytes;
        /* The rows `ahead` on, their scales and offsets too: short rows end before the hardware's
         * prefetcher ramps up, and left to it the scales' streams held Q4_1's LM head to 36 GB/s
         * (50-60 with them). About PREFETCH_BYTES of weight ahead measured best, short rows or long.
         * With AVX-512 a line is prefetched as each step reads one (tile_step): prefetching a tile's
         * worth at its start read Q8_0 at 64-80% of the copy bandwidth on an Intel Xeon, spread
         * over the steps at 82-101%. */
        const int prefetched = n + tile + ahead <= N;
        const int64_t at = (int64_t)(n + ahead) * scale_bytes;
        if (prefetched && !VNNI512) {
            for (int64_t k = 0; k < tile * row_bytes; k += 64) __builtin_prefetch(w + ahead * row_bytes + k, 0, 3);
            for (int64_t k = 0; k < tile * scale_bytes; k += 64) __builtin_prefetch((const char *)scale + at + k, 0, 3);
        }
        if (prefetched && offset)
            for (int64_t k = 0; k < tile * scale_bytes; k += 64) __builtin_prefetch((const char *)offset + at + k, 0, 3);
        const void *ws = (const char *)scale + n * scale_bytes; /* each step's widened as read */
        for (int m = 0; m < M; m += ROWS) {
            const int R = M - m < ROWS ? M - m : ROWS;
            float out[TILE * ROWS];
            const int64_t pf = VNNI512 && prefetched && m == 0 ? ahead : 0; /* x's later rows: cached */
#define ROWS_OF(BITS, SD, GROUP) tile_rows(w, row_bytes, ws, scale_bytes, xq, m, BITS, SD, GROUP, out, nr, R, pf)
            if (bits == 8 && group == BLOCK) scale_dtype == F16 ? ROWS_OF(8, F16, BLOCK) : ROWS_OF(8, F32, BLOCK);
            else if (bits == 8) scale_dtype == F16 ? ROWS_OF(8, F16, BLOCK / 2) : ROWS_OF(8, F32, BLOCK / 2);
            else scale_dtype == F16 ? ROWS_OF(4, F16, BLOCK) : ROWS_OF(4, F32, BLOCK);
#undef ROWS_OF
            for (int i = 0; i < nr; i++)
                for (int r = 0; r < R; r++)
                    store_output(y, y_stride, dtype, offset, bias, scale_dtype, scale_bytes, xq, n + i, m + r,
                                 out[i * R + r]);
        }
    }
}

#if AMX
/* 8-bit weights of at least AMX_MIN_ROWS x rows: at 8 rows the vector kernel was faster (Q8_0
 * decode 149 against 135 tok/s), at 16 the tiles (190 against 140). 4-bit codes stay on the
 * vector kernel: unpacked for the tiles they lost at every batch (Q4_1 146-162 against 176-192). */
enum { AMX_ROWS = 16, AMX_MIN_ROWS = 16 };

/* Whether Linux lets this process use the tiles' state (asked once: arch_prctl's
 * ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); no, on an older kernel or under a seccomp filter. */
static int amx_permitted(void) {
    static int state; /* 0 not asked, 1 granted, -1 refused */
    if (state == 0) state = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
    return state == 1;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* Tiles 0 and 4: 16 weight rows by one group's bytes; 1 and 5: the group's x for 16 x rows in
 * the tiles' order (group / 4 rows of 16 x rows' 4 bytes); 2 and 3: their int32 products, 16
 * weight rows by 16 x rows. Two sets, so one group's product runs while the other's is summed. */
static void amx_configure(int group) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 6; t++) c.rows[t] = AMX_ROWS, c.colsb[t] = 64;
    c.colsb[0] = c.colsb[4] = (uint16_t)group;
    c.rows[1] = c.rows[5] = (uint8_t)(group / 4);
    _tile_loadconfig(&c);
}

/* x's quantized rows (8-bit layout, stored as x + 128) as the tiles take them: chunk c of 16 x
 * rows, group g, row r holds x[16c + m][g * group + 4r + j] at m * 4 + j (0 for rows past M);
 * and each block's scale per chunk [chunks, blocks, 16]. */
static void amx_arrange_x(const Quantized *xq, int M, int K, int group, int8_t *xt, float *xs) {
    const int groups = K / group, blocks = K / BLOCK, chunks = (M + AMX_ROWS - 1) / AMX_ROWS;
    memset(xt, 0, (size_t)chunks * K * AMX_ROWS);
    memset(xs, 0, sizeof(float) * (size_t)chunks * blocks * AMX_ROWS);
    for (int m = 0; m < M; m++) {
        const int c = m / AMX_ROWS, col = m % AMX_ROWS;
        const int8_t *row = xq->q + (int64_t)m * xq->width;
        for (int k = 0; k < K; k += 4) {
            uint32_t v;
            memcpy(&v, row + k, 4);
            v ^= 0x80808080u; /* back to signed */
            const int64_t at = (((int64_t)c * groups + k / group) * (group / 4) + (k % group) / 4) * 64 + col * 4;
            memcpy(xt + at, &v, 4);
        }
        for (int b = 0; b < blocks; b++)
            xs[((int64_t)c * blocks + b) * AMX_ROWS + col] = xq->lanes[((int64_t)m * xq->steps + b / 2) * LANES + (b % 2) * 8];
    }
}

/* acc[i] += (product row i) * (x's block scales) * (weight row i's scale of group g). */
static inline __attribute__((always_inline)) void amx_sum(const int32_t *product, const float *xs, const void *ws,
                                                          int64_t scale_stride, int64_t g, const int sd, __m512 *acc) {
    const __m512 xd = _mm512_loadu_ps(xs);
    for (int i = 0; i < AMX_ROWS; i++) {
        const float wd = load_one((const char *)ws + i * scale_stride, g, sd, NULL);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(product + i * AMX_ROWS)),
                                 _mm512_mul_ps(xd, _mm512_set1_ps(wd)), acc[i]);
    }
}

/* Weight rows [n, n + 16) times x rows of chunk c, into acc (lane m: x row 16c + m). */
static inline __attribute__((always_inline)) void amx_tile(const uint8_t *w, int64_t row_bytes, const void *ws,
                                                           int64_t scale_stride, const int8_t *xt, const float *xs,
                                                           int groups, const int sd, const int group, __m512 *acc) {
    int32_t product[2][AMX_ROWS * AMX_ROWS] __attribute__((aligned(64)));
    const int x_rows = group / 4;
    int64_t g = 0;
    for (; g + 1 < groups; g += 2) {
        _tile_loadd(0, w + g * group, row_bytes);
        _tile_loadd(1, xt + g * x_rows * 64, 64);
        _tile_zero(2);
        _tile_dpbssd(2, 0, 1);
        _tile_loadd(4, w + (g + 1) * group, row_bytes);
        _tile_loadd(5, xt + (g + 1) * x_rows * 64, 64);
        _tile_zero(3);
        _tile_dpbssd(3, 4, 5);
        _tile_stored(2, product[0], 64);
        amx_sum(product[0], xs + (g * group / BLOCK) * AMX_ROWS, ws, scale_stride, g, sd, acc);
        _tile_stored(3, product[1], 64);
        amx_sum(product[1], xs + ((g + 1) * group / BLOCK) * AMX_ROWS, ws, scale_stride, g + 1, sd, acc);
    }
    if (g < groups) {
        _tile_loadd(0, w + g * group, row_bytes);
        _tile_loadd(1, xt + g * x_rows * 64, 64);
        _tile_zero(2);
        _tile_dpbssd(2, 0, 1);
        _tile_stored(2, product[0], 64);
        amx_sum(product[0], xs + (g * group / BLOCK) * AMX_ROWS, ws, scale_stride, g, sd, acc);
    }
}

/* int8_linear of 8-bit weights on the tiles: whole tiles of 16 weight rows here, the last rows
 * through the vector kernel. Each group's 16 x 16 integer product is one tile instruction, then
 * scaled and summed in float (the groups' scales differ). */
static int amx_linear(const void *x, int64_t x_stride, int dtype, void *y, int64_t y_stride, const uint8_t *qweight,
                      const void *scale, const void *offset, const void *bias, int scale_dtype, int M, int N, int K,
                      int group, int threads) {
    const int blocks = K / BLOCK, groups = K / group, chunks = (M + AMX_ROWS - 1) / AMX_ROWS;
    Quantized xq;
    int8_t *xt = malloc((size_t)chunks * K * AMX_ROWS);
    float *xs = malloc(sizeof(float) * (size_t)chunks * blocks * AMX_ROWS);
    if (quantize_rows(x, x_stride, dtype, M, K, 8, group, &xq) != 0 || !xt || !xs) {
        free_quantized(&xq), free(xt), free(xs);
        return -1;
    }
    amx_arrange_x(&xq, M, K, group, xt, xs);
    const int64_t row_bytes = K, scale_bytes = groups * element_size(scale_dtype);
    const int tiles = N / AMX_ROWS;
#pragma omp parallel num_threads(threads)
    {
        amx_configure(group);
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            const int n = t * AMX_ROWS;
            const uint8_t *w = qweight + n * row_bytes;
            const void *ws = (const char *)scale + n * scale_bytes;
            for (int c = 0; c < chunks; c++) {
                __m512 acc[AMX_ROWS];
                for (int i = 0; i < AMX_ROWS; i++) acc[i] = _mm512_setzero_ps();
                const int8_t *xtc = xt + (int64_t)c * K * AMX_ROWS;
                const float *xsc = xs + (int64_t)c * blocks * AMX_ROWS;
#define TILE_OF(SD, GROUP) amx_tile(w, row_bytes, ws, scale_bytes, xtc, xsc, groups, SD, GROUP, acc)
                if (group == BLOCK) scale_dtype == F16 ? TILE_OF(F16, BLOCK) : TILE_OF(F32, BLOCK);
                else scale_dtype == F16 ? TILE_OF(F16, BLOCK / 2) : TILE_OF(F32, BLOCK / 2);
#undef TILE_OF
                const int rows = M - c * AMX_ROWS < AMX_ROWS ? M - c * AMX_ROWS : AMX_ROWS;
                for (int i = 0; i < AMX_ROWS; i++) {
                    float sums[AMX_ROWS];
                    _mm512_storeu_ps(sums, acc[i]);
                    for (int r = 0; r < rows; r++)
                        store_output(y, y_stride, dtype, offset, bias, scale_dtype, scale_bytes, &xq, n + i,
                                     c * AMX_ROWS + r, sums[r]);
                }
            }
        }
        _tile_release();
    }
    const int done = tiles * AMX_ROWS; /* the last rows on the vector kernel, from the same x */
    if (done < N)
        vector_rows(&xq, dtype, (char *)y + done * element_size(dtype), y_stride, qweight + done * row_bytes,
                    (const char *)scale + done * scale_bytes, offset ? (const char *)offset + done * scale_bytes : NULL,
                    bias ? (const char *)bias + done * element_size(dtype) : NULL, scale_dtype, M, N - done, K, 8, group,
                    threads);
    free_quantized(&xq), free(xt), free(xs);
    return 0;
}
#endif

/* group: 32, or 16 with 8 bits. Returns 0, or -1 when scratch memory cannot be allocated. */
int int8_linear(const void *x, int64_t x_stride, int dtype, void *y, int64_t y_stride, const uint8_t *qweight,
                const void *scale, const void *offset, const void *bias, int scale_dtype, int M, int N, int K,
                int bits, int group, int threads) {
#if AMX
    if (bits == 8 && M >= AMX_MIN_ROWS && N >= AMX_ROWS && amx_permitted())
        return amx_linear(x, x_stride, dtype, y, y_stride, qweight, scale, offset, bias, scale_dtype, M, N, K, group,
                          threads);
#endif
    Quantized xq;
    const int status = quantize_rows(x, x_stride, dtype, M, K, bits, group, &xq);
    if (status == 0)
        vector_rows(&xq, dtype, y, y_stride, qweight, scale, offset, bias, scale_dtype, M, N, K, bits, group, threads);
    free_quantized(&xq);
    return status;
}

/* Whether 8-bit weights take the tiles here, from AMX_MIN_ROWS x rows (int8_linear.py asks). */
int int8_linear_tiles(void) {
#if AMX
    return amx_permitted();
#else
    return 0;
#endif
}
