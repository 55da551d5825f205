/* Writing a step's keys and values into the paged KV cache on the CPU, in one call per layer.
 *
 * The torch path (reference/cache.py) is eight small ops per layer (the slots widened and checked
 * for -1, two index copies through reshaped views); at a decode step's one row per request their
 * dispatch costs far more than the few hundred bytes they move. Same element type in and out,
 * so a row is copied as bytes: bit for bit what the reference writes.
 */
#include <stdint.h>
#include <string.h>

/* key/value [T, Hkv, D] (strides in elements, the last one 1), caches [num_slots, Hkv, D]
 * contiguous, slots [T] (-1: skip the token); element_size in bytes. Returns the first token
 * whose slot is past the cache (nothing of it written), else -1. */
int store_kv(const void *key, int64_t k_stride0, int64_t k_stride1, const void *value,
              int64_t v_stride0, int64_t v_stride1, void *k_cache, void *v_cache,
              const int64_t *slots, int64_t num_slots, int tokens, int heads, int head_dim, int element_size) {
    const size_t row = (size_t)head_dim * element_size;
    const int64_t slot_bytes = (int64_t)heads * head_dim * element_size;
    const char *k = key, *v = value;
    char *kc = k_cache, *vc = v_cache;
    for (int t = 0; t < tokens; t++) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        if (slot >= num_slots) return t;
        for (int h = 0; h < heads; h++) {
            memcpy(kc + slot * slot_bytes + h * row,
                   k + ((int64_t)t * k_stride0 + (int64_t)h * k_stride1) * element_size, row);
            memcpy(vc + slot * slot_bytes + h * row,
                   v + ((int64_t)t * v_stride0 + (int64_t)h * v_stride1) * element_size, row);
        }
    }
    return -1;
}
