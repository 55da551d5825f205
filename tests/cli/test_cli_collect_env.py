"""``infernetes collect-env``: a real report, with secrets masked."""

import json

from infernetes.cli import main as cli_main
from infernetes.cli.collect_env import MASK, format_report, relevant_env


def test_relevant_env_masks_secrets():
    env = {
        "VLLM_API_KEY": "sk-123",
        "HF_TOKEN": "hf_abc",
        "VLLM_LOGGING_LEVEL": "DEBUG",
        "VLLM_CUSTOM_PASSWORD": "x",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HOME": "/root",
        "S3_SECRET_ACCESS_KEY": "s3",
    }
    report = relevant_env(env)
    assert report == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HF_TOKEN": MASK,
        "S3_SECRET_ACCESS_KEY": MASK,
        "VLLM_API_KEY": MASK,
        "VLLM_CUSTOM_PASSWORD": MASK,
        "VLLM_LOGGING_LEVEL": "DEBUG",
    }


def test_full_report(capsys, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    assert cli_main.main(["collect-env", "--json"]) == 0
    out = capsys.readouterr().out
    assert "sk-very-secret" not in out
    report = json.loads(out)
    assert report["environment"]["VLLM_API_KEY"] == MASK
    assert report["python"]["version"].startswith("3.")
    assert report["torch"]["installed"] and report["torch"]["version"]
    assert "cuda_build" in report["torch"] and "gpus" in report["torch"]
    assert report["packages"]["infernetes"]
    text = format_report(report)
    assert "== torch ==" in text and "sk-very-secret" not in text
