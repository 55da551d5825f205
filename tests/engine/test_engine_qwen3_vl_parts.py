"""Qwen3-VL's parts against transformers': the vision tower's rows and DeepStack rows for images
of different grids and a video's grid of several frames (the learned position grid resized to
each); the interleaved M-RoPE rotary; the positions laid out from a prompt's images and
per-frame video items equal ``get_rope_index``, whole and chunk by chunk; the video prompt's
timestamps equal the processor's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from infernetes.runtime.model_executor.layers.rotary import MRotaryEmbedding, get_rope
from infernetes.runtime.model_executor.loader import build_model, inspect_model, load_hf_config
from infernetes.runtime.multimodal.inputs import MultiModalFeature
from infernetes.runtime.multimodal.qwen_vl import Qwen3VLProcessor
from infernetes.runtime.testing_vision import make_tiny_qwen2_vl
from infernetes.runtime.worker.mrope import prompt_layout, step_positions
from transformers import Qwen3VLTextConfig
from transformers.models.qwen3_vl import modeling_qwen3_vl as hf
from transformers.models.qwen3_vl import processing_qwen3_vl as hf_processing

PATCH_ROW = 3 * 2 * 8 * 8  # channels x temporal patch x patch x patch
# (frames, patch rows, patch columns): wide, tall, smaller than the 4 x 4 learned grid, 3 frames
GRIDS = [(1, 6, 8), (1, 10, 4), (1, 2, 2), (3, 4, 6)]
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
SECTION = [6, 5, 5]  # the released models' [24, 20, 20] over a 32-wide head
IMAGE, VIDEO = 9, 10  # placeholder token ids in the prompts below


def test_tower_rows_and_deepstack_rows_equal_transformers(tmp_path):
    import transformers

    path = make_tiny_qwen2_vl(tmp_path, version="3")
    hf_model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32
    ).eval()
    info = inspect_model(path, load_hf_config(path), "float32", 64, torch.device("cpu"))
    model = build_model(info, torch.device("cpu"), use_tqdm=False)
    torch.manual_seed(0)
    patches = torch.randn(sum(t * h * w for t, h, w in GRIDS), PATCH_ROW)
    with torch.inference_mode():
        out = hf_model.model.visual(patches, grid_thw=torch.tensor(GRIDS))
        want = torch.cat([out.pooler_output, *out.deepstack_features], dim=-1)
        got = model.visual(patches, GRIDS)
    assert got.shape == (sum(t * h * w for t, h, w in GRIDS) // 4, 64 * 3)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _hf_rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple:
    config = Qwen3VLTextConfig(
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        head_dim=HEAD_DIM,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": SECTION},
    )
    cos, sin = hf.Qwen3VLTextRotaryEmbedding(config)(q, positions[:, None])
    num = len(q)
    q4, k4 = (x.view(1, num, -1, HEAD_DIM).transpose(1, 2) for x in (q, k))
    q4, k4 = hf.apply_rotary_pos_emb(q4, k4, cos, sin)
    return (x[0].transpose(0, 1).reshape(num, -1) for x in (q4, k4))


def test_interleaved_rotary_equals_transformers():
    torch.manual_seed(0)
    num = 23
    positions = torch.randint(0, 40, (3, num))
    q, k = torch.randn(num, HEADS * HEAD_DIM), torch.randn(num, KV_HEADS * HEAD_DIM)
    scaling = {"rope_type": "default", "mrope_section": SECTION, "mrope_interleaved": True}
    rope = get_rope(HEAD_DIM, HEAD_DIM, 64, 1e4, scaling)
    assert isinstance(rope, MRotaryEmbedding)
    ours = rope(positions, q.clone(), k.clone())
    for got, want in zip(ours, _hf_rotary(positions, q, k), strict=True):
        torch.testing.assert_close(got, want)
    # the sections in runs (Qwen2-VL's) turn other frequencies by other axes
    runs = get_rope(HEAD_DIM, HEAD_DIM, 64, 1e4, {**scaling, "mrope_interleaved": False})
    assert not torch.allclose(runs(positions, q.clone(), k.clone())[0], rope(positions, q, k)[0])


def _prompt(pieces: list) -> tuple[list[int], list[int], list[MultiModalFeature], dict]:
    """Token ids from ``pieces`` (an int: that many text tokens; ``(modality, t, h, w)``: an
    image, or a video written as Qwen3-VL's processor writes it: for each frame two tokens of
    timestamp, ``<|vision_start|>``, its tokens, ``<|vision_end|>``), merge 2: the ids, their
    ``mm_token_type_ids``, the items (a video's one per frame) and the grids."""
    ids: list[int] = []
    types: list[int] = []
    features = []
    grids: dict[str, list] = {"image": [], "video": []}

    def add(modality: str, grid: list[int]) -> None:
        count = int(np.prod(grid)) // 4
        data = {f"{modality}_grid_thw": np.array(grid)}
        features.append(MultiModalFeature(modality, len(ids), count, str(len(features)), data))
        ids.extend([IMAGE if modality == "image" else VIDEO] * count)
        types.extend([1 if modality == "image" else 2] * count)

    for piece in pieces:
        if isinstance(piece, int):
            ids += [1] * piece
            types += [0] * piece
            continue
        modality, t, h, w = piece
        grids[modality].append([t, h, w])
        if modality == "image":
            add("image", [t, h, w])
            continue
        for _ in range(t):
            ids += [1, 1, 1]
            types += [0, 0, 0]
            add("video", [1, h, w])
            ids.append(1)
            types.append(0)
    return ids, types, features, grids


def _hf_rope_index(ids: list[int], types: list[int], grids: dict) -> tuple[np.ndarray, int]:
    model = SimpleNamespace(
        config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=2)),
        get_vision_position_ids=lambda *a, **kw: hf.Qwen3VLModel.get_vision_position_ids(
            None, *a, **kw
        ),
    )
    positions, delta = hf.Qwen3VLModel.get_rope_index(
        model,
        torch.tensor([ids]),
        torch.tensor([types]),
        torch.tensor(grids["image"]) if grids["image"] else None,
        torch.tensor(grids["video"]) if grids["video"] else None,
    )
    return positions[:, 0].numpy(), int(delta)


