"""Chat messages -> prompt text through a Jinja chat template (the tokenizer's or --chat-template).

``--chat-template-content-format`` decides how message content reaches the template: ``string``
(parts joined into one string) or ``openai`` (a list of ``{"type": "text", "text": ...}`` parts);
``auto`` looks at the template: one that loops over a message's content wants ``openai``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
import jinja2.nodes
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.chat_parts import MediaPart, split_content
from infernetes.runtime.server.errors import APIError
from infernetes.runtime.server.template_sandbox import TemplateRenderError, TemplateSandbox
from infernetes.runtime.tokenization.mistral import MistralTokenizer

logger = logging.getLogger("infernetes.runtime.server")


class ChatTemplateError(ValueError):
    pass


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a path to a file, or the template itself."""
    if value is None:
        return None
    path = Path(value)
    if any(c in value for c in "{}\n") or len(value) > 4096:
        return value
    if path.is_file():
        return path.read_text()
    raise ChatTemplateError(
        f"--chat-template {value!r}: no such file, and it does not look like an inline Jinja "
        "template (expected '{{ ... }}' or '{% ... %}')"
    )


def _loops_over_content(template: str) -> bool:
    try:
        ast = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    for loop in ast.find_all(jinja2.nodes.For):
        nodes = [loop.iter, *loop.iter.find_all((jinja2.nodes.Getattr, jinja2.nodes.Getitem))]
        for node in nodes:
            key = getattr(node, "attr", None)
            arg = getattr(node, "arg", None)
            if key is None and isinstance(arg, jinja2.nodes.Const):
                key = arg.value
            if key == "content":
                return True
    return False


def resolve_content_format(setting: str, template: str) -> str:
    if setting != "auto":
        return setting
    return "openai" if _loops_over_content(template) else "string"


def normalize_messages(
    messages: list[Any],
    content_format: str,
    media: list[MediaPart] | None = None,
    placeholders: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Messages (pydantic or dicts) -> the dicts the template sees, content shaped per
    ``content_format``; image and video parts go to ``media`` (``placeholders`` None: refused,
    a text model's)."""
    out = []
    for i, message in enumerate(messages):
        item = message if isinstance(message, dict) else message.model_dump(exclude_none=True)
        item = dict(item)
        content = item.get("content")
        param = f"messages[{i}].content"
        if isinstance(content, list):
            try:
                item["content"] = split_content(content, param, content_format, media, placeholders)
            except RequestError as error:
                raise APIError(str(error), 400, error.param) from error
        elif content is None:
            item["content"] = [] if content_format == "openai" else ""
        elif content_format == "openai":
            item["content"] = [{"type": "text", "text": content}]
        for call in item.get("tool_calls", []) or []:
            # Templates iterate arguments as a mapping (as transformers documents).
            function = call.get("function", {})
            if isinstance(function.get("arguments"), str):
                with contextlib.suppress(json.JSONDecodeError):
                    function["arguments"] = json.loads(function["arguments"])
        out.append(item)
    return out


class ChatRenderer:
    """Renders a conversation with a model's tokenizer and the server's template settings.

    A template sent in a request is refused unless ``trust_request_templates``
    (``--trust-request-chat-template``); then it renders in a ``TemplateSandbox`` process."""

    def __init__(
        self,
        tokenizer: Any,
        template: str | None,
        content_format: str,
        trust_request_templates: bool = False,
        default_template_kwargs: Mapping[str, Any] | None = None,
        media_placeholders: dict[str, str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        if template and isinstance(tokenizer, MistralTokenizer):
            logger.warning(
                "--chat-template has no effect with --tokenizer-mode mistral: mistral_common "
                "encodes the chats"
            )
        # A vision-language model's placeholder of one item of each modality it takes (None:
        # the model takes text only).
        self.media_placeholders = media_placeholders
        # What every template gets unless the request's chat_template_kwargs say otherwise.
        self.default_template_kwargs = dict(default_template_kwargs or {})
        self.default_template = template or getattr(tokenizer, "chat_template", None)
        self.content_format = content_format
        self.sandbox = TemplateSandbox(tokenizer) if trust_request_templates else None

    def template_kwargs(self, requested: Mapping[str, Any] | None) -> dict[str, Any]:
        """What the template gets besides the conversation: the request's kwargs over the
        server's defaults."""
        return {**self.default_template_kwargs, **(requested or {})}

    def encode_chat(
        self,
        messages: list[Any],
        *,
        template: str | None,
        tools: list[dict[str, Any]] | None,
        continue_final_message: bool,
    ) -> list[int] | None:
        """The prompt's ids when the tokenizer encodes chats itself (``--tokenizer-mode
        mistral``: mistral_common, no template), else None and ``render`` makes the text."""
        if not isinstance(self.tokenizer, MistralTokenizer):
            return None
        if template is not None:
            raise APIError(
                "chat_template in a request has no use with --tokenizer-mode mistral: "
                "mistral_common encodes the chat",
                400,
                "chat_template",
            )
        media: list[MediaPart] | None = None if self.media_placeholders is None else []
        conversation = normalize_messages(messages, "string", media, self.media_placeholders)
        if media:
            raise APIError(
                "image and video parts with --tokenizer-mode mistral are planned (mistral_common "
                "encodes images itself); with --tokenizer-mode auto the model's processor takes them",
                400,
                "messages",
            )
        try:
            return self.tokenizer.encode_chat(conversation, tools, continue_final_message)
        except ValueError as error:
            raise APIError(
                f"mistral_common refused these messages: {error}", 400, "messages"
            ) from error

    def render(
        self,
        messages: list[Any],
        *,
        template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, str]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        media: list[MediaPart] | None = None,
    ) -> str:
        """The prompt text; the messages' image and video parts are appended to ``media`` (refused when
        it is None or the model takes text only)."""
        if template is not None and self.sandbox is None:
            raise APIError(
                "chat_template in a request is refused: this server renders only its own "
                "template (start it with --trust-request-chat-template to allow request "
                "templates)",
                400,
                "chat_template",
            )
        chosen = template or self.default_template
        if not chosen:
            raise APIError(
                "this model's tokenizer has no chat template; start the server with "
                "--chat-template or pass chat_template in the request",
                400,
                "chat_template",
            )
        if isinstance(chosen, dict):  # some tokenizers keep several named templates
            chosen = chosen.get("default") or next(iter(chosen.values()))
        content_format = resolve_content_format(self.content_format, chosen)
        conversation = normalize_messages(messages, content_format, media, self.media_placeholders)
        if continue_final_message and conversation[-1].get("role") != "assistant":
            raise APIError(
                "continue_final_message needs the last message to be from the assistant",
                400,
                "continue_final_message",
            )
        kwargs = self.template_kwargs(template_kwargs)
        for reserved in ("conversation", "messages", "tokenize", "chat_template", "tools"):
            kwargs.pop(reserved, None)
        kwargs.update(
            chat_template=chosen,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
        if template is not None and self.sandbox is not None:  # None was refused above
            try:
                return self.sandbox.render(conversation, **kwargs)
            except TemplateRenderError as exc:
                raise APIError(
                    f"the request's chat template failed on these messages: {exc}",
                    400,
                    "chat_template",
                ) from exc
        try:
            return self.tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs)
        except Exception as exc:  # whatever the template raises, these messages made it raise
            raise APIError(
                f"chat template failed on these messages: {type(exc).__name__}: {exc}",
                400,
                "messages",
            ) from exc
