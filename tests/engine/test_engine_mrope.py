"""M-RoPE: the rotary by ``[3, T]`` positions equals transformers' Qwen2-VL rotary, and the
positions laid out from a prompt's images equal transformers' ``get_rope_index``, whole or
taken chunk by chunk, with decode steps going on by the prompt's delta."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from infernetes.runtime.model_executor.layers.rotary import MRotaryEmbedding, get_rope
from infernetes.runtime.multimodal.inputs import MultiModalFeature
from infernetes.runtime.worker.mrope import prompt_layout, step_positions
from transformers import Qwen2VLTextConfig
from transformers.models.qwen2_vl import modeling_qwen2_vl as hf

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
SECTION = [2, 3, 3]
IMAGE = 9  # the placeholder token id in the prompts below


def _hf_rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple:
    config = Qwen2VLTextConfig(
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": SECTION},
    )
    cos, sin = hf.Qwen2VLRotaryEmbedding(config)(q, positions[:, None])
    num = len(q)
    q4, k4 = (x.view(1, num, -1, HEAD_DIM).transpose(1, 2) for x in (q, k))
    q4, k4 = hf.apply_rotary_pos_emb(q4, k4, cos, sin)
    return (x[0].transpose(0, 1).reshape(num, -1) for x in (q4, k4))


def test_rotary_by_three_axes_equals_transformers():
    torch.manual_seed(0)
    num = 23
    positions = torch.randint(0, 40, (3, num))
    q, k = torch.randn(num, HEADS * HEAD_DIM), torch.randn(num, KV_HEADS * HEAD_DIM)
    rope = get_rope(HEAD_DIM, HEAD_DIM, 64, 1e4, {"rope_type": "default", "mrope_section": SECTION})
    assert isinstance(rope, MRotaryEmbedding)
    ours = rope(positions, q.clone(), k.clone())
    for got, want in zip(ours, _hf_rotary(positions, q, k), strict=True):
        torch.testing.assert_close(got, want)
    # one position on every axis is the plain rotary
    flat = positions[0]
    plain = get_rope(HEAD_DIM, HEAD_DIM, 64, 1e4)
    for got, want in zip(rope(flat, q, k), plain(flat, q, k), strict=True):
        torch.testing.assert_close(got, want)


def test_a_section_that_does_not_cover_the_head_is_refused():
    with pytest.raises(ValueError, match="mrope_section"):
        MRotaryEmbedding(HEAD_DIM, HEAD_DIM, 64, 1e4, [2, 3, 2])


def _prompt(pieces: list) -> tuple[list[int], list[MultiModalFeature], list[list[int]]]:
    """Token ids from ``pieces`` (an int: that many text tokens; a tuple: an image's
    (t, h, w) patch grid, merge 2), its features and grids."""
    ids: list[int] = []
    features, grids = [], []
    for piece in pieces:
        if isinstance(piece, int):
            ids += [1] * piece
            continue
        t, h, w = piece
        count = t * h * w // 4
        grid = np.array([t, h, w])
        features.append(
            MultiModalFeature("image", len(ids), count, str(len(grids)), {"image_grid_thw": grid})
        )
        grids.append(list(piece))
        ids += [IMAGE] * count
    return ids, features, grids


def _hf_rope_index(ids: list[int], grids: list[list[int]]) -> tuple[np.ndarray, int]:
    model = SimpleNamespace(
        config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=2)),
        get_vision_position_ids=lambda *a, **kw: hf.Qwen2VLModel.get_vision_position_ids(
            None, *a, **kw
        ),
    )
    tensor = torch.tensor([ids])
    positions, delta = hf.Qwen2VLModel.get_rope_index(
        model, tensor, (tensor == IMAGE).int(), torch.tensor(grids)
    )
    return positions[:, 0].numpy(), int(delta)


LAYOUTS = [
    [5, (1, 4, 6), 3],  # text, a wide image, text
    [(1, 2, 8), 4],  # an image first
    [3, (1, 6, 2)],  # an image last: decode goes on past its largest position
    [
        2,
        (1, 4, 4),
        2,
        (1, 2, 2),
        1,
        (1, 8, 4),
        6,
    ],  # three images, <|vision_end|><|vision_start|> apart
    [4, (2, 4, 4), 2],  # two frames (a video's grid)
]


@pytest.mark.parametrize("pieces", LAYOUTS)
def test_prompt_layout_equals_get_rope_index(pieces):
    ids, features, grids = _prompt(pieces)
    layout = prompt_layout(len(ids), features, 2)
    positions, delta = _hf_rope_index(ids, grids)
    np.testing.assert_array_equal(layout.positions, positions)
    assert layout.delta == delta


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_chunks_and_decode_take_the_whole_prompts_positions(chunk):
    ids, features, _ = _prompt(LAYOUTS[3])
    layout = prompt_layout(len(ids), features, 2)
    text_layout = None  # a text-only request batched beside it: positions are its indices
    total = len(ids) + 3  # the prompt and three decoded tokens
    got = []
    for start in range(0, total, chunk):
        count = min(chunk, total - start)
        indices = np.concatenate([np.arange(start, start + count), [start]])
        step = step_positions(indices, [layout, text_layout], [start, start], [count, 1])
        step = np.broadcast_to(step, (3, count + 1))
        np.testing.assert_array_equal(step[:, -1], [start] * 3)
        got.append(step[:, :-1])
    decoded = np.arange(len(ids), total) + layout.delta
    want = np.concatenate([layout.positions, np.stack([decoded] * 3)], axis=1)
    np.testing.assert_array_equal(np.concatenate(got, axis=1), want)


def test_a_step_of_text_and_decode_keeps_one_row():
    ids, features, _ = _prompt(LAYOUTS[2])
    layout = prompt_layout(len(ids), features, 2)
    step = step_positions(np.array([len(ids), 4]), [layout, None], [len(ids), 4], [1, 1])
    assert step.shape == (2,)  # the shape a decode graph was captured with
    assert step.tolist() == [len(ids) + layout.delta, 4]


def test_get_rope_shares_a_rotary_per_device_models_are_built_on():
    # The GPU smoke tests build a CPU model, then a CUDA one with the same settings: the second
    # must not get the first's CPU cos/sin cache (meta stands in for the other device here).
    on_cpu = get_rope(64, 64, 128, 10000.0)
    with torch.device("meta"):
        elsewhere = get_rope(64, 64, 128, 10000.0)
    assert on_cpu is get_rope(64, 64, 128, 10000.0)
    assert on_cpu.cos_sin_cache.device.type == "cpu"
    assert elsewhere.cos_sin_cache.device.type == "meta"
