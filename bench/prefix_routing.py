"""Prefix-cache routing on serving pods: precise (llm-d's scheduler, fed by the pods' KV events),
approximate (the Inference Extension's picker, guessing from its own routing) and random, in one
run against the same 3 pods of one InferenceService on the local control plane (serving nodes:
cluster/README.md), each picker run on this machine with the command line the operator renders.

The workload has the shape of inference-perf's `shared_prefix`: `--groups` system prompts of
`--prefix-tokens` tokens, each asked `--questions` short questions (`--question-tokens`), in a
shuffled order, with Poisson arrivals at `--rate` requests/s; each answer is `--output-tokens`
tokens (ignore_eos). Every pod's KV cache holds `--cache-prompts` prompts, fewer than the groups:
a pod that is sent every group recomputes. Before each mode the pods' prefix caches are reset
(the engines run in dev mode for `/reset_prefix_cache`), so each mode starts cold; `--rounds`
rounds of the three, the order rotated each round, pooled per mode; both pickers run (and scrape
the pods) throughout. Reported: TTFT
p50/p90 (from the request's arrival, the pick included), output tokens/s, each pod's
prefix-cache hit rate (hits / queried tokens), and precise's TTFT p90 as a ratio of the others'.

The model is a random-weight Llama (`--hidden-size`, `--layers`) sized so that a cold prefill of
a system prompt takes a fraction of a second here (measured and printed); one torch thread per
pod, so that 2 cores carry 3 pods.

    python -m bench prefix_routing [--groups 9] [--questions 8] [--rate 3.0]

Needs root (network namespaces), Go, cargo, libzmq and Python 3.12's headers (the pickers'
builds); reuses a running `make cluster`, else starts one.

Before the rounds, `--lag-probes` requests on idle pods measure how soon llm-d's index holds a
prompt's blocks (and the picker scores them) against when its first token arrives.

The figures measured, with their commands and the machine's load: bench/results/prefix_routing.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from infernetes.runtime.server.sse_reader import asse_lines

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "cluster"))

from host_picker import (  # noqa: E402  (cluster/, put on the path above)
    HostPicker,
    build,
    local_tokenizers,
    rendered_picker_args,
    routed_service,
)
from localcluster import LocalCluster  # noqa: E402
from serving_nodes import (  # noqa: E402
    model_claim,
    pod_ready,
    serving_pods,
    serving_spec,
)

from bench._cluster import local_cluster  # noqa: E402

NAME = "prefixes"
BLOCK_SIZE = 16
REPLICAS = 3
STARTUP_TIMEOUT = 900  # three engines loading on two busy cores
# The Inference Extension's default profile, and llm-d's precise well-lit path's (its guide's
# gaie-kv-events values, with scheduler v0.5.0): both modes alike.
WEIGHTS = {"prefix": 3, "kv-cache-utilization-scorer": 2, "queue-scorer": 2}
ADMISSIONS = "kvcache_index_admissions_total"  # blocks llm-d's index has taken in
LAG_TIMEOUT = 120  # a ceiling for a loaded machine, never what is reported
LAG_POLL_S = 0.01  # between looks at the picker: a busy loop would slow the engines down


@dataclass
class Outcome:
    ttft: list[float]
    pick: list[float]  # seconds the picker took, part of the TTFT
    output_tokens: int
    seconds: float
    hit_rate: dict[str, float]  # pod name -> hits / queries


def scorers(prefix_type: str) -> list[dict[str, Any]]:
    return [
        {"type": prefix_type, "weight": WEIGHTS["prefix"]},
        {"type": "kv-cache-utilization-scorer", "weight": WEIGHTS["kv-cache-utilization-scorer"]},
        {"type": "queue-scorer", "weight": WEIGHTS["queue-scorer"]},
    ]


def make_model(directory: Path, args: argparse.Namespace) -> Path:
    from infernetes.runtime.testing import make_tiny_llama

    return make_tiny_llama(
        directory / "prefix-llama",
        hidden_size=args.hidden_size,
        intermediate_size=args.hidden_size * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden_size // 64,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )


def text_of(tokenizer: Any, rng: random.Random, tokens: int) -> str:
    """Random words cut to `tokens` tokens of this tokenizer."""
    words = " ".join(
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8)))
        for _ in range(tokens)
    )
    ids = tokenizer.encode(words, add_special_tokens=False)[:tokens]
    return str(tokenizer.decode(ids))


def workload(model_dir: Path, args: argparse.Namespace) -> list[tuple[float, str]]:
    """(arrival second, prompt) for every request: shuffled groups, Poisson arrivals."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rng = random.Random(args.seed)
    prompts = []
    for group in range(args.groups):
        system = f"System {group}. " + text_of(tokenizer, rng, args.prefix_tokens)
        for question in range(args.questions):
            asked = text_of(tokenizer, rng, args.question_tokens)
            prompts.append(f"{system}\nQuestion {question}: {asked}")
    rng.shuffle(prompts)
    arrivals, now = [], 0.0
    for prompt in prompts:
        arrivals.append((now, prompt))
        now += rng.expovariate(args.rate)
    return arrivals


