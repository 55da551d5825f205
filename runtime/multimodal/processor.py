"""The model's own Hugging Face processor, run on the API side of the engine core's pipe (in the
server's preparation threads, never on its event loop): it expands each image's placeholder in
the text to the image's feature tokens and turns the image into the encoder's arrays.

``--limit-mm-per-prompt`` bounds the items of each modality a prompt may carry and
``--mm-processor-kwargs`` (a request's ``mm_processor_kwargs`` over it) goes to the processor's
call. ``--mm-processor-cache-gb`` keeps the image processor's output per image
(``processor_cache.py``). Loading a processor imports transformers' image processing, which imports torch: a
vision-language model's API process has torch, a text model's still does not."""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.inputs import (
    MultiModalFeature,
    MultiModalPrompt,
    image_digest,
    video_digest,
)
from infernetes.runtime.multimodal.processor_cache import (
    CachedImageProcessor,
    ProcessorCache,
    item_digests,
)
from infernetes.runtime.multimodal.qwen_vl import DEFAULT_FPS
from infernetes.runtime.multimodal.video import DecodedVideo, processor_picks, sampling_settings

logger = logging.getLogger(__name__)

MODALITIES = ("image", "video", "audio")
SUPPORTED_MODALITIES = ("image",)  # of every vision-language model served here
VIDEO_MODALITIES = ("image", "video")  # of those whose processor has a video token (Qwen2-VL)
# A video's frames at most (as given, or as sampled at --mm-processor-kwargs' fps): each is an
# image's work for the processor and the tower
MAX_VIDEO_FRAMES = 768
# What the processors return of each image: its pixels, its size (LLaVA-NeXT's tiling), its grid
# of patches (Qwen2-VL's dynamic resolution: pixel_values then holds every image's patches)
ITEM_ARRAYS = ("pixel_values", "image_sizes", "image_grid_thw")
# The longer side of an image at most this many times the shorter (Qwen2-VL's processor's
# bound): processors resize the shorter side up, and a thin strip would grow to gigabytes.
MAX_ASPECT_RATIO = 200


def parse_limits(limits: Mapping[str, Any]) -> dict[str, int]:
    """``--limit-mm-per-prompt`` as counts: ``{"image": 2}`` or vLLM's newer
    ``{"image": {"count": 2, ...}}`` (the size hints are for memory profiling, not a limit)."""
    counts = {}
    for modality, value in limits.items():
        if modality not in MODALITIES:
            raise ValueError(
                f"limit_mm_per_prompt: unknown modality {modality!r}; one of {', '.join(MODALITIES)}"
            )
        count = value.get("count") if isinstance(value, Mapping) else value
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"limit_mm_per_prompt.{modality}: a count of 0 or more, got {value!r}")
        counts[modality] = count
    return counts


def check_limits(
    limits: Mapping[str, Any], architecture: str, supported: Sequence[str] = SUPPORTED_MODALITIES
) -> dict[str, int]:
    """The counts, or ValueError when one allows a modality the model does not take (as vLLM
    refuses it at startup)."""
    counts = parse_limits(limits)
    for modality, count in counts.items():
        if count > 0 and modality not in supported:
            raise ValueError(
                f"limit_mm_per_prompt.{modality}: {architecture} takes "
                f"{', '.join(supported)} only; set it to 0 or leave it out"
            )
    return counts


def _as_list(items: Any) -> list[Any]:
    return list(items) if isinstance(items, list | tuple) else [items]


