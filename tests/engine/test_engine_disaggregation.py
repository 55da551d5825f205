"""Disaggregated prefill with the NixlConnector (``runtime/kv_transfer/nixl.py``): a prefill
engine in another process answers after one token and hands out its blocks; this process's
decode engine reads them over NIXL and gives the very tokens of one engine doing both, having
computed none of the prompt tokens it read (prompt tokens by source, as vLLM counts them). A
producer gone or a request timed out there leaves the decode engine computing the prompt; the
producer frees its blocks once they are read, or once the timeout passes."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time

import pytest
from infernetes.runtime.engine.llm_engine import LLMEngine
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.testing import StepTotals

from infernetes.schema.config import build_config

pytest.importorskip("nixl", reason="the NixlConnector needs the nixl package (extra 'pd')")

BLOCK_SIZE = 16
MAX_TOKENS = 6
_rng = random.Random(1)
# a partial last block, whole blocks only, a short one
PROMPTS = [[_rng.randrange(5, 500) for _ in range(n)] for n in (100, 64, 7)]
WAIT_S = 120  # how long a helper waits for the other process before the test fails

# The prefill engine's process: requests in as JSON lines on stdin, answers out on stdout.
PRODUCER = r"""
import json, select, sys
from infernetes.runtime.engine.llm_engine import LLMEngine
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.schema.config import build_config

engine = LLMEngine(build_config(**json.loads(sys.argv[1])), stat_loggers=[])
manager = engine.engine_core.block_manager
def say(answer):  # (NIXL logs on stdout too)
    print("@" + json.dumps(answer), flush=True)

say({"free": manager.num_free_blocks})
remote_decode = {"kv_transfer_params": {"do_remote_decode": True}}
while True:
    busy = engine.has_unfinished_requests()
    if select.select([sys.stdin], [], [], 0 if busy else 0.05)[0]:
        line = sys.stdin.readline()
        if not line:
            break
        ask = json.loads(line)
        if ask["op"] == "prefill":  # (one line: more would wait in stdin's buffer)
            params = SamplingParams(max_tokens=1, temperature=0, extra_args=remote_decode)
            for i, prompt in enumerate(ask["prompts"]):
                engine.add_request(f"p{i}", prompt, params)
        else:
            say({"free": manager.num_free_blocks})
    if busy:
        for out in engine.step():
            if out.finished:
                answer = {"id": out.request_id, "tokens": out.outputs[0].token_ids,
                          "params": out.kv_transfer_params}
                say(answer)