def body(prompt: str, args: argparse.Namespace, stream: bool = True) -> dict[str, Any]:
    # llm-d's scheduler tokenizes the prompt without special tokens: the engine adds none either.
    return {
        "model": NAME,
        "prompt": prompt,
        "max_tokens": args.output_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
        "add_special_tokens": False,
    }


def counters(endpoint: str) -> tuple[float, float]:
    """(prefix-cache hits, queries) of the engine at `endpoint`, in tokens."""
    text = httpx.get(f"http://{endpoint}/metrics", timeout=30).text
    totals = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals["vllm:prefix_cache_hits_total"], totals["vllm:prefix_cache_queries_total"]


async def ttft_of(client: httpx.AsyncClient, endpoint: str, payload: dict[str, Any]) -> float:
    """Streams one completion; the moment its first token arrived (read to its end)."""
    async with client.stream("POST", f"http://{endpoint}/v1/completions", json=payload) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{endpoint}: {reply.status_code} {await reply.aread()!r}")
        first: float | None = None
        async for line in asse_lines(reply.aiter_text()):
            if first is None and line.startswith("data: {"):
                first = time.monotonic()
        if first is None:
            raise RuntimeError(f"{endpoint}: no token streamed")
        return first


async def run_mode(
    pick: Any, arrivals: list[tuple[float, str]], args: argparse.Namespace
) -> tuple[list[float], list[float], float]:
    """Sends every request at its arrival time to the endpoint `pick` names; (TTFTs, pick
    times, seconds)."""
    async with httpx.AsyncClient(timeout=600) as client:
        start = time.monotonic()

        async def one(at: float, prompt: str) -> tuple[float, float]:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            arrived = time.monotonic()
            payload = body(prompt, args)
            endpoint = await asyncio.to_thread(pick, payload)
            picked = time.monotonic()
            return await ttft_of(client, endpoint, payload) - arrived, picked - arrived

        timings = await asyncio.gather(*(one(at, prompt) for at, prompt in arrivals))
        ttfts, picks = [t for t, _ in timings], [p for _, p in timings]
        return ttfts, picks, time.monotonic() - start


def measure(
    pick: Any,
    endpoints: dict[str, str],
    arrivals: list[tuple[float, str]],
    args: argparse.Namespace,
) -> Outcome:
    for endpoint in endpoints.values():
        httpx.post(f"http://{endpoint}/reset_prefix_cache", timeout=60).raise_for_status()
    before = {pod: counters(endpoint) for pod, endpoint in endpoints.items()}
    ttfts, picks, seconds = asyncio.run(run_mode(pick, arrivals, args))
    after = {pod: counters(endpoint) for pod, endpoint in endpoints.items()}
    hit_rate = {
        pod: (after[pod][0] - before[pod][0]) / max(1.0, after[pod][1] - before[pod][1])
        for pod in endpoints
    }
    return Outcome(ttfts, picks, len(arrivals) * args.output_tokens, seconds, hit_rate)


