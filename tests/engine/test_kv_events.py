"""--kv-events-config as vLLM publishes KV-cache events, seen by a subscriber of its own: a pyzmq
SUB socket decoding with msgspec structs that mirror vLLM's (a batch is an array, each event an
array led by its name, as llm-d's indexer decodes them; extra fields refused, so nothing is sent
that vLLM does not send). A
request's blocks arrive in order, chained by their parents' hashes, with their tokens; eviction
gives BlockRemoved; a reset and sleep give AllBlocksCleared; a late subscriber replays what it
missed; data parallel ranks publish on consecutive ports; a full queue drops and counts; a
subscriber that never reads holds nothing up; a prompt's blocks go out before the forward that
fills them."""

from __future__ import annotations

import asyncio
import socket
import sys
import time

import msgspec
import pytest
import zmq
from infernetes.runtime.config import KVEventsConfig
from infernetes.runtime.engine.async_engine import AsyncEngine
from infernetes.runtime.engine.stats import SchedulerStats
from infernetes.runtime.kv_events.config import kv_events_config, rank_endpoint
from infernetes.runtime.kv_events.events import AllBlocksCleared, BlockRemoved, BlockStored
from infernetes.runtime.kv_events.publisher import PUBLISHERS, ZmqEventPublisher, binds
from infernetes.runtime.server.metrics import PrometheusStatLogger
from infernetes.runtime.testing import SAMPLE_PROMPTS
from prometheus_client.parser import text_string_to_metric_families

from infernetes import LLM, SamplingParams
from infernetes.schema.config import build_config
from infernetes.schema.errors import ConfigError
from infernetes.schema.support import KEY_SUPPORT
from infernetes.schema.support_check import check_support

BLOCK_SIZE = 8
RECEIVE_TIMEOUT_S = 60  # a ceiling for a loaded machine, never what is asserted


# -- the subscriber's own view of vLLM's wire format ---------------------------------------------


class Stored(msgspec.Struct, tag="BlockStored", array_like=True, forbid_unknown_fields=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class Removed(msgspec.Struct, tag="BlockRemoved", array_like=True, forbid_unknown_fields=True):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class Cleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True, forbid_unknown_fields=True):
    pass


