"""Whisper (``WhisperForConditionalGeneration``): an encoder over 30 s of log-mel features (two
convolutions, the second halving 3000 frames to 1500, learned-table positions, pre-LayerNorm
blocks) and a text decoder whose every layer attends to itself (causally, in the paged KV cache)
and then to the encoder's output (cross-attention).

Encoder-decoder in a decoder-only engine, as vLLM V1 serves it: a request's audio is encoded
once, when the worker first schedules it, and each decoder layer's cross-attention keys and
values of its 1500 frames are kept with the request (``CrossAttentionBatch``) for all its steps;
the decoder's own tokens go through the engine's scheduler, paged cache and sampler as any
model's. The output embedding is the token embedding unless the config unties ``proj_out``."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from infernetes.runtime.model_executor.context import get_attention_metadata
from infernetes.runtime.model_executor.layers.activation import get_activation
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.layers.linear import ReplicatedLinear
from infernetes.runtime.model_executor.models.utils import load_stacked_weights
from torch import nn
from transformers import PretrainedConfig

# A layer's cross-attention keys and values of one request's audio: [heads, frames, head_dim]
CrossKeysValues = tuple[torch.Tensor, torch.Tensor]


class WhisperAttention(nn.Module):
    """Whisper's projections: the key without a bias, the query, value and output with one."""

    def __init__(self, config: PretrainedConfig, heads: int) -> None:
        super().__init__()
        width = config.d_model
        self.heads = heads
        self.head_dim = width // heads
        self.q_proj = ReplicatedLinear(width, width, bias=True)
        self.k_proj = ReplicatedLinear(width, width, bias=False)
        self.v_proj = ReplicatedLinear(width, width, bias=True)
        self.out_proj = ReplicatedLinear(width, width, bias=True)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., frames, width]`` -> ``[..., heads, frames, head_dim]``."""
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(-3, -2)

    def keys_values(self, states: torch.Tensor) -> CrossKeysValues:
        return self.split_heads(self.k_proj(states)), self.split_heads(self.v_proj(states))


class WhisperEncoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        width = config.d_model
        self.self_attn = WhisperAttention(config, config.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(width)
        self.fc1 = ReplicatedLinear(width, config.encoder_ffn_dim, bias=True)
        self.fc2 = ReplicatedLinear(config.encoder_ffn_dim, width, bias=True)
        self.final_layer_norm = nn.LayerNorm(width)
        self.act = get_activation(config.activation_function)

    def forward(self, x: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor:
        """``x``: ``[items, frames, width]``; every frame sees every frame, or those ``seen``
        (``[items, 1, 1, frames]``, True where a frame is audio, not padding) marks."""
        attn = self.self_attn
        h = self.self_attn_layer_norm(x)
        k, v = attn.keys_values(h)
        mixed = F.scaled_dot_product_attention(attn.split_heads(attn.q_proj(h)), k, v, seen)
        x = x + attn.out_proj(mixed.transpose(-3, -2).flatten(-2))
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


class WhisperEncoder(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        width = config.d_model
        self.conv1 = nn.Conv1d(config.num_mel_bins, width, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(width, width, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(config.max_source_positions, width)
        self.layers = nn.ModuleList(
            WhisperEncoderLayer(config) for _ in range(config.encoder_layers)
        )
        self.layer_norm = nn.LayerNorm(width)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[items, mel_bins, 3000]`` log-mel features -> ``[items, 1500, width]``."""
        return self.layer_norm(self.blocks(features))

    def blocks(self, features: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor:
        """The convolutions and the layers, before the final norm (``seen``: the frames each
        attends to, ``WhisperEncoderLayer``)."""
        x = F.gelu(self.conv1(features))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        x = x + self.embed_positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x, seen)
        return x


