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

import torch
from infernetes.runtime.model_executor.models.llama import LlamaForCausalLM, LlamaModel
from infernetes.runtime.model_executor.models.qwen2_vl import Qwen2VLForConditionalGeneration
from infernetes.runtime.model_executor.models.qwen3_vision import Qwen3VisionTransformer
from infernetes.runtime.model_executor.models.utils import IntermediateTensors, PPMissingLayer
from infernetes.runtime.multimodal.qwen_vl import Qwen3VLProcessor
from transformers import PretrainedConfig

MROPE_SECTION = [24, 20, 20]  # transformers' when a config names none


class DeepStackModel(LlamaModel):
    """Qwen3's decoder, adding ``deepstack[:, i]`` to layer ``i``'s output for the first
    ``num_deepstack`` layers, which must all be on the first pipeline stage (it alone has the
    image rows)."""

    def __init__(self, config: PretrainedConfig, max_position: int, num_deepstack: int, mlp):
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
        if intermediate is None:
            hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
            residual = None
        else:  # a later pipeline stage goes on from the previous one's
            hidden, residual = intermediate["hidden"], intermediate["residual"]
        for i in range(self.start, self.end):
            hidden, residual = self.layers[i](positions, hidden, residual)
            if deepstack is not None and i < deepstack.shape[1]:
                hidden = hidden + deepstack[:, i]  # the layer's output is hidden + residual
        if isinstance(self.norm, PPMissingLayer):
            assert residual is not None
            return {"hidden": hidden, "residual": residual}
        hidden, _ = self.norm(hidden, residual)
        return hidden


class DeepStackLanguageModel(LlamaForCausalLM):
    def __init__(self, config: PretrainedConfig, max_position: int, num_deepstack: int) -> None:
        self.num_deepstack = num_deepstack
        super().__init__(config, max_position)

    def build_model(self, config: PretrainedConfig, max_position: int) -> DeepStackModel:
        return DeepStackModel(config, max_position, self.num_deepstack, self.mlp)


class Qwen3VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    hf_processor_class = Qwen3VLProcessor  # transformers' needs torchvision (qwen_vl.py)
    tower_class = Qwen3VisionTransformer
    language_model: DeepStackLanguageModel

    def build_language_model(self, text: PretrainedConfig, max_position: int) -> LlamaForCausalLM:
        # transformers' Qwen3-VL always interleaves, whatever the config says
        rope = dict(getattr(text, "rope_parameters", None) or {})
        rope.setdefault("mrope_section", MROPE_SECTION)
        text.rope_parameters = {**rope, "mrope_interleaved": True}
        self.num_deepstack = len(self.config.vision_config.deepstack_visual_indexes)
        self.width = text.hidden_size
        return DeepStackLanguageModel(text, max_position, self.num_deepstack)

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
