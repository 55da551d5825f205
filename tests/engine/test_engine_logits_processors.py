"""``--logits-processors``: user classes in vLLM V1's LogitsProcessor shape, loaded by name,
told of every change to the batch and applied to each step's logits, with per-request arguments
(``extra_args``, ``vllm_xargs`` over HTTP) they may refuse."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import httpx
import pytest
import torch
from infernetes.runtime.engine.async_engine import AsyncEngine
from infernetes.runtime.logits_processor import load_logits_processor_classes
from infernetes.runtime.server.api_server import build_app
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.state import ServerState
from infernetes.runtime.testing import SAMPLE_PROMPTS
from infernetes.runtime.worker.logits_processor_batch import LogitsProcessorBatch
from infernetes.runtime.worker.request_state import CachedRequestState

from infernetes import LLM, SamplingParams
from infernetes.schema.config import build_config

# The plugin modules beside this file import by name, here and in the spawned engine core.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from logits_processor_plugins import ForceToken

FORCE = "logits_processor_plugins:ForceToken"
VOCAB = 50


def _state(request_id: str, force: int | None) -> CachedRequestState:
    params = SamplingParams(extra_args={"force": force} if force is not None else None)
    return CachedRequestState(request_id, [1, 2, 3], 3, params, None, -1, 3)


def test_batch_rows_follow_requests_through_any_churn():
    """Whatever joins, leaves or reorders between steps, each request's row gets its own
    forcing: the updates describe a persistent batch the processor can follow."""
    rng = random.Random(0)
    batch = LogitsProcessorBatch([ForceToken(None, torch.device("cpu"), False)])
    running: list[CachedRequestState] = []
    for step in range(300):
        running = [r for r in running if rng.random() > 0.3]
        for n in range(rng.randint(0, 3)):
            force = rng.choice([None, rng.randrange(VOCAB)])
            running.append(_state(f"r{step}-{n}", force))
        rng.shuffle(running)
        logits = torch.randn(len(running), VOCAB)
        out = batch.apply(logits.clone(), running)
        for row, request in enumerate(running):
            force = (request.sampling_params.extra_args or {}).get("force")
            if force is None:
                assert torch.equal(out[row], logits[row])
            else:
                assert out[row].argmax() == force and out[row].isinf().sum() == VOCAB - 1
        assert len(batch.rows) == len(running)


def test_output_ids_given_at_admission_grow_with_the_request():
    batch = LogitsProcessorBatch(load_logits_processor_classes(["logits_processor_plugins.RowLog"]))
    batch.processors = [cls(None, torch.device("cpu"), False) for cls in batch.processors]
    request = _state("a", None)
    batch.apply(torch.zeros(1, VOCAB), [request])
    output = batch.processors[0].outputs[0]
    request.token_ids += [7, 8]
    assert list(output) == [7, 8] and len(output) == 2 and output[-1] == 8


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("vllm_logits_processor_plugin:LogitsProcessor", "vLLM is not part of this server"),
        ("logits_processor_plugins:NotAProcessor", "is not a logits processor class"),
        ("no_such_module_here.Processor", "cannot import module 'no_such_module_here'"),
        ("logits_processor_plugins.Missing", "has no attribute 'Missing'"),
        ("Processor", "expected 'module.attribute'"),
    ],
)
def test_bad_names_are_refused_with_the_reason(name, message):
    with pytest.raises(ValueError, match=f"--logits-processors {name!r}.*{message}"):
        load_logits_processor_classes([name])


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(
        tiny_llama,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=96,
        block_size=8,
        seed=0,
        logits_processors=[FORCE],
    )


def test_each_request_is_forced_by_its_own_arguments(llm):
    plain = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    alone = llm.generate(SAMPLE_PROMPTS[0], plain)[0].outputs[0].token_ids
    prompts, params = [], []
    for i, force in enumerate([11, None, 23, 5, None, 31]):
        prompts.append(SAMPLE_PROMPTS[0])
        params.append(
            SamplingParams(
                temperature=0.0 if i % 2 else 0.8,
                max_tokens=3 + 2 * i,  # requests finish at different steps: rows move
                ignore_eos=True,
                extra_args={"force": force} if force is not None else None,
            )
        )
    outputs = llm.generate(prompts, params)
    for output, force, p in zip(outputs, [11, None, 23, 5, None, 31], params, strict=True):
        tokens = output.outputs[0].token_ids
        assert len(tokens) == p.max_tokens
        if force is not None:
            assert tokens == [force] * p.max_tokens
    # A greedy request without arguments is the model's own, batch or not.
    assert outputs[1].outputs[0].token_ids[:6] == alone[: len(outputs[1].outputs[0].token_ids)]


def test_the_offline_llm_takes_the_class_itself(tiny_llama):
    llm = LLM(tiny_llama, max_model_len=128, logits_processors=[ForceToken])
    params = SamplingParams(max_tokens=3, ignore_eos=True, extra_args={"force": 4})
    assert llm.generate(SAMPLE_PROMPTS[0], params)[0].outputs[0].token_ids == [4, 4, 4]


def test_a_request_the_processor_refuses_is_refused(llm):
    params = SamplingParams(max_tokens=2, extra_args={"force": "x"})
    with pytest.raises(ValueError, match="force must be a token id"):
        llm.generate(SAMPLE_PROMPTS[0], params)


async def test_vllm_xargs_reach_the_processors_over_http(tiny_llama):
    engine = AsyncEngine.from_config(
        build_config(tiny_llama, max_model_len=128, seed=0, logits_processors=[FORCE])
    )
    state = ServerState(FrontendSettings(model="tiny", served_model_names=("tiny",)))
    state.attach_engine(engine)
    body = {
        "model": "tiny",
        "prompt": "Hello",
        "max_tokens": 4,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=build_app(state)), base_url="http://t"
        ) as http:
            forced = await http.post("/v1/completions", json={**body, "vllm_xargs": {"force": 9}})
            assert forced.json()["choices"][0]["logprobs"]["tokens"] == ["token_id:9"] * 4
            # kv_transfer_params share extra_args with the processors' arguments, losing neither
            both = await http.post(
                "/v1/completions",
                json={**body, "vllm_xargs": {"force": 7}, "kv_transfer_params": {"x": 1}},
            )
            assert both.json()["choices"][0]["logprobs"]["tokens"] == ["token_id:7"] * 4
            refused = await http.post(
                "/v1/completions", json={**body, "vllm_xargs": {"force": "nine"}}
            )
            assert refused.status_code == 400
            error = refused.json()["error"]
            assert error["param"] == "vllm_xargs" and "force must be a token id" in error["message"]
    finally:
        await engine.shutdown()


def test_speculative_decoding_is_refused_with_the_reason(tiny_llama):
    """As vLLM refuses it (its reason, word for word but the capital)."""
    reason = "custom logits processors are not supported when speculative decoding is enabled"
    with pytest.raises(ValueError, match=f"cannot be combined with --speculative-config.*{reason}"):
        LLM(
            tiny_llama,
            max_model_len=128,
            logits_processors=[FORCE],
            speculative_config={"method": "ngram", "num_speculative_tokens": 2},
        )
