"""What a GGUF file costs resident in infernetes, as ``bench/results/cpu_llamacpp.md`` reports it
for the Qwen2.5-0.5B Q4_1 file: the bytes of the file's tensors; of every tensor the model holds
(``testing_gguf.held_tensor_bytes``: blocks, scales, norms, no dense copy); and the anonymous
memory (``/proc/self/smaps_rollup``) that loading adds to the process, then a 16-token generate.
Printed as one JSON line (MiB, and ratios to the file's tensors).

    python -m bench._llamacpp.resident FILE.gguf
"""

import json
import sys
from pathlib import Path

from gguf import GGUFReader
from infernetes.runtime.llm import LLM
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.testing_gguf import held_tensor_bytes

MIB = 1 << 20


def anonymous_bytes() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no Anonymous line in /proc/self/smaps_rollup")


def main() -> None:
    file = sys.argv[1]
    tensors = sum(int(t.n_bytes) for t in GGUFReader(file).tensors)
    before = anonymous_bytes()
    llm = LLM(file, max_model_len=256, seed=0)
    loaded = anonymous_bytes() - before
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    held = held_tensor_bytes(model)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(100, 116))}], params)
    generated = anonymous_bytes() - before
    figures = {"file_tensors": tensors, "held": held, "load": loaded, "generate": generated}
    report = {name: round(value / MIB, 1) for name, value in figures.items()}
    report |= {f"{name}_ratio": round(value / tensors, 3) for name, value in figures.items()}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
