"""Flags newer vLLM releases added: --async-scheduling (not with pipeline parallelism),
--enable-log-requests (--disable-log-requests deprecated), --structured-outputs-config with its
keys, whole or dotted, and the multi-node flags of vLLM 0.11 (--nnodes, --node-rank,
--master-addr, --master-port)."""

from __future__ import annotations

import pytest

from infernetes.schema.config import ConfigError, build_config
from infernetes.schema.parser import parse_with_notices
from infernetes.schema.support_check import check_support, report_support


def test_async_scheduling_is_honoured_but_not_with_pipeline_parallelism(capsys):
    config, _ = parse_with_notices(["m", "--async-scheduling"])
    assert config.async_scheduling is True
    report_support(config, "infernetes serve", environ={})  # honoured: no exit
    with pytest.raises(ConfigError, match=r"--async-scheduling.*--pipeline-parallel-size"):
        build_config("m", async_scheduling=True, pipeline_parallel_size=2)
    with pytest.raises(SystemExit) as info:
        parse_with_notices(["m", "--async-scheduling", "-pp", "2"])
    assert info.value.code == 2
    assert "--pipeline-parallel-size" in capsys.readouterr().err


def test_enable_log_requests_and_the_deprecated_disable_flag():
    config, notices = parse_with_notices(["m", "--enable-log-requests"])
    assert config.enable_log_requests is True and not notices
    config, notices = parse_with_notices(["m", "--disable-log-requests"])
    assert config.enable_log_requests is False
    assert any("--disable-log-requests is deprecated" in n for n in notices)
    assert "--enable-log-requests" in " ".join(notices)


def test_structured_outputs_config_whole_and_dotted():
    whole, _ = parse_with_notices(
        ["m", "--structured-outputs-config", '{"backend": "guidance", "disable_fallback": true}']
    )
    assert whole.structured_outputs_config == {"backend": "guidance", "disable_fallback": True}
    dotted, _ = parse_with_notices(
        [
            "m",
            "--structured-outputs-config.backend",
            "guidance",
            "--structured-outputs-config.disable_any_whitespace",
            "true",
        ]
    )
    assert dotted.structured_outputs_config == {
        "backend": "guidance",
        "disable_any_whitespace": True,
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"backends": "guidance"}, "unknown key 'backends'"),
        ({"backend": "nope"}, "--structured-outputs-config.backend: invalid choice 'nope'"),
        ({"disable_fallback": "yes"}, "expected a bool"),
        ({"reasoning_parser": "nope"}, "invalid choice 'nope'"),
    ],
)
def test_structured_outputs_config_keys_are_checked(value, message):
    with pytest.raises(ConfigError, match=message):
        build_config("m", structured_outputs_config=value)


@pytest.mark.parametrize(
    ("value", "verdict"),
    [
        ({"backend": "guidance"}, None),
        ({"backend": "auto", "disable_any_whitespace": True}, None),
        ({"backend": "xgrammar"}, None),
        ({"backend": "outlines"}, "error"),
        ({"disable_additional_properties": True}, "error"),
        ({"enable_in_reasoning": True}, "error"),
        ({"reasoning_parser": "step3p5"}, "error"),
        ({"reasoning_parser": "qwen3"}, None),
        ({"disable_fallback": True}, None),
    ],
)
def test_structured_outputs_config_keys_go_through_the_support_table(value, verdict):
    report = check_support(build_config("m", structured_outputs_config=value), environ={})
    key = next(iter(value if verdict is None else [k for k, v in value.items() if v]))
    errors = [e for e in report.errors if f"--structured-outputs-config.{key}" in e]
    warnings = [w for w in report.warnings if f"--structured-outputs-config.{key}" in w]
    assert (bool(errors), bool(warnings)) == (verdict == "error", verdict == "warning")


def test_multi_node_flags_with_their_short_forms_and_defaults():
    default, _ = parse_with_notices(["m"])
    assert (default.nnodes, default.node_rank) == (1, 0)
    assert (default.master_addr, default.master_port) == ("127.0.0.1", 29501)
    argv = ["m", "-tp", "4", "-n", "2", "-r", "1", "--headless", "--master-addr", "leader.lws"]
    config, notices = parse_with_notices([*argv, "--master-port", "30000"])
    assert (config.nnodes, config.node_rank, config.headless) == (2, 1, True)
    assert (config.master_addr, config.master_port) == ("leader.lws", 30000)
    assert not notices
    report = check_support(config, environ={})
    assert (report.errors, report.warnings) == ([], [])
