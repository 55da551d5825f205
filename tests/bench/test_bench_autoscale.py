"""`python -m bench autoscale`'s own arithmetic and report (bench/autoscale.py), and the endpoint
view and the streams of the load it drives (cluster/streaming_load.py), without a cluster."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "cluster"))

from streaming_load import LoadReport, Lost, serving_addresses, stream_completion  # noqa: E402

from bench.autoscale import (  # noqa: E402
    FromZero,
    Sample,
    Sampler,
    from_zero_line,
    print_report,
    quantile,
    settings_line,
)

ARGS = argparse.Namespace(ttft=1.0, window=30, max_replicas=3, max_num_seqs=2, output_tokens=12)


def sampler_with(samples: list[Sample], began: float) -> Sampler:
    sampler = Sampler(cluster=None, ns="bench", prometheus=None, interval=5)  # type: ignore[arg-type]
    sampler.samples, sampler.began = samples, began
    return sampler


def report_of(from_zero: FromZero, capsys: pytest.CaptureFixture[str]) -> str:
    # Two phases (1 client over [100, 160), 4 over [160, 220)), then the settle to zero.
    report = LoadReport(completed=5)
    report.first_tokens = [(100.0, 0.1), (110.0, 0.2), (150.0, 0.3), (170.0, 1.0), (200.0, 3.0)]
    report.lost = [Lost("04:00:00", "10.0.0.1", 171.0, "HTTP 503: draining", left_view=171.5)]
    phases = [(1, 100.0, 160.0, 0), (4, 160.0, 220.0, 0), (0, 220.0, 250.0, 1)]
    samples = [
        Sample(0, 0, 0, None),
        Sample(5, 1, 0, None),
        Sample(10, 1, 1, 0.2),
        Sample(65, 3, 1, 2.5),  # 165 s: in the 4-client phase
        Sample(70, 3, 2, 2.0),
        Sample(125, 0, 0, None),  # 225 s: settling
    ]
    print_report(report, phases, sampler_with(samples, began=100.0), from_zero)
    return capsys.readouterr().out


def test_the_report_gives_the_first_token_from_zero_and_each_phase(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from_zero = FromZero(held=41.25, first_token=41.5, problem="")
    assert "0..3 replicas" in settings_line(ARGS)
    line = from_zero_line(from_zero)
    assert line.startswith("first request at zero replicas: first token after 41.5 s (held 41.2 s")
    out = report_of(from_zero, capsys)
    # The bench printed those two lines before the ramp: the report does not repeat them.
    assert line not in out and settings_line(ARGS) not in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "phase" not in line]
    # Requests count in the phase they were sent in; the lost one in the phase it was lost.
    assert rows[0] == "| 1 | 1 | 60 | 3 | 0 | 0.200 | 0.280 | 0..1 |"
    assert rows[1] == "| 2 | 4 | 60 | 2 | 1 | 2.000 | 2.800 | 1..2 |"
    assert rows[2] == "| 3 | 0 | 30 | 0 | 0 | - | - | 0..0 |"
    # The first request is one of those sent and completed.
    assert "requests sent 7 (the first one included), completed 6, lost 1" in out
    assert "     5 s: 1/0 (p90 -)" in out
    assert "    65 s: 3/1 (p90 2.500)" in out
    assert "lost: 04:00:00 10.0.0.1 (left the client's view +0.5 s after it was sent)" in out


def test_a_lost_first_request_counts_as_lost(capsys: pytest.CaptureFixture[str]) -> None:
    from_zero = FromZero(held=720.0, first_token=0.0, problem="HTTP 503: no pod")
    assert from_zero_line(from_zero) == "first request at zero replicas: lost after 720.0 s"
    out = report_of(from_zero, capsys)
    assert from_zero_line(from_zero) not in out
    assert "requests sent 7 (the first one included), completed 5, lost 2" in out
    assert "lost: the first request: HTTP 503: no pod" in out


def test_quantiles_interpolate_between_samples() -> None:
    assert quantile([0.1, 0.2, 0.3], 50) == pytest.approx(0.2)
    assert quantile([0.1, 0.2, 0.3], 90) == pytest.approx(0.28)
    assert quantile([4.0], 90) == 4.0


def test_the_view_holds_only_ready_endpoints_that_are_not_terminating() -> None:
    def endpoint(address: str, **conditions: bool) -> dict:
        return {"addresses": [address], "conditions": conditions}

    slices = [
        {
            "endpoints": [
                endpoint("10.0.0.1", ready=True, serving=True, terminating=False),
                # A going pod: still serving through its preStop, but no longer ready.
                endpoint("10.0.0.2", ready=False, serving=True, terminating=True),
                endpoint("10.0.0.3", ready=False, serving=False, terminating=False),
                endpoint("10.0.0.4"),  # no conditions: unknown, not ready
            ]
        },
        # The same pod in a second slice while the controller moves it counts once.
        {"endpoints": [endpoint("10.0.0.1", ready=True)]},
        {"endpoints": None},
    ]
    assert serving_addresses(slices) == ["10.0.0.1"]


def test_a_lost_request_says_when_its_endpoint_left_the_view() -> None:
    assert str(Lost("04:00:00", None, 1.0, "no ready endpoint")) == "04:00:00 no ready endpoint"
    still = Lost("04:00:00", "10.0.0.1", 1.0, "HTTP 503")
    assert "in the client's view until the end" in str(still)
    early = Lost("04:00:00", "10.0.0.1", 10.0, "HTTP 503", left_view=12.25)
    assert (
        str(early)
        == "04:00:00 10.0.0.1 (left the client's view +2.2 s after it was sent): HTTP 503"
    )


def _streamed(*events: dict | str) -> httpx.AsyncClient:
    """A client whose every request gets these events as a server-sent event stream."""
    body = "".join(
        f"data: {e if isinstance(e, str) else json.dumps(e, ensure_ascii=False)}\n\n"
        for e in events
    )
    return httpx.AsyncClient(
        transport=httpx.MockTransport(lambda _: httpx.Response(200, text=body))
    )


async def test_a_stream_whose_tokens_hold_unicode_line_separators_completes() -> None:
    # Raw U+2028 and U+0085 in a token's text: one event each (read line by line only at LF).
    token = {"choices": [{"text": "a\u2028b\x85c", "finish_reason": None}]}
    last = {"choices": [{"text": "d", "finish_reason": "length"}]}
    async with _streamed(token, last, "[DONE]") as http:
        problem, _ = await stream_completion(http, "10.0.0.1", {}, sent=0.0)
    assert problem == ""
    async with _streamed(token, last) as http:
        problem, _ = await stream_completion(http, "10.0.0.1", {}, sent=0.0)
    assert problem == "stream ended with finish_reason='length', [DONE] missing"
