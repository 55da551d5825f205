"""GGUF's quantized block types as ``GroupQuantWeight``s, exactly: each block's integers are kept
and its scale and minimum become a group's ``scale`` and ``offset``, computed in float32 as the
``gguf`` package's reference dequantisation computes them (``gguf.quants.dequantize``), so
``dequantize(float32)`` gives its values bit for bit. Where float16 holds every one of them
exactly (Q8_0's and Q4_1's are the file's f16 fields, Q4_0's ``-8 * d`` short of overflow) they
stay float16, the file's bytes; the K-quants' products of two scales need float32.

A row of a GGUF tensor (``[N, K]``, the layout of a torch weight) is a run of blocks along K:

- Q8_0: 32 int8 after one f16 scale ``d``: group 32, 8 bits, ``w = d * q``.
- Q4_0 / Q4_1: 32 4-bit codes after ``d`` (and Q4_1's f16 minimum ``m``), element ``j`` in the
  low nibble of byte ``j``, ``j + 16`` in its high one: ``w = d * (q - 8)``, ``w = d * q + m``.
- Q5_0 / Q5_1: as Q4_0 / Q4_1 with a fifth bit for element ``j`` at bit ``j`` of four bytes
  (``qh``, little-endian) after the scales: ``w = d * (q - 16)``, ``w = d * q + m``, the codes
  kept as 8 bits (``q - 16`` for Q5_0, so no offset).
- Q4_K / Q5_K: super-blocks of 256 with ``d``, ``dmin`` and eight 6-bit scales and minimums, one
  per group of 32: ``w = d * sc * q - dmin * m``; Q5_K's fifth bits come in 32 bytes of their own,
  so its codes (0..31) are kept as 8 bits.
- Q6_K: super-blocks of 256 in 16 groups of 16 with an int8 scale each and ``d`` at the end:
  ``w = d * sc * (q - 32)``, kept as 8 bits.

Every type is marked ``int8_activations``: decode on the CPU multiplies it with x quantized to
int8 blocks of 32, as llama.cpp does for Q8_0, Q4_0 and Q4_1 (kernels/cpu/int8_linear.py, Q6_K's
groups of 16 two to a block; for the K-quants llama.cpp quantizes x in blocks of 256).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
from gguf import GGMLQuantizationType
from infernetes.runtime.model_executor.layers.quantization.group_quant import GroupQuantWeight

Q = GGMLQuantizationType
SUPER_BLOCK = 256  # the K-quants' QK_K


def _f16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The f16 field at byte ``at`` of each block, as float32 ``[rows, blocks]``."""
    return blocks[..., at : at + 2].contiguous().view(torch.float16)[..., 0].float()


