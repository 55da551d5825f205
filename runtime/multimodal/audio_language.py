"""The processor of an audio-language model (Qwen2-Audio), on the API side of the engine core's
pipe: transformers' ``Qwen2AudioProcessor`` (a ``WhisperFeatureExtractor`` and the tokenizer,
numpy only) turns each clip into 30 s of log-mel features, padded, with a mask of its audio
frames, and expands each clip's ``<|AUDIO|>`` in the text to one token per row the model's
encoder makes of it (``audio_token_count``). Clips are checked, mixed and resampled as
Whisper's are (``audio.clip_samples``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.audio import audio_digest, clip_samples
from infernetes.runtime.multimodal.inputs import MultiModalFeature, MultiModalPrompt


def convolved_frames(frames: int) -> int:
    """``frames`` log-mel frames after the encoder's second convolution (stride 2, padding 1)."""
    return (frames - 1) // 2 + 1


def audio_token_count(frames: int) -> int:
    """The encoder's rows of a clip of ``frames`` log-mel frames of audio: the convolutions
    halve them, then the average pool (two frames, no padding) halves them again."""
    return (convolved_frames(frames) - 2) // 2 + 1


class AudioLanguageProcessor:
    """Picklable (it travels to the API side in ``EngineInfo``, as the tokenizer does)."""

    cache = None  # no processor cache: clips are not kept (--mm-processor-cache-gb is for images)
    requires_audio = False  # text alone is a prompt too

    def __init__(
        self, hf_processor: Any, limits: dict[str, int], default_kwargs: Mapping[str, Any] | None
    ) -> None:
        self.hf_processor = hf_processor
        self.limits = limits  # a modality left out: no limit
        self.default_kwargs = dict(default_kwargs or {})
        self.audio_token: str = hf_processor.audio_token
        self.audio_token_id: int = hf_processor.audio_token_id
        self.sampling_rate: int = hf_processor.feature_extractor.sampling_rate
        # a clip's place in a chat's text (the string content format), as the chat template
        # writes it
        self.placeholders = {
            "audio": f"{hf_processor.audio_bos_token}{self.audio_token}"
            f"{hf_processor.audio_eos_token}"
        }

    @classmethod
    def load(
        cls, path: str | Path, limits: dict[str, int], default_kwargs: Mapping[str, Any] | None
    ) -> AudioLanguageProcessor:
        from transformers import Qwen2AudioProcessor

        try:
            hf_processor = Qwen2AudioProcessor.from_pretrained(str(path))
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot load the audio processor of {path}: {error}") from error
        return cls(hf_processor, limits, default_kwargs)

    def process(
        self,
        text: str,
        data: Mapping[str, Any],
        request_kwargs: Mapping[str, Any] | None = None,
        add_special_tokens: bool = True,
    ) -> MultiModalPrompt:
        """``text`` with one ``<|AUDIO|>`` per clip of ``data`` (``{"audio": (samples, rate)}``
        or a list of such clips) -> its expanded ids and one item per clip; a RequestError
        naming the field when anything is wrong."""
        clips = self._clips(data)
        in_text = text.count(self.audio_token)
        if in_text != len(clips):
            raise RequestError(
                f"the prompt has {in_text} audio placeholder(s) {self.audio_token!r} but "
                f"{len(clips)} clip(s) were given: one placeholder per clip",
                "multi_modal_data.audio",
            )
        kwargs = {**self.default_kwargs, **(request_kwargs or {})}
        try:
            out = self.hf_processor(
                text=text,
                audio=clips or None,
                sampling_rate=self.sampling_rate,
                return_tensors="np",
                add_special_tokens=add_special_tokens,
                **kwargs,
            )
        except (ValueError, TypeError, KeyError) as error:
            raise RequestError(
                f"the model's processor refused the input: {error}",
                "mm_processor_kwargs" if kwargs else "multi_modal_data.audio",
            ) from error
        ids = [int(t) for t in out["input_ids"][0]]
        return MultiModalPrompt(text, ids, self._features(ids, clips, out, kwargs))

    def _clips(self, data: Mapping[str, Any]) -> list[np.ndarray]:
        unknown = sorted(set(data) - {"audio"})
        if unknown:
            raise RequestError(
                f"multi_modal_data.{unknown[0]}: this model takes audio only",
                f"multi_modal_data.{unknown[0]}",
            )
        given = data.get("audio")
        clips = [] if given is None else given if isinstance(given, list) else [given]
        limit = self.limits.get("audio")
        if limit is not None and len(clips) > limit:
            raise RequestError(
                f"At most {limit} audio clip(s) may be provided in one prompt "
                f"(--limit-mm-per-prompt); got {len(clips)}",
                "multi_modal_data.audio",
            )
        return [
            clip_samples(clip, self.sampling_rate, f"multi_modal_data.audio[{i}]")
            for i, clip in enumerate(clips)
        ]

    def _features(
        self, ids: list[int], clips: list[np.ndarray], out: Any, kwargs: dict[str, Any]
    ) -> list[MultiModalFeature]:
        """Each clip's run of ``<|AUDIO|>`` tokens, its features and its frames' mask."""
        if not clips:
            return []
        positions = [i for i, t in enumerate(ids) if t == self.audio_token_id]
        masks = out["feature_attention_mask"]
        counts = [audio_token_count(int(mask.sum())) for mask in masks]
        if sum(counts) != len(positions):
            raise RequestError(
                f"the prompt has {len(positions)} {self.audio_token!r} tokens after expansion; "
                f"its {len(clips)} clip(s) make {sum(counts)} rows",
                "multi_modal_data.audio",
            )
        features = []
        start = 0
        for i, (samples, count) in enumerate(zip(clips, counts, strict=True)):
            if count < 1:
                where = f"multi_modal_data.audio[{i}]"
                raise RequestError(f"{where}: the clip is too short to make one row", where)
            run = positions[start : start + count]
            start += count
            if run[-1] - run[0] != count - 1:
                raise RequestError(
                    f"an {self.audio_token!r} token appears in the prompt's text apart from a clip",
                    "multi_modal_data.audio",
                )
            data = {
                "input_features": out["input_features"][i].astype(np.float32),
                "feature_attention_mask": out["feature_attention_mask"][i].astype(np.int64),
            }
            digest = audio_digest(samples, self.sampling_rate, kwargs)
            features.append(MultiModalFeature("audio", run[0], count, digest, data))
        return features
