"""Images, videos and audio a request names by URL, read and checked before anything decodes them.

``data:`` URIs (base64), ``file://`` paths only inside ``--allowed-local-media-path``, and
``http(s)://`` URLs fetched within ``VLLM_IMAGE_FETCH_TIMEOUT`` (a video's:
``VLLM_VIDEO_FETCH_TIMEOUT``, audio's: ``VLLM_AUDIO_FETCH_TIMEOUT``) seconds from the
``--allowed-media-domains`` (any, when not given), never following a redirect and never reading
more than ``MAX_MEDIA_BYTES``. Before decoding, the header's pixel count is checked against
PIL's ``Image.MAX_IMAGE_PIXELS`` (a decompression bomb is refused without being decoded), and
the format against the declared MIME type (videos: ``video.py``); audio is at most
``VLLM_MAX_AUDIO_CLIP_FILESIZE_MB`` and one clip's ``audio.MAX_CLIP_SECONDS`` (checked from its
header, before decoding). Every fault is a ``RequestError`` naming the part.
"""

from __future__ import annotations

import base64
import binascii
import io
import mimetypes
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urlparse

from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.video import (
    DEFAULT_LOADER_FRAMES,
    DecodedVideo,
    decode_video,
    loader_frames,
)

MAX_MEDIA_BYTES = 32 * 1024 * 1024  # one item's encoded bytes, as much as a request body holds


class MediaSettings(NamedTuple):
    allowed_local_media_path: str = ""  # "": file:// URLs are refused
    allowed_media_domains: tuple[str, ...] | None = None  # None: any host
    fetch_timeout_s: float = 5.0  # VLLM_IMAGE_FETCH_TIMEOUT
    video_fetch_timeout_s: float = 30.0  # VLLM_VIDEO_FETCH_TIMEOUT
    video_num_frames: int = DEFAULT_LOADER_FRAMES  # --media-io-kwargs' video.num_frames
    audio_fetch_timeout_s: float = 10.0  # VLLM_AUDIO_FETCH_TIMEOUT
    # VLLM_MAX_AUDIO_CLIP_FILESIZE_MB: an audio file's bytes (a chat part's, an upload's)
    max_audio_file_mb: int = 25

    @classmethod
    def of(cls, config: Any, environ: Any = None) -> MediaSettings:
        """From a ``ServeConfig`` and the environment (``VLLM_*_FETCH_TIMEOUT``); ValueError
        naming a ``--media-io-kwargs`` key that is not allowed."""
        from infernetes.schema.env import read_env

        domains = getattr(config, "allowed_media_domains", None)
        return cls(
            getattr(config, "allowed_local_media_path", "") or "",
            tuple(domains) if domains else None,
            float(read_env("VLLM_IMAGE_FETCH_TIMEOUT", environ)),
            float(read_env("VLLM_VIDEO_FETCH_TIMEOUT", environ)),
            loader_frames(getattr(config, "media_io_kwargs", None)),
            float(read_env("VLLM_AUDIO_FETCH_TIMEOUT", environ)),
            int(read_env("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB", environ)),
        )


def load_image(url: Any, settings: MediaSettings, param: str) -> Any:
    """The PIL image ``url`` names, decoded and checked; RequestError naming ``param``."""
    mime, data = read_media(url, settings, param, "image")
    return decode_image(data, mime, param)


def load_video(url: Any, settings: MediaSettings, param: str) -> DecodedVideo:
    """The loader's frames of the video ``url`` names; RequestError naming ``param``."""
    from infernetes.runtime.multimodal.processor import MAX_VIDEO_FRAMES
    from PIL import Image

    mime, data = read_media(url, settings, param, "video")
    max_pixels = Image.MAX_IMAGE_PIXELS or 0  # (None: PIL's limit is off; so is this one)
    return decode_video(
        data, mime, param, settings.video_num_frames, MAX_VIDEO_FRAMES, max_pixels or 2**62
    )


def load_audio(url: Any, settings: MediaSettings, param: str) -> tuple[Any, int]:
    """The samples (float32, mono) and rate of the audio ``url`` names, one clip's length at
    most; RequestError naming ``param``."""
    from infernetes.runtime.multimodal.audio import MAX_CLIP_SECONDS, decode_audio

    mime, data = read_media(url, settings, param, "audio")
    if mime is not None and not mime.startswith("audio/") and mime != "application/octet-stream":
        raise RequestError(f"{param}: the MIME type {mime!r} is not an audio type", param)
    limit = settings.max_audio_file_mb
    if len(data) > limit * 2**20:
        raise RequestError(
            f"{param}: {len(data) / 2**20:.1f} MiB of audio; at most {limit} MiB are taken "
            "(VLLM_MAX_AUDIO_CLIP_FILESIZE_MB)",
            param,
        )
    return decode_audio(data, param, MAX_CLIP_SECONDS)


