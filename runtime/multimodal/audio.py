"""Audio for an encoder-decoder speech model (Whisper), on the API side of the engine core's
pipe: files decoded with soundfile (libsndfile: WAV, FLAC, OGG, MP3, ...), mixed to mono and
resampled to the model's rate with scipy, then turned into log-mel features by the model's own
``WhisperFeatureExtractor`` (numpy, no torchaudio). The decoder prompt is the text the request
gives, tokenized as it stands (no special tokens added: the prompt carries Whisper's own)."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from math import gcd
from pathlib import Path
from typing import Any

import numpy as np
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.inputs import MultiModalFeature, MultiModalPrompt

FIRST_TIMESTAMP = "<|0.00|>"  # Whisper's first timestamp token; 0.02 s steps follow it

# What one prompt's encoder takes: Whisper's 30 s window (longer audio is split by the server)
MAX_CLIP_SECONDS = 30.0
# Longer audio is cut in its quietest stretch (RMS over windows of this many samples, vLLM's
# 0.1 s at 16 kHz) within the last second before each 30 s
SPLIT_SEARCH_SECONDS = 1.0
SPLIT_WINDOW = 1600
# What a file may decode to: its duration, and its samples over all channels (a small
# compressed file can hold hours of silence)
MAX_FILE_SECONDS = 15 * 60.0


def decode_audio(
    data: bytes, field: str = "file", max_seconds: float = MAX_FILE_SECONDS
) -> tuple[np.ndarray, int]:
    """An audio file's bytes -> its samples (float32, mono: channels averaged) and their rate;
    RequestError naming ``field`` when they are not audio soundfile can read or its header says
    more than ``max_seconds`` (checked before decoding)."""
    import soundfile

    if not data:
        raise RequestError(f"{field}: the audio file is empty", field)
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as audio:
            seconds = audio.frames / audio.samplerate
            limit = max_seconds * 48000 * 2
            if seconds > max_seconds or audio.frames * audio.channels > limit:
                raise RequestError(
                    f"{field}: {seconds:.1f} s of audio ({audio.channels} channel(s) at "
                    f"{audio.samplerate} Hz); at most {max_seconds:.0f} s of 48 kHz stereo "
                    "are taken",
                    field,
                )
            samples = audio.read(dtype="float32", always_2d=True)
            rate = audio.samplerate
    except RequestError:
        raise
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as error:
        raise RequestError(
            f"{field}: not an audio file that can be decoded (WAV, FLAC, OGG, MP3, ...): {error}",
            field,
        ) from error
    if samples.shape[0] == 0:
        raise RequestError(f"{field}: the audio file holds no samples", field)
    return samples.mean(axis=1), int(rate)


def split_clips(samples: np.ndarray, rate: int) -> list[np.ndarray]:
    """``samples`` in clips of at most ``MAX_CLIP_SECONDS``, as vLLM splits long audio: each
    cut at the quietest window of the last ``SPLIT_SEARCH_SECONDS`` before the limit."""
    limit = int(MAX_CLIP_SECONDS * rate)
    search = int(SPLIT_SEARCH_SECONDS * rate)
    clips = []
    start = 0
    while len(samples) - start > limit:
        stretch = samples[start + limit - search : start + limit]
        windows = -(-(len(stretch) - SPLIT_WINDOW) // SPLIT_WINDOW)  # not the last (vLLM's)
        energy = (stretch[: windows * SPLIT_WINDOW].reshape(windows, -1) ** 2).mean(axis=1)
        cut = start + limit - search + int(energy.argmin()) * SPLIT_WINDOW
        clips.append(samples[start:cut])
        start = cut
    clips.append(samples[start:])
    return clips


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``samples`` at ``rate`` Hz -> at ``target`` Hz (polyphase, scipy)."""
    if rate == target:
        return samples
    from scipy.signal import resample_poly

    common = gcd(rate, target)
    return resample_poly(samples, target // common, rate // common).astype(np.float32)


def audio_digest(samples: np.ndarray, rate: int, processor_kwargs: Mapping[str, Any]) -> str:
    """sha256 of the samples, their rate and the feature extractor's settings (prefix cache)."""
    digest = hashlib.sha256(f"audio{rate}".encode())
    digest.update(np.ascontiguousarray(samples, dtype=np.float32).tobytes())
    digest.update(json.dumps(dict(processor_kwargs), sort_keys=True, default=str).encode())
    return digest.hexdigest()


class AudioProcessor:
    """The processor of an encoder-decoder speech model: each prompt takes one clip of audio
    (``multi_modal_data={"audio": (samples, rate)}`` as vLLM takes it) and its text is the
    decoder's prompt. Picklable (it travels to the API side in ``EngineInfo``)."""

    # no chat media parts: audio comes as a file to /v1/audio/* or offline as multi_modal_data
    placeholders: dict[str, str] | None = None
    cache = None  # no processor cache: each clip is its own
    requires_audio = True  # a prompt without audio has nothing to decode from

    def __init__(
        self,
        feature_extractor: Any,
        tokenizer: Any,
        limits: dict[str, int],
        default_kwargs: Mapping[str, Any] | None,
    ) -> None:
        self.feature_extractor = feature_extractor
        self.tokenizer = tokenizer
        self.sampling_rate: int = feature_extractor.sampling_rate
        self.limits = limits
        self.default_kwargs = dict(default_kwargs or {})

    @classmethod
    def load(
        cls,
        path: str | Path,
        tokenizer: Any,
        limits: dict[str, int],
        default_kwargs: Mapping[str, Any] | None,
    ) -> AudioProcessor:
        from transformers import WhisperFeatureExtractor

        try:
            extractor = WhisperFeatureExtractor.from_pretrained(str(path))
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot load the feature extractor of {path}: {error}") from error
        return cls(extractor, tokenizer, limits, default_kwargs)

    def language_token(self, language: str) -> str:
        """``<|language|>`` when the tokenizer has it as one token, else RequestError."""
        token = f"<|{language}|>"
        if language and self.tokenizer.convert_tokens_to_ids(token) not in (
            None,
            self.tokenizer.unk_token_id,
        ):
            return token
        raise RequestError(
            f"language {language!r} is not one the model knows: an ISO 639-1 code it has a "
            "token for, such as 'en'",
            "language",
        )

    def decoder_prompt(
        self, task: str, language: str, prompt: str = "", timestamps: bool = False
    ) -> str:
        """Whisper's decoder prompt as vLLM builds it: the previous text (``prompt``) after
        ``<|startofprev|>``, then the start, language and task tokens, then ``<|notimestamps|>``
        or, with ``timestamps``, the first timestamp ``<|0.00|>`` (the model then writes them)."""
        previous = f"<|startofprev|>{prompt}" if prompt else ""
        last = FIRST_TIMESTAMP if timestamps else "<|notimestamps|>"
        return f"{previous}<|startoftranscript|>{self.language_token(language)}<|{task}|>{last}"

    @property
    def first_timestamp(self) -> int | None:
        """``<|0.00|>``'s id; None when the tokenizer has no timestamp tokens."""
        token = self.tokenizer.convert_tokens_to_ids(FIRST_TIMESTAMP)
        return None if token in (None, self.tokenizer.unk_token_id) else int(token)

    def process(
        self,
        text: str,
        data: Mapping[str, Any],
        request_kwargs: Mapping[str, Any] | None = None,
        add_special_tokens: bool = True,
    ) -> MultiModalPrompt:
        """The decoder prompt ``text`` and one audio clip -> the prompt's ids and the clip's
        log-mel features, as one item spanning the prompt (its digest keys the prefix cache:
        the decoder's keys depend on the audio)."""
        unknown = set(data) - {"audio"}
        if unknown:
            raise RequestError(
                f"{', '.join(sorted(unknown))}: this model takes audio only",
                f"multi_modal_data.{sorted(unknown)[0]}",
            )
        samples = self._samples(data.get("audio"))
        kwargs = {**self.default_kwargs, **(request_kwargs or {})}
        try:
            features = self.feature_extractor(
                samples, sampling_rate=self.sampling_rate, return_tensors="np", **kwargs
            )["input_features"][0]
        except (ValueError, TypeError) as error:
            raise RequestError(
                f"the model's feature extractor refused the input: {error}",
                "mm_processor_kwargs" if kwargs else "multi_modal_data.audio",
            ) from error
        ids = list(self.tokenizer(text, add_special_tokens=False).input_ids)
        if not ids:
            raise RequestError("the decoder prompt is empty", "prompt")
        digest = audio_digest(samples, self.sampling_rate, kwargs)
        feature = MultiModalFeature(
            "audio", 0, len(ids), digest, {"input_features": features.astype(np.float32)}
        )
        return MultiModalPrompt(text, ids, [feature])

    def _samples(self, given: Any) -> np.ndarray:
        """``(samples, rate)`` (or samples at the model's rate) -> float32 mono samples at the
        model's rate, at most ``MAX_CLIP_SECONDS`` of them."""
        field = "multi_modal_data.audio"
        clips = given if isinstance(given, list) else [given]
        if given is None or len(clips) != 1:
            count = 0 if given is None else len(clips)
            raise RequestError(f"{field}: one audio clip per prompt, got {count}", field)
        limit = self.limits.get("audio")
        if limit == 0:
            raise RequestError(f"{field}: --limit-mm-per-prompt allows no audio", field)
        [clip] = clips
        return clip_samples(clip, self.sampling_rate, field)


def clip_samples(clip: Any, sampling_rate: int, field: str) -> np.ndarray:
    """One clip as a prompt gives it, ``(samples, rate)`` (or samples at ``sampling_rate``) ->
    float32 mono samples at ``sampling_rate``, at most ``MAX_CLIP_SECONDS`` of them;
    RequestError naming ``field`` when they are not that."""
    samples, rate = clip if isinstance(clip, tuple) and len(clip) == 2 else (clip, sampling_rate)
    try:
        samples = np.asarray(samples)
    except (TypeError, ValueError) as error:  # ragged lists
        raise RequestError(f"{field}: a non-empty 1-D array of samples", field) from error
    if samples.ndim != 1 or samples.size == 0 or not np.issubdtype(samples.dtype, np.number):
        raise RequestError(f"{field}: a non-empty 1-D array of samples", field)
    if not isinstance(rate, int | np.integer) or isinstance(rate, bool) or rate <= 0:
        raise RequestError(f"{field}: the sample rate must be a positive integer", field)
    if not np.isfinite(samples).all():
        raise RequestError(f"{field}: the samples must be finite numbers", field)
    seconds = samples.size / rate
    if seconds > MAX_CLIP_SECONDS:
        raise RequestError(
            f"{field}: {seconds:.1f} s of audio; one prompt takes at most "
            f"{MAX_CLIP_SECONDS:.0f} s (the encoder's window)",
            field,
        )
    return resample(samples.astype(np.float32), int(rate), sampling_rate)
