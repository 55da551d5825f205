"""Which models attend through a sliding window, read from their config."""

from __future__ import annotations

from transformers import PretrainedConfig


def sliding_window(hf_config: PretrainedConfig) -> int | None:
    """The attention window of a model whose layers (some or all) attend only to the last N
    tokens, else None."""
    hf_config = hf_config.get_text_config()  # a vision-language model's language model
    window = getattr(hf_config, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    if getattr(hf_config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return window


def window_of_every_layer(hf_config: PretrainedConfig) -> int | None:
    """The window when every layer attends through it (a token before it is then needed by no
    later query, and its KV block can go), else None."""
    window = sliding_window(hf_config)
    hf_config = hf_config.get_text_config()
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None and any(kind != "sliding_attention" for kind in layer_types):
        return None
    return window
