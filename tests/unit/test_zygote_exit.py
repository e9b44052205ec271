"""A forked rank's exit work (rank_exit.drop_user_namespaces): the script's own modules are
finalized as an interpreter's exit would; what the zygote had before the fork is not looked at,
unless its name now holds another module (the script's ``__main__`` replaced the zygote's)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from orchestrator.node.rank_exit import drop_user_namespaces


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


def test_installed_packages_the_standard_library_and_ours_are_never_the_users(tmp_path: Path) -> None:
    import json
    import sysconfig

    import orchestrator
    from orchestrator.core.module_origin import is_users_own

    assert not is_users_own(json.__file__) and not is_users_own(orchestrator.__file__)
    assert not is_users_own(str(Path(sysconfig.get_paths()["purelib"]) / "numpy" / "__init__.py"))
    assert not is_users_own("/opt/conda/lib/python3.11/site-packages/lightning/__init__.py")
    assert not is_users_own("/usr/lib/python3/dist-packages/yaml/__init__.py")
    assert not is_users_own("<frozen importlib._bootstrap>")
    assert is_users_own(str(tmp_path / "train.py")) and is_users_own(str(tmp_path / "site" / "model.py"))


def test_a_package_installed_after_the_fork_keeps_its_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the script's modules are finalized: a package it imported (lightning, numpy) is left to
    the process's end, as torch is."""
    import sysconfig

    real = {name: module for name, module in sys.modules.items() if name != "__main__"}
    installed = _module("late_package", Path(sysconfig.get_paths()["purelib"]) / "late_package")
    script = _module("__main__", tmp_path)
    monkeypatch.setattr(sys, "modules", {**real, "late_package": installed, "__main__": script})
    drop_user_namespaces({name: id(module) for name, module in real.items()})
    assert hasattr(installed, "kept") and not hasattr(script, "kept")