class Batch(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    ts: float
    events: list[Stored | Removed | Cleared]
    data_parallel_rank: int | None = None


DECODER = msgspec.msgpack.Decoder(Batch)


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports free now (rank r publishes on the first + r)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            first = sock.getsockname()[1]
        for port in range(first + 1, first + count):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    break
        else:
            return first


class Subscriber:
    """Live batches in sequence order; a gap (a batch sent before the subscription took hold) is
    filled from the replay socket, as a KV-aware router does."""

    def __init__(self, port: int, replay_port: int, topic: bytes = b"") -> None:
        context = zmq.Context.instance()
        self.sub = context.socket(zmq.SUB)
        self.sub.connect(f"tcp://127.0.0.1:{port}")
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.replay_port = replay_port
        self.batches: list[Batch] = []  # by sequence: batches[i] is sequence i
        self.topics: set[bytes] = set()

    def receive(self) -> None:
        """Wait for the next batch: live, with whatever came before it fetched from the replay
        socket; or, while nothing arrives live (a subscription not yet in effect), replayed."""
        deadline = time.monotonic() + RECEIVE_TIMEOUT_S
        while not self.sub.poll(200):
            missed = replay(self.replay_port, len(self.batches))
            if missed:
                self.batches += [DECODER.decode(payload) for _, payload in missed]
                return
            assert time.monotonic() < deadline, "no KV-cache event batch arrived"
        topic, sequence, payload = self.sub.recv_multipart()
        self.topics.add(topic)
        sequence = int.from_bytes(sequence, "big")
        if sequence > len(self.batches):
            for missed_sequence, missed_payload in replay(self.replay_port, len(self.batches)):
                if missed_sequence < sequence:
                    self.batches.append(DECODER.decode(missed_payload))
        if sequence == len(self.batches):
            self.batches.append(DECODER.decode(payload))

    def events_until(self, done) -> list:
        while not done(events := [e for b in self.batches for e in b.events]):
            self.receive()
        return events

    def close(self) -> None:
        self.sub.close(linger=0)


def replay(port: int, start: int) -> list[tuple[int, bytes]]:
    """Ask the ROUTER replay socket for every kept batch from ``start``: (sequence, payload)."""
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.connect(f"tcp://127.0.0.1:{port}")
    try:
        client.send_multipart((b"", start.to_bytes(8, "big")))
        got = []
        while True:
            assert client.poll(RECEIVE_TIMEOUT_S * 1000), "the replay socket did not answer"
            empty, sequence, payload = client.recv_multipart()
            assert empty == b""
            sequence = int.from_bytes(sequence, "big", signed=True)
            if sequence == -1:
                assert payload == b""
                return got
            got.append((sequence, payload))
    finally:
        client.close(linger=0)


def replay_until(port: int, done) -> list[Batch]:
    """The kept batches, once ``done(their events)``: the publisher thread sends on its own time."""
    deadline = time.monotonic() + RECEIVE_TIMEOUT_S
    while True:
        batches = [DECODER.decode(payload) for _, payload in replay(port, 0)]
        if done([e for b in batches for e in b.events]):
            return batches
        assert time.monotonic() < deadline, "the batches were not sent"


def events_config(port: int, replay_port: int, **extra) -> dict:
    return {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        **extra,
    }


def stored_blocks(events: list) -> list[tuple[int, int | None, list[int]]]:
    """(hash, parent hash, tokens) of every stored block, in the order they were stored."""
    blocks = []
    for event in events:
        if isinstance(event, Stored):
            parents = [event.parent_block_hash, *event.block_hashes[:-1]]
            for i, (block_hash, parent) in enumerate(zip(event.block_hashes, parents, strict=True)):
                tokens = event.token_ids[i * event.block_size : (i + 1) * event.block_size]
                blocks.append((block_hash, parent, tokens))
    return blocks


# -- the engine ------------------------------------------------------------------------------


@pytest.fixture
def ports():
    """(PUB port, replay port), each with the next port free for a second rank."""
    first = free_ports(4)
    return first, first + 2


def _llm(model: str, kv_events: dict, **overrides) -> LLM:
    settings = dict(
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=12,
        max_model_len=64,
        enforce_eager=True,
        seed=0,
        kv_events_config=kv_events,
    )
    return LLM(model, **(settings | overrides))


def test_a_request_s_blocks_arrive_in_order_then_evictions_then_a_reset(tiny_llama, ports):
    port, replay_port = ports
    llm = _llm(tiny_llama, events_config(port, replay_port, topic="kv@pod@tiny"))
    subscriber = Subscriber(port, replay_port, topic=b"kv@")
    try:
        params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
        prompt = list(range(10, 35))  # 25 tokens: 3 full blocks, then a 4th filled by sampling
        (output,) = llm.generate([{"prompt_token_ids": prompt}], params)
        tokens = prompt + list(output.outputs[0].token_ids)
        events = subscriber.events_until(lambda e: len(stored_blocks(e)) >= 3)
        blocks = stored_blocks(events)
        # in order, each chained on the one before, each with its own tokens
        assert [b[2] for b in blocks[:3]] == [tokens[i : i + BLOCK_SIZE] for i in (0, 8, 16)]
        assert blocks[0][1] is None
        assert [b[1] for b in blocks[1:3]] == [b[0] for b in blocks[:2]]
        first = next(e for e in events if isinstance(e, Stored))
        assert (first.block_size, first.medium, first.lora_id, first.group_idx) == (
            BLOCK_SIZE,
            "GPU",
            None,
            None,  # not sent for a model without a sliding window: llm-d refuses more fields
        )
        assert all(0 <= h < 2**64 for b in blocks for h in b[:1])
        assert all(b.data_parallel_rank == 0 for b in subscriber.batches)

        # 12 blocks: the third prompt takes freed cached ones back, the first request's first
        for start in (100, 200, 300):
            llm.generate([{"prompt_token_ids": list(range(start, start + 40))}], params)
        events = subscriber.events_until(lambda e: any(isinstance(x, Removed) for x in e))
        removed = [h for e in events if isinstance(e, Removed) for h in e.block_hashes]
        assert removed[0] in {b[0] for b in blocks[:3]}
        assert set(removed) <= {b[0] for b in stored_blocks(events)}

        core = llm.llm_engine.engine_core

        def resets() -> int:
            return sum(b.events == [Cleared()] for b in subscriber.batches)

        while True:  # a reset publishes at once; again until one batch came live, not replayed
            before = resets()
            assert core.reset_prefix_cache() is True
            while resets() == before:
                subscriber.receive()
            assert subscriber.batches[-1].events == [Cleared()]  # the last batch sent
            if subscriber.topics:
                break
        assert subscriber.topics == {b"kv@pod@tiny"}
    finally:
        subscriber.close()
        llm.llm_engine.engine_core.shutdown()


def test_a_prompt_s_blocks_go_out_before_the_forward_that_fills_them(tiny_llama, ports):
    # As vLLM's scheduler publishes: a router hears of a prefix when the engine schedules its
    # prefill, not a prefill later.
    port, replay_port = ports
    llm = _llm(tiny_llama, events_config(port, replay_port))
    subscriber = Subscriber(port, replay_port)
    core = llm.llm_engine.engine_core
    execute_model = core.executor.execute_model
    seen_before_forward: list[list] = []

    def execute_after_looking(scheduler_output, *args, **kwargs):
        if not seen_before_forward:  # the prefill: its blocks must already be out
            seen_before_forward.append(
                stored_blocks(subscriber.events_until(lambda e: len(stored_blocks(e)) >= 3))
            )
        return execute_model(scheduler_output, *args, **kwargs)

    core.executor.execute_model = execute_after_looking
    try:
        params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        prompt = list(range(40, 65))  # 25 tokens: 3 full blocks
        llm.generate([{"prompt_token_ids": prompt}], params)
        (blocks,) = seen_before_forward
        assert [b[2] for b in blocks[:3]] == [prompt[i : i + BLOCK_SIZE] for i in (0, 8, 16)]
    finally:
        subscriber.close()
        core.shutdown()


def test_a_late_subscriber_replays_what_it_missed_and_sleep_clears(tiny_llama, ports):
    port, replay_port = ports
    llm = _llm(
        tiny_llama, events_config(port, replay_port, buffer_steps=1000), enable_sleep_mode=True
    )
    core = llm.llm_engine.engine_core
    try:
        params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        llm.generate([{"prompt_token_ids": list(range(1, 26))}], params)
        # nobody listened: the batches are kept for replay, from sequence 0
        kept = replay_until(replay_port, lambda events: len(stored_blocks(events)) == 3)
        assert [s for s, _ in replay(replay_port, 1)] == list(range(1, len(kept)))
        blocks = stored_blocks([e for b in kept for e in b.events])
        assert [b[2] for b in blocks[:3]] == [list(range(i, i + 8)) for i in (1, 9, 17)]

        subscriber = Subscriber(port, replay_port)
        try:
            core.sleep(1)  # frees the KV cache: every cached block is gone
            events = subscriber.events_until(lambda e: e and isinstance(e[-1], Cleared))
            assert stored_blocks(events) == blocks  # the missed batches came back in order
        finally:
            subscriber.close()
    finally:
        core.shutdown()


def test_a_subscriber_that_never_reads_holds_no_step_up(tiny_llama, ports):
    port, replay_port = ports
    config = events_config(port, replay_port, hwm=1, buffer_steps=100_000)
    llm = _llm(tiny_llama, config, num_gpu_blocks_override=64, max_model_len=256)
    idle = zmq.Context.instance().socket(zmq.SUB)
    idle.setsockopt(zmq.RCVHWM, 1)
    idle.setsockopt(zmq.SUBSCRIBE, b"")
    idle.connect(f"tcp://127.0.0.1:{port}")
    core = llm.llm_engine.engine_core
    try:
        params = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
        (output,) = llm.generate([{"prompt_token_ids": list(range(1, 61))}], params)
        assert len(output.outputs[0].token_ids) == 120  # every step completed
        # and every block's batch went out (the last sampled token's KV is never computed)
        replay_until(replay_port, lambda events: len(stored_blocks(events)) == 179 // BLOCK_SIZE)
        assert core.kv_event_publisher.take_dropped() == 0
    finally:
        idle.close(linger=0)
        core.shutdown()


async def test_data_parallel_ranks_publish_on_consecutive_ports(tiny_llama, ports):
    port, replay_port = ports
    config = build_config(
        tiny_llama,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=32,
        block_size=BLOCK_SIZE,
        data_parallel_size=2,
        kv_events_config=events_config(port, replay_port),
    )
    engine = AsyncEngine.from_config(config, multiprocess=True)
    subscribers = [Subscriber(port + rank, replay_port + rank) for rank in (0, 1)]
    try:
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

        async def run(i: int, prompt: str):
            return [out async for out in engine.generate(prompt, params, f"req-{i}")]

        await asyncio.gather(*(run(i, p) for i, p in enumerate(SAMPLE_PROMPTS)))
        for rank, subscriber in enumerate(subscribers):
            subscriber.events_until(lambda e: len(stored_blocks(e)) >= 1)
            assert {b.data_parallel_rank for b in subscriber.batches} == {rank}
    finally:
        for subscriber in subscribers:
            subscriber.close()
        await engine.shutdown()


# -- the publisher ---------------------------------------------------------------------------


def test_a_full_queue_drops_whole_batches_and_counts_their_events(ports):
    port, replay_port = ports
    config = KVEventsConfig(
        True, "zmq", f"tcp://*:{port}", f"tcp://*:{replay_port}", max_queue_size=1
    )
    publisher = ZmqEventPublisher(config)
    batches = 200
    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0)  # the publisher thread gets no turn while the queue is filled
    try:
        for _ in range(batches):
            publisher.record(AllBlocksCleared())
            publisher.record(AllBlocksCleared())
            publisher.flush()
    finally:
        sys.setswitchinterval(interval)
    dropped = publisher.take_dropped()
    assert dropped > 0 and dropped % 2 == 0
    # each batch either sent or counted
    sent = replay_until(replay_port, lambda events: len(events) == 2 * batches - dropped)
    assert len(sent) == batches - dropped // 2
    assert publisher.take_dropped() == 0
    publisher.shutdown()

    logger = PrometheusStatLogger("tiny", 64)
    logger.record(SchedulerStats(kv_events_dropped=dropped), None)
    (family,) = [
        f
        for f in text_string_to_metric_families(logger.exposition().decode())
        if f.name == "vllm:kv_events_dropped"
    ]
    assert [s.value for s in family.samples if s.name.endswith("_total")] == [dropped]


def test_the_wire_is_a_batch_array_of_arrays_each_led_by_its_event_s_name(ports):
    port, replay_port = ports
    publisher = ZmqEventPublisher(
        KVEventsConfig(True, "zmq", f"tcp://*:{port}", f"tcp://*:{replay_port}"), 0
    )
    try:
        publisher.record(BlockStored([2**64 - 1], None, [1, 2], 2, None, "GPU"))
        publisher.record(BlockStored([5], 7, [3, 4], 2, 1, "GPU", "sql"))
        window = {"group_idx": 0, "kv_cache_spec_kind": "sliding_window"}
        publisher.record(BlockStored([6], None, [5, 6], 2, None, "GPU", **window))
        publisher.record(BlockRemoved([5], "GPU"))
        publisher.record(AllBlocksCleared())
        publisher.flush()
        replay_until(replay_port, lambda events: bool(events))
        ((sequence, payload),) = replay(replay_port, 0)
        ts, events, rank = msgspec.msgpack.decode(payload)
        assert (sequence, rank) == (0, 0) and isinstance(ts, float)
        # Each event's fields after its name are exactly what llm-d's indexer (v0.4.0) decodes
        # (6 for BlockStored, 2 for BlockRemoved); a later one goes out only when it is set.
        assert events == [
            ["BlockStored", [2**64 - 1], None, [1, 2], 2, None, "GPU"],
            ["BlockStored", [5], 7, [3, 4], 2, 1, "GPU", "sql"],
            ["BlockStored", [6], None, [5, 6], 2, None, "GPU", None, None, 0, "sliding_window"],
            ["BlockRemoved", [5], "GPU"],
            ["AllBlocksCleared"],
        ]
    finally:
        publisher.shutdown()


# -- the configuration -----------------------------------------------------------------------


def test_the_config_takes_vllm_s_keys_and_defaults():
    assert kv_events_config(None) is None
    on = kv_events_config({"enable_kv_cache_events": True})
    assert on == KVEventsConfig(enable_kv_cache_events=True, publisher="zmq")
    assert on.endpoint == "tcp://*:5557" and on.buffer_steps == 10_000 and on.publishes
    assert kv_events_config({"publisher": "zmq"}).publishes is False  # not enabled: nothing
    assert (
        kv_events_config({"enable_kv_cache_events": True, "publisher": "null"}).publishes is False
    )
    with pytest.raises(ConfigError, match="unknown key"):
        kv_events_config({"enable_kv_cache_events": True, "port": 5557})
    with pytest.raises(ValueError, match="hwm"):
        kv_events_config({"enable_kv_cache_events": True, "hwm": -1})
    with pytest.raises(ValueError, match="tcp://"):
        kv_events_config({"enable_kv_cache_events": True, "endpoint": "ipc:///tmp/kv"}, 2)
    assert set(KEY_SUPPORT["kv_events_config.publisher"].values) == set(PUBLISHERS)


def test_hashes_go_out_as_integers_only():
    # vLLM's default, which the indexers key on; raw digests (0) are refused at startup
    config = build_config("m", kv_events_config={"enable_kv_cache_events": True})
    assert not check_support(config, {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1"}).errors
    (error,) = check_support(config, {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"}).errors
    assert "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES" in error


def test_each_rank_offsets_its_endpoint_and_binds_as_vllm_decides():
    assert rank_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert rank_endpoint("tcp://*:5557", 3) == "tcp://*:5560"
    assert rank_endpoint("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    assert rank_endpoint("inproc://kv", 2) == "inproc://kv_dp2"
    assert rank_endpoint(None, 1) is None
    assert binds("tcp://*:5557") and binds("tcp://[::]:5557") and binds("ipc:///tmp/kv")
    assert binds("inproc://kv") and not binds("tcp://collector:5557")
