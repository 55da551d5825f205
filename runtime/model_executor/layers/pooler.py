"""Pooling hidden states into one embedding per sequence: CLS, mean, last token; normalised or not.

A sentence-transformers folder declares its pooling (``modules.json`` + ``1_Pooling/config.json``,
a ``Normalize`` module); without one, encoders pool the CLS token and normalise (vLLM's default).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

POOLING_TYPES = ("CLS", "MEAN", "LAST")


class Pooler:
    def __init__(self, pooling_type: str = "CLS", normalize: bool = True) -> None:
        if pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"pooling_type must be one of {', '.join(POOLING_TYPES)}; got {pooling_type!r}"
            )
        self.pooling_type = pooling_type
        self.normalize = normalize

    @classmethod
    def for_model(
        cls, path: Path, default_type: str = "CLS", overrides: dict[str, Any] | None = None
    ) -> Pooler:
        pooling_type, normalize = default_type, True
        modules_file = path / "modules.json"
        if modules_file.is_file():
            modules = json.loads(modules_file.read_text())
            normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
            for module in modules:
                if module.get("type", "").endswith("Pooling"):
                    config = json.loads((path / module["path"] / "config.json").read_text())
                    if config.get("pooling_mode_mean_tokens"):
                        pooling_type = "MEAN"
                    elif config.get("pooling_mode_cls_token"):
                        pooling_type = "CLS"
                    elif config.get("pooling_mode_lasttoken"):
                        pooling_type = "LAST"
                    else:
                        raise ValueError(
                            f"{path}: only CLS, mean and last-token pooling are supported"
                        )
        overrides = overrides or {}
        return cls(
            overrides.get("pooling_type", pooling_type), overrides.get("normalize", normalize)
        )

    def __call__(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        bounds = cu_seqlens.tolist()
        pooled = []
        for start, end in itertools.pairwise(bounds):
            tokens = hidden[start:end]
            if self.pooling_type == "CLS":
                pooled.append(tokens[0])
            elif self.pooling_type == "MEAN":
                pooled.append(tokens.float().mean(dim=0).to(tokens.dtype))
            else:
                pooled.append(tokens[-1])
        out = torch.stack(pooled)
        return F.normalize(out.float(), p=2, dim=-1) if self.normalize else out