class MultiModalProcessor:
    """Picklable (it travels to the API side in ``EngineInfo``, as the tokenizer does)."""

    def __init__(
        self,
        hf_processor: Any,
        image_shape: tuple[int | None, ...],
        limits: dict[str, int],
        default_kwargs: Mapping[str, Any] | None,
        cache_bytes: int = 0,
        one_item_per_image: bool = False,
    ) -> None:
        self.hf_processor = hf_processor
        # each image one item, the tiles its processor cuts it into together (the transformers
        # fallback: the model encodes an item's tiles as transformers' get_image_features does)
        self.one_item_per_image = one_item_per_image
        # one image's pixel_values, as the vision tower takes it (None: a side of any size)
        self.image_shape = image_shape
        self.limits = limits  # a modality left out: no limit
        self.default_kwargs = dict(default_kwargs or {})
        self.image_token: str = hf_processor.image_token  # an image's placeholder in the text
        # the token the processor expands it to, one per feature row (Gemma 3's differs from
        # the placeholder: <start_of_image> becomes a run of <image_soft_token>)
        [feature_token_id, *structure] = hf_processor.image_token_ids
        self.image_token_id: int = (
            feature_token_id
            if feature_token_id is not None
            else hf_processor.tokenizer.convert_tokens_to_ids(self.image_token)
        )
        # the tokens an image's placeholder is made of: its feature token, and for a grid
        # (Pixtral's) the tokens that end its rows; each item then carries its own
        # (placeholder_ids), for the model to lay the features among them
        self.placeholder_token_ids = {self.image_token_id, *(t for t in structure if t is not None)}
        self.video_token: str | None = getattr(hf_processor, "video_token", None)
        self.modalities = VIDEO_MODALITIES if self.video_token else SUPPORTED_MODALITIES
        # what stands for one item of each modality in a chat's text
        self.placeholders = {"image": self.image_token}
        if self.video_token:
            self.placeholders["video"] = self.video_token
        self.cache = ProcessorCache(cache_bytes) if cache_bytes > 0 else None  # 0: disabled
        if self.cache is not None:
            hf_processor.image_processor = CachedImageProcessor(
                hf_processor.image_processor, self.cache
            )

    @classmethod
    def load(
        cls,
        path: str | Path,
        image_shape: tuple[int | None, ...],
        limits: dict[str, int],
        default_kwargs: Mapping[str, Any] | None,
        cache_bytes: int = 0,
        trust_remote_code: bool = False,
        processor_class: Any = None,
        one_item_per_image: bool = False,
    ) -> MultiModalProcessor:
        """``processor_class``: the model's own stand-in for its Hugging Face processor (one
        with ``from_pretrained``), where that cannot be built here; None: ``AutoProcessor``."""
        from transformers import AutoProcessor
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # "requires torchvision ... falling back": both work
        try:
            hf_processor = (processor_class or AutoProcessor).from_pretrained(
                str(path), trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError, ImportError) as error:  # ImportError: e.g. no torchvision
            raise ValueError(f"cannot load the multimodal processor of {path}: {error}") from error
        finally:
            hf_logging.set_verbosity(verbosity)
        return cls(
            hf_processor, image_shape, limits, default_kwargs, cache_bytes, one_item_per_image
        )

    def process(
        self,
        text: str,
        data: Mapping[str, Any],
        request_kwargs: Mapping[str, Any] | None = None,
        add_special_tokens: bool = True,
    ) -> MultiModalPrompt:
        """``text`` with one placeholder per image of ``data`` (vLLM's ``multi_modal_data``:
        ``{"image": PIL image or a list of them}``) -> its expanded ids and the items; a
        RequestError naming the field when anything is wrong."""
        images = self._images(data)
        kwargs = {**self.default_kwargs, **(request_kwargs or {})}
        videos, video_fps = self._sampled_videos(data, sampling_settings(kwargs))
        text_images = text.count(self.image_token)
        if text_images != len(images):
            raise RequestError(
                f"the prompt has {text_images} image placeholder(s) {self.image_token!r} but "
                f"{len(images)} image(s) were given: one placeholder per image",
                "multi_modal_data.image",
            )
        if videos and text.count(self.video_token or "") != len(videos):
            raise RequestError(
                f"the prompt has {text.count(self.video_token or '')} video placeholder(s) "
                f"{self.video_token!r} but {len(videos)} video(s) were given: one per video",
                "multi_modal_data.video",
            )
        digests = [image_digest(image, kwargs) for image in images]
        frame_digests = [[image_digest(frame, kwargs) for frame in video] for video in videos]
        by_frame = {
            id(frame): digest
            for video, video_digests in zip(videos, frame_digests, strict=True)
            for frame, digest in zip(video, video_digests, strict=True)
        }
        with_videos = {"videos": videos, "fps": video_fps} if videos else {}
        try:
            with item_digests(digests, by_frame):
                out = self.hf_processor(
                    text=text,
                    images=images or None,
                    return_tensors="np",
                    add_special_tokens=add_special_tokens,
                    **with_videos,
                    **kwargs,
                )
        except (ValueError, TypeError, KeyError) as error:
            field = "mm_processor_kwargs" if kwargs else "multi_modal_data.image"
            raise RequestError(
                f"the model's processor refused the input: {error}", field
            ) from error
        ids = [int(t) for t in out["input_ids"][0]]
        if out.get("batch_num_images") is not None and len(images) > 1:
            # LLaVA-OneVision takes an image among several otherwise than one alone: its
            # features (and the prefix cache's key) differ
            digests = [f"{digest}:among-several" for digest in digests]
        arrays = {k: out[k] for k in ITEM_ARRAYS if out.get(k) is not None}
        features = self._features(ids, images, digests, arrays, kwargs)
        if videos:
            features += self._video_features(ids, frame_digests, video_fps, out, kwargs)
            features.sort(key=lambda feature: feature.offset)
        return MultiModalPrompt(text, ids, features)

    def _sampled_videos(
        self, data: Mapping[str, Any], sampling: dict[str, Any]
    ) -> tuple[list[list[Any]], list[float]]:
        """Each video's frames the processor takes and their rate: a decoded video's
        (``video_url``) sampled as ``sampling`` says, at the rate they were sampled at; frames
        given as such all of them, at ``fps`` (Qwen's 2 when not given)."""
        videos, fps = [], []
        for i, video in enumerate(self._videos(data)):
            where = f"multi_modal_data.video[{i}]"
            if isinstance(video, DecodedVideo):
                # frames are taken in temporal patches (Qwen's 2); one at a time elsewhere
                temporal = getattr(self.hf_processor.image_processor, "temporal_patch_size", 1)
                video = video.taking(processor_picks(video, sampling, temporal, where))
                videos.append(video.frames)
                fps.append(video.sampled_fps)
                continue
            if sampling.get("do_sample_frames") or set(sampling) - {"fps", "do_sample_frames"}:
                raise RequestError(
                    "mm_processor_kwargs: do_sample_frames, num_frames, min_frames and "
                    "max_frames sample a decoded video (a video_url); frames given as such are "
                    "taken as given",
                    "mm_processor_kwargs",
                )
            videos.append(video)
            fps.append(float(sampling.get("fps", DEFAULT_FPS)))
        return videos, fps

    def _videos(self, data: Mapping[str, Any]) -> list[Any]:
        """``multi_modal_data.video``: one video (a list of PIL frames, or a ``[frames, H, W, 3]``
        uint8 array, as vLLM takes it; or a ``DecodedVideo``, a ``video_url``'s) or a list of them
        -> each video's RGB PIL frames (a decoded video stays one)."""
        import numpy as np
        from PIL import Image

        given = data.get("video")
        if given is None:
            return []
        one = isinstance(given, np.ndarray | DecodedVideo) or (
            isinstance(given, list | tuple) and given and isinstance(given[0], Image.Image)
        )
        videos = [given] if one else _as_list(given)
        limit = self.limits.get("video")
        if limit is not None and len(videos) > limit:
            raise RequestError(
                f"At most {limit} video(s) may be provided in one prompt (--limit-mm-per-prompt); "
                f"got {len(videos)}",
                "multi_modal_data.video",
            )
        out: list[Any] = []
        for i, video in enumerate(videos):
            where = f"multi_modal_data.video[{i}]"
            if isinstance(video, DecodedVideo):
                out.append(video)
                continue
            if isinstance(video, np.ndarray):
                if video.ndim != 4 or video.shape[-1] != 3 or video.dtype != np.uint8:
                    raise RequestError(
                        f"{where}: an array of [frames, height, width, 3] uint8, got "
                        f"{video.dtype} {list(video.shape)}",
                        where,
                    )
                video = [Image.fromarray(frame) for frame in video]
            if not isinstance(video, list | tuple) or not all(
                isinstance(frame, Image.Image) for frame in video
            ):
                raise RequestError(f"{where}: a list of PIL frames or a uint8 array", where)
            if not 0 < len(video) <= MAX_VIDEO_FRAMES:
                raise RequestError(
                    f"{where}: {len(video)} frames; from 1 to {MAX_VIDEO_FRAMES} are allowed", where
                )
            if len({frame.size for frame in video}) != 1:
                raise RequestError(f"{where}: its frames must all have one size", where)
            out.append([f if f.mode == "RGB" else f.convert("RGB") for f in video])
        return out

    def _video_features(
        self,
        ids: Sequence[int],
        frame_digests: list[list[str]],
        fps: list[float],
        out: Any,
        kwargs: dict[str, Any],
    ) -> list[MultiModalFeature]:
        """Each video's run of ``<|video_pad|>`` tokens and its rows of the processor's
        ``pixel_values_videos`` (its ``video_grid_thw`` patches) and its ``second_per_grid_ts``;
        or, where its temporal patches' runs stand apart (Qwen3-VL writes each one's time
        between them), one item per temporal patch, at ``t = 1``."""
        import numpy as np

        token_id = self.hf_processor.tokenizer.convert_tokens_to_ids(self.video_token)
        positions = [i for i, t in enumerate(ids) if t == token_id]
        if "video_grid_thw" not in out:
            return _whole_video_features(positions, frame_digests, fps, out["pixel_values_videos"])
        grids = out["video_grid_thw"]
        merge = kwargs.get("merge_size") or self.hf_processor.image_processor.merge_size
        bounds = [0, *itertools.accumulate(int(grid.prod()) for grid in grids)]
        features = []
        start = 0
        for i, (frames, rate, grid) in enumerate(zip(frame_digests, fps, grids, strict=True)):
            count = int(grid.prod()) // merge**2
            run = positions[start : start + count]
            start += count
            grid_t = int(grid[0])
            patches = out["pixel_values_videos"][bounds[i] : bounds[i + 1]]
            items = [(run, grid, patches)]
            if len(run) == count and run[-1] - run[0] != count - 1:  # a run per temporal patch
                per_frame = count // grid_t
                frame = np.array([1, *grid[1:]], grid.dtype)
                items = [
                    (run[j * per_frame : (j + 1) * per_frame], frame, rows)
                    for j, rows in enumerate(np.split(patches, grid_t))
                ]
            digest = video_digest(frames, rate)
            for j, (tokens, item_grid, rows) in enumerate(items):
                if (
                    len(tokens) != len(rows) // merge**2
                    or tokens[-1] - tokens[0] != len(tokens) - 1
                ):
                    raise RequestError(
                        "a video placeholder token appears in the prompt's text apart from a video",
                        "multi_modal_data.video",
                    )
                data = {
                    "pixel_values_videos": rows,
                    "video_grid_thw": item_grid,
                    "second_per_grid_ts": out["second_per_grid_ts"][i : i + 1],
                }
                identifier = digest if len(items) == 1 else f"{digest}:{j}"
                features.append(
                    MultiModalFeature("video", tokens[0], len(tokens), identifier, data)
                )
        return features

    def _images(self, data: Mapping[str, Any]) -> list[Any]:
        from PIL import Image

        for modality in data:
            if modality not in self.modalities:
                raise RequestError(
                    f"multi_modal_data.{modality}: this model takes "
                    f"{', '.join(self.modalities)} only",
                    f"multi_modal_data.{modality}",
                )
        images = _as_list(data.get("image", []))
        limit = self.limits.get("image")
        if limit is not None and len(images) > limit:
            raise RequestError(
                f"At most {limit} image(s) may be provided in one prompt (--limit-mm-per-prompt); "
                f"got {len(images)}",
                "multi_modal_data.image",
            )
        for i, image in enumerate(images):
            if not isinstance(image, Image.Image):
                raise RequestError(
                    f"multi_modal_data.image[{i}]: a PIL image, got {type(image).__name__}",
                    "multi_modal_data.image",
                )
            width, height = image.size
            if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
                raise RequestError(
                    f"multi_modal_data.image[{i}]: {width} x {height} pixels; the longer side may "
                    f"be at most {MAX_ASPECT_RATIO} times the shorter",
                    "multi_modal_data.image",
                )
        return [image if image.mode == "RGB" else image.convert("RGB") for image in images]

    def _features(
        self,
        ids: Sequence[int],
        images: list[Any],
        digests: list[str],
        arrays: dict[str, Any],
        kwargs: dict[str, Any],
    ) -> list[MultiModalFeature]:
        """Each image's run of placeholder tokens in ``ids`` and its rows of the processor's
        ``arrays`` (``pixel_values``; ``image_sizes`` for LLaVA-NeXT's tiling)."""
        if not images:
            return []
        shape = tuple(arrays["pixel_values"].shape[-len(self.image_shape) :])
        if any(want not in (None, got) for want, got in zip(self.image_shape, shape, strict=True)):
            raise RequestError(
                f"the processor made images of shape {list(shape)}; this model's vision tower "
                f"takes {list(self.image_shape)}",
                "mm_processor_kwargs" if kwargs else "multi_modal_data.image",
            )
        if self.one_item_per_image:
            return self._tiled_features(ids, images, digests, arrays, kwargs)
        positions = [i for i, t in enumerate(ids) if t in self.placeholder_token_ids]
        items = _item_arrays(arrays)
        num_items = len(items)
        if num_items != len(images):
            # Pan-and-scan (Gemma 3): each image's crops follow it, each an item with its own
            # placeholders. The processor does not say which image a crop came from, so an
            # item is known by all the prompt's images and its place among the items.
            whole = hashlib.sha256("".join(digests).encode()).hexdigest()
            digests = [f"{whole}:{i}" for i in range(num_items)]
        counts = self._placeholder_counts(positions, images, num_items, kwargs)
        features = []
        start = 0
        for i, (digest, count) in enumerate(zip(digests, counts, strict=True)):
            run = positions[start : start + count]
            start += count
            if run[-1] - run[0] != count - 1:
                raise RequestError(
                    "an image placeholder token appears in the prompt's text apart from an image",
                    "multi_modal_data.image",
                )
            item = items[i]
            if len(self.placeholder_token_ids) > 1:
                item = {**item, "placeholder_ids": np.asarray(ids[run[0] : run[-1] + 1], np.int64)}
            features.append(MultiModalFeature("image", run[0], count, digest, item))
        return features

    def _tiled_features(
        self,
        ids: Sequence[int],
        images: list[Any],
        digests: list[str],
        arrays: dict[str, Any],
        kwargs: dict[str, Any],
    ) -> list[MultiModalFeature]:
        """Each image one item with the tiles the processor cut it into (``pixel_values``
        ``[tiles, C, H, W]``, as many as the processor counts for its size), spanning its ids
        from its first feature token to its last; the tile marks between them, text or not,
        keep their own embeddings (``placeholder_ids``)."""
        field = "mm_processor_kwargs" if kwargs else "multi_modal_data.image"
        rows = len(arrays["pixel_values"])
        tiles = [1] * len(images)
        if rows != len(images):
            counter = getattr(self.hf_processor, "_get_num_multimodal_tokens", None)
            sizes = [(image.height, image.width) for image in images]
            counted = counter(image_sizes=sizes, **kwargs) if counter else None
            tiles = list(getattr(counted, "num_image_patches", None) or [])
            if sum(tiles) != rows or len(tiles) != len(images):
                raise RequestError(
                    f"the model's processor made {rows} image arrays of {len(images)} "
                    "image(s) and does not say which image each is of",
                    field,
                )
        positions = [i for i, t in enumerate(ids) if t == self.image_token_id]
        per_tile, rest = divmod(len(positions), rows)
        if rest or per_tile == 0:
            raise RequestError(
                f"the prompt's {len(positions)} image feature tokens do not divide among the "
                f"{rows} image arrays the processor made",
                field,
            )
        per_image = {name: array for name, array in arrays.items() if len(array) == len(images)}
        bounds = [0, *itertools.accumulate(tiles)]
        features = []
        for i, (digest, (a, b)) in enumerate(zip(digests, itertools.pairwise(bounds), strict=True)):
            first, last = positions[a * per_tile], positions[b * per_tile - 1]
            item = {name: array[i] for name, array in per_image.items()}
            item["pixel_values"] = arrays["pixel_values"][a:b]
            item["placeholder_ids"] = np.asarray(ids[first : last + 1], np.int64)
            features.append(MultiModalFeature("image", first, last + 1 - first, digest, item))
        return features

    def _placeholder_counts(
        self, positions: list[int], images: list[Any], num_items: int, kwargs: dict[str, Any]
    ) -> list[int]:
        """How many of the placeholder tokens at ``positions`` each of ``num_items`` items (the
        images, or their crops) has: the runs apart when there is one per item, else as the
        processor counts them for each image's size (LLaVA-NeXT's depend on it), else split
        evenly (LLaVA's do not)."""
        runs = [1 + i for i, (a, b) in enumerate(itertools.pairwise(positions)) if b != a + 1]
        bounds = [0, *runs, len(positions)]
        counts = [b - a for a, b in itertools.pairwise(bounds) if b > a]
        if len(counts) != num_items and num_items == len(images):
            counter = getattr(self.hf_processor, "_get_num_multimodal_tokens", None)
            sizes = [(image.height, image.width) for image in images]
            counted = counter(image_sizes=sizes, **kwargs).num_image_tokens if counter else None
            if counted and sum(counted) == len(positions):
                counts = list(counted)
            else:
                per_image, rest = divmod(len(positions), len(images))
                counts = [] if rest or per_image == 0 else [per_image] * len(images)
        if len(counts) != num_items or 0 in counts:
            raise RequestError(
                f"the prompt's expanded placeholders ({len(positions)}) do not divide among "
                f"{len(images)} image(s)",
                "multi_modal_data.image",
            )
        return counts