class WhisperCrossAttention(WhisperAttention):
    def forward(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """Each request's rows of the step attend to its own audio's keys and values (kept per
        request, ``CrossAttentionBatch``), every frame visible to every row."""
        cross = get_attention_metadata().cross_attention
        assert cross is not None, "the model runner sets a Whisper step's cross-attention"
        queries = self.split_heads(self.q_proj(x))  # [heads, T, head_dim]
        out = []
        for rows, keys_values in zip(
            queries.split(cross.query_lens, dim=1), cross.keys_values, strict=True
        ):
            k, v = keys_values[layer]
            out.append(F.scaled_dot_product_attention(rows, k, v))
        return self.out_proj(torch.cat(out, dim=1).transpose(0, 1).flatten(1))


class WhisperSelfAttention(WhisperAttention):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config, config.decoder_attention_heads)
        self.attn = Attention(self.heads, self.head_dim, self.head_dim**-0.5, self.heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.attn(self.q_proj(x), self.k_proj(x), self.v_proj(x)))


class WhisperDecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, index: int) -> None:
        super().__init__()
        width = config.d_model
        self.index = index
        self.self_attn = WhisperSelfAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(width)
        self.encoder_attn = WhisperCrossAttention(config, config.decoder_attention_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(width)
        self.fc1 = ReplicatedLinear(width, config.decoder_ffn_dim, bias=True)
        self.fc2 = ReplicatedLinear(config.decoder_ffn_dim, width, bias=True)
        self.final_layer_norm = nn.LayerNorm(width)
        self.act = get_activation(config.activation_function)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(self.self_attn_layer_norm(h))
        h = h + self.encoder_attn(self.encoder_attn_layer_norm(h), self.index)
        return h + self.fc2(self.act(self.fc1(self.final_layer_norm(h))))


class WhisperDecoder(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        width = config.d_model
        self.embed_tokens = nn.Embedding(config.vocab_size, width)
        self.embed_positions = nn.Embedding(config.max_target_positions, width)
        self.layers = nn.ModuleList(
            WhisperDecoderLayer(config, i) for i in range(config.decoder_layers)
        )
        self.layer_norm = nn.LayerNorm(width)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids) + self.embed_positions(positions)
        for layer in self.layers:
            h = layer(h)
        return self.layer_norm(h)


class WhisperModel(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.encoder = WhisperEncoder(config)
        self.decoder = WhisperDecoder(config)


class WhisperForConditionalGeneration(nn.Module):
    is_encoder_decoder = True
    modalities = ("audio",)
    # One rank, eager: its layers are replicated, and a step's cross-attention loops over
    # requests, which a captured graph would freeze.
    single_rank = True
    eager_only = True

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        if max_position > config.max_target_positions:
            raise ValueError(
                f"max_model_len {max_position} is longer than Whisper's decoder: it has "
                f"{config.max_target_positions} learned positions"
            )
        self.config = config
        self.model = WhisperModel(config)
        tied = getattr(config, "tie_word_embeddings", True)
        self.proj_out = (
            None if tied else ReplicatedLinear(config.d_model, config.vocab_size, bias=False)
        )

    def encode(self, input_features: torch.Tensor) -> list[list[CrossKeysValues]]:
        """``[items, mel_bins, 3000]`` -> per item, per decoder layer, its cross-attention keys
        and values of the item's 1500 frames."""
        states = self.model.encoder(input_features.to(self.model.encoder.conv1.weight.dtype))
        layers: list[WhisperDecoderLayer] = list(self.model.decoder.layers)  # type: ignore[arg-type]  # a ModuleList of them
        per_layer = [layer.encoder_attn.keys_values(states) for layer in layers]
        # copies: a request's keys and values outlive the others' of its batch
        return [[(k[i].clone(), v[i].clone()) for k, v in per_layer] for i in range(len(states))]

    def cross_attention_bytes(self) -> int:
        """What ``encode`` keeps of one request: every decoder layer's keys and values of the
        encoder's frames."""
        config = self.config
        element = self.model.decoder.embed_tokens.weight.element_size()
        return 2 * config.decoder_layers * config.max_source_positions * config.d_model * element

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model.decoder(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.proj_out is not None:
            return self.proj_out(hidden_states)
        return F.linear(hidden_states, self.model.decoder.embed_tokens.weight)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        if self.proj_out is None:  # tied: the token embedding, not read twice
            weights = ((n, t) for n, t in weights if not n.startswith("proj_out."))
        return load_stacked_weights(self, weights, [])
