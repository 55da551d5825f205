"""CacheConfig: the paged KV cache."""

from infernetes.schema.choices import KV_CACHE_DTYPES
from infernetes.schema.declare import Arg

G = "CacheConfig"

ARGS = (
    Arg(
        "block-size",
        "int",
        None,
        G,
        "Tokens per KV-cache block; chosen for the platform when unset.",
        choices=(1, 8, 16, 32, 64, 128),
    ),
    Arg(
        "gpu-memory-utilization",
        "float",
        0.9,
        G,
        "Fraction of GPU memory this instance may use for weights, activations and KV cache.",
        minimum=0,
        maximum=1,
        exclusive_minimum=True,
    ),
    Arg(
        "kv-cache-memory-bytes",
        "size",
        None,
        G,
        "KV-cache size in bytes per GPU (takes 4G, 512M, ...); overrides --gpu-memory-utilization for the cache.",
        minimum=1,
    ),
    Arg("swap-space", "float", 4, G, "CPU swap space per GPU in GiB.", minimum=0),
    Arg(
        "kv-cache-dtype",
        "str",
        "auto",
        G,
        "KV-cache dtype; auto uses the model dtype, fp8 means fp8_e4m3.",
        choices=KV_CACHE_DTYPES,
    ),
    Arg(
        "num-gpu-blocks-override",
        "int",
        None,
        G,
        "Use exactly this many KV-cache blocks instead of the profiled number.",
        minimum=1,
    ),
    Arg(
        "enable-prefix-caching",
        "bool",
        None,
        G,
        "Reuse KV-cache blocks of shared prompt prefixes (on by default).",
    ),
    Arg(
        "prefix-caching-hash-algo",
        "str",
        "builtin",
        G,
        "Hash of prefix-cache blocks: builtin (fast), sha256 (collision resistant) or "
        "sha256_cbor (vLLM's portable hash, which a KV-aware router recomputes; seeded by "
        "PYTHONHASHSEED).",
        choices=("builtin", "sha256", "sha256_cbor"),
    ),
    Arg(
        "cpu-offload-gb",
        "float",
        0,
        G,
        "GiB of weights per GPU kept in CPU memory and streamed in.",
        minimum=0,
    ),
    Arg(
        "calculate-kv-scales",
        "bool",
        False,
        G,
        "Compute fp8 KV-cache scales at run time instead of loading them.",
    ),
    Arg(
        "kv-sharing-fast-prefill",
        "bool",
        False,
        G,
        "Skip prefill work for layers that share their KV cache with earlier layers.",
    ),
)
