"""Chat message content parts, as OpenAI and vLLM spell them, split into text and media.

Image parts: ``{"type": "image_url", "image_url": {"url": ...}}`` (or the URL alone),
the Responses API's ``{"type": "input_image", "image_url": ...}`` and, offline only, vLLM's
``{"type": "image_pil", "image_pil": <PIL image>}``; video parts: vLLM's ``{"type":
"video_url", "video_url": {"url": ...}}``, for models that take videos. What reaches the chat
template: with the ``openai`` content format each media part becomes ``{"type": "image"}`` or
``{"type": "video"}`` where it stood; with ``string`` the placeholders come first, one line
each, then the text (vLLM's order).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.media import MediaSettings, load_image, load_video

TEXT_TYPES = ("text", "input_text")
MEDIA_TYPES = {  # part type -> modality
    "image_url": "image",
    "input_image": "image",
    "image_pil": "image",
    "video_url": "video",
}


class MediaPart(NamedTuple):
    """An image or video part of a chat, loaded when the request is prepared."""

    modality: str  # "image" or "video"
    param: str  # where it is in the request, e.g. messages[0].content[1]
    url: str | None
    image: Any = None  # a PIL image given as such (offline)

    def load(self, settings: MediaSettings) -> Any:
        if self.image is not None:
            return self.image
        if self.modality == "video":
            return load_video(self.url, settings, self.param)
        return load_image(self.url, settings, self.param)


def _media_part(part: dict[str, Any], param: str) -> MediaPart:
    kind = part["type"]
    modality = MEDIA_TYPES[kind]
    if kind == "image_pil":
        return MediaPart(modality, param, None, part.get("image_pil"))
    url = part.get("video_url" if modality == "video" else "image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str):
        raise RequestError(f"{param}: a {kind} part needs its {modality} URL", param)
    return MediaPart(modality, param, url)


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
    """The parts loaded, as ``multi_modal_data``: ``{"image": [...], "video": [...]}``."""
    data: dict[str, list[Any]] = {}
    for part in parts:
        data.setdefault(part.modality, []).append(part.load(settings))
    return data