LAYOUTS = [
    [5, ("image", 1, 4, 6), 3],  # text, a wide image, text
    [("image", 1, 2, 8), 4],  # an image first
    [3, ("image", 1, 6, 2)],  # an image last
    [2, ("image", 1, 4, 4), 2, ("video", 2, 4, 6), 1, ("image", 1, 8, 4), 6],
    [4, ("video", 3, 2, 4), 2],  # a video of three temporal patches
]


@pytest.mark.parametrize("pieces", LAYOUTS)
def test_prompt_layout_equals_get_rope_index(pieces):
    ids, types, features, grids = _prompt(pieces)
    layout = prompt_layout(len(ids), features, 2)
    positions, delta = _hf_rope_index(ids, types, grids)
    np.testing.assert_array_equal(layout.positions, positions)
    assert layout.delta == delta


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_chunks_and_decode_take_the_whole_prompts_positions(chunk):
    ids, types, features, grids = _prompt(LAYOUTS[3])
    layout = prompt_layout(len(ids), features, 2)
    positions, delta = _hf_rope_index(ids, types, grids)
    total = len(ids) + 3  # the prompt and three decoded tokens
    got = []
    for start in range(0, total, chunk):
        count = min(chunk, total - start)
        step = step_positions(np.arange(start, start + count), [layout], [start], [count])
        got.append(np.broadcast_to(step, (3, count)))
    decoded = np.arange(len(ids), total) + delta  # transformers' decode: index + delta
    want = np.concatenate([positions, np.stack([decoded] * 3)], axis=1)
    np.testing.assert_array_equal(np.concatenate(got, axis=1), want)


@pytest.mark.parametrize("frames", [1, 3, 4, 7])
def test_video_timestamps_equal_the_processors(frames):
    # transformers' own Qwen3VLProcessor needs torchvision; its placeholder for a video of
    # ``frames`` frames at 2 fps, from its metadata, against ours
    grid_t = -(-frames // 2)
    grids = np.array([[grid_t, 4, 6]])
    tokens = dict(
        video_token="<|video_pad|>",
        vision_start_token="<|vision_start|>",
        vision_end_token="<|vision_end|>",
    )
    theirs = SimpleNamespace(
        video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
        _calculate_timestamps=lambda *a: hf_processing.Qwen3VLProcessor._calculate_timestamps(
            None, *a
        ),
        **tokens,
    )
    metadata = SimpleNamespace(fps=2.0, frames_indices=list(range(frames)))
    want = hf_processing.Qwen3VLProcessor.replace_video_token(
        theirs, {"video_grid_thw": grids, "video_metadata": [metadata]}, 0
    )
    ours = SimpleNamespace(image_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2))
    got = Qwen3VLProcessor._expand_videos(ours, "<|video_pad|>", [frames], grids, 2.0, {})  # type: ignore[arg-type]
    assert got == want


def test_a_first_pipeline_stage_without_the_deepstack_layers_is_refused(monkeypatch, tmp_path):
    import transformers
    from infernetes.runtime.model_executor.models import llama
    from infernetes.runtime.model_executor.models.qwen3_vl import DeepStackModel

    path = make_tiny_qwen2_vl(tmp_path, version="3")
    text = transformers.AutoConfig.from_pretrained(path).text_config
    real = llama.stage_layers

    def one_layer_first(num_layers, build):  # as a first stage of one layer would be
        _, _, layers = real(num_layers, build)
        return 0, 1, layers

    monkeypatch.setattr(llama, "stage_layers", one_layer_first)
    with pytest.raises(ValueError, match="first 2 decoder layers"):
        DeepStackModel(text, 64, 2, lambda i: llama.LlamaMLP(text))
