"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL videos on the CPU, offline (``multi_modal_data={"video":
frames}``): greedy tokens and logprobs equal transformers' given ``pixel_values_videos``,
``video_grid_thw`` and ``second_per_grid_ts`` (Qwen2.5-VL's frames spaced in time in M-RoPE;
Qwen3-VL's by timestamps in the text, each temporal patch an item of its own)
for one video, a video with an odd frame count (its last frame repeated) and a video with an
image; the frames' patches are laid out as Qwen's video processor does; the same video hits the
prefix cache and a changed frame misses; too many videos or frames are refused naming the
field."""

from __future__ import annotations

import numpy as np
import pytest
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.qwen_vl import video_patches
from infernetes.runtime.testing_vision import (
    QWEN_IMAGE,
    assert_equals_transformers,
    hf_llava_greedy,
    make_tiny_qwen2_vl,
    random_image,
)

from infernetes import LLM, SamplingParams

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
ENGINE = dict(dtype="float32", max_model_len=256, num_gpu_blocks_override=128, block_size=8)
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"


def _video(seed: int, frames: int, size: tuple[int, int] = (48, 32)) -> list:
    return [random_image(seed * 100 + i, size) for i in range(frames)]


# (prompt, images, videos): four frames (two temporal patches), three (the last repeated), a
# video then an image
CASES = [
    (f"What happens in {VIDEO} here?", [], [(1, 4)]),
    (f"{VIDEO} describe", [], [(2, 3)]),
    (f"Compare {VIDEO} and {QWEN_IMAGE} now", [(3, (40, 36))], [(4, 4)]),
]


@pytest.fixture(
    scope="module", params=["2", "2.5", "3"], ids=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
)
def qwen(request, tmp_path_factory):
    return str(make_tiny_qwen2_vl(tmp_path_factory.mktemp("qwen"), version=request.param))


def _inputs(images, videos):
    return [random_image(seed, size) for seed, size in images], [_video(*v) for v in videos]


@pytest.fixture(scope="module")
def llm(qwen):
    return LLM(qwen, **ENGINE)


def test_video_patches_hold_each_frame_in_turn():
    # two frames of one 1x2x2 patch each, as the image processor gives them (each frame's
    # pixels repeated over the temporal patch of 2): the video's patch holds frame 0 then 1
    frames = np.arange(2 * 4, dtype=np.float32).reshape(2, 1, 1, 1, 4)
    repeated = np.repeat(frames, 2, axis=3).reshape(2, 1, 8)
    assert video_patches(repeated, 2, 2).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]
    # three frames: the last repeated to fill the second temporal patch
    three = np.repeat(np.arange(3, dtype=np.float32).reshape(3, 1, 1, 1, 1), 2, axis=3)
    assert video_patches(three.reshape(3, 1, 2), 2, 1).tolist() == [[0, 1], [2, 2]]


def test_videos_equal_transformers(qwen, llm):
    expected = []
    prompts = []
    for text, images, videos in CASES:
        pil_images, frames = _inputs(images, videos)
        expected.append(hf_llava_greedy(qwen, text, pil_images, MAX_TOKENS, videos=frames))
        data = {"video": frames if len(frames) > 1 else frames[0]}
        if pil_images:
            data["image"] = pil_images
        prompts.append({"prompt": text, "multi_modal_data": data})
    outputs = llm.generate(prompts, GREEDY)
    assert_equals_transformers(outputs, expected)


def test_a_video_as_a_uint8_array_is_the_same_video(llm):
    frames = _video(5, 2)
    as_array = np.stack([np.asarray(frame) for frame in frames])
    text = f"See {VIDEO}"
    [a, b] = llm.generate(
        [
            {"prompt": text, "multi_modal_data": {"video": frames}},
            {"prompt": text, "multi_modal_data": {"video": as_array}},
        ],
        GREEDY,
    )
    assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_same_video_hits_the_prefix_cache_and_a_changed_frame_misses(qwen):
    llm = LLM(qwen, enable_prefix_caching=True, **ENGINE)
    text = f"{VIDEO} and then some words"
    frames = _video(6, 4)
    changed = [*frames[:3], random_image(999, (48, 32))]
    first, same, other = (
        llm.generate([{"prompt": text, "multi_modal_data": {"video": v}}], GREEDY)[0]
        for v in (frames, frames, changed)
    )
    assert first.num_cached_tokens == 0
    assert same.num_cached_tokens > 0
    assert other.num_cached_tokens < same.num_cached_tokens


def test_too_many_videos_or_frames_are_refused(qwen):
    llm = LLM(qwen, limit_mm_per_prompt={"video": 1}, **ENGINE)
    two = {"video": [_video(7, 2), _video(8, 2)]}
    with pytest.raises(RequestError, match="At most 1 video") as error:
        llm.generate([{"prompt": VIDEO + VIDEO, "multi_modal_data": two}], GREEDY)
    assert error.value.param == "multi_modal_data.video"
    huge = np.zeros((769, 32, 32, 3), np.uint8)
    with pytest.raises(RequestError, match="769 frames") as error:
        llm.generate([{"prompt": VIDEO, "multi_modal_data": {"video": huge}}], GREEDY)
    assert error.value.param == "multi_modal_data.video[0]"
