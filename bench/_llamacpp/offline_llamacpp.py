"""llama.cpp's offline figures through its Python binding, run by the binding's own venv (it
imports nothing of this project): prompt processing and batch-1 decode tokens/s, printed as one
JSON line. Arguments: GGUF path, threads, prompt length, decode tokens, rounds (best counts),
and ``--no-repack`` to load without llama.cpp's extra buffer types (its AMX and repacked
layouts), as ``llama-server --no-repack`` does."""

import json
import random
import sys
import time

import llama_cpp.llama_cpp as capi
from llama_cpp import Llama


def _without_extra_buffer_types() -> None:
    # The binding's Llama takes no argument for it; it starts from these defaults.
    defaults = capi.llama_model_default_params

    def params():
        chosen = defaults()
        chosen.use_extra_bufts = False
        return chosen

    capi.llama_model_default_params = params


def main() -> None:
    path, threads, prompt_len, decode_tokens, rounds = sys.argv[1], *map(int, sys.argv[2:6])
    if "--no-repack" in sys.argv[6:]:
        _without_extra_buffer_types()
    llm = Llama(
        model_path=path,
        n_ctx=prompt_len + decode_tokens + 32,
        n_batch=prompt_len,
        n_ubatch=prompt_len,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    rng = random.Random(0)
    prompt = [rng.randrange(100, 500) for _ in range(prompt_len)]
    prefill, decode = [], []
    for _ in range(rounds):
        llm.reset()  # the next eval drops the cache past position 0
        start = time.perf_counter()
        llm.eval(prompt)
        prefill.append(time.perf_counter() - start)
        llm.reset()
        llm.eval(prompt[:16])
        start = time.perf_counter()
        for token in prompt[16 : 16 + decode_tokens]:
            llm.eval([token])  # one token a step, as greedy decoding feeds its own output
        decode.append(time.perf_counter() - start)
    print(
        json.dumps(
            {"prefill_tps": prompt_len / min(prefill), "decode_tps": decode_tokens / min(decode)}
        )
    )


if __name__ == "__main__":
    main()
