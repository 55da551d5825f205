"""Decode steps replayed from C on the CPU: the host's counterpart of a CUDA graph.

A decode step of a small model on a CPU spends as long in Python as in its kernels: each layer's
ten C kernels are reached through module calls, dispatch, checks and ctypes (measured on
SmolLM2-135M: 9.4 ms a token, 3.8 of them in the linear kernels). The step's work is the same
every time for a batch size, so `record` runs the forward once while writing down every kernel
call (`native.Traced`) and every torch op (a dispatch mode), and `Program` replays them: runs of
kernel calls through one C loop (the trampolines below, generated from ``native.SIGNATURES``),
torch ops in between by running them again on the same tensors.

What makes a replay equal the forward it recorded: every tensor the recording created is kept (so
the pointers written down stay valid and distinct), the step's inputs live in static buffers
(`cuda_graph.DecodeGraphs`), and nothing in the forward decides on tensor values on the host. A
recording that sees such a read (``.item()``, ``.tolist()``, an op whose output shape depends on
values) is refused with the reason, and the caller runs that step eagerly.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from infernetes.kernels.cpu import native
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

logger = logging.getLogger(__name__)

_C_TYPES = {
    ctypes.c_void_p: "void *",
    ctypes.c_int64: "int64_t",
    ctypes.c_int: "int",
    ctypes.c_float: "float",
    ctypes.c_double: "double",
}
_REALS = (ctypes.c_float, ctypes.c_double)
KINDS = tuple(sorted(native.SIGNATURES))  # a recorded call's kind: its kernel's index here

# Ops that only make a tensor (no values to compute again) or a view of one.
_NO_WORK = {
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.detach.default,
}
_HOST_READS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)


def _source() -> str:
    """C trampolines, one per kernel, that call it with its recorded arguments, and the loop."""
    lines = [
        "#include <stdint.h>",
        "typedef int (*Caller)(void *fn, const int64_t *i, const double *r);",
        "typedef struct { void *fn; const int64_t *ints; const double *reals; int32_t kind;"
        " int32_t expect; } Call;",
    ]
    for k, symbol in enumerate(KINDS):
        argtypes = native.SIGNATURES[symbol][1]
        params, args, ints, reals = [], [], 0, 0
        for t in argtypes:
            c_type = _C_TYPES[t]
            params.append(c_type)
            if t in _REALS:
                args.append(f"({c_type})r[{reals}]")
                reals += 1
            elif t is ctypes.c_void_p:
                args.append(f"(void *)(intptr_t)i[{ints}]")
                ints += 1
            else:
                args.append(f"({c_type})i[{ints}]")
                ints += 1
        lines.append(
            f"static int call_{k}(void *fn, const int64_t *i, const double *r) {{ /* {symbol} */\n"
            f"    (void)i, (void)r;\n"
            f"    return ((int (*)({', '.join(params)}))fn)({', '.join(args)});\n}}"
        )
    lines.append(
        f"static const Caller callers[] = {{{', '.join(f'call_{k}' for k in range(len(KINDS)))}}};"
    )
    lines.append(
        "/* Runs the calls in order; returns -1, or the index of the first whose status is not the\n"
        " * one it returned when recorded (then its status in *status). */\n"
        "int replay(const Call *calls, int n, int *status) {\n"
        "    for (int k = 0; k < n; k++) {\n"
        "        const int s = callers[calls[k].kind](calls[k].fn, calls[k].ints, calls[k].reals);\n"
        "        if (s != calls[k].expect) { *status = s; return k; }\n"
        "    }\n"
        "    return -1;\n"
        "}"
    )
    return "\n".join(lines) + "\n"


@cache
def library() -> ctypes.CDLL | None:
    lib = native.load_generated("replay", _source())
    if lib is not None:
        lib.replay.restype = ctypes.c_int
        lib.replay.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    return lib


class _Call(ctypes.Structure):
    _fields_ = [
        ("fn", ctypes.c_void_p),
        ("ints", ctypes.c_void_p),
        ("reals", ctypes.c_void_p),
        ("kind", ctypes.c_int32),
        ("expect", ctypes.c_int32),
    ]


@dataclass
class _KernelCall:
    symbol: str
    address: int
    ints: list[int]
    reals: list[float]
    status: int


@dataclass(repr=False)
class _TorchOp:
    """A torch op run again on the recorded tensors; an op that returns new tensors copies them
    into the recorded ones, which later calls read."""

    func: Any
    args: tuple
    kwargs: dict
    outputs: list[torch.Tensor] | None  # None: the op writes its arguments in place

    def __repr__(self) -> str:
        return f"_TorchOp({self.func})"

    def __call__(self) -> None:
        result = self.func(*self.args, **self.kwargs)
        if self.outputs is not None:
            for recorded, new in zip(self.outputs, tree_flatten(result)[0], strict=True):
                recorded.copy_(new)


class _Kernels:
    """A run of recorded kernel calls, replayed by one C call."""

    def __init__(self, calls: Sequence[_KernelCall]) -> None:
        self.symbols = [c.symbol for c in calls]
        self.ints = torch.tensor([v for c in calls for v in c.ints] or [0], dtype=torch.int64)
        self.reals = torch.tensor([v for c in calls for v in c.reals] or [0.0], dtype=torch.float64)
        self.calls = (_Call * len(calls))()
        i = r = 0
        for slot, c in zip(self.calls, calls, strict=True):
            slot.fn = c.address
            slot.ints = self.ints.data_ptr() + 8 * i
            slot.reals = self.reals.data_ptr() + 8 * r
            slot.kind, slot.expect = KINDS.index(c.symbol), c.status
            i, r = i + len(c.ints), r + len(c.reals)
        self.address = ctypes.addressof(self.calls)
        self.count = len(calls)
        self.status = ctypes.c_int(0)

    def __call__(self) -> None:
        lib = library()
        assert lib is not None  # a Program exists only where it was built
        failed = lib.replay(self.address, self.count, ctypes.byref(self.status))
        if failed >= 0:
            raise RuntimeError(
                f"the replayed CPU kernel {self.symbols[failed]} failed (status "
                f"{self.status.value})"
            )


@dataclass
class Program:
    """A recorded forward: its output and the steps that compute it again."""

    output: Any
    steps: list[Callable[[], None]]
    kept: list[torch.Tensor] = field(repr=False)  # every tensor the recording made

    @property
    def kernel_runs(self) -> int:
        return sum(isinstance(s, _Kernels) for s in self.steps)

    @property
    def torch_ops(self) -> int:
        return sum(isinstance(s, _TorchOp) for s in self.steps)

    def __call__(self) -> Any:
        for step in self.steps:
            step()
        return self.output


class Refused(Exception):
    """The forward cannot be replayed; the message says why."""


class Tape(TorchDispatchMode):
    """Writes down the kernel calls (through `native.Traced`) and torch ops of a forward."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[_KernelCall | _TorchOp] = []
        self.kept: list[torch.Tensor] = []
        self.refusal: str | None = None

    def kernel_call(self, traced: native.Traced, args: tuple, status: int) -> None:
        ints, reals = [], []
        for t, value in zip(traced.function.argtypes, args, strict=True):
            value = getattr(value, "value", value)  # a ctypes scalar
            if t in _REALS:
                reals.append(float(value))
            else:
                ints.append(0 if value is None else int(value))
        address = ctypes.cast(traced.function, ctypes.c_void_p).value or 0
        self.entries.append(_KernelCall(traced.symbol, address, ints, reals, int(status)))

    def refuse(self, why: str) -> None:
        if self.refusal is None:
            self.refusal = why

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.kept.extend(tensors)
        if any(tag in func.tags for tag in _HOST_READS) and not _integer_indexing(func, args):
            self.refuse(f"{func} reads tensor values on the host")
        elif func is torch.ops.aten.lift_fresh.default:
            self.refuse("a tensor made from host values (torch.tensor) inside the forward")
        elif any(t.device.type != "cpu" for t in tensors):
            self.refuse(f"{func} made a tensor off the CPU")
        elif func not in _NO_WORK:
            writes = any(
                a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments
            )
            if writes:  # in place or out=: run again as it is
                self.entries.append(_TorchOp(func, args, kwargs, None))
            elif not _aliases(tensors, (args, kwargs)):
                self.entries.append(_TorchOp(func, args, kwargs, tensors))
        return out


