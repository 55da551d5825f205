"""Structured output through llguidance, compiled in the engine core only.

The core's ``StructuredOutputManager`` compiles a request's constraint once and fills each step's
bitmask; the sampler masks the logits by it. Random logits stay inside the grammar; a bad
constraint is a RequestError naming the field. End to end under ``-tp 2`` (a worker process per
rank, gloo) and ``-pp 2`` (steps in flight): each request is compiled once, in the core; the
workers never import llguidance nor open a tokenizer file; the outputs satisfy their constraints
and equal one rank's, and ``--async-scheduling``'s equal the synchronous engine's."""

from __future__ import annotations

import json
import os
import re
import textwrap

import llguidance
import pytest
import torch
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.engine.llm_engine import LLMEngine
from infernetes.runtime.engine.request import Request
from infernetes.runtime.engine.scheduler_output import CachedRequestData, SchedulerOutput
from infernetes.runtime.engine.structured_output import StructuredOutputManager
from infernetes.runtime.model_executor.sampler import apply_grammar_bitmask
from infernetes.runtime.sampling_params import SamplingParams, StructuredOutputsParams
from infernetes.runtime.testing import build_tokenizer

from infernetes.schema.config import build_config

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "n"],
    "additionalProperties": False,
}


def _is_answer(text: str) -> bool:
    value = json.loads(text)
    return set(value) == {"answer", "n"} and value["answer"] in ("yes", "no") and value["n"] < 10


