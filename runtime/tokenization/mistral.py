"""``--tokenizer-mode mistral``: mistral_common's tokenizer, as vLLM uses it.

The model folder's ``tekken.json`` is read by mistral_common; chats are encoded to token ids by
its ``ChatCompletionRequest`` (messages and tools, no Jinja template), and the rest of the
engine and server sees the Hugging Face calls they make of any tokenizer (``encode``,
``decode``, ``convert_ids_to_tokens``, the special ids), answered by the Tekken tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

TEKKEN_FILE = "tekken.json"


def find_mistral_tokenizer_file(name: str | Path) -> Path:
    """The Tekken file of ``name`` (a folder holding ``tekken.json``, or the file itself);
    ValueError saying what was found otherwise."""
    path = Path(name)
    if path.is_file() and path.name.endswith(".json") and "tekken" in path.name:
        return path
    if (path / TEKKEN_FILE).is_file():
        return path / TEKKEN_FILE
    sentencepiece = sorted(p.name for p in path.glob("tokenizer.model*")) if path.is_dir() else []
    found = (
        f"it has only the SentencePiece file(s) {', '.join(sentencepiece)}, which this server does "
        "not read in mistral mode (planned)"
        if sentencepiece
        else "it has none"
    )
    raise ValueError(
        f"tokenizer_mode 'mistral' reads mistral_common's {TEKKEN_FILE} from the model or "
        f"--tokenizer folder, and {str(name)!r}: {found}; use --tokenizer-mode auto for a "
        "Hugging Face tokenizer"
    )


class Encoding(NamedTuple):
    input_ids: list[int]


class MistralTokenizer:
    """mistral_common's tokenizer behind the Hugging Face calls the engine and server make."""

    # Chats are encoded by mistral_common, never by a template (ChatRenderer asks for this).
    chat_template = None

    def __init__(self, path: str | Path) -> None:
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer as Mistral
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        self.path = Path(path)
        self.mistral = Mistral.from_file(str(self.path))
        tekken = self.mistral.instruct_tokenizer.tokenizer
        assert isinstance(tekken, Tekkenizer)  # find_mistral_tokenizer_file takes Tekken only
        self.tekken = tekken
        self.eos_token_id: int = tekken.eos_id
        self.bos_token_id: int = tekken.bos_id
        self.pad_token_id: int = tekken.pad_id
        self.unk_token_id: int = tekken.unk_id
        self.all_special_ids = sorted(tekken.special_ids)
        self._special_ranks = {
            tekken.id_to_piece(rank): rank for rank in range(tekken.num_special_tokens)
        }

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        # The API process gets the tokenizer over the engine's pipe: it reads the same file.
        return MistralTokenizer, (self.path,)

    def __len__(self) -> int:
        return self.tekken.n_words

    @property
    def vocab_size(self) -> int:
        return self.tekken.n_words

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text`` as tokens, after BOS when ``add_special_tokens`` (special-token strings in
        the text are plain text, as mistral_common encodes them)."""
        return self.tekken.encode(text, bos=add_special_tokens, eos=False)

    def __call__(self, text: str, add_special_tokens: bool = True) -> Encoding:
        return Encoding(self.encode(text, add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True, **_: Any) -> str:
        """The text of ``ids``; special tokens as their strings unless skipped (the spacing
        options of Hugging Face's decode have no meaning for a byte-level vocabulary)."""
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        policy = SpecialTokenPolicy.IGNORE if skip_special_tokens else SpecialTokenPolicy.KEEP
        return self.tekken.decode(list(ids), special_token_policy=policy)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.tekken.id_to_piece(i) for i in ids]

    def convert_tokens_to_ids(self, token: str) -> int | None:
        """A special token's id (the only tokens a string names unambiguously here)."""
        return self._special_ranks.get(token, self.unk_token_id)

    def token_bytes(self) -> list[bytes]:
        """Every token's bytes in id order, special tokens empty (they are never text): the
        vocabulary a grammar is matched against."""
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        ignore = SpecialTokenPolicy.IGNORE
        return [self.tekken.id_to_byte_piece(i, ignore) for i in range(self.tekken.n_words)]

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        continue_final_message: bool = False,
    ) -> list[int]:
        """The prompt of an OpenAI-style chat, as mistral_common encodes it; ValueError (from
        mistral_common's validation) when the conversation breaks its rules."""
        from mistral_common.exceptions import MistralCommonException
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        try:
            request = ChatCompletionRequest.from_openai(
                _short_call_ids(messages),
                tools=tools or None,
                continue_final_message=continue_final_message,
            )
            return list(self.mistral.encode_chat_completion(request).tokens)
        except (MistralCommonException, ValueError, TypeError, KeyError) as error:
            raise ValueError(f"{type(error).__name__}: {error}") from error


# mistral_common takes tool-call ids of 9 letters and digits.
_CALL_ID_LENGTH = 9


def _short_call_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with each tool-call id cut to its last 9 characters, as vLLM does for
    mistral_common: ids from this server or other APIs are longer (``chatcmpl-tool-<hex>``)."""

    def short(call_id: Any) -> Any:
        return call_id[-_CALL_ID_LENGTH:] if isinstance(call_id, str) else call_id

    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**call, "id": short(call.get("id"))} for call in message["tool_calls"]
            ]
        if "tool_call_id" in message:
            message["tool_call_id"] = short(message["tool_call_id"])
        out.append(message)
    return out
