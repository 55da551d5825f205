"""``make serve``: write the deterministic demo model (if missing) and serve it on localhost:8000,
printing a curl line to try once the server answers.

The demo model is the engine's tiny Llama (random weights from a fixed seed, a byte-level BPE
tokenizer trained here, a ChatML chat template): it talks nonsense, quickly, on any CPU.

    python -m infernetes.runtime.server.demo [DIR] [serve options...]
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

DEFAULT_DIR = "demo-model"
SERVED_NAME = "demo"


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
            "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 16,
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

    directory = Path(argv[0] if argv and not argv[0].startswith("-") else DEFAULT_DIR)
    options = argv[1:] if argv and not argv[0].startswith("-") else argv
    ensure_demo_model(directory)
    config = parse_serve_args(
        [
            str(directory),
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
