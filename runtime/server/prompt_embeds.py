"""The completions API's ``prompt_embeds``, as vLLM takes them: each a base64 string of a
``torch.save``d tensor ``[num_prompt_tokens, hidden_size]`` (with ``--enable-prompt-embeds``).

Read with ``torch.load(weights_only=True)``, which unpickles tensors and plain containers only, so a
crafted payload cannot run code; a sparse or non-tensor payload is refused. torch is imported on
the first such request only: the API process holds none otherwise. Shape, dtype and whether the
engine takes embeddings at all are the input processor's checks (one home, for the offline
``LLM`` and the server alike)."""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from infernetes.runtime.server.errors import APIError


def decode_prompt_embeds(data: str, param: str) -> Any:
    """The tensor ``data`` holds; APIError naming ``param`` when it is not one."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as error:
        raise APIError(f"{param} is not valid base64: {error}", 400, param) from error
    import torch

    try:
        tensor = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except Exception as error:  # torch raises many kinds on a malformed or unsafe payload
        raise APIError(
            f"{param} is not a torch.save'd tensor (read with weights_only=True): {error}",
            400,
            param,
        ) from error
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
        raise APIError(f"{param} must hold one dense tensor", 400, param)
    return tensor
