"""infernetes' offline figures with ``LLM.generate``, the counterpart of ``offline_llamacpp.py``:
prompt processing tokens/s (a ``prompt_len`` prompt, one output token) and batch-1 decode
tokens/s (``decode_tokens`` more output tokens, less the one-token run), printed as one JSON line.
Arguments: model (a GGUF file or a checkpoint folder), dtype, prompt length, decode tokens,
rounds (best counts). Threads: OMP_NUM_THREADS."""

import json
import random
import sys
import time

from infernetes.runtime.llm import LLM
from infernetes.runtime.sampling_params import SamplingParams


def main() -> None:
    model, dtype = sys.argv[1], sys.argv[2]
    prompt_len, decode_tokens, rounds = map(int, sys.argv[3:6])
    llm = LLM(
        model,
        dtype=dtype,
        max_model_len=prompt_len + decode_tokens + 32,
        max_num_batched_tokens=max(prompt_len, 512),
        enable_prefix_caching=False,  # every round computes its prompt again
        seed=0,
    )
    rng = random.Random(0)
    prompt = [rng.randrange(100, 500) for _ in range(prompt_len)]

    def timed(tokens: list[int], max_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": tokens}], params)
        return time.perf_counter() - start

    timed(prompt[:16], 4)  # warm-up
    prefill = [timed(prompt, 1) for _ in range(rounds)]
    one = min(timed(prompt[:16], 1) for _ in range(rounds))
    many = min(timed(prompt[:16], 1 + decode_tokens) for _ in range(rounds))
    print(
        json.dumps(
            {"prefill_tps": prompt_len / min(prefill), "decode_tps": decode_tokens / (many - one)}
        )
    )


if __name__ == "__main__":
    main()
