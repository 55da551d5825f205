"""The ``--help`` forms: all, listgroup, a group, one argument, a keyword."""

import pytest

from infernetes.schema.declare import GROUPS
from infernetes.schema.parser import parse_serve_args


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(list(argv))
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_plain_help_lists_every_group(capsys):
    out = help_text(capsys, "--help")
    assert "usage: infernetes serve [model_tag] [options]" in out
    for group in GROUPS:
        assert group in out
    assert help_text(capsys, "-h") == out
    assert help_text(capsys, "--help=all") == out


def test_listgroup(capsys):
    out = help_text(capsys, "--help=listgroup")
    assert [line.strip() for line in out.splitlines()[1:] if line.strip()] == list(GROUPS)


def test_one_group(capsys):
    out = help_text(capsys, "--help=CacheConfig")
    assert "--block-size" in out and "--gpu-memory-utilization" in out
    assert "--max-num-seqs" not in out
    assert help_text(capsys, "--help=cacheconfig") == out


def test_one_argument(capsys):
    out = help_text(capsys, "--help=max-num-seqs")
    assert "--max-num-seqs" in out and "--max-num-batched-tokens" not in out
    assert help_text(capsys, "--help=--max-num-seqs") == out
    assert help_text(capsys, "--help=max_num_seqs") == out


def test_keyword(capsys):
    out = help_text(capsys, "--help=prefix")
    assert "--enable-prefix-caching" in out and "--prefix-caching-hash-algo" in out
    assert "--tensor-parallel-size" not in out


def test_unknown_topic_says_what_exists(capsys):
    out = help_text(capsys, "--help=zzzz")
    assert "No group or argument matches" in out and "ModelConfig" in out


def test_help_wins_over_bad_arguments(capsys):
    assert "usage" in help_text(capsys, "--max-num-seqs", "bad", "--help")


def test_deprecated_flags_say_so(capsys):
    assert "deprecated" in help_text(capsys, "--help=worker-use-ray")
