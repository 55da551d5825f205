/* RMSNorm (with the residual add), rotary embedding and SiLU-and-mul for the CPU path, each one
 * pass over its rows.
 *
 * In torch each of these is five to fifteen small ops; for the few dozen rows of a decode step the
 * per-op dispatch costs more than the arithmetic. These kernels give the torch reference's bits:
 * they round to the storage type (bf16/fp16) after every step where torch does, and this file is
 * built without multiply-add contraction so float32 products and sums round as torch's do. Only
 * the RMS sum of squares may add in another order.
 *
 * Element types as in dtypes.h (0 float32, 1 bfloat16, 2 float16); strides are in elements.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "dtypes.h"

/* out = weight * round(x * rsqrt(mean(x^2) + eps)); with a residual, x = round(x + residual) first
 * and that sum is written to residual_out (the next layer's residual). */
static inline __attribute__((always_inline)) void rms_norm_rows(
    const void *x, int64_t x_stride, const void *residual, int64_t r_stride, const void *weight,
    void *out, void *residual_out, int rows, int hidden, float eps, float *restrict sum, const int dtype) {
    for (int r = 0; r < rows; r++) {
        float squares = 0.0f;
        for (int i = 0; i < hidden; i++) {
            float v = load_one(x, (int64_t)r * x_stride + i, dtype, NULL);
            if (residual) v = round_to(v + load_one(residual, (int64_t)r * r_stride + i, dtype, NULL), dtype);
            sum[i] = v;
            squares += v * v;
        }
        const float inv = 1.0f / sqrtf(squares / (float)hidden + eps);
        for (int i = 0; i < hidden; i++) {
            const float normed = round_to(sum[i] * inv, dtype);
            store_one(out, (int64_t)r * hidden + i, load_one(weight, i, dtype, NULL) * normed, dtype);
            if (residual) store_one(residual_out, (int64_t)r * hidden + i, sum[i], dtype);
        }
    }
}

int rms_norm(const void *x, int64_t x_stride, const void *residual, int64_t r_stride, const void *weight,
             void *out, void *residual_out, int rows, int hidden, float eps, int dtype) {
    float *sum = malloc(sizeof(float) * (size_t)hidden);
    if (!sum) return -1;
    switch (dtype) {
    case F32: rms_norm_rows(x, x_stride, residual, r_stride, weight, out, residual_out, rows, hidden, eps, sum, F32); break;
    case BF16: rms_norm_rows(x, x_stride, residual, r_stride, weight, out, residual_out, rows, hidden, eps, sum, BF16); break;
    default: rms_norm_rows(x, x_stride, residual, r_stride, weight, out, residual_out, rows, hidden, eps, sum, F16); break;
    }
    free(sum);
    return 0;
}

/* The heads of one token rotated by (cos, sin) of its position, rounded as torch rounds:
 * o1 = x1*cos - x2*sin, o2 = x2*cos + x1*sin, each product and each sum in the storage type.
 * neox pairs feature j with j + rot/2; GPT-J pairs 2j with 2j+1. Features past rot_dim pass. */
static inline __attribute__((always_inline)) void rotate_heads(
    const void *x, int64_t row_offset, int64_t head_stride, int heads, void *out, int64_t out_offset,
    const float *restrict cos, const float *restrict sin, int head_dim, int rot_dim, const int neox, const int dtype) {
    const int half = rot_dim / 2;
    for (int h = 0; h < heads; h++) {
        const int64_t src = row_offset + (int64_t)h * head_stride, dst = out_offset + (int64_t)h * head_dim;
        for (int j = 0; j < half; j++) {
            const int i1 = neox ? j : 2 * j, i2 = neox ? j + half : 2 * j + 1;
            const float x1 = load_one(x, src + i1, dtype, NULL), x2 = load_one(x, src + i2, dtype, NULL);
            const float o1 = round_to(round_to(x1 * cos[j], dtype) - round_to(x2 * sin[j], dtype), dtype);
            const float o2 = round_to(round_to(x2 * cos[j], dtype) + round_to(x1 * sin[j], dtype), dtype);
            store_one(out, dst + i1, o1, dtype);
            store_one(out, dst + i2, o2, dtype);
        }
        for (int i = rot_dim; i < head_dim; i++) store_one(out, dst + i, load_one(x, src + i, dtype, NULL), dtype);
    }
}