def _as_stored(
    scale: torch.Tensor, offset: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A float32 scale and offset (or None) in float16 when it holds both exactly, else as
    they are."""
    wide = [t for t in (scale, offset) if t is not None]
    narrow = [t.half() for t in wide]
    if not all(torch.equal(n.float(), t) for n, t in zip(narrow, wide, strict=True)):
        return scale, offset
    return narrow[0], narrow[1] if offset is not None else None


def _nibbles(codes: torch.Tensor, run: int) -> torch.Tensor:
    """Bytes ``[..., n]`` read in runs of ``run`` bytes: a run's low nibbles are ``run`` values,
    then its high nibbles the next ``run``."""
    runs = codes.reshape(*codes.shape[:-1], -1, 1, run)
    return torch.cat((runs & 0x0F, runs >> 4), dim=-2).reshape(*codes.shape[:-1], -1)


def _repack4(codes: torch.Tensor, run: int) -> torch.Tensor:
    """The 4-bit codes of ``_nibbles(codes, run)`` in GroupQuantWeight's layout (input 2j in
    the low nibble, 2j + 1 in the high one) as ``[rows, K // 2]``, byte by byte: the first half
    of a run's values are the low nibbles of its bytes, the second half the high ones."""
    runs = codes.reshape(codes.shape[0], -1, run)
    even, odd = runs[..., 0::2], runs[..., 1::2]
    low = (even & 0x0F) | (odd << 4)
    high = (even >> 4) | (odd & 0xF0)
    return torch.cat((low, high), dim=-1).reshape(codes.shape[0], -1)


def _k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and minimums of a Q4_K/Q5_K super-block's 12 bytes: bytes 0..3
    hold scales 0..3 (low 6 bits), 4..7 minimums 0..3, 8..11 the low 4 bits of scales 4..7
    (low nibble) and minimums 4..7 (high nibble), whose top 2 bits are the top bits of 0..7."""
    low, mid, high = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = torch.cat((low & 0x3F, (high & 0x0F) | ((low >> 2) & 0x30)), dim=-1)
    mins = torch.cat((mid & 0x3F, (high >> 4) | ((mid >> 2) & 0x30)), dim=-1)
    return scales.float(), mins.float()


def _flat(values: torch.Tensor) -> torch.Tensor:
    """``[rows, blocks, per block]`` as ``[rows, blocks * per block]``."""
    return values.reshape(values.shape[0], -1).contiguous()


def _q8_0(blocks: torch.Tensor) -> GroupQuantWeight:
    q = blocks[..., 2:34].contiguous().view(torch.int8)
    scale, _ = _as_stored(_flat(_f16(blocks, 0)), None)
    return GroupQuantWeight(_flat(q), scale, None, 32, 8, int8_activations=True)


def _q4_0(blocks: torch.Tensor) -> GroupQuantWeight:
    d = _f16(blocks, 0)
    q = _repack4(blocks[..., 2:18], 16)
    scale, offset = _as_stored(_flat(d), _flat(-8 * d))
    return GroupQuantWeight(q, scale, offset, 32, 4, int8_activations=True)


def _q4_1(blocks: torch.Tensor) -> GroupQuantWeight:
    q = _repack4(blocks[..., 4:20], 16)
    scale, offset = _as_stored(_flat(_f16(blocks, 0)), _flat(_f16(blocks, 2)))
    return GroupQuantWeight(q, scale, offset, 32, 4, int8_activations=True)


def _fifth_bits(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """Q5_0's / Q5_1's 32 fifth bits (bit j of the little-endian 4 bytes at ``at``), as 0 or 16."""
    bits = blocks[..., at : at + 4].unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)
    return ((bits & 1) << 4).reshape(*blocks.shape[:-1], 32)


def _q5_0(blocks: torch.Tensor) -> GroupQuantWeight:
    q = (_nibbles(blocks[..., 6:22], 16) | _fifth_bits(blocks, 2)).to(torch.int8) - 16
    scale, _ = _as_stored(_flat(_f16(blocks, 0)), None)
    return GroupQuantWeight(_flat(q), scale, None, 32, 8, int8_activations=True)


def _q5_1(blocks: torch.Tensor) -> GroupQuantWeight:
    q = (_nibbles(blocks[..., 8:24], 16) | _fifth_bits(blocks, 4)).to(torch.int8)
    scale, offset = _as_stored(_flat(_f16(blocks, 0)), _flat(_f16(blocks, 2)))
    return GroupQuantWeight(_flat(q), scale, offset, 32, 8, int8_activations=True)


def _k_groups(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's per-group scale ``d * sc`` and offset ``-(dmin * m)``."""
    scales, mins = _k_scales(blocks[..., 4:16])
    d, dmin = _f16(blocks, 0).unsqueeze(-1), _f16(blocks, 2).unsqueeze(-1)
    return _flat(d * scales), _flat(-(dmin * mins))


def _q4_k(blocks: torch.Tensor) -> GroupQuantWeight:
    scale, offset = _k_groups(blocks)
    q = _repack4(blocks[..., 16:144], 32)
    return GroupQuantWeight(q, scale, offset, 32, 4, int8_activations=True)


def _q5_k(blocks: torch.Tensor) -> GroupQuantWeight:
    scale, offset = _k_groups(blocks)
    low = _nibbles(blocks[..., 48:176], 32)
    # group j's fifth bits are bit j of the 32 high-bit bytes
    shifts = torch.arange(8, dtype=torch.uint8).reshape(8, 1)
    high = ((blocks[..., 16:48].unsqueeze(-2) >> shifts) & 1).reshape(low.shape)
    q = (low | (high << 4)).to(torch.int8)
    return GroupQuantWeight(_flat(q), scale, offset, 32, 8, int8_activations=True)


def _q6_k(blocks: torch.Tensor) -> GroupQuantWeight:
    low = _nibbles(blocks[..., 0:128], 64)
    # each half of the super-block: 32 bytes of 2-bit fields, four runs of 32 values
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(4, 1)
    halves = blocks[..., 128:192].reshape(*blocks.shape[:-1], 2, 1, 32)
    high = ((halves >> shifts) & 3).reshape(low.shape)
    q = (low | (high << 4)).to(torch.int8) - 32
    scales = blocks[..., 192:208].contiguous().view(torch.int8).float()
    scale = _f16(blocks, 208).unsqueeze(-1) * scales
    return GroupQuantWeight(_flat(q), _flat(scale), None, 16, 8, int8_activations=True)


# type: (bytes per block, values per block, conversion of [rows, blocks, bytes] uint8)
BLOCK_TYPES: dict[Q, tuple[int, int, Callable[[torch.Tensor], GroupQuantWeight]]] = {
    Q.Q8_0: (34, 32, _q8_0),
    Q.Q4_0: (18, 32, _q4_0),
    Q.Q4_1: (20, 32, _q4_1),
    Q.Q5_0: (22, 32, _q5_0),
    Q.Q5_1: (24, 32, _q5_1),
    Q.Q4_K: (144, SUPER_BLOCK, _q4_k),
    Q.Q5_K: (176, SUPER_BLOCK, _q5_k),
    Q.Q6_K: (210, SUPER_BLOCK, _q6_k),
}


def group_quant_weight(raw: np.ndarray, qtype: Q) -> GroupQuantWeight:
    """The ``[N, K]`` weight whose rows are ``raw``'s (uint8 ``[N, bytes per row]``, as
    ``gguf.GGUFReader`` gives a quantized tensor) in block type ``qtype``."""
    block_bytes, _, convert = BLOCK_TYPES[qtype]
    rows = torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True)).reshape(raw.shape[0], -1)
    return convert(rows.reshape(rows.shape[0], -1, block_bytes))


def in_one_form(parts: list[GroupQuantWeight]) -> list[GroupQuantWeight]:
    """The parts of a fused layer stored in different block types (llama.cpp's ``Q4_K_M`` keeps
    some V projections in Q6_K) in one form, values unchanged: 8 bits where any part has them
    (4-bit codes fit in int8), the smallest group (each scale and offset repeated), and float32
    scales unless every part's are float16."""
    bits = max(p.bits for p in parts)
    group = math.gcd(*(p.group_size for p in parts))
    dtypes = {p.scale.dtype for p in parts}
    scale_dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    alike = []
    for part in parts:
        if part.scale.dtype != scale_dtype:
            offset = part.offset.float() if part.offset is not None else None
            part = replace(part, scale=part.scale.float(), offset=offset)
        if part.bits != bits:
            part = replace(part, qweight=part.unpacked().to(torch.int8), bits=bits)
        if part.group_size != group:
            repeat = part.group_size // group
            offset = part.offset.repeat_interleave(repeat, 1) if part.offset is not None else None
            scale = part.scale.repeat_interleave(repeat, 1)
            part = replace(part, scale=scale, offset=offset, group_size=group)
        alike.append(part)
    return alike
