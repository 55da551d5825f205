"""The Qwen2-VL and Qwen2.5-VL vision towers, model level, against transformers': images of
different grids and a grid of several frames (a video's shape: attention stays within each
frame, 2.5's windows too) in one call give the same rows. Serving videos is planned; this is
the part of it the tower already does."""

from __future__ import annotations

import pytest
import torch
from infernetes.runtime.model_executor.loader import build_model, inspect_model, load_hf_config
from infernetes.runtime.testing_vision import make_tiny_qwen2_vl

PATCH_ROW = 3 * 2 * 8 * 8  # channels x temporal patch x patch x patch
# (frames, patch rows, patch columns): a wide image, a tall one past a window's edge, 3 frames
GRIDS = [(1, 6, 8), (1, 10, 4), (3, 4, 6)]


@pytest.mark.parametrize("version", ["2", "2.5"])
def test_tower_rows_equal_transformers(tmp_path, version):
    import transformers

    path = make_tiny_qwen2_vl(tmp_path, version=version)
    architecture = transformers.AutoConfig.from_pretrained(path).architectures[0]
    hf = getattr(transformers, architecture).from_pretrained(path, dtype=torch.float32).eval()
    info = inspect_model(path, load_hf_config(path), "float32", 64, torch.device("cpu"))
    model = build_model(info, torch.device("cpu"), use_tqdm=False)
    torch.manual_seed(0)
    patches = torch.randn(sum(t * h * w for t, h, w in GRIDS), PATCH_ROW)
    with torch.inference_mode():
        want = hf.model.visual(patches, grid_thw=torch.tensor(GRIDS)).pooler_output
        got = model.visual(patches, GRIDS)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
