"""A tiny Mistral tokenizer file for tests: mistral_common's ``tekken.json`` format (a tiktoken
BPE vocabulary of byte strings by rank, the special tokens before it) with a vocabulary trained
here on the tiny models' corpus, so nothing is downloaded."""

from __future__ import annotations

import base64
import itertools
import json
from collections import Counter
from pathlib import Path

from infernetes.runtime.testing import _CORPUS

# Words, numbers one digit at a time, punctuation runs and whitespace (tiktoken's pattern syntax).
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Room for every special token mistral_common names; the rest are fillers (<SPECIAL_n>).
NUM_SPECIAL_TOKENS = 64
# Text the tool-call tests use, so their JSON is a few tokens rather than bytes.
_TOOL_TEXT = '{"city": "Paris", "unit": "celsius"} get_weather [{"name": "get_weather"}]\n'


def _train_bpe(text: str, num_merges: int) -> list[bytes]:
    """The 256 bytes, then one token per merge of the most frequent adjacent pair (ties: the
    pair seen first), as tiktoken's ranks expect: each token is two earlier ones joined."""
    import regex  # type: ignore[import-untyped]  # \p{L}: tiktoken's pattern syntax

    vocab = [bytes([b]) for b in range(256)]
    words = Counter(
        tuple(bytes([b]) for b in chunk.encode()) for chunk in regex.findall(TEKKEN_PATTERN, text)
    )
    for _ in range(num_merges):
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for word, count in words.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        (left, right), _ = pairs.most_common(1)[0]
        vocab.append(left + right)
        words = Counter({_merge(word, left, right): count for word, count in words.items()})
    return vocab


def _merge(word: tuple[bytes, ...], left: bytes, right: bytes) -> tuple[bytes, ...]:
    merged: list[bytes] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == left and word[i + 1] == right:
            merged.append(left + right)
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return tuple(merged)


def write_tekken(directory: str | Path, num_merges: int = 300, version: str = "v11") -> Path:
    """Write ``directory/tekken.json``; its vocabulary size is ``NUM_SPECIAL_TOKENS`` plus 256
    bytes plus at most ``num_merges`` merges (``tekken_vocab_size`` reads it back)."""
    from mistral_common.tokens.tokenizers.base import SpecialTokens

    vocab = _train_bpe(_CORPUS + _TOOL_TEXT * 8, num_merges)
    names = [token.value for token in SpecialTokens]
    special = [{"rank": i, "token_str": name, "is_control": True} for i, name in enumerate(names)]
    path = Path(directory) / "tekken.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "config": {
                    "pattern": TEKKEN_PATTERN,
                    "num_vocab_tokens": len(vocab),
                    "default_vocab_size": NUM_SPECIAL_TOKENS + len(vocab),
                    "default_num_special_tokens": NUM_SPECIAL_TOKENS,
                    "version": version,
                },
                "vocab": [
                    {
                        "rank": rank,
                        "token_bytes": base64.b64encode(piece).decode(),
                        "token_str": piece.decode("utf-8", errors="ignore") or None,
                    }
                    for rank, piece in enumerate(vocab)
                ],
                "special_tokens": special,
                "version": 1,
                "type": "Tekken",
            }
        )
    )
    return path


def tekken_vocab_size(path: str | Path) -> int:
    return int(json.loads(Path(path).read_text())["config"]["default_vocab_size"])


def make_tiny_tekken_mistral(directory: str | Path, seed: int = 0) -> Path:
    """A tiny random Mistral whose vocabulary is ``write_tekken``'s (BOS, EOS and pad as
    mistral_common numbers them); the folder keeps the Hugging Face tokenizer files the tiny
    models have too, as Mistral's own repositories do."""
    from infernetes.runtime.testing import make_tiny_model

    tekken = write_tekken(directory)
    return make_tiny_model(
        directory,
        "MistralForCausalLM",
        seed=seed,
        vocab_size=tekken_vocab_size(tekken),
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=11,
    )
