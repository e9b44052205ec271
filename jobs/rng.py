"""Seeding, and the RNG state a checkpoint carries so that a resumed run draws what an
uninterrupted one would have drawn (shuffles, dropout, augmentation)."""

from __future__ import annotations

import random
from typing import Any

import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's (when installed) and torch's generators."""
    random.seed(seed)
    np = _numpy()
    if np is not None:
        np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's generator states, to be restored with ``set_rng_state``."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np = _numpy()
    if np is not None:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np = _numpy()
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy
