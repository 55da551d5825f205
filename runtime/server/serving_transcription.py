"""POST /v1/audio/transcriptions and /v1/audio/translations, as vLLM serves them for Whisper: a
multipart form with the audio ``file``; the audio decoded, resampled to 16 kHz and cut into
clips of at most 30 s at quiet points (vLLM's splitting), each clip one engine request with the
decoder prompt ``[<|startofprev|>prompt]<|startoftranscript|><|lang|><|task|><|notimestamps|>``;
their texts joined, whole (``json``, ``text``) or streamed as they are decoded. With timestamps
(``verbose_json``, ``srt``, ``vtt``) the prompt ends in ``<|0.00|>`` instead and the timestamp
tokens the model writes become segments, offset by their clip's start."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import Any

from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.audio import (
    AudioProcessor,
    decode_audio,
    resample,
    split_clips,
)
from infernetes.runtime.multimodal.inputs import MultiModalPrompt
from infernetes.runtime.sampling_params import RequestOutputKind, SamplingParams
from infernetes.runtime.server.errors import APIError, error_body
from infernetes.runtime.server.off_loop import off_loop
from infernetes.runtime.server.protocol import (
    TranscriptionRequest,
    TranscriptionResponse,
    TranscriptionSegment,
    TranscriptionUsage,
    TranslationResponse,
    VerboseTranscriptionResponse,
    VerboseTranslationResponse,
    random_id,
)
from infernetes.runtime.server.serving_base import ServingBase
from infernetes.runtime.server.streaming import DONE, engine_stream, merge, sse
from infernetes.runtime.server.subtitles import srt, vtt
from infernetes.runtime.server.transcription_segments import clip_segments, compression_ratio
from transformers.models.whisper.tokenization_whisper import LANGUAGES

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
TIMED_FORMATS = ("verbose_json", "srt", "vtt")  # answered from timestamped segments
FRAMES_PER_SECOND = 100  # a segment's seek counts mel frames (10 ms), as openai/whisper does
DEFAULT_LANGUAGE = "en"  # vLLM's, when a request names none
_NOUNS = {"transcribe": "transcription", "translate": "translation"}


class TranscriptionServing(ServingBase):
    def _prepare(
        self, request: TranscriptionRequest, audio: bytes, task: str
    ) -> tuple[list[MultiModalPrompt], list[SamplingParams], list[float]]:
        """The request's clips as engine prompts, their sampling parameters and durations;
        every fault a 400 naming its field (in the preparation threads)."""
        self.check_model(request.model)
        self.check_engine()
        timed = _check_format(request)
        if task == "translate" and request.to_language not in (None, "en"):
            raise APIError("Whisper translates into English only", 400, "to_language")
        self.check_file_size(len(audio))
        processor = self.engine.input_processor.mm_processor
        assert isinstance(processor, AudioProcessor)  # the route serves speech models only
        if timed and processor.first_timestamp is None:
            raise APIError(
                f"response_format {request.response_format!r} needs timestamps, and this "
                "model's tokenizer has no <|0.00|> token; use json or text",
                400,
                "response_format",
            )
        try:
            samples, rate = decode_audio(audio)
            samples = resample(samples, rate, processor.sampling_rate)
            text = processor.decoder_prompt(
                task, request.language or DEFAULT_LANGUAGE, request.prompt, timed
            )
            clips = split_clips(samples, processor.sampling_rate)
            prompts = [
                self.engine.input_processor.process_multimodal(
                    text, {"audio": (clip, processor.sampling_rate)}
                )
                for clip in clips
            ]
        except RequestError as error:
            param = "file" if error.param == "multi_modal_data.audio" else error.param
            raise APIError(str(error), 400, param) from error
        params = [
            self._sampling(request, len(prompt.prompt_token_ids), timed) for prompt in prompts
        ]
        seconds = [len(clip) / processor.sampling_rate for clip in clips]
        return prompts, params, seconds

    def check_file_size(self, size: int | None) -> None:
        """A 400 naming ``file`` for an upload over ``VLLM_MAX_AUDIO_CLIP_FILESIZE_MB``."""
        limit = self.settings.media.max_audio_file_mb
        if size is not None and size > limit * 2**20:
            raise APIError(
                f"file: {size / 2**20:.1f} MiB; at most {limit} MiB are taken "
                "(VLLM_MAX_AUDIO_CLIP_FILESIZE_MB)",
                400,
                "file",
            )

    def _sampling(
        self, request: TranscriptionRequest, prompt_length: int, timed: bool
    ) -> SamplingParams:
        fields: dict[str, Any] = {
            "temperature": request.temperature,
            "seed": request.seed,
            "max_tokens": self.resolve_max_tokens(
                prompt_length, request.max_completion_tokens, "prompt"
            ),
            "output_kind": RequestOutputKind.DELTA
            if request.stream
            else RequestOutputKind.FINAL_ONLY,
            # a segment's avg_logprob: each sampled token's own logprob (vLLM asks for them too)
            "logprobs": 0 if timed else None,
        }
        for name in ("top_p", "top_k", "min_p", "repetition_penalty"):
            if getattr(request, name) is not None:
                fields[name] = getattr(request, name)
        for name in ("frequency_penalty", "presence_penalty"):
            fields[name] = getattr(request, name) or 0.0
        try:
            return SamplingParams(**fields)
        except (ValueError, TypeError) as exc:
            raise APIError(str(exc), 400) from exc

    async def create(
        self, request: TranscriptionRequest, audio: bytes, task: str
    ) -> (
        TranscriptionResponse
        | TranslationResponse
        | VerboseTranslationResponse
        | str
        | AsyncIterator[bytes]
    ):
        prompts, params, clip_seconds = await off_loop(self._prepare, request, audio, task)
        request_id = random_id(_NOUNS[task])
        if request.stream:
            return self._stream(request, request_id, prompts, params, f"{_NOUNS[task]}.chunk")
        outputs: list[Any] = [None] * len(prompts)
        # the clips decoded together, their texts joined in order
        async for i, output in merge(self._generators(request_id, prompts, params)):
            outputs[i] = output.outputs[0]
        seconds = sum(clip_seconds)
        if request.response_format in TIMED_FORMATS:
            return self._timed(request, task, outputs, clip_seconds)
        text = "".join(output.text for output in outputs)
        if request.response_format == "text":
            return text
        if task == "translate":  # vLLM's translations carry no usage
            return TranslationResponse(text=text)
        usage = TranscriptionUsage(seconds=math.ceil(seconds))
        return TranscriptionResponse(text=text, usage=usage)

    def _timed(
        self,
        request: TranscriptionRequest,
        task: str,
        outputs: list[Any],
        clip_seconds: list[float],
    ) -> VerboseTranslationResponse | str:
        """The clips' timestamped tokens as ``verbose_json``, ``srt`` or ``vtt``."""
        processor = self.engine.input_processor.mm_processor
        assert isinstance(processor, AudioProcessor) and processor.first_timestamp is not None
        tokenizer = processor.tokenizer
        segments: list[TranscriptionSegment] = []
        offset = 0.0
        for output, seconds in zip(outputs, clip_seconds, strict=True):
            tokens = list(output.token_ids)
            logprobs = [
                top[token].logprob for token, top in zip(tokens, output.logprobs, strict=True)
            ]
            if tokens and tokens[-1] == tokenizer.eos_token_id:
                del tokens[-1], logprobs[-1]
            for piece in clip_segments(tokens, logprobs, processor.first_timestamp, seconds):
                text = tokenizer.decode(piece.tokens, skip_special_tokens=True)
                segments.append(
                    TranscriptionSegment(
                        id=len(segments),
                        seek=round(offset * FRAMES_PER_SECOND),
                        start=round(offset + piece.start, 2),
                        end=round(offset + piece.end, 2),
                        text=text,
                        tokens=piece.tokens,
                        temperature=request.temperature,
                        avg_logprob=piece.avg_logprob,
                        compression_ratio=compression_ratio(text),
                    )
                )
            offset += seconds
        if request.response_format == "srt":
            return srt(segments)
        if request.response_format == "vtt":
            return vtt(segments)
        text = "".join(segment.text for segment in segments)
        code = request.language or DEFAULT_LANGUAGE
        # OpenAI names the language in English words; a translation's is always English
        language = "english" if task == "translate" else LANGUAGES.get(code, code)
        if task == "translate":
            return VerboseTranslationResponse(
                language=language, duration=offset, text=text, segments=segments
            )
        return VerboseTranscriptionResponse(
            language=language,
            duration=offset,
            text=text,
            segments=segments,
            usage=TranscriptionUsage(seconds=math.ceil(offset)),
        )

    def _generators(
        self, request_id: str, prompts: list[MultiModalPrompt], params: list[SamplingParams]
    ) -> list[AsyncIterator[Any]]:
        generators = []
        for i, (prompt, clip_params) in enumerate(zip(prompts, params, strict=True)):
            sub_id = f"{request_id}-{i}"
            self.log_request(sub_id, prompt.prompt, prompt.prompt_token_ids, clip_params)
            generators.append(engine_stream(self.engine.generate(prompt, clip_params, sub_id)))
        return generators

    async def _stream(
        self,
        request: TranscriptionRequest,
        request_id: str,
        prompts: list[MultiModalPrompt],
        params: list[SamplingParams],
        chunk_object: str,
    ) -> AsyncIterator[bytes]:
        """vLLM's ``transcription.chunk`` (``translation.chunk``) events: each piece of text as
        it is decoded, clip after clip (each clip's last with its finish reason), then the usage
        (``stream_include_usage``) and ``[DONE]``."""
        created = int(time.time())
        model = request.model or self.settings.model_name
        prompt_tokens = completion_tokens = 0
        try:
            # clip after clip, so that the text streams in order
            for i, prompt in enumerate(prompts):
                prompt_tokens += len(prompt.prompt_token_ids)
                [stream] = self._generators(f"{request_id}-{i}", [prompt], [params[i]])
                async for output in stream:
                    [out] = output.outputs
                    completion_tokens += len(out.token_ids)
                    if not out.text and out.finish_reason is None:
                        continue
                    chunk: dict[str, Any] = {
                        "id": request_id,
                        "object": chunk_object,
                        "created": created,
                        "model": model,
                        "choices": [
                            {
                                "delta": {"content": out.text},
                                "finish_reason": out.finish_reason,
                                "stop_reason": out.stop_reason,
                            }
                        ],
                    }
                    if request.stream_include_usage and request.stream_continuous_usage_stats:
                        chunk["usage"] = _usage(prompt_tokens, completion_tokens)
                    yield sse(chunk)
            if request.stream_include_usage:
                yield sse(
                    {
                        "id": request_id,
                        "object": chunk_object,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage(prompt_tokens, completion_tokens),
                    }
                )
        except APIError as exc:
            yield sse(error_body(exc.message, exc.status, exc.param))
        yield DONE


def _check_format(request: TranscriptionRequest) -> bool:
    """Whether the answer is timed (``verbose_json``, ``srt``, ``vtt``); a 400 naming the field
    for a format, granularity or streaming the server does not give."""
    if request.response_format not in RESPONSE_FORMATS:
        raise APIError(
            f"response_format {request.response_format!r} is not supported; one of "
            f"{', '.join(RESPONSE_FORMATS)}",
            400,
            "response_format",
        )
    if "word" in request.timestamp_granularities:
        raise APIError(
            "timestamp_granularities: word-level timestamps are not served (they need the "
            "decoder's cross-attention aligned to the audio); 'segment' is",
            400,
            "timestamp_granularities",
        )
    if request.timestamp_granularities and request.response_format != "verbose_json":
        raise APIError(
            "timestamp_granularities needs response_format 'verbose_json'",
            400,
            "timestamp_granularities",
        )
    timed = request.response_format in TIMED_FORMATS
    if timed and request.stream:  # vLLM's refusal too: segments need the whole clip
        raise APIError(
            f"response_format {request.response_format!r} cannot be streamed; stream json or text",
            400,
            "stream",
        )
    return timed


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
