"""M-RoPE positions (Qwen2-VL, Qwen2.5-VL): a ``[3, T]`` position (temporal, height, width) for
each token instead of one number, as transformers' ``get_rope_index`` lays them out.

Text tokens have the same number on all three axes, counting on from the last one. An image of
``t x h x w`` merged patches (its grid over ``spatial_merge_size`` squared) starting at ``p``
puts its tokens at ``(p + frame, p + row, p + column)``, and the text after it starts at
``p + max(h, w)``. The layout is a function of the whole prompt, so it is made once per request
(``prompt_layout``) and a prefill chunk starting anywhere takes its columns; a token past the
prompt (decode, or output recomputed after a preemption) at index ``i`` is at ``i + delta`` on
every axis, ``delta`` being the layout's largest position + 1 less the prompt's length.

A video's frames (Qwen2.5-VL's, which says ``tokens_per_second``) are spaced in time: temporal
patch ``i`` is at ``p + floor(i * second_per_grid_t * tokens_per_second)``; Qwen2-VL's at ``p + i``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from infernetes.runtime.multimodal.inputs import MultiModalFeature


class PromptLayout(NamedTuple):
    positions: np.ndarray  # [3, prompt tokens] int64
    delta: int  # a later token's position less its index


def image_grid(feature: MultiModalFeature, spatial_merge_size: int) -> tuple[int, int, int]:
    """The item's ``(t, h, w)`` in merged patches (its tokens), from the processor's grid."""
    grid = feature.data.get("image_grid_thw", feature.data.get("video_grid_thw"))
    t, h, w = (int(v) for v in np.asarray(grid).reshape(3))
    return t, h // spatial_merge_size, w // spatial_merge_size


def prompt_layout(
    num_tokens: int,
    features: Sequence[MultiModalFeature],
    spatial_merge_size: int,
    tokens_per_second: float | None = None,
) -> PromptLayout:
    """The positions of a prompt of ``num_tokens`` whose items are ``features``."""
    positions = np.empty((3, num_tokens), np.int64)
    next_position = 0  # of the next text token
    index = 0
    for feature in sorted(features, key=lambda f: f.offset):
        text = feature.offset - index
        positions[:, index : feature.offset] = np.arange(text) + next_position
        next_position += text
        t, h, w = image_grid(feature, spatial_merge_size)
        if t * h * w != feature.length:
            raise ValueError(
                f"an image of {t} x {h} x {w} merged patches has {feature.length} placeholder "
                "tokens"
            )
        frames = np.arange(t)
        seconds = feature.data.get("second_per_grid_ts")
        if seconds is not None and tokens_per_second:
            # in float32 then truncated, as transformers' get_rope_index does
            interval = np.float32(np.asarray(seconds).item() * tokens_per_second)
            frames = (frames.astype(np.float32) * interval).astype(np.int64)
        axes = np.meshgrid(frames, np.arange(h), np.arange(w), indexing="ij")
        positions[:, feature.offset : feature.end] = np.stack(axes).reshape(3, -1) + next_position
        next_position += max(h, w)
        index = feature.end
    positions[:, index:] = np.arange(num_tokens - index) + next_position
    delta = int(positions.max()) + 1 - num_tokens if num_tokens else 0
    return PromptLayout(positions, delta)


def step_positions(
    positions: np.ndarray,
    layouts: Sequence[PromptLayout | None],
    starts: Sequence[int],
    num_scheduled: Sequence[int],
) -> np.ndarray:
    """The step's rope positions from its ``[T]`` token indices (``positions``, the requests'
    tokens one after another): ``[3, T]``, or ``[T]`` when every axis agrees (text and decode
    steps: the plain rotary, and the shape a CUDA graph was captured with). ``layouts[i]`` is
    request ``i``'s (None: text only, its positions are its indices)."""
    if all(layout is None for layout in layouts):
        return positions
    rope = np.repeat(positions[None], 3, axis=0)
    row = 0
    for layout, start, count in zip(layouts, starts, num_scheduled, strict=True):
        if layout is not None:
            in_prompt = max(0, min(count, layout.positions.shape[1] - start))
            rope[:, row : row + in_prompt] = layout.positions[:, start : start + in_prompt]
            rope[:, row + in_prompt : row + count] += layout.delta
        row += count
    return rope[0].copy() if (rope == rope[0]).all() else rope
