"""Choosing between the Triton kernels and the torch reference."""

import pytest
import torch
from infernetes.kernels import backend, ops


def test_defaults_per_device():
    assert backend.resolve_backend(None, "cuda") == backend.TRITON_ATTN
    assert backend.resolve_backend("", "cpu") == backend.TORCH_SDPA


def test_explicit_names():
    assert backend.resolve_backend("TORCH_SDPA", "cuda") == backend.TORCH_SDPA
    assert backend.resolve_backend("triton_attn", "cuda") == backend.TRITON_ATTN


def test_foreign_vllm_backend_falls_back_to_the_device_default(monkeypatch):
    assert backend.resolve_backend("FLASH_ATTN", "cuda") == backend.TRITON_ATTN
    assert backend.resolve_backend("FLASHINFER", "cpu") == backend.TORCH_SDPA
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "XFORMERS")
    assert backend.attention_backend("cpu") == backend.TORCH_SDPA


def test_environment_value_unknown_to_the_schema_is_rejected(monkeypatch):
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "NOPE")
    with pytest.raises(ValueError, match=r"VLLM_ATTENTION_BACKEND.*TRITON_ATTN"):
        backend.attention_backend("cpu")


def test_unknown_backend_names_the_allowed_values():
    with pytest.raises(
        ValueError, match=r"VLLM_ATTENTION_BACKEND='BOGUS'.*TRITON_ATTN, TORCH_SDPA"
    ):
        backend.resolve_backend("BOGUS", "cpu")


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(backend.BackendError, match="TRITON_INTERPRET=1"):
        backend.resolve_backend("TRITON_ATTN", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert backend.resolve_backend("TRITON_ATTN", "cpu") == backend.TRITON_ATTN


def test_ops_follow_the_environment(monkeypatch):
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TORCH_SDPA")
    assert backend.attention_backend("cpu") == backend.TORCH_SDPA
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    with pytest.raises(backend.BackendError):
        ops.silu_and_mul(torch.randn(2, 4))


@pytest.fixture
def no_selected_backend():
    yield
    backend.select_backend(None)


def test_attention_backend_flag_wins_over_the_variable(caplog):
    environ = {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}
    assert backend.startup_backend("TORCH_SDPA", "cuda", environ) == backend.TORCH_SDPA
    assert (
        "--attention-backend TORCH_SDPA overrides VLLM_ATTENTION_BACKEND=TRITON_ATTN" in caplog.text
    )
    assert backend.startup_backend("auto", "cuda", environ) == backend.TRITON_ATTN
    assert backend.startup_backend(None, "cpu", {}) == backend.TORCH_SDPA


def test_unavailable_attention_backend_flag_fails_at_startup_naming_the_flag(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(
        backend.BackendError,
        match=r"--attention-backend TRITON_ATTN needs a CUDA device.*"
        r"--attention-backend TORCH_SDPA",
    ):
        backend.startup_backend("TRITON_ATTN", "cpu", {})


def test_foreign_attention_backend_flag_warns_and_uses_the_default(caplog):
    assert backend.startup_backend("FLASHINFER", "cpu", {}) == backend.TORCH_SDPA
    assert (
        "--attention-backend FLASHINFER is a vLLM backend that infernetes does not implement"
        in caplog.text
    )


def test_ops_follow_the_selected_attention_backend(monkeypatch, no_selected_backend):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    backend.select_backend("TORCH_SDPA")
    assert backend.attention_backend("cpu") == backend.TORCH_SDPA
    ops.silu_and_mul(torch.randn(2, 4))  # the torch reference: no Triton needed
    backend.select_backend("auto")  # auto: the variable decides again
    with pytest.raises(backend.BackendError):
        ops.silu_and_mul(torch.randn(2, 4))
