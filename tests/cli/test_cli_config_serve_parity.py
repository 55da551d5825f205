"""``infernetes config`` and ``infernetes serve`` agree: every tool-call and reasoning parser name
is accepted by both or refused by both (and accepted exactly when the server has the parser).
(tests/engine/test_engine_config_matches_serve.py: the values resolved against a model.)"""

from __future__ import annotations

import pytest
from infernetes.runtime.server.reasoning import REASONING_PARSERS
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.tool_parsers import TOOL_PARSERS
from infernetes.runtime.testing import harmony_vocab_dir

from infernetes.cli import main as cli_main
from infernetes.schema.choices import REASONING_PARSERS as REASONING_CHOICES
from infernetes.schema.choices import TOOL_CALL_PARSERS

TOOL_NAMES = sorted({*TOOL_CALL_PARSERS, *TOOL_PARSERS})
REASONING_NAMES = sorted({*REASONING_CHOICES, *REASONING_PARSERS})
# The harmony parsers need openai-harmony's vocabulary: without it both refuse them alike.
HARMONY = {"openai", "openai_gptoss"}


def has_parser(name: str, built: dict, monkeypatch) -> bool:
    """Whether the server has the parser; a harmony one only with its vocabulary."""
    folder = harmony_vocab_dir()
    if folder is not None:
        monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(folder))
    return name in built and (name not in HARMONY or folder is not None)


def config_accepts(argv: list[str]) -> bool:
    try:
        return cli_main.main(["config", *argv]) == 0
    except SystemExit as exc:
        return exc.code == 0


def serve_accepts(argv: list[str], monkeypatch) -> bool:
    """``serve`` up to the moment it would start loading: the support table, then the server's
    own checks of the frontend settings (run_server's first step)."""
    # Imported here, not at collection: the server pulls in Triton, which fixes interpreter or
    # compiler when first imported, before tests/kernels/conftest.py can choose the interpreter.
    from infernetes.runtime.preflight import check_frontend_settings
    from infernetes.runtime.server import api_server

    def checks_only(config):
        check_frontend_settings(FrontendSettings.from_config(config))

    monkeypatch.setattr(api_server, "run_server", checks_only)
    try:
        cli_main.main(["serve", *argv])
    except (SystemExit, ValueError):
        return False
    return True


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_tool_call_parser_names(name, monkeypatch, capsys):
    argv = ["org/model", "--enable-auto-tool-choice", "--tool-call-parser", name]
    expected = has_parser(name, TOOL_PARSERS, monkeypatch)
    accepted = config_accepts(argv)
    assert serve_accepts(argv, monkeypatch) == accepted
    assert accepted == expected
    capsys.readouterr()


@pytest.mark.parametrize("name", REASONING_NAMES)
def test_reasoning_parser_names(name, monkeypatch, capsys):
    argv = ["org/model", "--reasoning-parser", name]
    expected = has_parser(name, REASONING_PARSERS, monkeypatch)
    accepted = config_accepts(argv)
    assert serve_accepts(argv, monkeypatch) == accepted
    assert accepted == expected
    capsys.readouterr()


@pytest.mark.parametrize(
    ("middleware", "accepted", "message"),
    [
        ("no_such_module_here.Middleware", False, "cannot import module 'no_such_module_here'"),
        ("json.NoSuchAttribute", False, "module has no attribute 'NoSuchAttribute'"),
        ("json.dumps", False, "must be a class or an async function"),
        ("nomodule", False, "expected 'module.attribute'"),
        ("starlette.middleware.gzip.GZipMiddleware", True, ""),
    ],
)
def test_middleware_is_resolved_before_anything_loads(
    middleware, accepted, message, monkeypatch, capsys
):
    """A --middleware that cannot be imported is a clear error from both, never a traceback."""
    argv = ["org/model", "--middleware", middleware]
    assert config_accepts(argv) == accepted
    assert message in capsys.readouterr().err
    assert serve_accepts(argv, monkeypatch) == accepted
    capsys.readouterr()