def read_media(
    url: Any, settings: MediaSettings, param: str, what: str
) -> tuple[str | None, bytes]:
    """The declared MIME type (None: not declared) and the bytes of the ``what`` (image, video
    or audio) ``url`` names."""
    if not isinstance(url, str):
        raise RequestError(f"{param}: the {what} URL must be a string", param)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return _data_uri(url, param, what)
    if scheme == "file":
        return _local_file(url, settings, param, what)
    if scheme in ("http", "https"):
        timeout = {
            "image": settings.fetch_timeout_s,
            "video": settings.video_fetch_timeout_s,
            "audio": settings.audio_fetch_timeout_s,
        }[what]
        return _fetch(url, settings, param, what, timeout)
    raise RequestError(f"{param}: the {what} URL must be a data:, file:// or http(s):// URL", param)


def _data_uri(url: str, param: str, what: str) -> tuple[str | None, bytes]:
    header, sep, payload = url[len("data:") :].partition(",")
    if not sep or not header.endswith(";base64"):
        raise RequestError(f"{param}: a data: URL must be data:<mime type>;base64,<data>", param)
    if len(payload) > MAX_MEDIA_BYTES * 4 // 3 + 4:
        raise RequestError(f"{param}: the {what} is larger than {MAX_MEDIA_BYTES} bytes", param)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as error:
        raise RequestError(
            f"{param}: the data: URL is not valid base64 ({error})", param
        ) from error
    return header.removesuffix(";base64") or None, data


def _local_file(
    url: str, settings: MediaSettings, param: str, what: str
) -> tuple[str | None, bytes]:
    if not settings.allowed_local_media_path:
        raise RequestError(
            f"{param}: file:// URLs are refused unless the server is started with "
            "--allowed-local-media-path",
            param,
        )
    root = Path(settings.allowed_local_media_path).resolve()
    path = Path(unquote(urlparse(url).path)).resolve()  # links and .. resolved before the check
    if root not in path.parents:
        raise RequestError(f"{param}: the file is outside --allowed-local-media-path", param)
    try:
        if path.stat().st_size > MAX_MEDIA_BYTES:
            raise RequestError(f"{param}: the {what} is larger than {MAX_MEDIA_BYTES} bytes", param)
        data = path.read_bytes()
    except OSError as error:
        raise RequestError(f"{param}: cannot read the file: {error.strerror}", param) from error
    return mimetypes.guess_type(path.name)[0], data


def _fetch(
    url: str, settings: MediaSettings, param: str, what: str, timeout: float
) -> tuple[str | None, bytes]:
    import httpx

    host = urlparse(url).hostname or ""
    domains = settings.allowed_media_domains
    if domains is not None and host not in domains:
        raise RequestError(
            f"{param}: {host!r} is not one of --allowed-media-domains ({', '.join(domains)})",
            param,
        )
    deadline = time.monotonic() + timeout
    too_slow = (
        f"{param}: fetching the {what} took longer than "
        f"VLLM_{what.upper()}_FETCH_TIMEOUT ({timeout:g} s)"
    )
    chunks, size = [], 0
    try:
        with (
            httpx.Client(timeout=timeout, follow_redirects=False) as client,
            client.stream("GET", url) as response,
        ):
            if response.is_redirect:
                raise RequestError(
                    f"{param}: the {what} URL redirects; redirects are not followed", param
                )
            if response.status_code != 200:
                raise RequestError(
                    f"{param}: fetching the {what} returned HTTP {response.status_code}", param
                )
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_MEDIA_BYTES:
                    raise RequestError(
                        f"{param}: the {what} is larger than {MAX_MEDIA_BYTES} bytes", param
                    )
                if time.monotonic() > deadline:
                    raise RequestError(too_slow, param)
                chunks.append(chunk)
            mime = response.headers.get("content-type", "").split(";")[0].strip() or None
    except httpx.TimeoutException as error:
        raise RequestError(too_slow, param) from error
    except httpx.HTTPError as error:
        raise RequestError(f"{param}: cannot fetch the {what}: {error}", param) from error
    return mime, b"".join(chunks)


def _same_type(declared: str, actual: str | None) -> bool:
    aliases = {"image/jpg": "image/jpeg", "image/x-png": "image/png"}
    return aliases.get(declared, declared) == actual


def decode_image(data: bytes, mime: str | None, param: str) -> Any:
    """Decode ``data``: refused when it is no image, its declared MIME type says another format,
    it has more pixels than PIL's limit (before decoding) or it is truncated or corrupt."""
    from PIL import Image, UnidentifiedImageError

    if mime is not None and not mime.startswith("image/"):
        raise RequestError(f"{param}: the MIME type {mime!r} is not an image type", param)
    limit = Image.MAX_IMAGE_PIXELS
    try:
        # Opening reads the header only and checks its pixel count: above 2x the limit PIL
        # raises, between 1x and 2x it only warns; both are refused here.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise RequestError(
            f"{param}: the image has more than {limit} pixels, the most this server decodes",
            param,
        ) from error
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise RequestError(
            f"{param}: the data is not an image this server can read", param
        ) from error
    actual = Image.MIME.get(image.format or "")
    if mime is not None and not _same_type(mime, actual):
        raise RequestError(
            f"{param}: declared {mime} but the data is {actual or image.format or 'unknown'}",
            param,
        )
    try:
        image.load()
    except (OSError, SyntaxError, ValueError, EOFError) as error:
        raise RequestError(
            f"{param}: the image is truncated or corrupt ({error})", param
        ) from error
    return image
