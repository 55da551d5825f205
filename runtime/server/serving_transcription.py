"""POST /v1/audio/transcriptions and /v1/audio/translations, as vLLM serves them for Whisper: a
multipart form with the audio ``file``; the audio decoded, resampled to 16 kHz and cut into
clips of at most 30 s at quiet points (vLLM's splitting), each clip one engine request with the
decoder prompt ``[<|startofprev|>prompt]<|startoftranscript|><|lang|><|task|><|notimestamps|>``;
their texts joined, whole (``json``, ``text``) or streamed as they are decoded."""

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
    TranscriptionUsage,
    TranslationResponse,
    random_id,
)
from infernetes.runtime.server.serving_base import ServingBase
from infernetes.runtime.server.streaming import DONE, engine_stream, merge, sse

# What vLLM answers in: the rest of OpenAI's formats need timestamps (planned here)
RESPONSE_FORMATS = ("json", "text")
DEFAULT_LANGUAGE = "en"  # vLLM's, when a request names none
_NOUNS = {"transcribe": "transcription", "translate": "translation"}


class TranscriptionServing(ServingBase):
    def _prepare(
        self, request: TranscriptionRequest, audio: bytes, task: str
    ) -> tuple[list[MultiModalPrompt], list[SamplingParams], float]:
        """The request's clips as engine prompts, their sampling parameters and the audio's
        duration; every fault a 400 naming its field (in the preparation threads)."""
        self.check_model(request.model)
        self.check_engine()
        if request.response_format not in RESPONSE_FORMATS:
            raise APIError(
                f"response_format {request.response_format!r} is not supported; one of "
                f"{', '.join(RESPONSE_FORMATS)} (segments with timestamps are planned)",
                400,
                "response_format",
            )
        if request.timestamp_granularities:
            raise APIError(
                "timestamp_granularities needs verbose_json, whose timestamps are planned",
                400,
                "timestamp_granularities",
            )
        if task == "translate" and request.to_language not in (None, "en"):
            raise APIError("Whisper translates into English only", 400, "to_language")
        self.check_file_size(len(audio))
        processor = self.engine.input_processor.mm_processor
        assert isinstance(processor, AudioProcessor)  # the route serves speech models only
        try:
            samples, rate = decode_audio(audio)
            samples = resample(samples, rate, processor.sampling_rate)
            text = processor.decoder_prompt(
                task, request.language or DEFAULT_LANGUAGE, request.prompt
            )
            prompts = [
                self.engine.input_processor.process_multimodal(
                    text, {"audio": (clip, processor.sampling_rate)}
                )
                for clip in split_clips(samples, processor.sampling_rate)
            ]
        except RequestError as error:
            param = "file" if error.param == "multi_modal_data.audio" else error.param
            raise APIError(str(error), 400, param) from error
        params = [self._sampling(request, len(prompt.prompt_token_ids)) for prompt in prompts]
        return prompts, params, len(samples) / processor.sampling_rate

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

    def _sampling(self, request: TranscriptionRequest, prompt_length: int) -> SamplingParams:
        fields: dict[str, Any] = {
            "temperature": request.temperature,
            "seed": request.seed,
            "max_tokens": self.resolve_max_tokens(
                prompt_length, request.max_completion_tokens, "prompt"
            ),
            "output_kind": RequestOutputKind.DELTA
            if request.stream
            else RequestOutputKind.FINAL_ONLY,
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
    ) -> TranscriptionResponse | TranslationResponse | str | AsyncIterator[bytes]:
        prompts, params, seconds = await off_loop(self._prepare, request, audio, task)
        request_id = random_id(_NOUNS[task])
        if request.stream:
            return self._stream(request, request_id, prompts, params, f"{_NOUNS[task]}.chunk")
        texts = [""] * len(prompts)
        # the clips decoded together, their texts joined in order
        async for i, output in merge(self._generators(request_id, prompts, params)):
            texts[i] = output.outputs[0].text
        text = "".join(texts)
        if request.response_format == "text":
            return text
        if task == "translate":  # vLLM's translations carry no usage
            return TranslationResponse(text=text)
        usage = TranscriptionUsage(seconds=math.ceil(seconds))
        return TranscriptionResponse(text=text, usage=usage)

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


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
