"""What a multimodal request carries across the engine core's pipe. No torch: the API process
makes them, and the processor's tensors travel as numpy arrays."""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple


class MultiModalFeature(NamedTuple):
    """One item (an image, a video, an audio clip) of a prompt: where its placeholder tokens
    are and what the model's encoder makes their embeddings from."""

    modality: str  # "image", "video" or "audio"
    offset: int  # the position of its first placeholder token in the prompt
    length: int  # its placeholder tokens: one row of the encoder's output each
    identifier: str  # a digest of the item and the processor settings (prefix cache, encoder cache)
    data: dict[str, Any]  # the processor's arrays of this item alone (pixel_values, image_sizes)

    @property
    def end(self) -> int:
        return self.offset + self.length


class MultiModalPrompt(NamedTuple):
    """A prompt whose items the processor has expanded and preprocessed: the ids hold each item's
    placeholder tokens (``features`` in order of position)."""

    prompt: str | None
    prompt_token_ids: list[int]
    features: list[MultiModalFeature]


def image_digest(image: Any, processor_kwargs: dict[str, Any]) -> str:
    """sha256 of a PIL image's mode, size and pixels and of the processor settings it was
    preprocessed with: one changed pixel is another item, the same pixels the same one."""
    digest = hashlib.sha256(f"{image.mode}{image.size}".encode())
    digest.update(image.tobytes())
    digest.update(json.dumps(processor_kwargs, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def overlapping(features: list[MultiModalFeature], start: int, end: int) -> list[str]:
    """The identifiers of the items whose placeholders overlap token positions [start, end)."""
    return [f.identifier for f in features if f.offset < end and start < f.end]


def video_digest(frame_digests: list[str], fps: float) -> str:
    """sha256 of a video's frames' digests (each ``image_digest``, with the processor settings)
    and the rate they are spaced at."""
    digest = hashlib.sha256(b"video")
    for frame in frame_digests:
        digest.update(frame.encode())
    digest.update(repr(float(fps)).encode())
    return digest.hexdigest()
