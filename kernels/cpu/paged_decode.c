/* Decode attention over the paged KV cache, reading the cache in place (the CPU path).
 *
 * One query token per sequence. For each sequence the kernel walks its blocks token by token,
 * scores every cached key against each query head (a query head reads its kv head's slice: GQA),
 * takes the softmax in float32 and sums the values. Nothing is copied out of the cache, which is
 * what makes this faster than gathering K/V into dense tensors every step: the decode step of a
 * small model on a CPU is bound by reading the cache (software prefetch of the next block was
 * tried and measured slower).
 *
 * Layouts (as in docs/architecture.md, "Kernels"): cache [num_blocks, block_size, Hkv, D]
 * contiguous; query/out rows [T, H, D] with a row stride and a head stride in elements;
 * block_tables [B, table_stride] int32; seq_lens [B] int32 (tokens in the cache, this one
 * included). rows[i] is the query row of decode sequence i, seqs[i] its batch index.
 *
 * Element types: 0 float32, 1 bfloat16, 2 float16, 3 one byte through a 256-entry table
 * (fp8 e4m3/e5m2 decoded by the caller's table; the kv scales multiply the scores and values).
 * Compiled at first use by infernetes/kernels/cpu/native.py with -O3 -march=native.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtypes.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

/* bf16 query . bf16 key with the CPU's bf16 dot-product instruction (32 products per step,
 * summed in float32), without converting the key row first; n a multiple of 32. */
static inline float dot_bf16(const uint16_t *a, const uint16_t *b, int n) {
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 32)
        sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_loadu_si512(a + j), (__m512bh)_mm512_loadu_si512(b + j));
    return _mm512_reduce_add_ps(sum);
}
#define HAVE_DOT_BF16 1
#else
#define HAVE_DOT_BF16 0
#endif

typedef struct {
    const void *query;
    int64_t q_row_stride, q_head_stride;
    int q_dtype;
    void *out;
    int64_t out_row_stride, out_head_stride;
    const void *k_cache, *v_cache;
    const float *kv_lut;
    float k_scale, v_scale;
    const int32_t *block_tables;
    int64_t table_stride;
    const int32_t *seq_lens, *rows, *seqs;
    int n, num_heads, num_kv_heads, head_dim, block_size;
    float scale;
} Problem;

typedef struct { /* per-thread scratch */
    float *scores, *qf, *acc, *kv, *best;
} Scratch;

/* Dot product as a tree of independent partial sums: a single running sum would make every
 * multiply-add wait for the one before it. */