def cold_prefill_seconds(
    endpoints: dict[str, str], model_dir: Path, args: argparse.Namespace
) -> float:
    """Warms every engine up (its first requests pay one-off costs), then times a request of a
    fresh system prompt alone on one of them: its prefill dominates (one output token)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rng = random.Random(-1)

    def seconds(endpoint: str) -> float:
        prompt = text_of(tokenizer, rng, args.prefix_tokens)
        payload = {**body(prompt, args, stream=False), "max_tokens": 1}
        started = time.monotonic()
        reply = httpx.post(f"http://{endpoint}/v1/completions", json=payload, timeout=600)
        reply.raise_for_status()
        return time.monotonic() - started

    for endpoint in endpoints.values():
        seconds(endpoint)
        seconds(endpoint)
    return statistics.median(seconds(next(iter(endpoints.values()))) for _ in range(3))


@dataclass
class Lag:
    """Seconds from a request's pick, on idle pods, to: its first token; llm-d's index holding
    its prompt's blocks; the precise picker sending another question on that prompt to the
    same pod (after the index has them). None: not within LAG_TIMEOUT."""

    ttft: float
    indexed: float | None
    scored: float | None


def event_lag(picker: HostPicker, model_dir: Path, args: argparse.Namespace) -> list[Lag]:
    """`--lag-probes` fresh system prompts, one at a time: the precise picker picks a pod for a
    question on each; while it is served the picker's index is polled for its blocks
    (kvcache_index_admissions_total) and asked about a second question on the same prompt."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rng = random.Random(-2)
    full_blocks = args.prefix_tokens // BLOCK_SIZE
    lags = []
    sender = ThreadPoolExecutor(1)
    for probe in range(args.lag_probes):
        system = f"Probe {probe}. " + text_of(tokenizer, rng, args.prefix_tokens)
        question, sibling = (
            body(f"{system}\nQuestion {q}: " + text_of(tokenizer, rng, args.question_tokens), args)
            for q in (0, 1)
        )
        needed = picker.metric(ADMISSIONS) + full_blocks
        started = time.monotonic()
        endpoint = picked_by(picker)(question)
        first_token = sender.submit(first_token_at, endpoint, question)
        indexed = scored = None
        deadline = started + LAG_TIMEOUT
        while indexed is None and time.monotonic() < deadline:
            if picker.metric(ADMISSIONS) >= needed:
                indexed = time.monotonic() - started
            time.sleep(LAG_POLL_S)
        while indexed is not None and scored is None and time.monotonic() < deadline:
            if picker.pick(sibling) == endpoint:
                scored = time.monotonic() - started
            time.sleep(LAG_POLL_S)
        lags.append(Lag(first_token.result() - started, indexed, scored))
    sender.shutdown()
    return lags


def first_token_at(endpoint: str, payload: dict[str, Any]) -> float:
    async def streamed() -> float:
        async with httpx.AsyncClient(timeout=600) as client:
            return await ttft_of(client, endpoint, payload)

    return asyncio.run(streamed())


def picked_by(picker: HostPicker) -> Any:
    def pick(payload: dict[str, Any]) -> str:
        endpoint = picker.pick(payload)
        if endpoint is None:
            raise RuntimeError(f"the picker gave no endpoint:\n{picker.log_tail()}")
        return endpoint

    return pick


def random_pick(choices: list[str], seed: int) -> Any:
    rng = random.Random(seed)
    return lambda _payload: rng.choice(choices)


def run_rounds(
    picks: dict[str, Any],
    endpoints: dict[str, str],
    arrivals: list[tuple[float, str]],
    args: argparse.Namespace,
) -> dict[str, Outcome]:
    """`--rounds` rounds of every mode, the order rotated each round (the load other jobs put on
    this machine moves within a run); each mode's rounds pooled."""
    modes = ["precise", "approximate", "random"]
    rounds: dict[str, list[Outcome]] = {mode: [] for mode in modes}
    for number in range(args.rounds):
        for mode in modes[number % 3 :] + modes[: number % 3]:
            rounds[mode].append(measure(picks[mode], endpoints, arrivals, args))
    return {
        mode: Outcome(
            ttft=[t for o in outcomes for t in o.ttft],
            pick=[t for o in outcomes for t in o.pick],
            output_tokens=sum(o.output_tokens for o in outcomes),
            seconds=sum(o.seconds for o in outcomes),
            hit_rate={pod: statistics.mean(o.hit_rate[pod] for o in outcomes) for pod in endpoints},
        )
        for mode, outcomes in rounds.items()
    }


