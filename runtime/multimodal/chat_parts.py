"""Chat message content parts, as OpenAI and vLLM spell them, split into text and images.

Image parts: ``{"type": "image_url", "image_url": {"url": ...}}`` (or the URL alone),
the Responses API's ``{"type": "input_image", "image_url": ...}`` and, offline only, vLLM's
``{"type": "image_pil", "image_pil": <PIL image>}``. What reaches the chat template: with the
``openai`` content format each image part becomes ``{"type": "image"}`` where it stood; with
``string`` the image placeholders come first, one line each, then the text (vLLM's order).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.media import MediaSettings, load_image

TEXT_TYPES = ("text", "input_text")
IMAGE_TYPES = ("image_url", "input_image", "image_pil")


class ImagePart(NamedTuple):
    param: str  # where it is in the request, e.g. messages[0].content[1]
    url: str | None
    image: Any = None  # a PIL image given as such (offline)

    def load(self, settings: MediaSettings) -> Any:
        if self.image is not None:
            return self.image
        return load_image(self.url, settings, self.param)


def _image_part(part: dict[str, Any], param: str) -> ImagePart:
    kind = part["type"]
    if kind == "image_pil":
        return ImagePart(param, None, part.get("image_pil"))
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str):
        raise RequestError(f"{param}: an {kind} part needs its image URL", param)
    return ImagePart(param, url)


def split_content(
    parts: list[dict[str, Any]],
    param: str,
    content_format: str,
    images: list[ImagePart] | None,
    placeholder: str | None,
) -> str | list[dict[str, Any]]:
    """The content the template sees; image parts go to ``images``. ``images`` None: the
    model takes text only, and an image part is refused."""
    texts: list[str] = []
    shaped: list[dict[str, Any]] = []
    num_images = 0
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        where = f"{param}[{i}]"
        if kind in TEXT_TYPES and isinstance(part.get("text"), str):
            texts.append(part["text"])
            shaped.append({"type": "text", "text": part["text"]})
        elif kind in IMAGE_TYPES and images is not None:
            images.append(_image_part(part, where))
            shaped.append({"type": "image"})
            num_images += 1
        elif kind in IMAGE_TYPES:
            raise RequestError(
                f"{where}: this model takes text only; {kind} parts need a vision-language model",
                where,
            )
        else:
            allowed = ", ".join(TEXT_TYPES + (IMAGE_TYPES if images is not None else ()))
            raise RequestError(
                f"{where}: content part type {kind!r} is not supported (allowed: {allowed})",
                where,
            )
    text = "\n".join(texts)
    if content_format == "openai":
        # text alone stays one part, as before images; with images each part keeps its place
        return shaped if num_images else [{"type": "text", "text": text}]
    if num_images:
        text = "\n".join([*[placeholder or ""] * num_images, text])
    return text
