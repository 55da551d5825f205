/* Linear layers of few rows (decode: M = 1 .. 8) on dense float32 or bfloat16 weights on the CPU:
 * y = x @ w.T + bias, with w [N, K] row-major and contiguous, x [M, K] and y [M, N] rows with a
 * row stride, all of one dtype (dtypes.h: float32 or bfloat16; bias too, or NULL).
 *
 * Decode is bound by reading the weight once per token. Threads take spans of weight rows
 * (OpenMP, sharing torch's pool as group_quant.c does) and read them BLOCK rows at a time, every
 * cache line once, each loaded vector serving up to ROWS rows of x (more rows of x
 * read the block again, from the cache). Sums in float32: with AVX-512 BF16 the CPU's bf16 dot
 * product (32 products per instruction), else bfloat16 widened to float32 and a multiply-add.
 * The vector types below compile to AVX-512, AVX2 or SSE as -march allows.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtypes.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#define HAVE_BF16_DOT 1
#else
#define HAVE_BF16_DOT 0
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));

enum { LANES = 16, BLOCK = 4, ROWS = 4, PREFETCH = 2, CHUNK = 16, STREAM_AHEAD = 1024, ROW_STREAM_X_BYTES = 32768 };

static inline v16f load_f32(const float *restrict p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v16f load_bf16(const uint16_t *restrict p) {
    v16u16 h;
    memcpy(&h, p, sizeof h);
    return (v16f)(__builtin_convertvector(h, v16u32) << 16);
}

static inline float sum16(v16f v) {
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += v[l];
    return s;
}

/* One weight row (of type wdtype) against R rows of float32 x: out[r]. The rows of a block are read
 * one after the other, so each thread's reads form one sequential stream, which the hardware
 * prefetcher follows best (bench/cpu_gemv.py: four rows read side by side, short ones especially,
 * ran about 25% slower); the software prefetch runs STREAM_AHEAD elements down that stream,
 * into the next rows. Every prefetch here fetches into all cache levels: non-temporal ones read
 * at 11 GB/s on an Intel Xeon where these read at 23-28 (copy bandwidth 26). x's rows stay in L1
 * for the whole call. */
static inline __attribute__((always_inline)) void row_dots(const void *row, const int wdtype,
                                                           const float *restrict x, int64_t x_stride, int K,
                                                           float out[ROWS], const int R) {
    v16f acc[ROWS][2] = {{{0}}};
    const int elsize = wdtype == F32 ? 4 : 2;
    const int whole = K / (2 * LANES) * (2 * LANES);
    for (int k = 0; k < whole; k += 2 * LANES) {
        __builtin_prefetch((const char *)row + (k + STREAM_AHEAD) * elsize, 0, 3);
        if (elsize == 4) __builtin_prefetch((const char *)row + (k + STREAM_AHEAD + LANES) * elsize, 0, 3);
        for (int j = 0; j < 2; j++) {
            const int kk = k + j * LANES;
            const v16f w = wdtype == F32 ? load_f32((const float *)row + kk) : load_bf16((const uint16_t *)row + kk);
            for (int r = 0; r < R; r++) acc[r][j] += w * load_f32(x + r * x_stride + kk);
        }
    }
    for (int r = 0; r < R; r++) {
        float s = sum16(acc[r][0] + acc[r][1]);
        for (int k = whole; k < K; k++) s += load_one(row, k, wdtype, NULL) * x[r * x_stride + k];
        out[r] = s;
    }
}

/* Weight rows `rows[0 .. BLOCK)` (of type wdtype) against R rows of float32 x: out[i][r]. */
static inline __attribute__((always_inline)) void block_dots(const void *const rows[BLOCK], int64_t ahead,
                                                             const int wdtype,
                                                             const float *restrict x, int64_t x_stride, int K,
                                                             float out[BLOCK][ROWS], const int R) {
    v16f acc[BLOCK][ROWS] = {{{0}}};
    const int elsize = wdtype == F32 ? 4 : 2;
    const int whole = K / LANES * LANES;
    for (int k = 0; k < whole; k += LANES) {
        v16f w[BLOCK];
        if (k % 32 == 0)
            for (int i = 0; i < BLOCK; i++) __builtin_prefetch((const char *)rows[i] + ahead + k * elsize, 0, 3);
        for (int i = 0; i < BLOCK; i++)
            w[i] = wdtype == F32 ? load_f32((const float *)rows[i] + k) : load_bf16((const uint16_t *)rows[i] + k);
        for (int r = 0; r < R; r++) {
            const v16f xv = load_f32(x + r * x_stride + k);
            for (int i = 0; i < BLOCK; i++) acc[i][r] += w[i] * xv;
        }
    }
    for (int i = 0; i < BLOCK; i++)
        for (int r = 0; r < R; r++) {
            float s = sum16(acc[i][r]);
            for (int k = whole; k < K; k++) s += load_one(rows[i], k, wdtype, NULL) * x[r * x_stride + k];
            out[i][r] = s;
        }
}

