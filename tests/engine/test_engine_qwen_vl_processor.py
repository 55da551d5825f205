"""Qwen2-VL's processor stand-in (transformers' own needs torchvision): each ``<|image_pad|>``
becomes one token per merge block of its image's patches, each item gets its own rows of the
patches and its grid, the processor cache gives the same tokens and arrays, and a prompt whose
placeholders do not match its images is a RequestError naming the field."""

from __future__ import annotations

import numpy as np
import pytest
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.processor import MultiModalProcessor
from infernetes.runtime.multimodal.qwen_vl import QwenVLProcessor
from infernetes.runtime.testing_vision import QWEN_IMAGE, make_tiny_qwen2_vl, random_image
from transformers import AutoImageProcessor

MiB = 1 << 20
PATCH_ROW = 3 * 2 * 8 * 8  # channels x temporal patch x patch x patch
TEXT = f"Compare {QWEN_IMAGE} with {QWEN_IMAGE} please."
SIZES = [(70, 50), (30, 90)]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return str(make_tiny_qwen2_vl(tmp_path_factory.mktemp("qwen")))


def _processor(path: str, cache_bytes: int) -> MultiModalProcessor:
    return MultiModalProcessor.load(
        path, (PATCH_ROW,), {}, {}, cache_bytes, processor_class=QwenVLProcessor
    )


def _images() -> list:
    return [random_image(seed, size) for seed, size in enumerate(SIZES)]


def test_each_image_is_its_grid_s_tokens_and_rows(qwen):
    prompt = _processor(qwen, 0).process(TEXT, {"image": _images()})
    reference = AutoImageProcessor.from_pretrained(qwen)(_images(), return_tensors="np")
    grids = reference["image_grid_thw"]
    pad = QwenVLProcessor.from_pretrained(qwen).image_token_ids[0]
    assert prompt.prompt_token_ids.count(pad) == int(grids.prod(axis=1).sum()) // 4
    rows = 0
    for feature, grid in zip(prompt.features, grids, strict=True):
        assert feature.length == int(grid.prod()) // 4
        assert set(prompt.prompt_token_ids[feature.offset : feature.end]) == {pad}
        np.testing.assert_array_equal(feature.data["image_grid_thw"], grid)
        patches = reference["pixel_values"][rows : rows + int(grid.prod())]
        np.testing.assert_array_equal(feature.data["pixel_values"], patches)
        rows += int(grid.prod())
    assert rows == len(reference["pixel_values"])


def test_the_processor_cache_gives_the_same_prompt(qwen):
    cached, plain = _processor(qwen, 64 * MiB), _processor(qwen, 0)
    for _ in range(2):  # the second time from the cache
        a, b = cached.process(TEXT, {"image": _images()}), plain.process(TEXT, {"image": _images()})
        assert a.prompt_token_ids == b.prompt_token_ids
        for x, y in zip(a.features, b.features, strict=True):
            assert x[:4] == y[:4]
            for name in x.data:
                np.testing.assert_array_equal(x.data[name], y.data[name])
    assert cached.cache is not None and cached.cache.take_stats().hits == 2


def test_placeholders_that_do_not_match_the_images_are_refused(qwen):
    with pytest.raises(RequestError, match="placeholder") as error:
        _processor(qwen, 0).process(f"Only {QWEN_IMAGE}", {"image": _images()})
    assert error.value.param == "multi_modal_data.image"
