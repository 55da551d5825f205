"""The multimodal processor cache (--mm-processor-cache-gb): a repeated image skips the image
processor, a changed one does not (and so a video's frames), the byte bound evicts the least recently used, 0 disables;
the tokens and arrays are the same either way (LLaVA-NeXT's tiles, padded across a batch, and
Gemma 3's pan-and-scan crops included), and the engine's outputs still equal transformers'."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from infernetes.runtime.engine.stats import MultiModalCacheStats
from infernetes.runtime.multimodal.processor import MultiModalProcessor
from infernetes.runtime.multimodal.qwen_vl import QwenVLProcessor
from infernetes.runtime.testing_vision import (
    QWEN_IMAGE,
    QWEN_VIDEO,
    assert_equals_transformers,
    hf_llava_greedy,
    make_tiny_gemma3,
    make_tiny_llava,
    make_tiny_llava_next,
    make_tiny_qwen2_vl,
    random_image,
)

from infernetes import LLM, SamplingParams

TEXT = "Compare <image> with <image> please."
MiB = 1 << 20


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory):
    return str(make_tiny_llava_next(tmp_path_factory.mktemp("llava_next")))


def _processor(
    path: str, cache_bytes: int, image_shape=(3, 32, 32), **kwargs
) -> MultiModalProcessor:
    return MultiModalProcessor.load(path, image_shape, {}, kwargs, cache_bytes)


def _count_image_processor_calls(processor: MultiModalProcessor, monkeypatch) -> list[int]:
    """How many images the model's own image processor was called on, call by call."""
    image_processor = processor.hf_processor.image_processor
    inner = getattr(image_processor, "inner", image_processor)
    calls: list[int] = []
    original = type(inner).preprocess

    def counted(self, images, *args, **kwargs):
        calls.append(len(images))
        return original(self, images, *args, **kwargs)

    monkeypatch.setattr(type(inner), "preprocess", counted)
    return calls


def _images(*seeds: int) -> list:
    # LLaVA-NeXT tiles these sizes into different numbers of tiles (padded in a batch)
    sizes = {1: (40, 36), 2: (90, 30), 3: (30, 70)}
    return [random_image(seed, sizes[seed]) for seed in seeds]


def _assert_same(cached, plain) -> None:
    assert cached.prompt_token_ids == plain.prompt_token_ids
    for a, b in zip(cached.features, plain.features, strict=True):
        assert a[:4] == b[:4]  # modality, offset, length, digest
        assert a.data.keys() == b.data.keys()
        for name in a.data:
            np.testing.assert_array_equal(a.data[name], b.data[name])


def test_repeated_image_skips_the_processor_changed_one_does_not(llava_next, monkeypatch):
    cached = _processor(llava_next, 64 * MiB)
    plain = _processor(llava_next, 0)
    calls = _count_image_processor_calls(cached, monkeypatch)
    first = cached.process(TEXT, {"image": _images(1, 2)})
    assert calls == [1, 1]  # each new image on its own
    again = cached.process(TEXT, {"image": _images(1, 2)})
    assert calls == [1, 1]  # both from the cache
    changed = _images(1, 2)
    changed[1].putpixel((3, 4), (0, 0, 0))
    other = cached.process(TEXT, {"image": changed})
    assert calls == [1, 1, 1]  # the changed one only
    assert cached.cache is not None and cached.cache.take_stats() == MultiModalCacheStats(6, 3)
    for result, images in ((first, _images(1, 2)), (again, _images(1, 2)), (other, changed)):
        _assert_same(result, plain.process(TEXT, {"image": images}))
    # two images of one prompt padded together, one from the cache and one not
    _assert_same(
        cached.process(TEXT, {"image": _images(3, 2)}),
        plain.process(TEXT, {"image": _images(3, 2)}),
    )


def test_the_byte_bound_evicts_the_least_recently_used(llava_next, monkeypatch):
    probe = _processor(llava_next, 64 * MiB)
    probe.process("<image>", {"image": _images(1)})
    assert probe.cache is not None
    one_image = probe.cache.used_bytes  # 1 and 3 have as many tiles
    cached = _processor(llava_next, one_image)
    calls = _count_image_processor_calls(cached, monkeypatch)
    for seed in (1, 1, 3, 3, 1):
        cached.process("<image>", {"image": _images(seed)})
    assert calls == [1, 1, 1]  # 1, then 3 evicted it, then 1 again
    assert cached.cache is not None and len(cached.cache) == 1
    assert cached.cache.used_bytes <= one_image


def test_zero_disables_the_cache(llava_next, monkeypatch):
    plain = _processor(llava_next, 0)
    assert plain.cache is None
    calls = _count_image_processor_calls(plain, monkeypatch)
    plain.process(TEXT, {"image": _images(1, 2)})
    plain.process(TEXT, {"image": _images(1, 2)})
    assert calls == [2, 2]


def test_a_cache_travels_empty_and_works_where_it_lands(llava_next, monkeypatch):
    cached = _processor(llava_next, 64 * MiB)
    cached.process(TEXT, {"image": _images(1, 2)})
    landed = pickle.loads(pickle.dumps(cached))
    assert landed.cache is not None and len(landed.cache) == 0
    calls = _count_image_processor_calls(landed, monkeypatch)
    landed.process(TEXT, {"image": _images(1, 2)})
    landed.process(TEXT, {"image": _images(1, 2)})
    assert calls == [1, 1]


