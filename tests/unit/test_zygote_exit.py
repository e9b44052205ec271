"""A forked rank's exit work (executors/zygote.drop_user_namespaces): the script's own modules are
finalized as an interpreter's exit would; what the zygote had before the fork is not looked at,
unless its name now holds another module (the script's ``__main__`` replaced the zygote's)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from orchestrator.executors.zygote import drop_user_namespaces


def _module(name: str, path: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = str(path / f"{name}.py")
    module.kept = "value"  # type: ignore[attr-defined]
    return module


def test_only_what_the_rank_imported_or_replaced_is_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = {name: _module(name, tmp_path) for name in ("__main__", "zygotes", "replaced")}
    real = {name: module for name, module in sys.modules.items() if name != "__main__"}  # this process's: kept
    preloaded = {name: id(module) for name, module in {**real, **before}.items()}
    fakes = {**before, "__main__": _module("__main__", tmp_path), "replaced": _module("replaced", tmp_path),
             "scripts": _module("scripts", tmp_path)}
    monkeypatch.setattr(sys, "modules", {**real, **fakes})  # the real modules too: imports still work
    drop_user_namespaces(preloaded)
    left = {name: hasattr(module, "kept") for name, module in fakes.items()}
    assert left == {"__main__": False, "zygotes": True, "replaced": False, "scripts": False}
    assert hasattr(before["__main__"], "kept")  # the zygote's own __main__ is no longer sys.modules'


def test_every_module_the_rank_imported_is_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = {name: module for name, module in sys.modules.items() if name != "__main__"}
    fakes = {name: _module(name, tmp_path) for name in ("__main__", "a", "b")}
    monkeypatch.setattr(sys, "modules", {**real, **fakes})
    drop_user_namespaces({name: id(module) for name, module in real.items()})  # only this process's are known
    assert not any(hasattr(module, "kept") for module in fakes.values())
