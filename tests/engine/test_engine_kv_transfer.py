"""The KV connector seam (``runtime/kv_transfer/``): the recording connector sees every call in
order and changes no token; tokens a connector brings count as computed, now or after a remote
load; blocks a connector still sends stay held until a worker reports them sent."""

from __future__ import annotations

import pytest
from infernetes.runtime.config import SchedulerConfig
from infernetes.runtime.engine.block_manager import BlockManager
from infernetes.runtime.engine.engine_config import resolve_config
from infernetes.runtime.engine.request import Request, RequestStatus
from infernetes.runtime.engine.scheduler import Scheduler
from infernetes.runtime.engine.scheduler_output import NewRequestData
from infernetes.runtime.kv_transfer.base import KVConnectorOutput, KVConnectorRole
from infernetes.runtime.kv_transfer.recording import RecordedStep, RecordingConnector
from infernetes.runtime.kv_transfer.registry import CONNECTORS
from infernetes.runtime.llm import LLM
from infernetes.runtime.sampling_params import SamplingParams

from infernetes.schema.config import build_config
from infernetes.schema.support import KEY_SUPPORT
from infernetes.schema.support_check import refuse_unsupported

BLOCK_SIZE = 16
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
RECORDING = {"kv_connector": "RecordingConnector", "kv_role": "kv_both"}
SHARED = [5, 17, 33, 2, 8, 41, 9, 12, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69]  # a block and more


def _llm(model: str, **kwargs) -> LLM:
    return LLM(model, num_gpu_blocks_override=32, max_model_len=128, seed=0, **kwargs)


