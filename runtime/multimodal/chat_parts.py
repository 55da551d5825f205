"""Chat message content parts, as OpenAI and vLLM spell them, split into text and media.

Image parts: ``{"type": "image_url", "image_url": {"url": ...}}`` (or the URL alone),
the Responses API's ``{"type": "input_image", "image_url": ...}`` and, offline only, vLLM's
``{"type": "image_pil", "image_pil": <PIL image>}``; video parts: vLLM's ``{"type":
"video_url", "video_url": {"url": ...}}``, for models that take videos; audio parts, for models
that take audio: OpenAI's ``{"type": "input_audio", "input_audio": {"data": <base64>,
"format": "wav"}}`` and vLLM's ``{"type": "audio_url", "audio_url": {"url": ...}}``. What
reaches the chat template: with the ``openai`` content format each media part becomes
``{"type": "image"}``, ``{"type": "video"}`` or ``{"type": "audio"}`` where it stood; with
``string`` the placeholders come first, one line each, then the text (vLLM's order).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.media import (
    MediaSettings,
    load_audio,
    load_image,
    load_video,
)

TEXT_TYPES = ("text", "input_text")
MEDIA_TYPES = {  # part type -> modality
    "image_url": "image",
    "input_image": "image",
    "image_pil": "image",
    "video_url": "video",
    "input_audio": "audio",
    "audio_url": "audio",
}
# A field of one item of the prompt the processor was given (RequestError.param)
ITEM_FIELD = re.compile(r"multi_modal_data\.(\w+)\[(\d+)\]")
# An input_audio part's format: a file name's extension (wav, mp3, flac, ogg, ...)
AUDIO_FORMAT = re.compile(r"[a-z0-9]{1,16}")


class MediaPart(NamedTuple):
    """An image, video or audio part of a chat, loaded when the request is prepared."""

    modality: str  # "image", "video" or "audio"
    param: str  # where it is in the request, e.g. messages[0].content[1]
    url: str | None
    image: Any = None  # a PIL image given as such (offline)

    def load(self, settings: MediaSettings) -> Any:
        if self.image is not None:
            return self.image
        if self.modality == "video":
            return load_video(self.url, settings, self.param)
        if self.modality == "audio":
            return load_audio(self.url, settings, self.param)
        return load_image(self.url, settings, self.param)


def _media_part(part: dict[str, Any], param: str) -> MediaPart:
    kind = part["type"]
    modality = MEDIA_TYPES[kind]
    if kind == "image_pil":
        return MediaPart(modality, param, None, part.get("image_pil"))
    if kind == "input_audio":
        return MediaPart(modality, param, _input_audio_url(part.get("input_audio"), param))
    url = part.get(kind if kind.endswith("_url") else "image_url")  # input_image: image_url
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str):
        raise RequestError(f"{param}: a {kind} part needs its {modality} URL", param)
    return MediaPart(modality, param, url)


def _input_audio_url(given: Any, param: str) -> str:
    """An ``input_audio`` part's base64 ``data`` and ``format`` as a ``data:`` URL, read as an
    ``audio_url``'s is."""
    if not isinstance(given, dict) or not isinstance(given.get("data"), str):
        raise RequestError(
            f'{param}: an input_audio part needs "input_audio": {{"data": <base64>, '
            '"format": "wav"}',
            param,
        )
    audio_format = given.get("format", "wav")
    if not isinstance(audio_format, str) or not AUDIO_FORMAT.fullmatch(audio_format):
        raise RequestError(
            f"{param}: input_audio.format must be a file extension such as 'wav' or 'mp3', "
            f"got {audio_format!r}",
            param,
        )
    return f"data:audio/{audio_format};base64,{given['data']}"


def split_content(
    parts: list[dict[str, Any]],
    param: str,
    content_format: str,
    media: list[MediaPart] | None,
    placeholders: dict[str, str] | None,
) -> str | list[dict[str, Any]]:
    """The content the template sees; media parts go to ``media``. ``placeholders``: what
    stands for an item of each modality the model takes (None: text only, and ``media`` is
    ignored); a part of another modality is refused."""
    takes = placeholders or {}
    texts: list[str] = []
    shaped: list[dict[str, Any]] = []
    found: list[str] = []  # the modality of each media part, in order
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        where = f"{param}[{i}]"
        modality = MEDIA_TYPES.get(kind) if isinstance(kind, str) else None
        if kind in TEXT_TYPES and isinstance(part.get("text"), str):
            texts.append(part["text"])
            shaped.append({"type": "text", "text": part["text"]})
        elif modality in takes and media is not None:
            media.append(_media_part(part, where))
            shaped.append({"type": modality})
            found.append(modality)
        elif modality is not None:
            model = "takes text only" if not takes else f"takes {', '.join(takes)} only"
            raise RequestError(f"{where}: this model {model}; {kind} parts are refused", where)
        else:
            allowed = TEXT_TYPES + tuple(k for k, m in MEDIA_TYPES.items() if m in takes)
            raise RequestError(
                f"{where}: content part type {kind!r} is not supported "
                f"(allowed: {', '.join(allowed)})",
                where,
            )
    text = "\n".join(texts)
    if content_format == "openai":
        # text alone stays one part, as before media; with media each part keeps its place
        return shaped if found else [{"type": "text", "text": text}]
    if found:
        text = "\n".join([*[takes[modality] for modality in found], text])
    return text


def load_media(parts: list[MediaPart], settings: MediaSettings) -> dict[str, list[Any]]:
    """The parts loaded, as ``multi_modal_data``: ``{"image": [...], "video": [...], "audio":
    [(samples, rate), ...]}``."""
    data: dict[str, list[Any]] = {}
    for part in parts:
        data.setdefault(part.modality, []).append(part.load(settings))
    return data


def naming_the_part(error: RequestError, parts: list[MediaPart]) -> RequestError:
    """``error`` about item ``i`` of a modality (``multi_modal_data.audio[1]``, as the processor
    names it) as one about the chat part it came from (the request's second audio part)."""
    match = ITEM_FIELD.fullmatch(error.param or "")
    of_modality = [part for part in parts if match and part.modality == match[1]]
    if match is None or int(match[2]) >= len(of_modality):
        return error
    param = of_modality[int(match[2])].param
    return RequestError(str(error).replace(match[0], param), param)
