"""The rank's finder (orchestrator/node/code_redirect.py): imports that resolve inside the live project
load the snapshot's files, however they were found (sys.path, an editable install's finder), and
what the snapshot lacks is imported live, said once."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.node import code_redirect


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


class EditableFinder(importlib.abc.MetaPathFinder):
    """What setuptools' editable install puts on sys.meta_path: a package name mapped to a live folder."""

    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname in self.mapping:
            init = Path(self.mapping[fullname]) / "__init__.py"
            return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])
        return None


@pytest.fixture
def isolated() -> Iterator[None]:
    """Leave sys.path, sys.meta_path and sys.modules as they were."""
    path, meta, modules = list(sys.path), list(sys.meta_path), dict(sys.modules)
    try:
        yield
    finally:
        sys.path[:], sys.meta_path[:] = path, meta
        for name in set(sys.modules) - set(modules):
            del sys.modules[name]
        importlib.invalidate_caches()


def _projects(tmp_path: Path, name: str) -> tuple[Path, Path]:
    live, tree = tmp_path / "live", tmp_path / "tree"
    for root, value in ((live, "live"), (tree, "frozen")):
        _write(root, {f"src/{name}/__init__.py": f"WHO = '{value}'\n",
                      f"src/{name}/sub.py": f"WHO = '{value}'\n",
                      f"{name}_top.py": f"WHO = '{value}'\n"})
    return live, tree


def test_a_module_found_on_sys_path_in_the_live_project_loads_from_the_tree(tmp_path: Path, isolated: None) -> None:
    live, tree = _projects(tmp_path, "pathpkg")
    sys.path.insert(0, str(live / "src"))
    sys.path.insert(0, str(live))
    code_redirect.install(str(live), str(tree))
    pkg = importlib.import_module("pathpkg")
    sub = importlib.import_module("pathpkg.sub")
    top = importlib.import_module("pathpkg_top")
    assert (pkg.WHO, sub.WHO, top.WHO) == ("frozen", "frozen", "frozen")
    assert Path(sub.__file__).is_relative_to(tree)  # the package's submodules follow its __path__


def test_an_editable_install_finder_is_redirected(tmp_path: Path, isolated: None) -> None:
    live, tree = _projects(tmp_path, "edpkg")
    sys.meta_path.append(EditableFinder({"edpkg": str(live / "src" / "edpkg")}))
    code_redirect.install(str(live), str(tree))
    assert importlib.import_module("edpkg").WHO == "frozen"
    assert importlib.import_module("edpkg.sub").WHO == "frozen"


def test_a_file_the_tree_lacks_is_imported_live_and_said_once(tmp_path: Path, isolated: None,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    live, tree = _projects(tmp_path, "halfpkg")
    _write(live, {"built_ext.py": "WHO = 'live'\n"})  # e.g. a build product git ignores
    sys.path.insert(0, str(live))
    finder = code_redirect.install(str(live), str(tree))
    assert importlib.import_module("built_ext").WHO == "live"
    assert finder.live_imports == ["built_ext"]
    assert capsys.readouterr().err.count("built_ext is imported from the live project") == 1


def test_a_virtual_environment_inside_the_project_is_not_the_projects_code(tmp_path: Path, isolated: None,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m venv .venv`` in the project folder (git ignores it): its packages are imported
    from there, as installed packages, and nothing says the project was imported live (the demo
    once said so of scikit-learn on every rank)."""
    live, tree = _projects(tmp_path, "venvproj")
    site = live / ".venv" / "lib" / "python3.11" / "site-packages"
    _write(site, {"venvpkg/__init__.py": "WHO = 'installed'\n"})
    sys.path.insert(0, str(site))
    finder = code_redirect.install(str(live), str(tree))
    assert importlib.import_module("venvpkg").WHO == "installed"
    assert finder.live_imports == [] and "imported from the live project" not in capsys.readouterr().err


def test_modules_outside_the_project_and_already_imported_ones_are_left_alone(tmp_path: Path, isolated: None) -> None:
    live, tree = _projects(tmp_path, "otherpkg")
    code_redirect.install(str(live), str(tree))
    import json

    assert importlib.import_module("email.message").__name__ == "email.message"
    assert json.__file__ and not Path(json.__file__).is_relative_to(tree)
    import orchestrator.code.snapshot as snap  # imported before: its package's __path__ decides

    assert not Path(snap.__file__).is_relative_to(tree)


def test_install_is_idempotent_and_uninstall_removes_it(tmp_path: Path, isolated: None) -> None:
    live, tree = _projects(tmp_path, "idem")
    first = code_redirect.install(str(live), str(tree))
    assert code_redirect.install(str(live), str(tree)) is first
    assert sum(isinstance(f, code_redirect.SnapshotFinder) for f in sys.meta_path) == 1
    code_redirect.uninstall(first)
    assert not any(isinstance(f, code_redirect.SnapshotFinder) for f in sys.meta_path)


def test_a_submodule_the_tree_lacks_is_found_live_and_children_find_the_tree(tmp_path: Path, isolated: None,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    live, tree = _projects(tmp_path, "genpkg")
    _write(live, {"src/genpkg/_version.py": "VERSION = '1.2.3'\n"})  # generated, git-ignored: not in the tree
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    sys.meta_path.append(EditableFinder({"genpkg": str(live / "src" / "genpkg")}))
    code_redirect.install(str(live), str(tree))
    pkg = importlib.import_module("genpkg")
    assert pkg.WHO == "frozen" and importlib.import_module("genpkg._version").VERSION == "1.2.3"
    import os

    assert sys.path[0] == str(tree / "src") and os.environ["PYTHONPATH"] == f"{tree / 'src'}{os.pathsep}/elsewhere"
