"""Whisper transcriptions through the offline engine, and where their time goes.

A Whisper-shaped model with random weights (default: whisper-tiny's widths, 384 wide, 4 encoder
and 4 decoder layers of 6 heads, 80 mel bins; the test tokenizer's 512 tokens) and its feature
extractor are written to a temporary folder. ``--num-prompts`` clips of ``--seconds`` of tones
and noise run greedy, EOS ignored, in one ``LLM.generate`` call after a warm-up. Reported:
requests and output tokens per second, and the share of the wall time spent in the feature
extractor (log-mel features, on the API side), in the encoder (with each decoder layer's
cross-attention keys and values of the 1500 frames) and the rest (the decoder's prefill and
decode, scheduling, sampling).
Run: ``python -m bench transcription`` (``--help`` for sizes).

Measured on the development machine's CPU (2 cores shared with other work; defaults, float32,
1 thread; 16 clips of 10 s, 4 prompt tokens and 32 output tokens each; one run, 2026-11-26):
0.41 requests/s, 13.2 output tokens/s; feature extraction 1.1%, the encoder 86%, the rest 13%.
Not measured on a GPU yet.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench transcription", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0, help="audio per clip (<= 30)")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--width", type=int, default=384, help="d_model")
    parser.add_argument("--layers", type=int, default=4, help="encoder and decoder layers each")
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import torch
    from infernetes.runtime.testing_audio import SAMPLE_RATE, make_tiny_whisper, tone

    from infernetes import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    sizes = dict(
        d_model=args.width,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=4 * args.width,
        decoder_ffn_dim=4 * args.width,
        max_target_positions=448,
        init_std=0.02,
    )
    with tempfile.TemporaryDirectory() as folder:
        path = str(make_tiny_whisper(folder, dtype=args.dtype, sizes=sizes))
        # the KV memory keeps room for each running request's cross-attention: as many as run
        llm = LLM(path, dtype=args.dtype, device=args.device, max_num_seqs=args.num_prompts)
        prompt = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
        prompts = [
            {
                "prompt": prompt,
                "multi_modal_data": {"audio": (tone(i, args.seconds), SAMPLE_RATE)},
            }
            for i in range(args.num_prompts)
        ]
        params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
        llm.generate(prompts[:2], params)  # warm-up
        spent = {"features": 0.0, "encoder": 0.0}
        processor = llm.llm_engine.input_processor.mm_processor
        model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
        _timed(processor, "feature_extractor", spent, "features")
        _timed(model, "encode", spent, "encoder", device=model.model.encoder.conv1.weight.device)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        wall = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(
        f"{args.num_prompts} clips of {args.seconds:.0f} s, {args.output_len} output tokens "
        f"each: {args.num_prompts / wall:.2f} requests/s, {tokens / wall:.1f} output tokens/s; "
        f"feature extraction {spent['features'] / wall:.1%}, encoder "
        f"{spent['encoder'] / wall:.1%}, the rest {1 - sum(spent.values()) / wall:.1%}"
    )
    return 0


def _timed(owner, name: str, spent: dict, key: str, device=None) -> None:
    """Wrap ``owner.name`` (a callable) to add its wall time to ``spent[key]``."""
    import torch

    inner = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = inner(*args, **kwargs)
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        spent[key] += time.perf_counter() - start
        return out

    setattr(owner, name, timed)
