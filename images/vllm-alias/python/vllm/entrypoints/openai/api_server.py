"""`python -m vllm.entrypoints.openai.api_server --model X ...`, vLLM's older server entry point
(KServe's and KubeAI's vLLM runtimes start it): `infernetes serve` with the same options."""

import sys

from infernetes.cli.main import main

# The guard matters: the engine-core process is spawned, and spawn re-imports this module.
if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
