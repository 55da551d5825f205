"""The client subcommands: chat, complete, run-batch, bench serve/throughput/latency."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from ports import free_port

from infernetes.cli.main import main


def test_client_modules_do_not_import_torch():
    code = (
        "import sys; from infernetes.cli.main import build_parser; build_parser(); "
        "import infernetes.cli.chat, infernetes.cli.complete, infernetes.cli.run_batch, "
        "infernetes.cli.bench; print('torch' in sys.modules, 'fastapi' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_chat_and_complete_quick_and_interactive(main_server, capsys, monkeypatch):
    common = ["--url", f"{main_server.url}/v1", "--api-key", main_server.api_key]
    assert main(["chat", *common, "-q", "Hello!", "--system-prompt", "Be brief."]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Using model: tiny\n") and len(out) > len("Using model: tiny\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\nsecond\n"))
    assert main(["complete", *common, "--model-name", "tiny-alias", "--max-tokens", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Using model: tiny-alias"
    assert (
        len([line for line in lines[1:] if len(line) > len("> ")]) == 2
    )  # a reply per prompt line


def test_bench_serve_reports(main_server, capsys, tmp_path):
    result = tmp_path / "result.json"
    code = main(
        [
            "bench",
            "serve",
            "--base-url",
            main_server.url,
            "--api-key",
            main_server.api_key,
            "--num-prompts",
            "6",
            "--random-input-len",
            "8",
            "--random-output-len",
            "4",
            "--max-concurrency",
            "3",
            "--request-rate",
            "50",
            "--result-filename",
            str(result),
        ]
    )
    assert code == 0
    report = capsys.readouterr().out
    for line in (
        "Successful requests:",
        "Mean TTFT (ms):",
        "P99 TPOT (ms):",
        "Median ITL (ms):",
        "P90 E2EL (ms):",
    ):
        assert line in report
    saved = json.loads(result.read_text())
    assert (
        saved["completed"] == 6
        and saved["total_output_tokens"] == 24
        and saved["total_input_tokens"] == 48
    )


def test_bench_throughput_and_latency(tiny_llama_dir, capsys, tmp_path):
    out = tmp_path / "t.json"
    assert (
        main(
            [
                "bench",
                "throughput",
                str(tiny_llama_dir),
                "--max-model-len",
                "128",
                "--num-prompts",
                "4",
                "--random-input-len",
                "8",
                "--random-output-len",
                "4",
                "--output-json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["num_requests"] == 4 and result["total_output_tokens"] == 16
    assert (
        main(
            [
                "bench",
                "latency",
                str(tiny_llama_dir),
                "--max-model-len",
                "128",
                "--batch-size",
                "2",
                "--input-len",
                "4",
                "--output-len",
                "2",
                "--num-iters-warmup",
                "0",
                "--num-iters",
                "2",
            ]
        )
        == 0
    )
    assert "Avg latency:" in capsys.readouterr().out


class _FileServer(BaseHTTPRequestHandler):
    """GET serves the batch input; PUT stores the uploaded output."""

    store: dict[str, bytes] = {}

    def do_GET(self):
        body = self.store.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"")

    def do_PUT(self):
        self.store[self.path] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


BATCH = [
    {
        "custom_id": "chat",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4,
            "ignore_eos": True,  # exactly 4 tokens, even if EOS is sampled
        },
    },
    {
        "custom_id": "completion",
        "method": "POST",
        "url": "/v1/completions",
        # greedy, EOS ignored: sampled tokens could be EOS first (empty text), now and then
        "body": {
            "model": "tiny",
            "prompt": "Hi",
            "max_tokens": 3,
            "temperature": 0,
            "ignore_eos": True,
        },
    },
    {"custom_id": "bad-route", "method": "POST", "url": "/v1/nope", "body": {}},
    {
        "custom_id": "bad-body",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"prompt": "x", "n": 0},
    },
]


@pytest.fixture
def file_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FileServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _FileServer.store
    server.shutdown()


def test_run_batch_over_urls_with_metrics(tiny_llama_dir, tmp_path, file_server):
    from infernetes.runtime.server.clients.batch import run_batch

    from infernetes.schema.config import build_config

    base, store = file_server
    store["/in.jsonl"] = "\n".join(json.dumps(line) for line in BATCH).encode() + b"\nnot json\n"
    config = build_config(
        str(tiny_llama_dir),
        served_model_name=["tiny"],
        max_model_len=128,
        disable_log_requests=True,
    )
    port = free_port()
    failed = asyncio.run(
        run_batch(
            config,
            f"{base}/in.jsonl",
            f"{base}/out.jsonl",
            str(tmp_path),
            metrics_address=("127.0.0.1", port),
        )
    )
    results = {
        r["custom_id"]: r for r in map(json.loads, store["/out.jsonl"].decode().splitlines())
    }
    assert failed == 3
    assert results["chat"]["response"]["status_code"] == 200
    assert results["chat"]["response"]["body"]["usage"]["completion_tokens"] == 4
    assert results["completion"]["response"]["body"]["choices"][0]["text"]
    assert results["bad-route"]["response"]["status_code"] == 400
    assert "n:" in results["bad-body"]["response"]["body"]["error"]["message"]
    assert results[None]["error"]["code"] == "invalid_json"
    assert list(tmp_path.iterdir()) == []  # the staged file was uploaded and removed
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert (
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 2.0'
        in metrics
    )


def test_run_batch_cli_local_files(tiny_llama_dir, tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(json.dumps(BATCH[1]) + "\n")
    assert (
        main(
            [
                "run-batch",
                "-i",
                str(source),
                "-o",
                str(target),
                "--model",
                str(tiny_llama_dir),
                "--served-model-name",
                "tiny",
                "--max-model-len",
                "128",
            ]
        )
        == 0
    )
    (line,) = target.read_text().splitlines()
    assert json.loads(line)["response"]["body"]["usage"]["completion_tokens"] == 3