def start_picker(
    binary: Path, args_: list[str], cluster: LocalCluster, ns: str, work: Path, env: dict
) -> HostPicker:
    from infernetes.operator.testing import wait_until

    picker = HostPicker(
        binary, args_, kubeconfig=cluster.kubeconfig, namespace=ns, log=work, env=env
    )
    ready = {"model": NAME, "prompt": "Hello", "max_tokens": 1}
    wait_until(lambda: picker.pick(ready), timeout=180, what=f"{binary.name} to pick")
    return picker


def approximate_args(ns: str, spec: dict[str, Any]) -> list[str]:
    """The picker arguments the operator renders with the approximate scorer instead."""
    from infernetes.operator.facts import ClusterFacts
    from infernetes.operator.render import plan

    facts = ClusterFacts.from_api_versions(["inference.networking.k8s.io/v1"])
    approximate = {**spec, "routing": {"scorers": scorers("prefix-cache-scorer")}}
    result = plan(approximate, facts, name=NAME, namespace=ns)
    (deployment,) = [
        m
        for m in result.manifests
        if m["kind"] == "Deployment" and m["metadata"]["name"] == f"{NAME}-epp"
    ]
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def with_approximate_too(picker_args: list[str]) -> list[str]:
    """The precise picker's arguments with the approximate scorer added to its profile at the
    prefix weight (llm-d's scheduler has both): an experiment (--precise-plus-approximate) on
    whether the picks approximate records at once close the gap before KV events arrive, as
    llm-d's later speculativeIndexing does. Admission refuses both scorers in a spec."""
    import yaml

    config_flag = "--config-text="
    result = []
    for arg in picker_args:
        if arg.startswith(config_flag):
            config = yaml.safe_load(arg[len(config_flag) :])
            config["plugins"].append({"type": "prefix-cache-scorer"})
            profile = config["schedulingProfiles"][0]["plugins"]
            profile.append({"pluginRef": "prefix-cache-scorer", "weight": WEIGHTS["prefix"]})
            arg = config_flag + yaml.safe_dump(config, sort_keys=False)
        result.append(arg)
    return result


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def seconds_or_never(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}"


def report_lags(lags: list[Lag]) -> None:
    for lag in lags:
        print(
            f"event lag (s from the pick, idle pods): first token {lag.ttft:.2f}, "
            f"in llm-d's index {seconds_or_never(lag.indexed)}, "
            f"scored to the same pod {seconds_or_never(lag.scored)}",
            flush=True,
        )


def report(outcomes: dict[str, Outcome], prefill: float, args: argparse.Namespace) -> None:
    print(f"cold prefill of a {args.prefix_tokens}-token system prompt: {prefill:.2f} s")
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"load average at the end (1, 5, 15 min): {load}")
    print(
        "| routing | TTFT p50 (s) | TTFT p90 (s) | pick p90 (s) | output tok/s "
        "| prefix-cache hit rate per pod |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for mode, o in outcomes.items():
        rates = ", ".join(f"{rate:.0%}" for _, rate in sorted(o.hit_rate.items()))
        print(
            f"| {mode} | {percentile(o.ttft, 50):.2f} | {percentile(o.ttft, 90):.2f} "
            f"| {percentile(o.pick, 90):.3f} | {o.output_tokens / o.seconds:.1f} | {rates} |"
        )
    precise = percentile(outcomes["precise"].ttft, 90)
    for other in ("approximate", "random"):
        print(f"TTFT p90 {other} / precise: {percentile(outcomes[other].ttft, 90) / precise:.2f}x")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench prefix_routing")
    parser.add_argument("--groups", type=int, default=9)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--question-tokens", type=int, default=24)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--rate", type=float, default=3.0, help="requests/s (Poisson)")
    parser.add_argument("--cache-prompts", type=int, default=4, help="prompts a pod's cache holds")
    parser.add_argument("--hidden-size", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2, help="of every mode, order rotated")
    parser.add_argument(
        "--precise-plus-approximate",
        action="store_true",
        help="an experiment: the precise picker scores with the approximate scorer too",
    )
    parser.add_argument(
        "--lag-probes", type=int, default=3, help="KV-event lag probes before the rounds"
    )
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-prefix-routing-"))
    model_dir = make_model(work, args)
    arrivals = workload(model_dir, args)
    with local_cluster() as cluster:
        cluster.start_serving_nodes(2)
        try:
            outcomes, prefill = run_all(cluster, model_dir, arrivals, work, args)
        finally:
            cluster.stop_serving_nodes()
    report(outcomes, prefill, args)
    return 0