#if HAVE_BF16_DOT
/* bfloat16 weights and x: 32 products per instruction, the tail by a masked (zero-filled) load. */
static inline __attribute__((always_inline)) void block_dots_bf16(const void *const rows[BLOCK], int64_t ahead,
                                                                  const uint16_t *restrict x, int64_t x_stride,
                                                                  int K, float out[BLOCK][ROWS], const int R) {
    __m512 acc[BLOCK][ROWS];
    for (int i = 0; i < BLOCK; i++)
        for (int r = 0; r < R; r++) acc[i][r] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) {
        const __mmask32 mask = K - k >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << (K - k)) - 1;
        __m512bh w[BLOCK];
        for (int i = 0; i < BLOCK; i++) __builtin_prefetch((const char *)rows[i] + ahead + 2 * k, 0, 3);
        for (int i = 0; i < BLOCK; i++)
            w[i] = (__m512bh)_mm512_maskz_loadu_epi16(mask, (const uint16_t *)rows[i] + k);
        for (int r = 0; r < R; r++) {
            const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + r * x_stride + k);
            for (int i = 0; i < BLOCK; i++) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], w[i], xv);
        }
    }
    for (int i = 0; i < BLOCK; i++)
        for (int r = 0; r < R; r++) out[i][r] = _mm512_reduce_add_ps(acc[i][r]);
}
#endif

typedef struct {
    const void *x; /* float32 [M, x_stride], or the caller's bfloat16 rows for the bf16 dot */
    int64_t x_stride;
    void *y;
    int64_t y_stride;
    const void *w;
    const void *bias;
    int dtype, bf16_dot, row_stream, M, N, K;
} Linear;

#define DOTS(R)                                                                                               \
    do {                                                                                                      \
        const float *xm = (const float *)p->x + m * p->x_stride;                                              \
        if (p->bf16_dot) BF16_DOTS(R);                                                                        \
        else if (p->row_stream)                                                                               \
            for (int i = 0; i < BLOCK; i++) row_dots(rows[i], p->dtype, xm, p->x_stride, p->K, out[i], R);   \
        else                                                                                                  \
            block_dots(rows, ahead, p->dtype, xm, p->x_stride, p->K, out, R);                                 \
    } while (0)
#if HAVE_BF16_DOT
#define BF16_DOTS(R) block_dots_bf16(rows, ahead, (const uint16_t *)p->x + m * p->x_stride, p->x_stride, p->K, out, R)
#else
#define BF16_DOTS(R) (void)0
#endif

static void linear_block(const Linear *p, int block) {
    const int n0 = block * BLOCK;
    const size_t row_bytes = (size_t)p->K * element_size(p->dtype);
    const void *rows[BLOCK];
    /* prefetched: the same place PREFETCH blocks on, a stream the hardware alone ramps up slowly
     * on rows of a few KB */
    const int64_t ahead = n0 + (PREFETCH + 1) * BLOCK <= p->N ? (int64_t)PREFETCH * BLOCK * row_bytes : 0;
    /* the last block repeats its last row rather than read past the weight */
    for (int i = 0; i < BLOCK; i++)
        rows[i] = (const char *)p->w + row_bytes * (size_t)(n0 + i < p->N ? n0 + i : p->N - 1);
    for (int m = 0; m < p->M; m += ROWS) {
        const int count = p->M - m < ROWS ? p->M - m : ROWS;
        float out[BLOCK][ROWS];
        switch (count) {
        case 4: DOTS(4); break;
        case 3: DOTS(3); break;
        case 2: DOTS(2); break;
        default: DOTS(1); break;
        }
        for (int i = 0; i < BLOCK && n0 + i < p->N; i++) {
            const float b = p->bias ? load_one(p->bias, n0 + i, p->dtype, NULL) : 0.0f;
            for (int r = 0; r < count; r++) store_one(p->y, (m + r) * p->y_stride + n0 + i, out[i][r] + b, p->dtype);
        }
    }
}

/* Returns 0, or -1 when scratch memory cannot be allocated. */
int skinny_linear(const void *x, int64_t x_stride, void *y, int64_t y_stride, const void *w, const void *bias,
                  int dtype, int M, int N, int K, int threads) {
    const int bf16_dot = HAVE_BF16_DOT && dtype == BF16;
    float *widened = NULL;
    /* Row by row while x's rows stay in L1 beside the stream; past that, each x vector loaded
     * serves BLOCK weight rows (bench/cpu_gemv.py: K = 4864 at 4 rows ran 25% slower row by row). */
    const int row_stream = (int64_t)M * K * (int64_t)sizeof(float) <= ROW_STREAM_X_BYTES;
    Linear p = {x, x_stride, y, y_stride, w, bias, dtype, bf16_dot, row_stream, M, N, K};
    if (dtype == BF16 && !bf16_dot) { /* x widened to float32 once, not once per weight block */
        widened = malloc(sizeof(float) * (size_t)M * K);
        if (!widened) return -1;
        for (int m = 0; m < M; m++)
            for (int k = 0; k < K; k++) widened[(int64_t)m * K + k] = load_one(x, m * x_stride + k, BF16, NULL);
        p.x = widened, p.x_stride = K;
    }
    const int blocks = (N + BLOCK - 1) / BLOCK;
    /* Spans of CHUNK blocks handed out as threads come free, not one fixed half each: on cores
     * shared with other work a thread that is descheduled leaves its rows to the other(s)
     * rather than hold up the whole call. */
#pragma omp parallel for schedule(dynamic, CHUNK) num_threads(threads)
    for (int block = 0; block < blocks; block++) linear_block(&p, block);
    free(widened);
    return 0;
}
