"""LLaVA-OneVision's image path, model level: the SigLIP tower, the projector, the anyres
tiling, unpadding, the scaling down of grids over ``anyres_max_N`` tiles' worth and the newline
rows give transformers' image features row for row, for images whose sizes pick every tiling
here. (Served end to end it needs torchvision, which its processor's video half imports: see
docs/multimodal.md.)"""

from __future__ import annotations

import pytest
import torch
from infernetes.runtime.model_executor.loader import build_model, inspect_model, load_hf_config
from infernetes.runtime.testing_vision import make_tiny_llava_onevision, random_image

# (width, height): 2 to 4 grid tiles; the 4-tile grids are over 2 tiles' worth: scaled down
SIZES = [(40, 36), (100, 30), (30, 70), (64, 64), (90, 40)]


@pytest.fixture(scope="module")
def onevision(tmp_path_factory):
    return make_tiny_llava_onevision(tmp_path_factory.mktemp("onevision"))


def test_image_features_equal_transformers(onevision):
    from transformers import AutoImageProcessor, LlavaOnevisionForConditionalGeneration

    images = [random_image(seed, size) for seed, size in enumerate(SIZES)]
    inputs = AutoImageProcessor.from_pretrained(str(onevision))(images, return_tensors="pt")
    hf = LlavaOnevisionForConditionalGeneration.from_pretrained(str(onevision)).eval()
    info = inspect_model(onevision, load_hf_config(onevision), "float32", 64, torch.device("cpu"))
    model = build_model(info, torch.device("cpu"), use_tqdm=False)
    fit, scaled = model.fit, []
    model.fit = lambda grid: scaled.append(fit(grid).shape != grid.shape) or fit(grid)
    with torch.inference_mode():
        expected = hf.model.get_image_features(
            pixel_values=inputs["pixel_values"], image_sizes=inputs["image_sizes"]
        ).pooler_output
        ours = model.embed_multimodal(
            "image",
            {"pixel_values": inputs["pixel_values"], "image_sizes": inputs["image_sizes"]},
        )
    assert [len(rows) for rows in ours] == [len(rows) for rows in expected]
    assert len(scaled) == len(SIZES) and any(scaled) and not all(scaled)
    for rows, reference in zip(ours, expected, strict=True):
        torch.testing.assert_close(rows, reference, atol=1e-5, rtol=1e-5)


def test_served_without_torchvision_is_a_clear_error(onevision):
    from infernetes import LLM

    with pytest.raises(ValueError, match=r"(?s)cannot load the multimodal processor.*Torchvision"):
        LLM(str(onevision), dtype="float32", max_model_len=400, num_gpu_blocks_override=64)
