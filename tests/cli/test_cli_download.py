"""`infernetes download` (the model-cache Job's command): a hub id goes through the same
resolver as serve (offline here: the hub's own error, as a clear message and exit 1); a local
folder is taken as is."""

from pathlib import Path

import pytest

from infernetes.cli.main import main


def test_local_folder_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert main(["download", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path)


def test_unreachable_model_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert main(["download", "org/missing-model", "--revision=main"]) == 1
    out = capsys.readouterr().out
    assert "infernetes download:" in out and "org/missing-model" in out