"""


def _free_port() -> int:
    """Two free consecutive ports (a side channel per TP rank) below the kernel's ephemeral
    range, so no socket bound to port 0 (another xdist worker's, a client's) can take them
    between this choice and the engine's bind, and in this xdist worker's own share."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    for _ in range(1000):
        port = random.randrange(20000, 32000, 2)
        if (port // 2) % workers != worker:
            continue
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no two free consecutive ports between 20000 and 32000")


def _settings(model: str, **overrides) -> dict:
    return {
        "model": model,
        "device": "cpu",
        "dtype": "float32",  # a prompt computed in other chunks must give the same tokens
        "max_model_len": 256,
        "num_gpu_blocks_override": 64,
        "seed": 0,
        **overrides,
    }


def _nixl(role: str) -> dict:
    return {"kv_connector": "NixlConnector", "kv_role": role}


class Producer:
    """A prefill engine in its own process, its side channel on a free port."""

    def __init__(self, model: str, timeout_s: int = 480, **overrides) -> None:
        self.port = _free_port()
        env = {
            **os.environ,
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.port),
            "VLLM_NIXL_ABORT_REQUEST_TIMEOUT": str(timeout_s),
        }
        settings = _settings(model, kv_transfer_config=_nixl("kv_producer"), **overrides)
        self.process = subprocess.Popen(
            [sys.executable, "-c", PRODUCER, json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.num_blocks = self._read()["free"]

    def _read(self) -> dict:
        while True:
            line = self.process.stdout.readline()  # type: ignore[union-attr]
            assert line, f"the producer ended ({self.process.wait()})"
            if line.startswith("@"):
                return json.loads(line[1:])

    def _send(self, message: dict) -> None:
        self.process.stdin.write(json.dumps(message) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]

    def prefill(self, prompts: list[list[int]]) -> list[dict]:
        """Each prompt's one token and its kv_transfer_params, in order."""
        self._send({"op": "prefill", "prompts": prompts})
        answers = {}
        while len(answers) < len(prompts):
            answer = self._read()
            answers[answer["id"]] = answer
        return [answers[f"p{i}"] for i in range(len(prompts))]

    def free_blocks(self) -> int:
        self._send({"op": "free"})
        return self._read()["free"]

    def wait_until_all_free(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while self.free_blocks() != self.num_blocks:
            assert time.monotonic() < deadline, "the producer kept its blocks"
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def _engine(model: str, counter: StepTotals | None = None, **overrides) -> LLMEngine:
    config = build_config(**_settings(model, **overrides))
    return LLMEngine(config, stat_loggers=[counter] if counter else [])


def _generate(engine: LLMEngine, prompts, params_list) -> list[list[int]]:
    """Every prompt at once; each one's tokens, in order."""
    for i, (prompt, params) in enumerate(zip(prompts, params_list, strict=True)):
        engine.add_request(str(i), prompt, params)
    results = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                results[output.request_id] = output.outputs[0].token_ids
    return [results[str(i)] for i in range(len(prompts))]


def _greedy(kv_transfer_params: dict | None = None) -> SamplingParams:
    extra = None if kv_transfer_params is None else {"kv_transfer_params": kv_transfer_params}
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0, extra_args=extra)


def _consumer(model: str, monkeypatch, counter: StepTotals, **overrides) -> LLMEngine:
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(_free_port()))
    return _engine(model, counter, kv_transfer_config=_nixl("kv_consumer"), **overrides)


@pytest.fixture
def wanted(tiny_llama):
    return _generate(_engine(tiny_llama), PROMPTS, [_greedy()] * len(PROMPTS))


def test_the_prefill_engine_answers_with_vllms_parameters(tiny_llama, wanted):
    producer = Producer(tiny_llama)
    try:
        answers = producer.prefill(PROMPTS)
        for prompt, answer, tokens in zip(PROMPTS, answers, wanted, strict=True):
            params = answer["params"]
            assert answer["tokens"] == tokens[:1]
            assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
            assert params["remote_port"] == producer.port
            assert (params["remote_host"], params["tp_size"]) == ("127.0.0.1", 1)
            assert len(params["remote_block_ids"]) == -(-len(prompt) // BLOCK_SIZE)
            assert params["remote_engine_id"] and params["remote_request_id"] == answer["id"]
        assert producer.free_blocks() < producer.num_blocks  # held for the decode engine
    finally:
        producer.stop()


@pytest.mark.parametrize(
    "consumer_overrides",
    [{}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 32}],
    ids=["default", "chunked"],
)
def test_the_decode_engine_continues_from_the_prefilled_blocks(
    tiny_llama, wanted, monkeypatch, consumer_overrides
):
    producer = Producer(tiny_llama, enable_chunked_prefill=True, max_num_batched_tokens=32)
    try:
        answers = producer.prefill(PROMPTS)
        counter = StepTotals()
        consumer = _consumer(tiny_llama, monkeypatch, counter, **consumer_overrides)
        got = _generate(consumer, PROMPTS, [_greedy(a["params"]) for a in answers])
        assert got == wanted
        # every prompt token but the last came from the producer
        assert counter.tokens_by_source == {
            "local_compute": len(PROMPTS),
            "local_cache_hit": 0,
            "external_kv_transfer": sum(len(p) - 1 for p in PROMPTS),
        }
        producer.wait_until_all_free()  # the reads' notifications freed them
    finally:
        producer.stop()


def test_a_local_prefix_hit_is_not_read_again(tiny_llama, wanted, monkeypatch):
    producer = Producer(tiny_llama)
    try:
        counter = StepTotals()
        consumer = _consumer(tiny_llama, monkeypatch, counter)
        head = PROMPTS[0][: 3 * BLOCK_SIZE]
        _generate(consumer, [head], [_greedy()])  # three blocks cached here
        counter.tokens_by_source = dict.fromkeys(counter.tokens_by_source, 0)
        (answer,) = producer.prefill(PROMPTS[:1])
        assert _generate(consumer, PROMPTS[:1], [_greedy(answer["params"])]) == wanted[:1]
        assert counter.tokens_by_source == {
            "local_compute": 1,
            "local_cache_hit": 3 * BLOCK_SIZE,
            "external_kv_transfer": len(PROMPTS[0]) - 1 - 3 * BLOCK_SIZE,
        }
        producer.wait_until_all_free()
    finally:
        producer.stop()


def test_timed_out_blocks_are_freed_and_the_decode_engine_computes_the_prompt(
    tiny_llama, wanted, monkeypatch
):
    producer = Producer(tiny_llama, timeout_s=1)
    try:
        answers = producer.prefill(PROMPTS)
        producer.wait_until_all_free()  # nobody pulled them
        counter = StepTotals()
        consumer = _consumer(tiny_llama, monkeypatch, counter)
        got = _generate(consumer, PROMPTS, [_greedy(a["params"]) for a in answers])
        assert got == wanted
        assert counter.tokens_by_source["external_kv_transfer"] == 0
        assert counter.tokens_by_source["local_compute"] == sum(len(p) for p in PROMPTS)
    finally:
        producer.stop()


def test_a_producer_gone_leaves_the_decode_engine_computing_the_prompt(
    tiny_llama, wanted, monkeypatch
):
    producer = Producer(tiny_llama)
    counter = StepTotals()
    consumer = _consumer(tiny_llama, monkeypatch, counter)
    try:
        first, *rest = producer.prefill(PROMPTS)
        # one read first, so that the consumer knows the producer's agent (its handshake done)
        assert _generate(consumer, PROMPTS[:1], [_greedy(first["params"])]) == wanted[:1]
    finally:
        producer.stop()
    counter.tokens_by_source = dict.fromkeys(counter.tokens_by_source, 0)
    got = _generate(consumer, PROMPTS[1:], [_greedy(a["params"]) for a in rest])
    assert got == wanted[1:]
    assert counter.tokens_by_source["external_kv_transfer"] == 0


def test_bad_parameters_leave_the_decode_engine_computing_the_prompt(
    tiny_llama, wanted, monkeypatch
):
    counter = StepTotals()
    consumer = _consumer(tiny_llama, monkeypatch, counter)
    params = {"do_remote_prefill": True, "remote_block_ids": "no"}
    assert _generate(consumer, PROMPTS[:1], [_greedy(params)]) == wanted[:1]
    assert counter.tokens_by_source["external_kv_transfer"] == 0


@pytest.mark.slow  # a worker process per rank, on both sides
def test_tensor_parallel_ranks_each_read_their_own_shard(tiny_llama, wanted, monkeypatch):
    producer = Producer(tiny_llama, tensor_parallel_size=2)
    counter = StepTotals()
    consumer = _consumer(tiny_llama, monkeypatch, counter, tensor_parallel_size=2)
    try:
        answers = producer.prefill(PROMPTS)
        assert {a["params"]["tp_size"] for a in answers} == {2}
        got = _generate(consumer, PROMPTS, [_greedy(a["params"]) for a in answers])
        assert got == wanted
        assert counter.tokens_by_source["external_kv_transfer"] == sum(len(p) - 1 for p in PROMPTS)
        producer.wait_until_all_free()
    finally:
        consumer.shutdown()
        producer.stop()
