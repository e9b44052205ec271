"""A rank asked for nccl without a GPU fails; it never switches alone to gloo (its peers would
use nccl and the job would hang until the collective timeout)."""

from __future__ import annotations

import pytest


def test_nccl_without_a_gpu_is_an_error_not_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from jobs.distributed import resolve_backend

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(RuntimeError, match="rank 3 sees no GPU"):
        resolve_backend("nccl", torch.device("cpu"))
    assert resolve_backend("auto", torch.device("cpu")) == "gloo"
    assert resolve_backend("gloo", torch.device("cpu")) == "gloo"


def test_the_hidden_gpu_hint_only_for_a_dry_run_that_asked_for_a_gpu() -> None:
    from orchestrator.core.failures import hidden_gpu_hint

    assert hidden_gpu_hint("RuntimeError: No CUDA GPUs are available", None)
    assert hidden_gpu_hint("CUDA error: invalid device ordinal", ())
    assert hidden_gpu_hint("No CUDA GPUs are available", (0,)) is None  # listed: a real GPU problem
    assert hidden_gpu_hint("ValueError: shard 1 is corrupt", None) is None
