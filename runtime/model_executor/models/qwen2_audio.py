"""Qwen2-Audio (``Qwen2AudioForConditionalGeneration``): Whisper's audio encoder (``whisper.py``'s
convolutions and layers, each frame attending only to the clip's frames of audio, not its
padding) with an average pool of two frames before the final norm, a linear projector, and a
Qwen2 language model. A clip, 30 s of log-mel features padded, becomes one row per 40 ms of its
audio, in place of its expanded ``<|AUDIO|>`` tokens (as many as the processor counts:
``multimodal/audio_language.audio_token_count``); from there it is Qwen2.

The encoder is plain PyTorch modules, replicated on every tensor rank of the first pipeline
stage (the language model is split as Qwen2's)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from infernetes.runtime.model_executor.models.llama import LlamaForCausalLM
from infernetes.runtime.model_executor.models.utils import on_first_stage
from infernetes.runtime.model_executor.models.vision_language import (
    VisionLanguageModel,
    text_config,
)
from infernetes.runtime.model_executor.models.whisper import WhisperEncoder
from infernetes.runtime.multimodal.audio_language import audio_token_count, convolved_frames
from torch import nn
from transformers import PretrainedConfig


class Qwen2AudioEncoder(WhisperEncoder):
    def forward_clips(self, features: torch.Tensor, frames: list[int]) -> list[torch.Tensor]:
        """``[clips, mel_bins, 3000]`` log-mel features, each clip's ``frames`` of audio ->
        each clip's ``audio_token_count(frames)`` rows."""
        features = features.to(self.conv1.weight.dtype)
        positions = convolved_frames(features.shape[-1])
        lengths = torch.tensor([convolved_frames(f) for f in frames], device=features.device)
        seen = torch.arange(positions, device=features.device) < lengths[:, None]
        x = self.blocks(features, seen[:, None, None, :])
        x = self.layer_norm(F.avg_pool1d(x.transpose(1, 2), 2).transpose(1, 2))
        return [rows[: audio_token_count(f)] for rows, f in zip(x, frames, strict=True)]


class Qwen2AudioProjector(nn.Module):
    def __init__(self, audio_width: int, text_width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(audio_width, text_width, bias=True)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.linear(rows)


class Qwen2AudioForConditionalGeneration(VisionLanguageModel):
    intermediate_names = LlamaForCausalLM.intermediate_names
    modalities = ("audio",)

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        # The pipeline's first stage embeds, so it alone encodes audio.
        self.audio_tower = on_first_stage(lambda: Qwen2AudioEncoder(config.audio_config))
        self.multi_modal_projector = on_first_stage(
            lambda: Qwen2AudioProjector(config.audio_config.d_model, config.text_config.hidden_size)
        )
        self.language_model = LlamaForCausalLM(text_config(config), max_position)

    def embed_multimodal(self, modality: str, data: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """``input_features`` ``[clips, mel_bins, 3000]`` and ``feature_attention_mask``
        ``[clips, 3000]`` (1 on a frame of audio) -> each clip's rows."""
        if modality != "audio":
            raise ValueError(f"Qwen2-Audio takes audio, not {modality}")
        frames = [int(n) for n in data["feature_attention_mask"].sum(-1).tolist()]
        tower: Qwen2AudioEncoder = self.audio_tower  # type: ignore[assignment]  # the first stage's
        return [
            self.multi_modal_projector(rows)
            for rows in tower.forward_clips(data["input_features"], frames)
        ]

    def keeps_encoder_weight(self, name: str) -> bool:
        return name.startswith(("audio_tower.", "multi_modal_projector."))
