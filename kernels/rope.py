"""Building the rotary cos/sin cache, for the plain rope and its scaling variants.

The cache is `[max_position, rotary_dim]`: cos of the rotary_dim/2 frequencies, then their sin,
both multiplied by the variant's attention factor (yarn), in float32. `ops.rotary_embedding` reads
it by position. The frequencies follow Hugging Face transformers' rope initialisers, so a model
built on this cache matches transformers.

`rope_scaling` is the model config's `rope_scaling` (or transformers 5's `rope_parameters`) dict;
its `rope_type` (or legacy `type`) is one of `ROPE_TYPES`. `base` is `rope_theta`.

Dynamic NTK: transformers recomputes the frequencies from the length of the current forward pass.
A paged engine needs a function of the position alone, so position `p` uses the frequencies for a
sequence of length `max(p + 1, max_position_embeddings)`. That equals transformers for every
position below `max_position_embeddings` and for each decoded token; prompt tokens beyond it
differ slightly (transformers uses the prompt's full length for all of them).

LongRoPE (Phi-3; `su` is its old name) is the same kind of switch: transformers takes the long
factors once a forward pass reaches past `original_max_position_embeddings`; here position `p`
takes them from that position on. Equal to transformers for prompts within the original length
and every token decoded after them; a prompt longer than it differs in its first part.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope", "su")


def rope_type_of(rope_scaling: Mapping[str, Any] | None) -> str:
    if not rope_scaling:
        return "default"
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"rope_scaling.rope_type={rope_type!r} is not supported; allowed values: {', '.join(ROPE_TYPES)}"
        )
    return rope_type


def _exponents(rotary_dim: int, device) -> torch.Tensor:
    return torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float() / rotary_dim


def _default_inv_freq(rotary_dim: int, base: float, device=None) -> torch.Tensor:
    return 1.0 / (base ** _exponents(rotary_dim, device))


def _require(rope_scaling: Mapping[str, Any], *keys: str) -> list:
    missing = [k for k in keys if rope_scaling.get(k) is None]
    if missing:
        raise ValueError(
            f"rope_scaling of type {rope_type_of(rope_scaling)!r} needs {', '.join(missing)}"
        )
    return [rope_scaling[k] for k in keys]


def _llama3_inv_freq(rotary_dim: int, base: float, rs: Mapping[str, Any], device) -> torch.Tensor:
    factor, low, high, old_len = _require(
        rs, "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"
    )
    inv_freq = _default_inv_freq(rotary_dim, base, device)
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = old_len / low, old_len / high
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(
    rotary_dim: int, base: float, rs: Mapping[str, Any], max_position_embeddings: int | None, device
) -> tuple[torch.Tensor, float]:
    (original_len,) = _require(rs, "original_max_position_embeddings")
    factor = rs.get("factor")
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError("yarn rope_scaling without factor needs max_position_embeddings")
        factor = max_position_embeddings / original_len
    attention_factor = rs.get("attention_factor")
    mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = rs.get("beta_fast") or 32
    beta_slow = rs.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (rotary_dim * math.log(original_len / (rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp.to(device)
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, device=device).float() / rotary_dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (
        1.0 / pos_freqs
    ) * extrapolation_weight
    return inv_freq, float(attention_factor)


def _longrope_freqs(
    rotary_dim: int,
    base: float,
    rs: Mapping[str, Any],
    max_position_embeddings: int | None,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, float]:
    """Per-position angles (short factors below the original length, long from it on) and the
    attention factor (see the module doc)."""
    short, long, original = _require(
        rs, "short_factor", "long_factor", "original_max_position_embeddings"
    )
    if len(short) != rotary_dim // 2 or len(long) != rotary_dim // 2:
        raise ValueError(
            f"longrope short_factor/long_factor need {rotary_dim // 2} values each (rotary_dim / 2)"
        )
    factor = rs.get("factor") or (max_position_embeddings or original) / original
    attention_factor = rs.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    scaled = base ** _exponents(rotary_dim, positions.device)
    inv_short = 1.0 / (torch.tensor(short, dtype=torch.float32, device=positions.device) * scaled)
    inv_long = 1.0 / (torch.tensor(long, dtype=torch.float32, device=positions.device) * scaled)
    inv_freq = torch.where(positions[:, None] >= original, inv_long, inv_short)
    return positions.float()[:, None] * inv_freq, float(attention_factor)


def _dynamic_freqs(
    rotary_dim: int,
    base: float,
    factor: float,
    max_position_embeddings: int,
    positions: torch.Tensor,
) -> torch.Tensor:
    """Per-position angles `[P, rotary_dim/2]` for dynamic NTK scaling (see the module doc)."""
    seq_len = torch.clamp(positions + 1, min=max_position_embeddings).double()
    bases = base * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (
        rotary_dim / (rotary_dim - 2)
    )
    exps = _exponents(rotary_dim, positions.device)
    short = positions < max_position_embeddings
    inv_freq = torch.empty(len(positions), rotary_dim // 2, device=positions.device)
    inv_freq[short] = _default_inv_freq(rotary_dim, base, positions.device)
    inv_freq[~short] = 1.0 / (bases[~short, None].float() ** exps[None, :])
    return positions.float()[:, None] * inv_freq


def build_cos_sin_cache(
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_scaling: Mapping[str, Any] | None = None,
    max_position_embeddings: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The `[max_position, rotary_dim]` float32 cos/sin cache for `ops.rotary_embedding`.

    `max_position_embeddings` is the model config's value (dynamic NTK and yarn read it).
    """
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
    rope_type = rope_type_of(rope_scaling)
    scaling = rope_scaling or {}  # empty only for the default type, which reads nothing from it
    positions = torch.arange(max_position, device=device)
    attention_factor = 1.0
    if rope_type == "dynamic":
        (factor,) = _require(scaling, "factor")
        if max_position_embeddings is None:
            raise ValueError("dynamic rope_scaling needs max_position_embeddings")
        freqs = _dynamic_freqs(rotary_dim, base, factor, max_position_embeddings, positions)
    elif rope_type in ("longrope", "su"):
        freqs, attention_factor = _longrope_freqs(
            rotary_dim, base, scaling, max_position_embeddings, positions
        )
    else:
        if rope_type == "default":
            inv_freq = _default_inv_freq(rotary_dim, base, device)
        elif rope_type == "linear":
            (factor,) = _require(scaling, "factor")
            inv_freq = _default_inv_freq(rotary_dim, base, device) / factor
        elif rope_type == "llama3":
            inv_freq = _llama3_inv_freq(rotary_dim, base, scaling, device)
        else:  # yarn
            inv_freq, attention_factor = _yarn_inv_freq(
                rotary_dim, base, scaling, max_position_embeddings, device
            )
        freqs = torch.outer(positions.float(), inv_freq)
    return torch.cat((freqs.cos() * attention_factor, freqs.sin() * attention_factor), dim=-1)
