"""Builds and loads the C kernels of the CPU path (``*.c`` beside this file) with the system compiler.

Built at first use with ``-O3 -march=native`` (so the loops vectorise for the CPU at hand) into a
per-user cache, keyed by the source, the flags, the compiler and the CPU, and loaded through
ctypes: no torch headers, so a build takes about a second. Without a working C compiler the CPU
path falls back to the torch reference, with one warning in the log.

``INFERNETES_CPU_KERNELS=0`` turns the C kernels off; ``INFERNETES_CPU_MARCH`` builds them for
another ``-march`` than ``native`` (``x86-64-v3``: AVX2 without AVX-512; ``x86-64``: the scalar
loops), which is how the tests run the paths this CPU would not take. The cache is
``INFERNETES_KERNEL_CACHE`` when set, else ``kernels/`` under ``VLLM_CACHE_ROOT`` (vLLM's folder for compiled artefacts), else
``$XDG_CACHE_HOME/infernetes/kernels`` (``~/.cache/infernetes/kernels``).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import torch

from infernetes.schema.env import read_env

logger = logging.getLogger(__name__)

# How the C kernels name an element type (their `dtype` arguments): one ABI for every kernel;
# each module keeps the subset its kernels take.
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def dtype_codes(*dtypes: torch.dtype) -> dict[torch.dtype, int]:
    """The codes of ``dtypes``, the element types a kernel takes."""
    return {dtype: DTYPE_CODES[dtype] for dtype in dtypes}


SOURCE_DIR = Path(__file__).resolve().parent
ENABLE_ENV = "INFERNETES_CPU_KERNELS"
CACHE_ENV = "INFERNETES_KERNEL_CACHE"
CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
MARCH_ENV = "INFERNETES_CPU_MARCH"
# Reassociation lets the compiler vectorise the dot products and sums; no -ffast-math, so exp,
# infinities and NaNs keep their IEEE meaning.
FLAGS = (
    "-O3",
    "-shared",
    "-fPIC",
    "-std=c11",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-ffp-contract=fast",
)

# Per source: the elementwise kernels must round each product and sum as torch does (no
# contraction), and on x86 they gain from whole AVX-512 vectors (gcc prefers 256-bit ones).
_WIDE = ("-mprefer-vector-width=512",) if platform.machine() in ("x86_64", "AMD64") else ()
# OpenMP: the .so's libgomp.so.1 resolves to the copy torch has loaded, so they share one pool.
EXTRA_FLAGS = {
    "elementwise": ("-ffp-contract=off", *_WIDE),
    "group_quant": ("-fopenmp", *_WIDE),
    "skinny_linear": ("-fopenmp", *_WIDE),
    "int8_linear": ("-fopenmp", *_WIDE),
}

# The leading arguments of the kernels on quantized weights (group_quant_linear, int8_linear),
# marshalled by `quantized_linear`.
_QUANT_LINEAR_ARGS = [
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int,  # x, its row stride, dtype
    ctypes.c_void_p,
    ctypes.c_int64,  # y, its row stride
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,  # qweight, scale, offset, bias
    ctypes.c_int,  # the scale's and offset's dtype
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,  # M, N, K
]

# Each kernel's C signature, its one home: ctypes converts the calls' arguments by it, and
# replay.py generates the C trampolines that replay recorded calls from it. Pointers go as plain
# addresses (``tensor.data_ptr()``): a ctypes.cast to a typed pointer costs half a microsecond, and
# decode attention passed four per layer in every step.
SIGNATURES = {
    "paged_decode_attention": (
        ctypes.c_int,
        [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int,  # query, strides, dtype
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,  # out, strides
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_void_p,  # k/v cache, dtype, byte table (float32)
            ctypes.c_float,
            ctypes.c_float,  # k_scale, v_scale
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,  # block tables, their row stride, seq_lens (int32)
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,  # rows, seqs, n
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_float,  # H, Hkv, D, block, scale
        ],
    ),
    "group_quant_linear": (
        ctypes.c_int,
        [*_QUANT_LINEAR_ARGS, ctypes.c_int, ctypes.c_int, ctypes.c_int],  # group, bits, threads
    ),
    "group_quant_dequantize": (
        ctypes.c_int,
        [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,  # qweight, scale, offset, their dtype
            ctypes.c_void_p,
            ctypes.c_int,  # out, its dtype
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,  # n0, n1, K, group, bits, threads
        ],
    ),
    "int8_linear": (
        ctypes.c_int,
        [*_QUANT_LINEAR_ARGS, ctypes.c_int, ctypes.c_int, ctypes.c_int],  # bits, group, threads
    ),
    "rms_norm": (
        ctypes.c_int,
        [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,  # x, residual, weight
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_float,
            ctypes.c_int,
        ],
    ),
    "rotary_embedding": (
        ctypes.c_int,
        [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,  # positions, cos_sin, its row stride
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int,  # query and its strides, heads
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int,  # key
            ctypes.c_void_p,
            ctypes.c_void_p,  # outputs
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,  # T, D, rot_dim, neox, dtype
        ],
    ),
    "skinny_linear": (
        ctypes.c_int,
        [
            ctypes.c_void_p,
            ctypes.c_int64,  # x, its row stride
            ctypes.c_void_p,
            ctypes.c_int64,  # y, its row stride
            ctypes.c_void_p,
            ctypes.c_void_p,  # weight, bias
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,  # dtype, M, N, K, threads
        ],
    ),
    "store_kv": (
        ctypes.c_int,
        [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,  # key and its strides
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,  # value and its strides
            ctypes.c_void_p,
            ctypes.c_void_p,  # k/v cache
            ctypes.c_void_p,
            ctypes.c_int64,  # slots, the caches' slot count
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,  # T, Hkv, D, element size
        ],
    ),
    "silu_and_mul": (
        ctypes.c_int,
        [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
        ],
    ),
}


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if os.environ.get(CACHE_ROOT_ENV):
        return Path(read_env(CACHE_ROOT_ENV)) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "infernetes" / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


@cache
def _cpuinfo() -> str | None:
    """/proc/cpuinfo's text, read once; None where there is no such file."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def _cpu_identity() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    text = _cpuinfo()
    if text is None:
        return platform.processor()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(lines)))


