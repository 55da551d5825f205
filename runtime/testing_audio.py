"""Tiny random speech models for tests: ``WhisperForConditionalGeneration`` from a
``WhisperConfig`` and ``Qwen2AudioForConditionalGeneration`` from a ``Qwen2AudioConfig``, each
with the byte-level tokenizer of ``testing.py`` and its special tokens and a
``WhisperFeatureExtractor``, all built here (nothing is downloaded); generated waveforms; and
transformers' greedy continuation as the reference (Qwen2-Audio's:
``testing_vision.hf_llava_greedy`` with ``audio``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from infernetes.runtime.testing import build_tokenizer
from infernetes.runtime.testing_vision import LLAVA_CHAT_TEMPLATE

LANGUAGES = ("en", "fr", "de")
WHISPER_TOKENS = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    *(f"<|{language}|>" for language in LANGUAGES),
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
]
# Whisper's timestamp tokens, 0.02 s apart over the 30 s window, numbered right after
# ``<|notimestamps|>`` and not special (as in the released tokenizers)
TIMESTAMP_TOKENS = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
SAMPLE_RATE = 16000
QWEN_AUDIO_TOKENS = ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]
QWEN_AUDIO = "<|audio_bos|><|AUDIO|><|audio_eos|>"  # a clip's place in a Qwen2-Audio prompt
# content given as a string or as OpenAI-style parts, an audio part as its placeholder
QWEN_AUDIO_CHAT_TEMPLATE = LLAVA_CHAT_TEMPLATE.replace("'<image>'", f"'{QWEN_AUDIO}'")


def make_tiny_whisper(
    directory: str | Path,
    *,
    seed: int = 0,
    dtype: str = "float32",
    sizes: dict[str, Any] | None = None,
    timestamps: bool = False,
) -> Path:
    """Write a random ``WhisperForConditionalGeneration``, its tokenizer and feature extractor;
    tiny unless ``sizes`` overrides the config (benchmarks). The weights are spread wider than
    Whisper's init so that greedy tokens vary. ``timestamps`` adds Whisper's 1501 timestamp
    tokens to the vocabulary."""
    import torch
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if timestamps:
        tokenizer = _timestamped_tokenizer(directory)
    else:
        tokenizer = build_tokenizer(directory, add_bos=False, extra_special_tokens=WHISPER_TOKENS)
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    settings: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        num_mel_bins=80,
        d_model=64,
        encoder_layers=2,
        encoder_attention_heads=2,
        decoder_layers=2,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=1500,
        max_target_positions=64,
        decoder_start_token_id=tokenizer.convert_tokens_to_ids("<|startoftranscript|>"),
        eos_token_id=end,
        pad_token_id=end,
        bos_token_id=end,
        init_std=0.5,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    config = transformers.WhisperConfig(**{**settings, **(sizes or {})})
    config.architectures = ["WhisperForConditionalGeneration"]
    config.dtype = dtype
    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(config).to(getattr(torch, dtype)).eval()
    model.save_pretrained(str(directory))
    transformers.WhisperFeatureExtractor(feature_size=80).save_pretrained(str(directory))
    return directory


def _timestamped_tokenizer(directory: Path) -> Any:
    """The tokenizer laid out as Whisper's: text tokens first, then the special tokens, then the
    timestamp tokens as plain added tokens (transformers' Whisper code finds them by id order)."""
    import transformers

    build_tokenizer(directory, add_bos=False)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    tokenizer.add_tokens(WHISPER_TOKENS, special_tokens=True)
    tokenizer.add_tokens(TIMESTAMP_TOKENS)
    tokenizer.save_pretrained(str(directory))
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def make_tiny_qwen2_audio(directory: str | Path, *, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a random ``Qwen2AudioForConditionalGeneration`` (a two-layer Whisper-style encoder
    over 80 mel bins, a two-layer Qwen2) and its ``Qwen2AudioProcessor``; the projector is spread
    wider than its init so that audio moves the logits."""
    import torch
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(
        directory,
        add_bos=False,
        extra_special_tokens=QWEN_AUDIO_TOKENS,
        chat_template=QWEN_AUDIO_CHAT_TEMPLATE,
    )
    audio_config = dict(
        num_mel_bins=80,
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        max_source_positions=1500,
    )
    text_config = dict(
        model_type="qwen2",
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.1,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = transformers.Qwen2AudioConfig(
        audio_config=audio_config,
        text_config=text_config,
        audio_token_index=tokenizer.convert_tokens_to_ids("<|AUDIO|>"),
    )
    config.architectures = ["Qwen2AudioForConditionalGeneration"]
    config.dtype = dtype
    torch.manual_seed(seed)
    model = transformers.Qwen2AudioForConditionalGeneration(config).to(getattr(torch, dtype))
    with torch.no_grad():
        for parameter in model.model.multi_modal_projector.parameters():
            parameter.normal_(0.0, 0.5)
    model.eval().save_pretrained(str(directory))
    transformers.Qwen2AudioProcessor(
        feature_extractor=transformers.WhisperFeatureExtractor(feature_size=80),
        tokenizer=tokenizer,
        chat_template=QWEN_AUDIO_CHAT_TEMPLATE,
    ).save_pretrained(str(directory))
    return directory


def tone(seed: int, seconds: float = 2.0, rate: int = SAMPLE_RATE) -> Any:
    """A few sine tones and some noise: float32 samples at ``rate``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    waves = sum(
        rng.uniform(0.1, 0.3) * np.sin(2 * np.pi * rng.uniform(100, 2000) * t) for _ in range(3)
    )
    return (waves + 0.05 * rng.standard_normal(len(t))).astype(np.float32)


def wav_bytes(samples: Any, rate: int = SAMPLE_RATE, format: str = "WAV") -> bytes:
    """``samples`` as an audio file (16-bit PCM WAV by default)."""
    import soundfile

    buffer = io.BytesIO()
    subtype = "PCM_16" if format == "WAV" else None
    soundfile.write(buffer, samples, rate, format=format, subtype=subtype)
    return buffer.getvalue()


def hf_whisper_greedy(
    path: str | Path, samples: Any, prompt: str, max_tokens: int
) -> tuple[list[int], list[int], list[float]]:
    """Transformers' greedy continuation of the decoder ``prompt`` over ``samples`` (16 kHz) in
    float32, EOS ignored: the prompt's ids, the new tokens and each one's logprob."""
    import torch
    import transformers

    extractor = transformers.WhisperFeatureExtractor.from_pretrained(str(path))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    features = extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    model = transformers.WhisperForConditionalGeneration.from_pretrained(
        str(path), dtype=torch.float32
    ).eval()
    with torch.inference_mode():
        # the generic generate: Whisper's own builds its prompt and runs long-form segments
        out = transformers.GenerationMixin.generate(
            model,
            input_features=features,
            decoder_input_ids=torch.tensor([prompt_ids]),
            eos_token_id=[],
            max_new_tokens=max_tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt_ids) :].tolist()
    logprobs = [
        torch.log_softmax(scores[0].float(), -1)[token].item()
        for scores, token in zip(out.scores, tokens, strict=True)
    ]
    return prompt_ids, tokens, logprobs
