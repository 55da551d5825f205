"""Loading the tokenizer (``--tokenizer``, ``--tokenizer-mode``, ``--tokenizer-revision``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOKENIZER_MODES = ("auto", "slow", "mistral", "custom")


def get_tokenizer(
    name: str | Path,
    mode: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
    download_dir: str | None = None,
    token: str | None = None,
) -> Any:
    import transformers
    from transformers import AutoTokenizer

    if mode not in TOKENIZER_MODES:
        raise ValueError(
            f"tokenizer_mode must be one of {', '.join(TOKENIZER_MODES)}; got {mode!r}"
        )
    if mode == "custom":
        raise ValueError(
            "tokenizer_mode='custom' is not supported; use 'auto', 'slow' or 'mistral'"
        )
    if mode == "mistral":
        from infernetes.runtime.tokenization.mistral import (
            MistralTokenizer,
            find_mistral_tokenizer_file,
        )

        return MistralTokenizer(find_mistral_tokenizer_file(name))
    from infernetes.runtime.model_executor.gguf_checkpoint import is_gguf, pretrained_source

    source, keywords = str(name), dict[str, Any]()
    if is_gguf(Path(name)):
        source, keywords = pretrained_source(Path(name))  # the vocabulary in its metadata
    if int(transformers.__version__.split(".")[0]) >= 5:
        # transformers 5 takes a folder's tekken.json over its tokenizer files whenever
        # mistral_common is installed; those files are what auto and slow mean here.
        keywords["mistral_format"] = False
    try:
        return AutoTokenizer.from_pretrained(
            source,
            **keywords,
            use_fast=mode != "slow",
            revision=revision,
            trust_remote_code=trust_remote_code,
            cache_dir=download_dir,
            token=token,
        )
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot load the tokenizer {str(name)!r}: {error}") from error
