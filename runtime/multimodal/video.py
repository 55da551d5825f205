"""Videos a request names by URL (``video_url`` chat parts): decoded with PyAV and sampled.

Two samplings, as vLLM has them. The loader's (``--media-io-kwargs '{"video": {"num_frames":
N}}'``, vLLM's default 32, -1 for every frame): ``N`` frames spread evenly from the first to the
last, all of them when the video has no more. Then the processor's, only when
``--mm-processor-kwargs`` (or a request's) sets ``do_sample_frames``: Qwen2-VL's video
processor's rule over the frames the loader kept (``fps`` or ``num_frames``, bounded by
``min_frames`` and ``max_frames``, a multiple of the temporal patch). A decoded video's frames
are spaced in time by the rate they were sampled at (Hugging Face's ``sampled_fps``).

Every fault (no video, corrupt or truncated data, no frames, frames too large or too many) is a
``RequestError`` naming the part."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from infernetes.runtime.engine.errors import RequestError

DEFAULT_LOADER_FRAMES = 32  # vLLM's VideoMediaIO: frames the loader keeps unless told
LOADER_KEYS = ("num_frames",)  # what --media-io-kwargs' "video" takes
# what --mm-processor-kwargs takes for sampling a decoded video's frames (Qwen2-VL's processor)
SAMPLING_KEYS = ("do_sample_frames", "fps", "num_frames", "min_frames", "max_frames")
DEFAULT_MIN_FRAMES = 4  # Qwen2-VL's video processor's bounds
DEFAULT_MAX_FRAMES = 768
DEFAULT_SOURCE_FPS = 24.0  # a container that states no rate (Hugging Face assumes the same)


class DecodedVideo(NamedTuple):
    """A video's kept frames and what the processor's sampling and time spacing need."""

    frames: list[Any]  # RGB PIL images, in order
    source_fps: float  # the container's frame rate
    total_frames: int  # the frames the video has
    indices: list[int]  # which of them ``frames`` are

    @property
    def sampled_fps(self) -> float:
        """The rate of the kept frames (Hugging Face's ``VideoMetadata.sampled_fps``)."""
        return len(self.indices) / self.total_frames * self.source_fps

    def taking(self, picks: list[int]) -> DecodedVideo:
        """The video with only its kept frames at positions ``picks``."""
        return self._replace(
            frames=[self.frames[i] for i in picks], indices=[self.indices[i] for i in picks]
        )


def loader_frames(media_io_kwargs: Mapping[str, Any] | None) -> int:
    """``--media-io-kwargs``' ``video.num_frames`` (-1: every frame); ValueError naming a key
    that is not one, or a value that is not allowed."""
    given = dict(media_io_kwargs or {})
    for modality in given:
        if modality != "video":
            raise ValueError(
                f"media_io_kwargs.{modality}: not honoured here; only video.num_frames is"
            )
    video = dict(given.get("video") or {})
    for key in video:
        if key not in LOADER_KEYS:
            raise ValueError(
                f"media_io_kwargs.video.{key}: not a video loader setting here; "
                f"allowed: {', '.join(LOADER_KEYS)}"
            )
    frames = video.get("num_frames", DEFAULT_LOADER_FRAMES)
    if isinstance(frames, bool) or not isinstance(frames, int) or not (frames == -1 or frames > 0):
        raise ValueError(
            f"media_io_kwargs.video.num_frames: -1 (every frame) or a count above 0, got {frames!r}"
        )
    return frames


def even_indices(total: int, count: int) -> list[int]:
    """``count`` frame indices spread evenly over ``total`` frames, the first and the last among
    them (vLLM's loader); all of them when ``count`` is -1 or not below ``total``."""
    if count == -1 or count >= total:
        return list(range(total))
    return [int(i) for i in np.linspace(0, total - 1, count).astype(int)]


def decode_video(
    data: bytes, mime: str | None, param: str, num_frames: int, max_frames: int, max_pixels: int
) -> DecodedVideo:
    """The loader's frames of ``data``; at most ``max_frames`` kept, each at most
    ``max_pixels`` (both checked before a frame is decoded)."""
    import av

    if mime is not None and not mime.startswith("video/"):
        raise RequestError(f"{param}: the MIME type {mime!r} is not a video type", param)
    try:
        with av.open(io.BytesIO(data)) as container:
            # an image (ffmpeg reads PNG and JPEG as one-frame "videos") is not taken as one
            if not container.streams.video or "_pipe" in container.format.name:
                raise RequestError(f"{param}: the data is not a video", param)
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            if width * height > max_pixels:
                raise RequestError(
                    f"{param}: its frames have {width} x {height} pixels; at most {max_pixels} "
                    "are decoded",
                    param,
                )
            total = stream.frames or _count_frames(data)
            wanted = even_indices(total, num_frames)
            if len(wanted) > max_frames:
                raise RequestError(
                    f"{param}: {len(wanted)} frames would be kept; at most {max_frames} are "
                    "allowed (set --media-io-kwargs' video.num_frames to sample fewer)",
                    param,
                )
            frames, kept = _decode(container, stream, set(wanted))
            rate = float(stream.average_rate or 0) or DEFAULT_SOURCE_FPS
    except av.FFmpegError as error:
        raise RequestError(
            f"{param}: the data is not a video this server can read, or it is corrupt ({error})",
            param,
        ) from error
    if not frames:
        raise RequestError(f"{param}: the video has no frames", param)
    return DecodedVideo(frames, rate, max(total, kept[-1] + 1), kept)


def _count_frames(data: bytes) -> int:
    """A video's frames counted from its packets (its header did not say), none decoded."""
    import av

    with av.open(io.BytesIO(data), "r") as container:
        stream = container.streams.video[0]
        return sum(1 for packet in container.demux(stream) if packet.size > 0)


def _decode(container: Any, stream: Any, wanted: set[int]) -> tuple[list[Any], list[int]]:
    """The frames at ``wanted`` as RGB PIL images and their indices; decoding stops past the
    last wanted."""
    frames, kept = [], []
    last = max(wanted, default=-1)
    for index, frame in enumerate(container.decode(stream)):
        if index in wanted:
            frames.append(frame.to_image())
            kept.append(index)
        if index >= last:
            break
    return frames, kept


def sampling_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The processor sampling keys taken out of ``kwargs`` (the rest go to the processor)."""
    return {key: kwargs.pop(key) for key in SAMPLING_KEYS if key in kwargs}


def processor_picks(
    video: DecodedVideo, settings: Mapping[str, Any], temporal_patch_size: int, param: str
) -> list[int]:
    """Which of ``video``'s kept frames the processor takes: all unless ``do_sample_frames``;
    else Qwen2-VL's video processor's rule (``num_frames`` rounded to the temporal patch, or
    ``fps`` frames a second within ``min_frames`` and ``max_frames``), evenly spaced."""
    count = len(video.frames)
    if not settings.get("do_sample_frames"):
        return list(range(count))
    fps, wanted = settings.get("fps"), settings.get("num_frames")
    if fps is not None and wanted is not None:
        raise RequestError(
            "mm_processor_kwargs: fps and num_frames are exclusive; give one", "mm_processor_kwargs"
        )
    if wanted is not None:
        wanted = round(wanted / temporal_patch_size) * temporal_patch_size
    else:
        low = settings.get("min_frames", DEFAULT_MIN_FRAMES)
        high = settings.get("max_frames", DEFAULT_MAX_FRAMES)
        high = math.floor(min(high, count) / temporal_patch_size) * temporal_patch_size
        wanted = count / video.sampled_fps * (2.0 if fps is None else fps)
        wanted = min(max(wanted, low), high, count)
        wanted = math.floor(wanted / temporal_patch_size) * temporal_patch_size
    if not 0 < wanted <= count:
        raise RequestError(
            f"{param}: sampling takes {wanted} of its {count} frames; lower num_frames or fps "
            "in mm_processor_kwargs",
            "mm_processor_kwargs",
        )
    return [int(i) for i in np.arange(0, count, count / wanted).astype(int)]