static inline __attribute__((always_inline)) float dot(const float *restrict a, const float *restrict b,
                                                       const int n) {
    if (n % 32 == 0) {
        float lane[32];
        for (int l = 0; l < 32; l++) lane[l] = a[l] * b[l];
        for (int j = 32; j < n; j += 32)
            for (int l = 0; l < 32; l++) lane[l] += a[j + l] * b[j + l];
        for (int l = 0; l < 16; l++) lane[l] += lane[l + 16];
        for (int l = 0; l < 8; l++) lane[l] += lane[l + 8];
        float s = 0.0f;
        for (int l = 0; l < 8; l++) s += lane[l];
        return s;
    }
    float s = 0.0f;
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

/* One decode sequence, every head. The cache is walked token by token in memory order (a token's
 * keys for all kv heads are one contiguous row), so the hardware prefetcher streams it; each query
 * head scores against its kv head's slice of the row (GQA). Softmax in float32, then the values. */
static inline __attribute__((always_inline)) void attend(const Problem *p, const Scratch *w, int i,
                                                         const int kv_dtype, const int dim) {
    const int heads = p->num_heads, group = heads / p->num_kv_heads, bs = p->block_size;
    const int len = p->seq_lens[p->seqs[i]];
    const int32_t *table = p->block_tables + (int64_t)p->seqs[i] * p->table_stride;
    const size_t q_size = element_size(p->q_dtype), kv_size = element_size(kv_dtype);
    const int64_t row_size = (int64_t)p->num_kv_heads * dim; /* elements of one token's row */
    float *restrict qf = w->qf, *restrict scores = w->scores, *restrict acc = w->acc, *restrict row = w->kv;
    float *restrict best = w->best;
    for (int h = 0; h < heads; h++) {
        const char *q = (const char *)p->query + ((int64_t)p->rows[i] * p->q_row_stride + (int64_t)h * p->q_head_stride) * q_size;
        load_row(q, p->q_dtype, NULL, qf + h * dim, dim);
        for (int d = 0; d < dim; d++) qf[h * dim + d] *= p->scale * p->k_scale;
        best[h] = -INFINITY;
    }
#if HAVE_DOT_BF16
    if (kv_dtype == BF16 && p->q_dtype == BF16 && dim % 32 == 0) {
        const float q_scale = p->scale * p->k_scale;
        for (int t0 = 0; t0 < len; t0 += bs) {
            const uint16_t *block = (const uint16_t *)p->k_cache + (int64_t)table[t0 / bs] * bs * row_size;
            const int count = len - t0 < bs ? len - t0 : bs;
            for (int o = 0; o < count; o++) {
                for (int h = 0; h < heads; h++) {
                    const uint16_t *q = (const uint16_t *)p->query + (int64_t)p->rows[i] * p->q_row_stride +
                                        (int64_t)h * p->q_head_stride;
                    const float s = dot_bf16(q, block + o * row_size + (h / group) * dim, dim) * q_scale;
                    scores[(int64_t)h * len + t0 + o] = s;
                    best[h] = s > best[h] ? s : best[h];
                }
            }
        }
    } else
#endif
    for (int t0 = 0; t0 < len; t0 += bs) {
        const char *block = (const char *)p->k_cache + (int64_t)table[t0 / bs] * bs * row_size * kv_size;
        const int count = len - t0 < bs ? len - t0 : bs;
        for (int o = 0; o < count; o++) {
            load_row(block + o * row_size * kv_size, kv_dtype, p->kv_lut, row, (int)row_size);
            for (int h = 0; h < heads; h++) {
                const float s = dot(qf + h * dim, row + (h / group) * dim, dim);
                scores[(int64_t)h * len + t0 + o] = s;
                best[h] = s > best[h] ? s : best[h];
            }
        }
    }
    for (int h = 0; h < heads; h++) {
        float *restrict sh = scores + (int64_t)h * len, total = 0.0f;
        for (int t = 0; t < len; t++) {
            sh[t] = expf(sh[t] - best[h]);
            total += sh[t];
        }
        const float norm = p->v_scale / total;
        for (int t = 0; t < len; t++) sh[t] *= norm;
    }
    /* Values: each head's sum over a block stays in registers (`part`), added to `acc` once. */
    memset(acc, 0, sizeof(float) * (size_t)heads * dim);
    for (int t0 = 0; t0 < len; t0 += bs) {
        const char *block = (const char *)p->v_cache + (int64_t)table[t0 / bs] * bs * row_size * kv_size;
        const int count = len - t0 < bs ? len - t0 : bs;
        for (int o = 0; o < count; o++) load_row(block + o * row_size * kv_size, kv_dtype, p->kv_lut, row + o * row_size, (int)row_size);
        for (int h = 0; h < heads; h++) {
            const float *restrict sh = scores + (int64_t)h * len + t0;
            const float *restrict vh = row + (h / group) * dim;
            float part[dim];
            for (int d = 0; d < dim; d++) part[d] = 0.0f;
            for (int o = 0; o < count; o++) {
                const float weight = sh[o];
                for (int d = 0; d < dim; d++) part[d] += weight * vh[o * row_size + d];
            }
            for (int d = 0; d < dim; d++) acc[h * dim + d] += part[d];
        }
    }
    for (int h = 0; h < heads; h++) {
        char *dst = (char *)p->out + ((int64_t)p->rows[i] * p->out_row_stride + (int64_t)h * p->out_head_stride) * q_size;
        store_row(acc + h * dim, p->q_dtype, dst, dim);
    }
}

/* Instantiations with the element type and the common head sizes as constants: the inner loops
 * then unroll into whole vectors with no remainder handling. */
#define ATTEND_FOR_DIM(DTYPE)                                                       \
    switch (p->head_dim) {                                                          \
    case 64: attend(p, w, i, DTYPE, 64); break;                                     \
    case 128: attend(p, w, i, DTYPE, 128); break;                                   \
    default: attend(p, w, i, DTYPE, p->head_dim); break;                            \
    }

static void attend_all(const Problem *p, const Scratch *w, int kv_dtype) {
    for (int i = 0; i < p->n; i++) {
        switch (kv_dtype) {
        case F32: ATTEND_FOR_DIM(F32); break;
        case BF16: ATTEND_FOR_DIM(BF16); break;
        case F16: ATTEND_FOR_DIM(F16); break;
        default: ATTEND_FOR_DIM(BYTE_LUT); break;
        }
    }
}

/* Returns 0, or -1 when the scratch memory cannot be allocated. */
int paged_decode_attention(
    const void *query, int64_t q_row_stride, int64_t q_head_stride, int q_dtype,
    void *out, int64_t out_row_stride, int64_t out_head_stride,
    const void *k_cache, const void *v_cache, int kv_dtype, const float *kv_lut,
    float k_scale, float v_scale,
    const int32_t *block_tables, int64_t table_stride, const int32_t *seq_lens,
    const int32_t *rows, const int32_t *seqs, int n,
    int num_heads, int num_kv_heads, int head_dim, int block_size, float scale) {
    const Problem p = {query, q_row_stride, q_head_stride, q_dtype, out, out_row_stride, out_head_stride,
                       k_cache, v_cache, kv_lut, k_scale, v_scale, block_tables, table_stride,
                       seq_lens, rows, seqs, n, num_heads, num_kv_heads, head_dim, block_size, scale};
    int max_len = 1;
    for (int i = 0; i < n; i++)
        if (seq_lens[seqs[i]] > max_len) max_len = seq_lens[seqs[i]];
    Scratch w = {
        malloc(sizeof(float) * (size_t)num_heads * max_len), malloc(sizeof(float) * (size_t)num_heads * head_dim),
        malloc(sizeof(float) * (size_t)num_heads * head_dim), malloc(sizeof(float) * (size_t)block_size * num_kv_heads * head_dim),
        malloc(sizeof(float) * (size_t)num_heads),
    };
    int status = -1;
    if (w.scores && w.qf && w.acc && w.kv && w.best) {
        attend_all(&p, &w, kv_dtype);
        status = 0;
    }
    free(w.scores), free(w.qf), free(w.acc), free(w.kv), free(w.best);
    return status;
}