REGEX = r"[0-9]{3}-(ok|ko)"
CHOICES = ["Paris", "London", "Rome"]
CONSTRAINTS = [
    (StructuredOutputsParams("json", SCHEMA, "guided_json", compact=True), _is_answer),
    # compact: a greedy tiny model loops on the whitespace free JSON allows
    (StructuredOutputsParams("json", json.dumps(SCHEMA), "guided_json", compact=True), _is_answer),
    (StructuredOutputsParams("regex", REGEX, "guided_regex"), lambda s: re.fullmatch(REGEX, s)),
    (StructuredOutputsParams("choice", CHOICES, "guided_choice"), lambda s: s in CHOICES),
    (
        StructuredOutputsParams("grammar", 'root ::= "yes" | "no" | "maybe"', "guided_grammar"),
        lambda s: s in ("yes", "no", "maybe"),
    ),
    (
        StructuredOutputsParams("grammar", 'start: "a" ("b" | "c")', "guided_grammar"),
        lambda s: s in ("ab", "ac"),
    ),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def _random_walk(manager, constraint, tokenizer, vocab, seed, limit=80) -> tuple[str, bool]:
    """Random logits masked step by step, as the core and the sampler do; (text, ended)."""
    request = Request("r", [1], SamplingParams())
    request.grammar = manager.compile(constraint)
    step = SchedulerOutput()
    step.add(CachedRequestData("r", [], 0), 1)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(limit):
        bitmask = manager.grammar_bitmask(step, {"r": request})
        logits = apply_grammar_bitmask(torch.randn(1, vocab, generator=generator), bitmask)
        token = int(torch.argmax(logits))
        if token == tokenizer.eos_token_id:
            return tokenizer.decode(request.output_token_ids), True
        request.append_token(token)
    return tokenizer.decode(request.output_token_ids), False


BACKENDS = ["guidance", "xgrammar", "auto"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("constraint", "check"), CONSTRAINTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_logits_stay_inside_the_constraint(tokenizer, constraint, check, seed, backend):
    vocab = len(tokenizer) + 7  # models often pad the vocabulary
    text, ended = _random_walk(
        StructuredOutputManager(tokenizer, vocab, backend), constraint, tokenizer, vocab, seed
    )
    assert ended, text
    assert check(text), text


@pytest.mark.parametrize("backend", BACKENDS)
def test_json_object_is_an_object(tokenizer, backend):
    vocab = len(tokenizer)
    constraint = StructuredOutputsParams("json_object", None, "response_format")
    text, _ = _random_walk(
        StructuredOutputManager(tokenizer, vocab, backend), constraint, tokenizer, vocab, 0, 12
    )
    assert text.lstrip().startswith("{")


@pytest.mark.parametrize(
    ("constraint", "param"),
    [
        (StructuredOutputsParams("json", "{not json", "guided_json"), "guided_json"),
        (
            StructuredOutputsParams("json", [1, 2], "response_format.json_schema.schema"),
            "response_format.json_schema.schema",
        ),
        (StructuredOutputsParams("regex", "(", "guided_regex"), "guided_regex"),
        (StructuredOutputsParams("grammar", "root ::::", "guided_grammar"), "guided_grammar"),
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_constraints_name_the_field(tokenizer, constraint, param, backend):
    with pytest.raises(RequestError) as info:
        StructuredOutputManager(tokenizer, len(tokenizer), backend).compile(constraint)
    assert info.value.param == param and param in str(info.value)


# -- end to end ----------------------------------------------------------------------------------

PROMPTS = [[1, 5, 9, 200, 17], [1, 77, 4, 150, 6, 8], [1, 300, 12]]
ENGINE = {"dtype": "float32", "max_model_len": 128, "block_size": 8}
GUIDANCE = {"backend": "guidance"}  # the test below counts llguidance's compiles

# Loaded by the worker processes (PYTHONPATH): logs each import of llguidance and each file a
# tokenizer loader opens, so a worker that compiles a grammar or loads a tokenizer shows up.
AUDIT = """
import os, sys

def _audit(event, args):
    name = args[0] if args and isinstance(args[0], str) else ""
    if (event == "import" and name.split(".")[0] == "llguidance") or (
        event == "open" and os.path.basename(name).startswith(("tokenizer", "special_tokens"))
    ):
        with open(os.environ["INFERNETES_TEST_AUDIT_LOG"], "a") as log:
            log.write(f"{os.getpid()} {event} {name}\\n")

sys.addaudithook(_audit)
"""


class CountingMatcher:
    """``llguidance.LLMatcher`` counting its constructions (the compiles) in this process."""

    def __init__(self) -> None:
        self.real = llguidance.LLMatcher
        self.made = 0

    def __call__(self, *args, **kwargs):
        self.made += 1
        return self.real(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.real, name)


def _run(engine: LLMEngine, n: int = 1) -> list[tuple[str, list[int], str]]:
    """Every constraint on every prompt, greedy, all at once: (text, tokens, finish reason)."""
    for c, (constraint, _) in enumerate(CONSTRAINTS):
        params = SamplingParams(temperature=0.0, max_tokens=40, n=n, structured_outputs=constraint)
        for p, prompt in enumerate(PROMPTS):
            engine.add_request(f"{c}-{p}", prompt, params)
    results = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                results[output.request_id] = [
                    (o.text, list(o.token_ids), o.finish_reason) for o in output.outputs
                ]
    return [item for key in sorted(results) for item in results[key]]


def _check(results) -> None:
    for i, (text, _, finish_reason) in enumerate(results):
        check = CONSTRAINTS[i // (len(results) // len(CONSTRAINTS))][1]
        assert finish_reason == "stop" and check(text), (i, text)


@pytest.mark.slow  # a worker process per rank
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])  # pp: steps in flight
def test_ranks_compile_nothing_and_match_one_rank(tiny_llama, tmp_path, monkeypatch, tp, pp):
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(AUDIT))
    log = tmp_path / "audit.log"
    log.touch()
    monkeypatch.setenv("INFERNETES_TEST_AUDIT_LOG", str(log))
    # (an empty entry would be the working directory, whose operator/ shadows the stdlib's)
    paths = [str(tmp_path), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    matcher = CountingMatcher()
    monkeypatch.setattr(llguidance, "LLMatcher", matcher)

    config = build_config(
        tiny_llama,
        device="cpu",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        structured_outputs_config=GUIDANCE,
        **ENGINE,
    )
    engine = LLMEngine(config)
    try:
        started = log.read_text()
        parallel = _run(engine, n=2)
        assert log.read_text() == started == "", "a worker imported llguidance or a tokenizer"
    finally:
        engine.shutdown()
    requests = len(CONSTRAINTS) * len(PROMPTS)
    assert matcher.made == requests  # once per request, n=2 sequences or not

    single = _run(
        LLMEngine(
            build_config(tiny_llama, device="cpu", structured_outputs_config=GUIDANCE, **ENGINE)
        ),
        n=2,
    )
    _check(parallel)
    assert parallel == single


@pytest.mark.slow
def test_async_scheduling_outputs_follow_the_constraints(tiny_llama):
    expected = _run(LLMEngine(build_config(tiny_llama, device="cpu", **ENGINE)))
    engine = LLMEngine(build_config(tiny_llama, device="cpu", async_scheduling=True, **ENGINE))
    got = _run(engine)
    _check(got)
    assert got == expected


CASE_INSENSITIVE = StructuredOutputsParams("regex", "(?i)yes", "guided_regex")  # not xgrammar's


def test_auto_falls_back_to_guidance_for_what_xgrammar_cannot_take(tokenizer):
    vocab = len(tokenizer)
    with pytest.raises(RequestError, match="guided_regex"):
        StructuredOutputManager(tokenizer, vocab, "xgrammar").compile(CASE_INSENSITIVE)
    text, ended = _random_walk(
        StructuredOutputManager(tokenizer, vocab, "auto"), CASE_INSENSITIVE, tokenizer, vocab, 0
    )
    assert ended and text.lower() == "yes", text
    with pytest.raises(RequestError, match="guided_regex"):
        StructuredOutputManager(tokenizer, vocab, "auto", fallback=False).compile(CASE_INSENSITIVE)


def test_schemas_xgrammar_would_not_enforce_go_to_guidance_under_auto(tokenizer):
    schema = {"type": "integer", "minimum": 1, "maximum": 99, "multipleOf": 7}
    constraint = StructuredOutputsParams("json", schema, "guided_json")
    vocab = len(tokenizer)
    with pytest.raises(RequestError, match="does not enforce multipleOf"):
        StructuredOutputManager(tokenizer, vocab, "xgrammar").compile(constraint)
    for seed in range(3):
        text, ended = _random_walk(
            StructuredOutputManager(tokenizer, vocab, "auto"), constraint, tokenizer, vocab, seed
        )
        assert ended and int(text) % 7 == 0, text


def test_vllm_xgrammar_cache_mb_bounds_the_compiled_grammar_cache(tokenizer, monkeypatch):
    from infernetes.runtime.engine.xgrammar_backend import XgrammarCompiler

    monkeypatch.setenv("VLLM_XGRAMMAR_CACHE_MB", "3")
    assert XgrammarCompiler(tokenizer, len(tokenizer)).compiler.cache_limit_bytes == 3 * 2**20


def test_the_xgrammar_backend_runs_the_engine(tiny_llama):
    # One engine, one backend: greedy outputs of every constraint, n=2, stay inside it.
    structured = {"backend": "xgrammar", "disable_any_whitespace": True}
    engine = LLMEngine(
        build_config(tiny_llama, device="cpu", structured_outputs_config=structured, **ENGINE)
    )
    try:
        assert engine.engine_core.structured_output.backend == "xgrammar"
        _check(_run(engine, n=2))
    finally:
        engine.shutdown()
