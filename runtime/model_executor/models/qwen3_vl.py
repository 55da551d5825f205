"""Qwen3-VL (``Qwen3VLForConditionalGeneration``): Qwen2-VL's layout (``qwen2_vl.py``: images at
their own resolution in place of their ``<|image_pad|>`` tokens, M-RoPE laid out by the runner)
with Qwen3-VL's tower (``qwen3_vision.py``), a Qwen3 language model (q/k norm) whose M-RoPE
deals its frequencies out to the axes in turn (``mrope_interleaved``), and DeepStack.

DeepStack: the tower also gives each image token one row per ``deepstack_visual_indexes``
block, and decoder layer ``i`` adds row ``i`` to its output at that token. Those rows travel with
the image's embedding: an encoder row here is ``[embedding, deepstack 0, deepstack 1, ...]`` and
so is a token's row from ``embed_input_ids`` (its deepstack part zero, so adding it changes
nothing), so the runner cuts and places them, chunk by chunk, as any model's image rows.

A video's frames are spaced by the timestamps its processor writes between them
(``multimodal/qwen_vl.py``), not in M-RoPE: each frame is its own item at ``t = 0``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch
from infernetes.runtime.model_executor.lazy_weight import as_tensor
from infernetes.runtime.model_executor.models.llama import LlamaForCausalLM, LlamaModel
from infernetes.runtime.model_executor.models.moe import Qwen2MoeForCausalLM
from infernetes.runtime.model_executor.models.qwen2_vl import Qwen2VLForConditionalGeneration
from infernetes.runtime.model_executor.models.qwen3_vision import Qwen3VisionTransformer
from infernetes.runtime.model_executor.models.utils import IntermediateTensors
from infernetes.runtime.multimodal.qwen_vl import Qwen3VLProcessor
from torch import nn
from transformers import PretrainedConfig

MROPE_SECTION = [24, 20, 20]  # transformers' when a config names none


class DeepStackModel(LlamaModel):
    """Qwen3's decoder, adding ``deepstack[:, i]`` to layer ``i``'s output for the first
    ``num_deepstack`` layers, which must all be on the first pipeline stage (it alone has the
    image rows)."""

    def __init__(
        self,
        config: PretrainedConfig,
        max_position: int,
        num_deepstack: int,
        mlp: Callable[[int], nn.Module],
    ) -> None:
        super().__init__(config, max_position, mlp)
        if self.start < num_deepstack and (self.start > 0 or self.end < num_deepstack):
            raise ValueError(
                f"Qwen3-VL adds image features to its first {num_deepstack} decoder layers: the "
                "first pipeline stage must hold them; use fewer pipeline stages"
            )

    def forward(  # the DeepStack rows besides Llama's
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        deepstack: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        hidden, residual = self.stage_input(input_ids, intermediate, inputs_embeds)
        for i in range(self.start, self.end):
            hidden, residual = self.layers[i](positions, hidden, residual)
            if deepstack is not None and i < deepstack.shape[1]:
                hidden = hidden + deepstack[:, i]  # the layer's output is hidden + residual
        return self.stage_output(hidden, residual)


class DeepStackLanguageModel(LlamaForCausalLM):
    def __init__(self, config: PretrainedConfig, max_position: int, num_deepstack: int) -> None:
        self.num_deepstack = num_deepstack
        super().__init__(config, max_position)

    def build_model(self, config: PretrainedConfig, max_position: int) -> DeepStackModel:
        return DeepStackModel(config, max_position, self.num_deepstack, self.mlp)


class DeepStackMoeLanguageModel(DeepStackLanguageModel, Qwen2MoeForCausalLM):
    """Qwen3-VL-MoE's: Qwen3-MoE's sparse layers through the fused MoE, and DeepStack."""


class Qwen3VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    hf_processor_class = Qwen3VLProcessor  # transformers' needs torchvision (qwen_vl.py)
    tower_class = Qwen3VisionTransformer
    language_model_class: type[DeepStackLanguageModel] = DeepStackLanguageModel
    language_model: DeepStackLanguageModel

    def build_language_model(self, text: PretrainedConfig, max_position: int) -> LlamaForCausalLM:
        # transformers' Qwen3-VL always interleaves, whatever the config says
        rope = dict(getattr(text, "rope_parameters", None) or {})
        rope.setdefault("mrope_section", MROPE_SECTION)
        text.rope_parameters = {**rope, "mrope_interleaved": True}
        self.num_deepstack = len(self.config.vision_config.deepstack_visual_indexes)
        self.width = text.hidden_size
        return self.language_model_class(text, max_position, self.num_deepstack)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Each token's embedding and zero DeepStack rows: the width of an image token's."""
        rows = self.language_model.embed_input_ids(input_ids)
        return torch.cat([rows, rows.new_zeros(len(rows), self.width * self.num_deepstack)], -1)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        deepstack = None
        if inputs_embeds is not None:
            deepstack = inputs_embeds[:, self.width :].reshape(len(inputs_embeds), -1, self.width)
            inputs_embeds = inputs_embeds[:, : self.width]
        return self.language_model.model(
            input_ids, positions, intermediate, inputs_embeds, deepstack
        )


class Qwen3VLMoeForConditionalGeneration(Qwen3VLForConditionalGeneration):
    """Qwen3-VL with Qwen3-MoE's decoder (every ``decoder_sparse_step``-th layer but the
    ``mlp_only_layers`` sparse). Its checkpoints keep each layer's experts fused:
    ``experts.gate_up_proj`` and ``experts.down_proj``, ``[experts, in, out]`` on the Hub and
    ``[experts, out, in]`` as transformers 5 saves them; they load expert by expert."""

    language_model_class = DeepStackMoeLanguageModel

    def build_language_model(self, text: PretrainedConfig, max_position: int) -> LlamaForCausalLM:
        text.norm_topk_prob = True  # its router always renormalises the top k (Qwen3-MoE's says)
        return super().build_language_model(text, max_position)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(expert_by_expert(weights, self.width))


def expert_by_expert(
    weights: Iterable[tuple[str, torch.Tensor]], hidden: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Fused expert tensors as one ``experts.{e}.{gate,up,down}_proj.weight`` ``[out, in]`` per
    expert, the rest as they are. A tensor already ``[experts, out, in]`` (its input side the
    hidden size for ``gate_up_proj``, its output side for ``down_proj``) is not transposed.
    A fused tensor is read whole (each tensor rank then takes its slice of each expert)."""
    for name, weight in weights:
        prefix, _, part = name.rpartition(".experts.")
        tensor = as_tensor(weight) if part in ("gate_up_proj", "down_proj") else weight
        if part == "gate_up_proj":
            if tensor.shape[-1] != hidden:  # the Hub's [experts, hidden, 2 x intermediate]
                tensor = tensor.transpose(1, 2)
            gate, up = tensor.chunk(2, dim=1)
            for expert in range(len(tensor)):
                yield f"{prefix}.experts.{expert}.gate_proj.weight", gate[expert]
                yield f"{prefix}.experts.{expert}.up_proj.weight", up[expert]
        elif part == "down_proj":
            if tensor.shape[-2] != hidden:  # the Hub's [experts, intermediate, hidden]
                tensor = tensor.transpose(1, 2)
            for expert in range(len(tensor)):
                yield f"{prefix}.experts.{expert}.down_proj.weight", tensor[expert]
        else:
            yield name, tensor