static inline __attribute__((always_inline)) void rotary_rows(
    const int64_t *positions, const float *cos_sin, int64_t cs_stride,
    const void *q, int64_t q_row, int64_t q_head, int q_heads, const void *k, int64_t k_row, int64_t k_head,
    int k_heads, void *q_out, void *k_out, int tokens, int head_dim, int rot_dim, const int neox,
    float *restrict cos, float *restrict sin, const int dtype) {
    const int half = rot_dim / 2;
    for (int t = 0; t < tokens; t++) {
        const float *row = cos_sin + positions[t] * cs_stride;
        for (int j = 0; j < half; j++) { /* cos/sin cast to the input type first, as the reference does */
            cos[j] = round_to(row[j], dtype);
            sin[j] = round_to(row[half + j], dtype);
        }
        rotate_heads(q, t * q_row, q_head, q_heads, q_out, (int64_t)t * q_heads * head_dim, cos, sin, head_dim,
                     rot_dim, neox, dtype);
        rotate_heads(k, t * k_row, k_head, k_heads, k_out, (int64_t)t * k_heads * head_dim, cos, sin, head_dim,
                     rot_dim, neox, dtype);
    }
}

int rotary_embedding(const int64_t *positions, const float *cos_sin, int64_t cs_stride,
                     const void *q, int64_t q_row, int64_t q_head, int q_heads,
                     const void *k, int64_t k_row, int64_t k_head, int k_heads,
                     void *q_out, void *k_out, int tokens, int head_dim, int rot_dim, int neox, int dtype) {
    float *cos = malloc(sizeof(float) * (size_t)(rot_dim / 2 + 1)), *sin = malloc(sizeof(float) * (size_t)(rot_dim / 2 + 1));
    if (!cos || !sin) {
        free(cos), free(sin);
        return -1;
    }
    /* dtype and style as constants: each combination is its own vectorised instantiation */
#define ROTARY(DTYPE, NEOX) rotary_rows(positions, cos_sin, cs_stride, q, q_row, q_head, q_heads, k, k_row, k_head, \
                                        k_heads, q_out, k_out, tokens, head_dim, rot_dim, NEOX, cos, sin, DTYPE)
    switch (dtype) {
    case F32: neox ? ROTARY(F32, 1) : ROTARY(F32, 0); break;
    case BF16: neox ? ROTARY(BF16, 1) : ROTARY(BF16, 0); break;
    default: neox ? ROTARY(F16, 1) : ROTARY(F16, 0); break;
    }
#undef ROTARY
    free(cos), free(sin);
    return 0;
}

/* e^x in float32 to about 2 ulp, branch-free so the SiLU loop vectorises (a call to expf does
 * not): 2^n * e^f with n = round(x / ln 2) and a degree-6 polynomial for e^f, |f| <= ln2 / 2. */
static inline float exp_vec(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    const float n = __builtin_rintf(x * 1.44269504088896341f);
    const float f = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
    float p = 1.0f / 720.0f;
    p = p * f + 1.0f / 120.0f;
    p = p * f + 1.0f / 24.0f;
    p = p * f + 1.0f / 6.0f;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* out = round(round(silu(gate)) * up) with gate = x[:, :d], up = x[:, d:]. */
static inline __attribute__((always_inline)) void silu_and_mul_rows(const void *x, int64_t x_stride, void *out,
                                                                    int rows, int d, const int dtype) {
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < d; i++) {
            const float gate = load_one(x, (int64_t)r * x_stride + i, dtype, NULL), up = load_one(x, (int64_t)r * x_stride + d + i, dtype, NULL);
            const float silu = round_to(gate / (1.0f + exp_vec(-gate)), dtype);
            store_one(out, (int64_t)r * d + i, silu * up, dtype);
        }
    }
}

int silu_and_mul(const void *x, int64_t x_stride, void *out, int rows, int d, int dtype) {
    switch (dtype) {
    case F32: silu_and_mul_rows(x, x_stride, out, rows, d, F32); break;
    case BF16: silu_and_mul_rows(x, x_stride, out, rows, d, BF16); break;
    default: silu_and_mul_rows(x, x_stride, out, rows, d, F16); break;
    }
    return 0;
}