def _whole_video_features(
    positions: list[int], frame_digests: list[list[str]], fps: list[float], pixels: Any
) -> list[MultiModalFeature]:
    """Each video as one item (LLaVA-OneVision's): its frames' ``pixel_values_videos`` and the
    run of its placeholder tokens, the runs apart in the prompt's order."""
    runs = [1 + i for i, (a, b) in enumerate(itertools.pairwise(positions)) if b != a + 1]
    bounds = [0, *runs, len(positions)]
    if len(bounds) - 1 != len(frame_digests) or not positions:
        raise RequestError(
            f"the prompt's {len(frame_digests)} video(s) must each stand apart in the text, "
            "their placeholders not side by side",
            "multi_modal_data.video",
        )
    return [
        MultiModalFeature(
            "video",
            positions[a],
            b - a,
            video_digest(frames, rate),
            {"pixel_values_videos": frames_pixels},
        )
        for (a, b), frames, rate, frames_pixels in zip(
            itertools.pairwise(bounds), frame_digests, fps, pixels, strict=True
        )
    ]


def _item_arrays(arrays: dict[str, Any]) -> list[dict[str, Any]]:
    """The processor's batch arrays split into each item's: row ``i`` of each, or, with an
    ``image_grid_thw``, item ``i``'s ``t * h * w`` rows of the patches in ``pixel_values``."""
    grids = arrays.get("image_grid_thw")
    if grids is None:
        return [
            {name: array[i] for name, array in arrays.items()}
            for i in range(len(arrays["pixel_values"]))
        ]
    bounds = [0, *itertools.accumulate(int(grid.prod()) for grid in grids)]
    if bounds[-1] != len(arrays["pixel_values"]):
        raise RequestError(
            f"the processor made {len(arrays['pixel_values'])} patches for grids of {bounds[-1]}",
            "multi_modal_data.image",
        )
    return [
        {"pixel_values": arrays["pixel_values"][a:b], "image_grid_thw": grid}
        for (a, b), grid in zip(itertools.pairwise(bounds), grids, strict=True)
    ]