def _aliases(outputs: list[torch.Tensor], inputs) -> bool:
    """Whether every output shares its storage with an input: a view, nothing computed (``to``
    and ``reshape`` are views or copies depending on the tensors, so their schema cannot say)."""
    storages = {_storage(t) for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)}
    return all(_storage(t) is not None and _storage(t) in storages for t in outputs)


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):  # opaque (oneDNN's packed weights): no storage
        return None


def _integer_indexing(func, args) -> bool:
    """``x[indices]`` with integer index tensors: its shape is the indices', whatever their values
    (a boolean mask's is not)."""
    return func is torch.ops.aten.index.Tensor and all(
        i is None or not (i.dtype == torch.bool or i.dtype == torch.uint8) for i in args[1]
    )


def _refuse_host_reads(tape: Tape):
    """``.tolist()`` and ``.numpy()`` read values without a dispatched op: while recording, they
    refuse the recording when the recording thread calls them (and still answer)."""
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

    def wrap(name):
        original = originals[name]

        def read(self, *args, **kwargs):
            if getattr(native.recording, "tape", None) is tape:  # this thread's forward
                tape.refuse(f"Tensor.{name}() reads tensor values on the host")
            return original(self, *args, **kwargs)

        return read

    return originals, {name: wrap(name) for name in originals}


def record(forward: Callable[[], Any]) -> Program:
    """Runs ``forward`` once, recording it; its replay. Raises `Refused` (with the reason) when it
    cannot be replayed: the C kernels off, or a host read of tensor values."""
    if library() is None:
        raise Refused("the C kernels are off or cannot be built")
    if getattr(native.recording, "tape", None) is not None:
        raise Refused("a recording is already in progress")
    tape = Tape()
    originals, patched = _refuse_host_reads(tape)
    native.recording.tape = tape
    for name, function in patched.items():
        setattr(torch.Tensor, name, function)
    try:
        with tape:
            output = forward()
    finally:
        native.recording.tape = None
        for name, function in originals.items():
            setattr(torch.Tensor, name, function)
    if tape.refusal is not None:
        raise Refused(tape.refusal)
    steps: list[Callable[[], None]] = []
    run: list[_KernelCall] = []
    for entry in tape.entries:
        if isinstance(entry, _KernelCall):
            run.append(entry)
            continue
        if run:
            steps.append(_Kernels(run))
            run = []
        steps.append(entry)
    if run:
        steps.append(_Kernels(run))
    return Program(output, steps, tape.kept)