def run_all(
    cluster: LocalCluster,
    model_dir: Path,
    arrivals: list[tuple[float, str]],
    work: Path,
    args: argparse.Namespace,
) -> tuple[dict[str, Outcome], float]:
    """Every mode against one InferenceService's pods (the precise picker's event lag printed
    first); (outcomes, cold prefill seconds)."""
    from infernetes.operator.testing import (
        apply_crds,
        go_module_crds,
        temporary_namespace,
        wait_until,
    )

    scheduler, epp = build("llmd-scheduler.sh"), build("epp.sh")
    apply_crds(
        cluster,
        go_module_crds(
            "sigs.k8s.io/gateway-api-inference-extension",
            "INFERENCE_EXTENSION_VERSION",
            "config/crd/bases/*.yaml",
        ),
    )
    # A prompt's blocks: the prefix, the question (and its label) and the answer.
    prompt_blocks = (args.prefix_tokens + args.question_tokens + args.output_tokens + 40) // 16
    with (
        temporary_namespace(cluster, "bench-prefix") as ns,
        model_claim(cluster, ns, model_dir) as claim,
    ):
        spec = serving_spec(
            f"pvc://{claim}/{model_dir.name}",
            NAME,
            engine={
                "maxModelLen": args.prefix_tokens + args.question_tokens + 256,
                "maxNumSeqs": 4,
                "blockSize": BLOCK_SIZE,
                "numGpuBlocksOverride": args.cache_prompts * prompt_blocks,
            },
            env=({"name": "OMP_NUM_THREADS", "value": "1"},),
            replicas=REPLICAS,
            engineEnv={"VLLM_SERVER_DEV_MODE": True},  # for /reset_prefix_cache
            routing={"scorers": scorers("precise-prefix-cache-scorer")},
        )
        (work / "operator").mkdir(exist_ok=True)
        with routed_service(cluster, ns, work / "operator", NAME, spec, STARTUP_TIMEOUT):
            pods = [p for p in serving_pods(cluster, ns, NAME) if pod_ready(p)]
            endpoints = {p["metadata"]["name"]: f"{p['status']['podIP']}:8000" for p in pods}
            prefill = cold_prefill_seconds(endpoints, model_dir, args)
            tokenizers = local_tokenizers(work / "tokenizers", {NAME: model_dir})
            llmd_env = {
                "LOCAL_TOKENIZER_DIR": str(tokenizers),
                "PYTHONPATH": str(scheduler.parent / "python"),
            }
            # Both pickers run through every mode: each scrapes every pod's /metrics (every
            # 50 ms), a load the engines carry alike in every mode.
            precise_args = rendered_picker_args(cluster, ns, NAME)
            if args.precise_plus_approximate:
                precise_args = with_approximate_too(precise_args)
            with contextlib.ExitStack() as pickers:
                picks = {"random": random_pick(sorted(endpoints.values()), args.seed)}
                started = {}
                for mode, binary, picker_args, env in (
                    ("precise", scheduler, precise_args, llmd_env),
                    ("approximate", epp, approximate_args(ns, spec), {}),
                ):
                    log = work / f"{mode}.log"
                    started[mode] = start_picker(binary, picker_args, cluster, ns, log, env)
                    pickers.callback(started[mode].stop)
                    picks[mode] = picked_by(started[mode])
                wait_until(
                    started["precise"].kv_events_bound,
                    timeout=180,
                    what="llm-d's KV-events socket to bind (another picker may hold port 5557)",
                )
                report_lags(event_lag(started["precise"], model_dir, args))
                outcomes = run_rounds(picks, endpoints, arrivals, args)
    return outcomes, prefill