@cache
def cpu_fields() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (``vendor_id``, ``flags``, ...); empty
    where there is no such file."""
    text = _cpuinfo()
    if text is None:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return fields


@cache
def mkl_tuned_here() -> bool:
    """Whether torch's float32 products (MKL) run the code made for this CPU: MKL picks its
    AVX-512 kernels, and spreads a single row's product over the threads, on Intel CPUs only
    (on an AMD EPYC it ran AVX2 code, and one row on one thread)."""
    return torch.backends.mkl.is_available() and cpu_fields().get("vendor_id") == "GenuineIntel"


def _build(name: str, compiler: str, text: str | None = None) -> Path:
    """The library of ``name.c`` here, or of the C source ``text`` (generated) under that name."""
    source = text if text is not None else (SOURCE_DIR / f"{name}.c").read_text()
    headers = [path.read_text() for path in sorted(SOURCE_DIR.glob("*.h"))]
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=False
    ).stdout
    march = os.environ.get(MARCH_ENV, "").strip() or "native"
    flags = (*FLAGS, f"-march={march}", *EXTRA_FLAGS.get(name, ()))
    key = hashlib.sha256(
        "\0".join(
            [
                source,
                *headers,
                " ".join(flags),
                version,
                _cpu_identity(),
                platform.machine(),
            ]
        ).encode()
    ).hexdigest()[:16]
    target = cache_dir() / f"{name}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: processes starting together never load half a file.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        source_file = Path(scratch) / f"{name}.c"
        source_file.write_text(source)
        result = subprocess.run(
            [compiler, *flags, f"-I{SOURCE_DIR}", "-o", str(built), str(source_file), "-lm"],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} could not build {name}.c:\n{result.stderr.strip()}")
        os.replace(built, target)
    return target


class Traced:
    """A kernel's ctypes function that also writes each call to the tape of a recording in
    progress (replay.py), after making it."""

    __slots__ = ("function", "symbol")

    def __init__(self, symbol: str, function: Any) -> None:  # a ctypes function
        self.symbol, self.function = symbol, function

    def __call__(self, *args: object) -> int:
        status = self.function(*args)
        tape = getattr(recording, "tape", None)
        if tape is not None:
            tape.kernel_call(self, args, status)
        return status


# ``recording.tape``: this thread's recording in progress (replay.Tape), set only by replay.record
# (an engine steps on its own thread under async scheduling).
recording = threading.local()


@cache
def load(name: str) -> ctypes.CDLL | None:
    """The built library `name` (a ``.c`` file here), or None when it cannot be built or is off."""
    return _load(name, None)


def load_generated(name: str, text: str) -> ctypes.CDLL | None:
    """The library built from the generated C source ``text``, or None (as `load`)."""
    return _load(name, text)


def _load(name: str, text: str | None) -> ctypes.CDLL | None:
    if not enabled():
        return None
    compiler = _compiler()
    if compiler is None:
        logger.warning(
            "no C compiler (cc, gcc, clang or $CC) found: the CPU path uses the slower torch "
            "reference for decode attention"
        )
        return None
    try:
        library = ctypes.CDLL(str(_build(name, compiler, text)))
    except (OSError, RuntimeError) as error:
        logger.warning(
            "the C kernel %s is unavailable (%s): using the torch reference", name, error
        )
        return None
    for symbol, (restype, argtypes) in SIGNATURES.items():
        if hasattr(library, symbol):
            function = getattr(library, symbol)
            function.restype, function.argtypes = restype, argtypes
            setattr(library, symbol, Traced(symbol, function))
    return library


def prebuild() -> None:
    """Builds (or finds in the cache) every kernel here now: an engine calls this before it
    serves, so that no step waits for the compiler (a cold build on busy cores took over a
    minute, past the engine's step watchdog)."""
    from infernetes.kernels.cpu import replay

    for source in sorted(SOURCE_DIR.glob("*.c")):
        load(source.stem)
    replay.library()


# The dtypes the kernels on quantized weights read scales and offsets in: float16 as GGUF's
# blocks store them, float32 for the rest.
SCALE_DTYPE_CODES = dtype_codes(torch.float32, torch.float16)


def takes_scales(scale: torch.Tensor, offset: torch.Tensor | None) -> bool:
    """Whether those kernels read this scale and offset (or None) as they are: contiguous, of one
    dtype they take, the offset's shape the scale's."""
    return (
        scale.dtype in SCALE_DTYPE_CODES
        and scale.is_contiguous()
        and (
            offset is None
            or (
                offset.dtype == scale.dtype
                and offset.shape == scale.shape
                and offset.is_contiguous()
            )
        )
    )


def quantized_linear(
    kernel: Callable[..., int],
    rows_x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    bias: torch.Tensor | None,
    *tail: int,
) -> torch.Tensor:
    """``[M, N]``: `kernel` (group_quant_linear or int8_linear, whose leading arguments are
    ``_QUANT_LINEAR_ARGS``) on the rows ``rows_x`` (``[M, K]``, unit stride along K), the
    arguments particular to it in `tail`, then the thread count."""
    rows, outputs = rows_x.shape[0], qweight.shape[0]
    if bias is not None:
        bias = bias.to(rows_x.dtype).contiguous()
    out = torch.empty((rows, outputs), dtype=rows_x.dtype)
    status = kernel(
        rows_x.data_ptr(),
        rows_x.stride(0),
        DTYPE_CODES[rows_x.dtype],
        out.data_ptr(),
        out.stride(0),
        qweight.data_ptr(),
        scale.data_ptr(),
        offset.data_ptr() if offset is not None else None,
        bias.data_ptr() if bias is not None else None,
        SCALE_DTYPE_CODES[scale.dtype],
        rows,
        outputs,
        rows_x.shape[1],
        *tail,
        torch.get_num_threads(),
    )
    if status != 0:
        name = getattr(kernel, "symbol", "the kernel")  # a native.Traced
        raise MemoryError(f"{name}: the CPU kernel could not allocate its scratch")
    return out
