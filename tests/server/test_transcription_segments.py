"""Whisper's timestamp tokens cut into segments as transformers' ``_decode_asr`` cuts the same
tokens (one clip, and clips offset by their start; it also keeps stretches without text),
text no timestamp closed kept as a last
segment to the clip's end, and the segments written as SRT and WebVTT."""

from __future__ import annotations

import numpy as np
import pytest
from infernetes.runtime.server.protocol import TranscriptionSegment
from infernetes.runtime.server.subtitles import srt, vtt
from infernetes.runtime.server.transcription_segments import clip_segments, compression_ratio
from infernetes.runtime.testing_audio import make_tiny_whisper


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import WhisperTokenizer

    path = make_tiny_whisper(tmp_path_factory.mktemp("whisper"), timestamps=True)
    return WhisperTokenizer.from_pretrained(str(path))


def _at(tokenizer, seconds: float) -> int:
    return tokenizer.convert_tokens_to_ids(f"<|{seconds:.2f}|>")


def _words(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def _clip(tokenizer, *parts) -> list[int]:
    """Sampled tokens from ``parts``: a float is a timestamp, a string its text's tokens."""
    tokens: list[int] = []
    for part in parts:
        tokens += [_at(tokenizer, part)] if isinstance(part, float) else _words(tokenizer, part)
    return tokens


def _ours(tokenizer, clips: list[list[int]], seconds: list[float]):
    first = _at(tokenizer, 0.0)
    found, offset = [], 0.0
    for tokens, length in zip(clips, seconds, strict=True):
        for piece in clip_segments(tokens, [-1.0] * len(tokens), first, length):
            text = tokenizer.decode(piece.tokens)
            found.append((round(offset + piece.start, 2), round(offset + piece.end, 2), text))
        offset += length
    return found


def _transformers(tokenizer, clips: list[list[int]], seconds: list[float]):
    from transformers.models.whisper.tokenization_whisper import _decode_asr

    outputs = [
        # each clip's tokens after the prompt's <|0.00|>, its length as a stride with no overlap
        {"tokens": np.array([[_at(tokenizer, 0.0), *tokens]]), "stride": (length, 0, 0)}
        for tokens, length in zip(clips, seconds, strict=True)
    ]
    _, found = _decode_asr(
        tokenizer, outputs, return_timestamps=True, return_language=None, time_precision=0.02
    )
    # a stretch without text (<|0.00|><|0.30|>) is a chunk there, no segment here
    return [(*chunk["timestamp"], chunk["text"]) for chunk in found["chunks"] if chunk["text"]]


CLIPS = [
    (" hello there", 1.0, 1.0, " the cat", 2.4),
    (" a gap", 1.16, 1.5, " and", 2.0, 2.0, " more words", 4.62),
    (" one", 0.5, 0.5, " two", 1.0, 1.0, " three", 1.5),
]


@pytest.mark.parametrize("parts", CLIPS, ids=["two", "gap", "three"])
def test_one_clip_cuts_as_transformers(tokenizer, parts):
    tokens = _clip(tokenizer, *parts)
    assert _ours(tokenizer, [tokens], [30.0]) == _transformers(tokenizer, [tokens], [30.0])
    assert len(_ours(tokenizer, [tokens], [30.0])) > 1


def test_clips_are_offset_by_their_start_as_transformers(tokenizer):
    clips = [_clip(tokenizer, *parts) for parts in CLIPS]
    seconds = [29.43, 28.9, 12.25]  # cut at quiet places, not at 30 s
    ours = _ours(tokenizer, clips, seconds)
    assert ours == _transformers(tokenizer, clips, seconds)
    assert ours[-1][:2] == (round(29.43 + 28.9 + 1.0, 2), round(29.43 + 28.9 + 1.5, 2))


def test_a_timestamp_right_after_the_prompts_opens_the_first_segment(tokenizer):
    # <|0.00|><|0.30|> text: transformers pairs timestamps in turn and would time the text from
    # its closing timestamp; the prompt's <|0.00|> is no opening of the model's
    tokens = _clip(tokenizer, 0.3, " late", 1.16, 1.5, " start", 2.0)
    assert _ours(tokenizer, [tokens], [30.0]) == [(0.3, 1.16, " late"), (1.5, 2.0, " start")]


def test_text_no_timestamp_closes_ends_at_the_clip_end(tokenizer):
    first = _at(tokenizer, 0.0)
    tokens = _clip(tokenizer, " said", 0.8, 0.8, " and then")
    pieces = clip_segments(tokens, list(range(len(tokens))), first, 7.5)
    assert [(p.start, p.end, tokenizer.decode(p.tokens)) for p in pieces] == [
        (0.0, 0.8, " said"),
        (0.8, 7.5, " and then"),
    ]
    # no timestamp at all: one segment over the whole clip, every token's logprob in it
    words = _words(tokenizer, " no stamps")
    [whole] = clip_segments(words, [-0.5] * len(words), first, 3.25)
    assert (whole.start, whole.end, whole.tokens) == (0.0, 3.25, words)
    assert whole.avg_logprob == -0.5


def test_a_segment_averages_the_logprobs_of_the_tokens_it_spans(tokenizer):
    first = _at(tokenizer, 0.0)
    tokens = [*_words(tokenizer, " a"), _at(tokenizer, 1.0), _at(tokenizer, 1.0)]
    tokens += [*_words(tokenizer, " b"), _at(tokenizer, 2.0)]
    logprobs = [-float(i + 1) for i in range(len(tokens))]
    one, two = clip_segments(tokens, logprobs, first, 30.0)
    cut = len(_words(tokenizer, " a")) + 1  # the text, then the timestamp that ends it
    assert one.avg_logprob == pytest.approx(np.mean(logprobs[:cut]))
    assert two.avg_logprob == pytest.approx(np.mean(logprobs[cut:]))


def test_compression_ratio_grows_with_repetition():
    assert compression_ratio("") == 0.0
    assert compression_ratio("la " * 50) > 5 > compression_ratio("the quick brown fox")


def _segment(i: int, start: float, end: float, text: str) -> TranscriptionSegment:
    return TranscriptionSegment(
        id=i,
        seek=0,
        start=start,
        end=end,
        text=text,
        tokens=[],
        temperature=0.0,
        avg_logprob=0.0,
        compression_ratio=0.0,
    )


def test_subtitles():
    segments = [_segment(0, 0.0, 1.5, " Hello."), _segment(1, 3599.98, 3725.04, " a --> b ")]
    assert srt(segments) == (
        "1\n00:00:00,000 --> 00:00:01,500\nHello.\n\n2\n00:59:59,980 --> 01:02:05,040\na -> b\n"
    )
    assert vtt(segments) == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello.\n\n00:59:59.980 --> 01:02:05.040\na -> b\n"
    )


def test_the_prompt_asks_for_timestamps_where_the_tokenizer_has_them(tmp_path):
    from infernetes.runtime.multimodal.audio import AudioProcessor
    from transformers import AutoTokenizer

    for timestamps in (True, False):
        path = make_tiny_whisper(tmp_path / str(timestamps), timestamps=timestamps)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        processor = AudioProcessor.load(path, tokenizer, {}, None)
        first = processor.first_timestamp
        assert first == (tokenizer.convert_tokens_to_ids("<|0.00|>") if timestamps else None)
    prompt = processor.decoder_prompt("transcribe", "en", "before", timestamps=True)
    assert prompt == "<|startofprev|>before<|startoftranscript|><|en|><|transcribe|><|0.00|>"
    assert processor.decoder_prompt("translate", "fr").endswith("<|translate|><|notimestamps|>")
