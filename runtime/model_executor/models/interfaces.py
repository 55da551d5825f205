"""What the worker calls on a model: every class in ``models/`` provides it (generative models
``compute_logits``, pooling models ``pool``). A model that also takes input embeddings beside
token ids (a prompt given as embeddings, images merged into the text's embeddings) says so with
``supports_inputs_embeds`` and provides ``SupportsInputsEmbeds``; one that encodes images says so
with ``supports_multimodal`` and provides ``SupportsMultiModal`` too."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch
from torch import nn

# The model forward as the runner calls it, eager, compiled or a graph replay:
# (input_ids, positions) -> hidden states.
ModelForward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ServableModel(Protocol):
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor: ...

    def pool(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]: ...

    def modules(self) -> Iterator[nn.Module]: ...

    def named_modules(self) -> Iterator[tuple[str, nn.Module]]: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...


class SupportsInputsEmbeds(Protocol):
    """vLLM V1's ``get_input_embeddings`` and ``inputs_embeds``: ``embed_input_ids`` is what the
    forward does to token ids first, and a forward given ``inputs_embeds`` (``[T, hidden]``, one
    row per token of the step) starts from those rows instead; ``input_ids`` are then ignored."""

    supports_inputs_embeds: bool

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor: ...

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> Any: ...


def supports_inputs_embeds(model: object) -> bool:
    """Whether ``model`` (a class or an instance) takes input embeddings beside token ids."""
    return bool(getattr(model, "supports_inputs_embeds", False))


class SupportsMultiModal(SupportsInputsEmbeds, Protocol):
    """vLLM V1's ``embed_multimodal``: the embeddings of a batch of one modality's items, one
    ``[feature_tokens, hidden]`` tensor per item, to take the rows of the item's placeholder
    tokens in the step's ``inputs_embeds``. ``data`` holds the processor's tensors of the items
    stacked (``pixel_values`` ``[items, C, H, W]``)."""

    supports_multimodal: bool

    @staticmethod
    def image_input_shape(config: Any) -> tuple[int | None, ...]:
        """The shape of one image's ``pixel_values`` the encoder takes (the processor's output
        is checked against it on the API side, so a bad one is a 400, not a failed step)."""
        ...

    @classmethod
    def processor_class(cls, config: Any) -> Any:
        """The model's stand-in for its Hugging Face processor, where that cannot be built here
        (None: ``AutoProcessor``)."""
        ...

    def embed_multimodal(
        self, modality: str, data: dict[str, torch.Tensor]
    ) -> list[torch.Tensor]: ...


def supports_multimodal(model: object) -> bool:
    """Whether ``model`` (a class or an instance) encodes images into its input embeddings."""
    return bool(getattr(model, "supports_multimodal", False))


def is_encoder_decoder(model: object) -> bool:
    """Whether ``model`` (a class or an instance) decodes from an encoder's output through
    cross-attention (Whisper): each prompt carries the encoder's input, the decoder's tokens
    go through the paged cache."""
    return bool(getattr(model, "is_encoder_decoder", False))
