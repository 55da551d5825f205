"""The ``infernetes`` console script: subcommand registry, light ``--help``, serve and config."""

import json
import subprocess
import sys
import types

import pytest

from infernetes import __version__
from infernetes.cli import main as cli_main

HEAVY = ("torch", "transformers", "fastapi", "uvicorn", "numpy", "triton")


def test_top_level_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in ("serve", "config", "collect-env"):
        assert name in out


def test_no_subcommand_prints_help(capsys):
    assert cli_main.main([]) == 0
    assert "usage: infernetes" in capsys.readouterr().out


def test_missing_subcommand_modules_are_skipped(monkeypatch):
    monkeypatch.setattr(cli_main, "SUBCOMMANDS", ("serve", "not-written-yet", "config"))
    parser = cli_main.build_parser()
    assert "not-written-yet" not in parser.format_help()
    assert cli_main._available() == ["serve", "config"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["serve", "--help"],
        ["serve", "--help=CacheConfig"],
        ["config", "--help"],
        ["collect-env", "--help"],
    ],
)
def test_help_imports_nothing_heavy(argv):
    code = (
        "import sys\n"
        "from infernetes.cli.main import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print([m for m in sys.modules if m.split('.')[0] in {HEAVY!r}], file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("flag", ["--version", "-v"])
def test_version_prints_the_package_version(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main.main([flag])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"infernetes {__version__}\n"


def test_every_subcommand_help_imports_nothing_heavy():
    for name in cli_main._available():
        test_help_imports_nothing_heavy([name, "--help"])


def test_config_prints_grouped_json(capsys):
    assert (
        cli_main.main(["config", "org/model", "--max-num-seqs", "8", "--max_model_len", "1k"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["SchedulerConfig"]["max_num_seqs"] == 8
    assert out["ModelConfig"]["max_model_len"] == 1000
    assert out["ModelConfig"]["model"] == "org/model"
    assert out["CacheConfig"]["gpu_memory_utilization"] == 0.9


def test_config_sends_deprecations_to_stderr(capsys):
    assert cli_main.main(["config", "m", "--max-context-len-to-capture", "4096"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ModelConfig"]["max_seq_len_to_capture"] == 4096
    assert "--max-context-len-to-capture is deprecated" in captured.err


def test_config_rejects_bad_input_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["config", "m", "--block-size", "7"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        "infernetes config: error: argument --block-size" in err and "1, 8, 16, 32, 64, 128" in err
    )


def test_serve_hands_the_config_to_the_server(monkeypatch):
    started = []
    fake = types.ModuleType("infernetes.runtime.server.api_server")
    fake.run_server = started.append
    for name in ("infernetes.runtime", "infernetes.runtime.server"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "infernetes.runtime.server.api_server", fake)
    assert cli_main.main(["serve", "org/model", "--port", "9001", "--enforce-eager"]) == 0
    assert started[0].model == "org/model" and started[0].port == 9001 and started[0].enforce_eager


def test_serve_bad_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["serve", "m", "--no-such-flag"])
    assert exc.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err


def test_console_script_runs():
    result = subprocess.run(
        [sys.executable, "-m", "infernetes.cli.main", "config", "m", "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ModelConfig"]["seed"] == 3


def test_config_masks_secrets_unless_asked(capsys):
    assert cli_main.main(["config", "m", "--api-key", "sk-123", "--hf-token", "hf_x"]) == 0
    out = capsys.readouterr().out
    assert "sk-123" not in out and "hf_x" not in out
    assert json.loads(out)["frontend"]["api_key"] == "***"
    assert cli_main.main(["config", "m", "--api-key", "sk-123", "sk-4", "--show-secrets"]) == 0
    assert json.loads(capsys.readouterr().out)["frontend"]["api_key"] == ["sk-123", "sk-4"]


def test_unknown_top_level_option_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["--frobnicate"])
    assert exc.value.code == 2
    assert "--frobnicate" in capsys.readouterr().err