def _blocks(num_tokens: int) -> int:
    return -(-num_tokens // BLOCK_SIZE)


def test_the_recording_connector_sees_each_call_in_order_and_changes_no_token(tiny_llama):
    prompts = [[*SHARED, 70, 71, 72], [*SHARED, 80, 81]]
    params = SamplingParams(temperature=0.0, max_tokens=5)
    plain = _llm(tiny_llama)
    wanted = [
        plain.generate([{"prompt_token_ids": p}], params)[0].outputs[0].token_ids for p in prompts
    ]
    llm = _llm(tiny_llama, kv_transfer_config=RECORDING)
    core = llm.llm_engine.engine_core
    assert core.config.decode_graphs is None  # a graph would not replay the per-layer calls
    # One request at a time: the second finds the first's full block in the prefix cache.
    got = [llm.generate([{"prompt_token_ids": p}], params)[0].outputs[0].token_ids for p in prompts]
    assert got == wanted

    scheduler_side = core.scheduler.connector
    runner = core.executor.driver_worker.model_runner
    worker_side = runner.kv_connector
    assert scheduler_side.role is KVConnectorRole.SCHEDULER
    assert worker_side.role is KVConnectorRole.WORKER
    layers = [a.layer_name for a in runner.attention_layers]
    assert len(set(layers)) == len(layers) > 1 and all(layers)

    # Scheduler side: per request, asked with its prefix-cache hit, told its blocks, then each
    # step's metadata, then its end with all of its blocks.
    calls = scheduler_side.calls
    first, second = (c[1] for c in calls if c[0] == "get_num_new_matched_tokens")
    assert [c[2] for c in calls if c[0] == "get_num_new_matched_tokens"] == [0, BLOCK_SIZE]
    for request_id, prompt in zip((first, second), prompts, strict=True):
        asked = next(
            i for i, c in enumerate(calls) if c[:2] == ("get_num_new_matched_tokens", request_id)
        )
        alloc = calls[asked + 1]
        assert alloc[:2] == ("update_state_after_alloc", request_id) and alloc[3] == 0
        assert len(alloc[2]) == _blocks(len(prompt))
        assert calls[asked + 2][0] == "build_connector_meta"
        num_cached = calls[asked][2]
        assert calls[asked + 2][1].num_scheduled_tokens == {request_id: len(prompt) - num_cached}
        (finished,) = [c for c in calls if c[:2] == ("request_finished", request_id)]
        # its last token is sampled, never computed
        assert finished[2][: len(alloc[2])] == alloc[2]
        assert len(finished[2]) == _blocks(len(prompt) + params.max_tokens - 1)
    steps = [c[1] for c in calls if c[0] == "build_connector_meta"]
    assert len(steps) == 2 * params.max_tokens

    # Worker side: caches by layer name; each step loads, runs every layer (wait, then save this
    # step's tokens), waits for the saves, and reports; ended requests are passed on.
    wcalls = worker_side.calls
    assert wcalls[0] == ("register_kv_caches", layers)
    per_step = 1 + 2 * len(layers) + 2
    assert len(wcalls) == 1 + per_step * len(steps)
    for i, step in enumerate(steps):
        chunk = wcalls[1 + i * per_step : 1 + (i + 1) * per_step]
        assert chunk[0] == ("start_load_kv", step)
        num_tokens = sum(step.num_scheduled_tokens.values())
        for j, layer in enumerate(layers):
            assert chunk[1 + 2 * j] == ("wait_for_layer_load", layer)
            assert chunk[2 + 2 * j] == ("save_kv_layer", layer, num_tokens)
        assert chunk[-2] == ("wait_for_save",)
        assert chunk[-1][0] == "get_finished"
    reported = [c[1] for c in wcalls if c[0] == "get_finished"]
    assert reported[params.max_tokens] == {first}  # the second request's first step says so


class _SendsAfterAStep(RecordingConnector):
    """Keeps a finished request's blocks; a worker reports them sent a step after it learns the
    request ended."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.learnt: set[str] = set()

    def request_finished(self, request, block_ids):
        super().request_finished(request, block_ids)
        return True, {"remote_block_ids": list(block_ids)}

    def get_finished(self, finished_req_ids):
        super().get_finished(finished_req_ids)
        sent, self.learnt = self.learnt, set(finished_req_ids)
        return sent, set()


def test_blocks_a_connector_sends_stay_held_until_a_worker_reports_them_sent(
    tiny_llama, monkeypatch
):
    monkeypatch.setitem(CONNECTORS, "RecordingConnector", _SendsAfterAStep)
    engine = _llm(tiny_llama, kv_transfer_config=RECORDING).llm_engine
    core = engine.engine_core
    manager = core.block_manager
    prompt = [*SHARED, 70, 71, 72]
    engine.add_request("a", prompt, SamplingParams(max_tokens=3))
    while not any(output.finished for output in core.step()):
        pass
    request = core.scheduler.sending["a"]
    held = _blocks(len(prompt) + 2)
    assert request.kv_transfer_params == {"remote_block_ids": request.block_ids}
    assert len(request.block_ids) == held
    assert manager.num_free_blocks == manager.num_blocks - held
    assert core.has_unfinished_requests()  # steps go on, with nothing to compute, until sent
    assert core.step() == []  # the worker learns that "a" ended
    assert manager.num_free_blocks == manager.num_blocks - held
    assert core.step() == []  # and reports it sent
    assert manager.num_free_blocks == manager.num_blocks
    assert not core.scheduler.sending and not core.has_unfinished_requests()


class _BringsTokens(RecordingConnector):
    """Brings the tokens ``matches`` says for each request id: (how many, asynchronously)."""

    def __init__(self, matches: dict[str, tuple[int, bool]]) -> None:
        super().__init__(None, KVConnectorRole.SCHEDULER)
        self.matches = matches

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        super().get_num_new_matched_tokens(request, num_computed_tokens)
        return self.matches[request.request_id]


def _scheduler(connector: RecordingConnector) -> tuple[Scheduler, BlockManager]:
    manager = BlockManager(num_blocks=16, block_size=4)
    limits = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    return Scheduler(limits, manager, connector=connector), manager


def _request(request_id: str) -> Request:
    """20 prompt tokens of its own (no prefix-cache hit)."""
    first = 100 + 20 * len(request_id)
    return Request(request_id, list(range(first, first + 20)), SamplingParams(max_tokens=4))


def test_tokens_a_connector_brings_count_as_computed_at_once_or_after_a_remote_load():
    connector = _BringsTokens({"now": (8, False), "later": (8, True)})
    scheduler, manager = _scheduler(connector)
    scheduler.add_request(_request("now"))
    scheduler.add_request(_request("later"))

    step = scheduler.schedule()
    (data,) = step.scheduled_reqs
    assert isinstance(data, NewRequestData) and data.request_id == "now"
    assert (data.num_computed_tokens, step.num_scheduled_tokens) == (8, [12])
    later = scheduler.waiting_for_remote_kvs["later"]
    assert later.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    # the blocks of all its tokens: back from the load, it starts without needing more
    assert len(later.block_ids) == 5 and later.num_computed_tokens == 8
    # its blocks hold nothing yet: no other request may find them
    assert not set(later.block_hashes) & set(manager.cached)
    assert ("update_state_after_alloc", "later", later.block_ids, 8) in connector.calls
    assert scheduler.num_waiting == 1 and scheduler.awaits_kv_transfer
    assert isinstance(step.kv_connector_metadata, RecordedStep)

    scheduler.abort_requests(["now"])  # (done with it)
    assert not scheduler.schedule()  # "later" still on its way: an empty step, for the workers
    scheduler.finish_kv_transfers(KVConnectorOutput(finished_recving={"later"}))
    step = scheduler.schedule()
    (data,) = [d for d in step.scheduled_reqs if d.request_id == "later"]
    assert (data.num_computed_tokens, data.block_ids[:2]) == (8, later.block_ids[:2])
    assert step.num_scheduled_tokens[step.request_ids.index("later")] == 12
    asked = [c[1] for c in connector.calls if c[0] == "get_num_new_matched_tokens"]
    assert asked == ["now", "later"]  # a request back from its load is not asked again


def test_a_request_back_from_its_load_goes_ahead_of_one_short_of_blocks():
    connector = _BringsTokens({"later": (8, True), "big": (0, False)})
    scheduler, manager = _scheduler(connector)
    scheduler.add_request(_request("later"))
    scheduler.schedule()
    scheduler.finish_kv_transfers(KVConnectorOutput(finished_recving={"later"}))
    # a request needing more blocks than are free (as a preempted one is) comes first
    big = Request("big", list(range(500, 548)), SamplingParams(max_tokens=4))  # 12 blocks
    assert manager.num_free_blocks == 11
    scheduler.requests["big"] = big
    scheduler.waiting.add_front(big)
    step = scheduler.schedule()
    assert step.request_ids == ["later"]  # else each would wait for the other's blocks
    assert scheduler.waiting.peek() is big


def test_a_request_aborted_during_its_remote_load_frees_its_blocks():
    connector = _BringsTokens({"later": (8, True)})
    scheduler, manager = _scheduler(connector)
    scheduler.add_request(_request("later"))
    scheduler.schedule()
    request = scheduler.waiting_for_remote_kvs["later"]
    held = list(request.block_ids)
    scheduler.finish_request(request, RequestStatus.FINISHED_ABORTED)
    assert manager.num_free_blocks == manager.num_blocks
    assert connector.calls[-1] == ("request_finished", "later", held)
    scheduler.finish_kv_transfers(KVConnectorOutput(finished_recving={"later"}))
    assert not scheduler.schedule() and not scheduler.has_unfinished()


def test_the_support_table_names_the_connectors_built_here():
    assert set(KEY_SUPPORT["kv_transfer_config.kv_connector"].values) == set(CONNECTORS)
    config = build_config(model="m", kv_transfer_config={"kv_connector": "LMCacheConnectorV1"})
    with pytest.raises(
        ValueError,
        match=r"kv_connector LMCacheConnectorV1.*supported: NixlConnector, OffloadingConnector",
    ):
        refuse_unsupported(config, {})


@pytest.mark.parametrize(
    ("given", "error"),
    [
        (
            {**RECORDING, "kv_ip": "10.0.0.1"},
            "kv_transfer_config has unknown key.s. kv_ip; allowed:",
        ),
        ({"kv_connector": "RecordingConnector"}, "kv_transfer_config.kv_role is required"),
        ({**RECORDING, "kv_role": "kv_sender"}, "'kv_sender' is not one of kv_producer"),
        ({**RECORDING, "kv_connector_extra_config": [1]}, "extra_config must be a JSON object"),
        (
            {**NIXL, "kv_connector_extra_config": {"backends": ["LIBFABRIC"]}},
            r"extra_config.backends \['LIBFABRIC'\]: only \['UCX'\]",
        ),
        (
            {**NIXL, "kv_connector_extra_config": {"num_threads": 4}},
            r"extra_config has unknown key.s. num_threads",
        ),
    ],
)
def test_a_bad_kv_transfer_config_names_the_key(tiny_llama, given, error):
    with pytest.raises(ValueError, match=error):
        resolve_config(build_config(model=tiny_llama, kv_transfer_config=given), {})


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"pipeline_parallel_size": 2}, "NixlConnector with --pipeline-parallel-size 2 is not"),
        ({"enable_sleep_mode": True}, "NixlConnector with --enable-sleep-mode is not supported"),
    ],
)
def test_what_the_nixl_connector_does_not_serve_is_refused(tiny_llama, overrides, error):
    config = build_config(model=tiny_llama, kv_transfer_config=NIXL, device="cpu", **overrides)
    with pytest.raises(ValueError, match=error):
        resolve_config(config, {})


def test_the_nixl_connector_gets_an_engine_id(tiny_llama):
    named, _ = resolve_config(
        build_config(model=tiny_llama, kv_transfer_config={**NIXL, "engine_id": "prefill-0"}), {}
    )
    fresh, _ = resolve_config(build_config(model=tiny_llama, kv_transfer_config=NIXL), {})
    assert named.kv_transfer is not None and fresh.kv_transfer is not None
    assert named.kv_transfer.engine_id == "prefill-0"
    assert fresh.kv_transfer.engine_id not in ("", "prefill-0")


def test_the_kv_transfer_config_reaches_the_connector(tiny_llama):
    given = {**RECORDING, "kv_role": "kv_producer", "kv_connector_extra_config": {"k": 1}}
    config, _ = resolve_config(build_config(model=tiny_llama, kv_transfer_config=given), {})
    assert config.kv_transfer is not None
    assert (config.kv_transfer.kv_role, config.kv_transfer.kv_connector_extra_config) == (
        "kv_producer",
        {"k": 1},
    )