def test_pan_and_scan_crops_come_from_the_cache_too(tmp_path, monkeypatch):
    gemma3 = str(make_tiny_gemma3(tmp_path / "gemma3"))
    crops = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}
    cached = _processor(gemma3, 64 * MiB, **crops)
    plain = _processor(gemma3, 0, **crops)
    calls = _count_image_processor_calls(cached, monkeypatch)
    text = "<start_of_image> and <start_of_image>"
    images = [random_image(1, (40, 36)), random_image(2, (120, 30))]
    first = cached.process(text, {"image": images})
    again = cached.process(text, {"image": images})
    assert calls == [1, 1]
    expected = plain.process(text, {"image": images})
    assert len(expected.features) > 2  # the wide image went as crops as well
    _assert_same(first, expected)
    _assert_same(again, expected)


ENGINE = dict(dtype="float32", max_model_len=160, num_gpu_blocks_override=96, block_size=8)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)


def test_engine_outputs_equal_transformers_with_the_cache_or_without(tmp_path):
    llava = str(make_tiny_llava(tmp_path / "llava"))
    text = "The quick brown fox <image> jumps over <image> the lazy dog <image> and"
    seeds = [4, 5, 4]
    expected = hf_llava_greedy(llava, text, [random_image(s) for s in seeds], 6)
    prompt = {"prompt": text, "multi_modal_data": {"image": [random_image(s) for s in seeds]}}
    for cache_gb in (4, 0):
        llm = LLM(llava, **ENGINE, mm_processor_cache_gb=cache_gb, enable_prefix_caching=False)
        outputs = llm.generate([prompt, prompt], GREEDY)  # the second from the cache, if any
        assert_equals_transformers(outputs, [expected, expected])


def test_shared_memory_cache_is_refused(tmp_path):
    llava = str(make_tiny_llava(tmp_path / "llava"))
    with pytest.raises(ValueError, match="--mm-processor-cache-type shm is not supported"):
        LLM(llava, **ENGINE, mm_processor_cache_type="shm")


def test_pixtral_images_of_different_sides_are_padded_as_without_the_cache(tmp_path, monkeypatch):
    from infernetes.runtime.multimodal.pixtral import PixtralVLProcessor
    from infernetes.runtime.testing_vision import make_tiny_mistral3

    mistral3 = str(make_tiny_mistral3(tmp_path / "mistral3"))

    def processor(cache_bytes: int) -> MultiModalProcessor:
        return MultiModalProcessor.load(
            mistral3, (3, None, None), {}, {}, cache_bytes, processor_class=PixtralVLProcessor
        )

    cached, plain = processor(64 * MiB), processor(0)
    calls = _count_image_processor_calls(cached, monkeypatch)
    text = "[IMG] and [IMG]"
    wide, tall = random_image(1, (70, 50)), random_image(2, (30, 90))
    cached.process("[IMG]", {"image": [wide]})
    first = cached.process("[IMG]", {"image": [tall]})
    both = cached.process(text, {"image": [wide, tall]})  # each from the cache, then padded
    assert calls == [1, 1]
    _assert_same(first, plain.process("[IMG]", {"image": [tall]}))
    _assert_same(both, plain.process(text, {"image": [wide, tall]}))
    assert [f.data["pixel_values"].shape for f in both.features] == [(3, 48, 48)] * 2


def _qwen_processor(path: str, cache_bytes: int) -> MultiModalProcessor:
    from infernetes.runtime.model_executor.models.qwen2_vl import (
        Qwen2VLForConditionalGeneration,
    )
    from transformers import AutoConfig

    shape = Qwen2VLForConditionalGeneration.image_input_shape(AutoConfig.from_pretrained(path))
    return MultiModalProcessor.load(
        path, shape, {}, {}, cache_bytes, processor_class=QwenVLProcessor
    )


def test_videos_frames_are_cached_as_images_are(tmp_path, monkeypatch):
    path = str(make_tiny_qwen2_vl(tmp_path))
    cached, plain = _qwen_processor(path, 64 * MiB), _qwen_processor(path, 0)
    calls = _count_image_processor_calls(cached, monkeypatch)
    video = [random_image(50 + i, (48, 32)) for i in range(4)]
    text = f"Watch {QWEN_VIDEO} and {QWEN_IMAGE}."
    first = cached.process(text, {"video": video, "image": video[0]})
    assert calls == [1, 1, 1, 1]  # each frame once; the image is the first frame
    again = cached.process(text, {"video": video, "image": video[0]})
    assert calls == [1, 1, 1, 1]
    changed = [frame.copy() for frame in video]
    changed[2].putpixel((3, 4), (0, 0, 0))
    other = cached.process(text, {"video": changed, "image": video[0]})
    assert calls == [1, 1, 1, 1, 1]  # the changed frame only
    assert other.features[0].identifier != first.features[0].identifier
    for result, frames in ((first, video), (again, video), (other, changed)):
        _assert_same(result, plain.process(text, {"video": frames, "image": video[0]}))
