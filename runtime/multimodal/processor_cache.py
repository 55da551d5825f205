"""vLLM's multimodal processor cache (``--mm-processor-cache-gb``, type ``lru``): the image
processor's output for each item, kept by the item's digest (the one the prefix cache keys its
blocks by) in an LRU bounded by bytes, so an image seen again is not resized and normalized again.

What is cached is the Hugging Face image processor's arrays for one image (``pixel_values`` and
what it adds: ``image_sizes``, ``num_crops``), not the expanded prompt: the model's processor
still expands the placeholders, from the cached arrays, so the tokens are the same either way.
The cache lives in the process that runs the processor (the API process, or the offline LLM's),
each its own, as vLLM's processor-side cache; the arrays still cross the pipe to the engine core
with every request (vLLM's ``lru`` keeps a mirror in the core to spare that; not built here)."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from infernetes.runtime.engine.stats import MultiModalCacheStats

# The digests of the images of the processor call running in this thread (set around it by
# MultiModalProcessor.process): the image processor sees only the images.
_CALL_DIGESTS: contextvars.ContextVar[Sequence[str] | None] = contextvars.ContextVar(
    "mm_call_digests", default=None
)
# The digests of the videos' frames, by the frame object: a video processor sees one video's
# frames a call, in an order of its own.
_CALL_FRAME_DIGESTS: contextvars.ContextVar[Mapping[int, str] | None] = contextvars.ContextVar(
    "mm_call_frame_digests", default=None
)


class ProcessorCache:
    """An LRU of per-item arrays bounded by their bytes; safe across the preparation threads.
    A cache does not travel: unpickled (in the API process) it starts empty."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._init_state()

    def _init_state(self) -> None:
        self._items: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self.used_bytes = 0
        # items looked up and found since the stats were last taken (vllm:mm_cache_*)
        self.stats = MultiModalCacheStats()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"capacity_bytes": self.capacity_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.capacity_bytes = state["capacity_bytes"]
        self._init_state()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, digest: str) -> dict[str, np.ndarray] | None:
        with self._lock:
            self.stats.queries += 1
            arrays = self._items.get(digest)
            if arrays is not None:
                self.stats.hits += 1
                self._items.move_to_end(digest)
            return arrays

    def put(self, digest: str, arrays: dict[str, np.ndarray]) -> None:
        """Keep ``arrays``, evicting the least recently used items until they fit; an item
        larger than the whole cache is not kept."""
        size = sum(array.nbytes for array in arrays.values())
        if size > self.capacity_bytes:
            return
        with self._lock:
            if digest in self._items:
                return
            while self.used_bytes + size > self.capacity_bytes:
                old, _ = self._items.popitem(last=False)
                self.used_bytes -= self._sizes.pop(old)
            self._items[digest] = arrays
            self._sizes[digest] = size
            self.used_bytes += size

    def take_stats(self) -> MultiModalCacheStats:
        with self._lock:
            return self.stats.take()


@contextlib.contextmanager
def item_digests(
    digests: Sequence[str], frame_digests: Mapping[int, str] | None = None
) -> Iterator[None]:
    """The digests of the images of the processor call made inside, in order, and of the
    videos' frames by ``id()`` of each frame."""
    token = _CALL_DIGESTS.set(digests)
    frames_token = _CALL_FRAME_DIGESTS.set(frame_digests)
    try:
        yield
    finally:
        _CALL_FRAME_DIGESTS.reset(frames_token)
        _CALL_DIGESTS.reset(token)


def _call_digests(flat: Any) -> Sequence[str] | None:
    """The digests of a call's images: all of them a video's frames, or the call's images."""
    if not isinstance(flat, list) or not flat:
        return None
    frames = _CALL_FRAME_DIGESTS.get() or {}
    found = [frames.get(id(image)) for image in flat]
    if None not in found:
        return found  # type: ignore[return-value]  # no None among them
    images = _CALL_DIGESTS.get()
    return images if images is not None and len(images) == len(flat) else None


class CachedImageProcessor:
    """Stands in for a Hugging Face processor's ``image_processor``: each image (or video
    frame) of a call whose digest is cached takes its arrays from the cache, the others are processed one by one and
    kept; the batch is then put together as the image processor would have made it (rows
    concatenated; LLaVA-NeXT's tiles and Pixtral's sides padded with zeros to the batch's most)."""

    def __init__(self, inner: Any, cache: ProcessorCache) -> None:
        self.inner = inner
        self.cache = cache

    def __getattr__(self, name: str) -> Any:
        if name == "inner" or name.startswith("__"):  # unpickling looks before inner exists
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, images: Any, *args: Any, **kwargs: Any) -> Any:
        from transformers import BatchFeature

        nested = isinstance(images, list) and bool(images) and isinstance(images[0], list)
        flat = [image for group in images for image in group] if nested else images
        digests = _call_digests(flat)
        if digests is None or args:
            return self.inner(images, *args, **kwargs)
        items = []
        for image, digest in zip(flat, digests, strict=True):
            arrays = self.cache.get(digest)
            if arrays is None:
                one = self.inner([[image]] if nested else [image], **kwargs)
                arrays = {name: np.asarray(value) for name, value in one.items()}
                self.cache.put(digest, arrays)
            items.append(arrays)
        return BatchFeature(_batched(items), tensor_type=kwargs.get("return_tensors"))


def _batched(items: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    batch = {}
    for name in items[0]:
        arrays = [item[name] for item in items]
        if arrays[0].ndim >= 3:  # LLaVA-NeXT's tiles, Pixtral's sides: padded to the most
            most = np.max([array.shape[1:] for array in arrays], axis=0)
            arrays = [
                np.pad(
                    array,
                    [(0, 0), *((0, m - n) for m, n in zip(most, array.shape[1:], strict=True))],
                )
                for array in arrays
            ]
        batch[name] = np.concatenate(arrays)
    return batch
