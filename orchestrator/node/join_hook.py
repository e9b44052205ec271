"""Know when a rank joined its process group, for any script, without importing torch early.

Standard library only. The launcher calls ``install(run_dir, rank)`` before the entrypoint. The
moment ``torch.distributed.distributed_c10d`` has executed (it runs inside ``import torch``), its
``init_process_group`` is replaced by a wrapper that, once the real call returns, writes
``<run>/joined/rank-N``. ``torch/distributed/__init__.py`` star-imports distributed_c10d after
that, so ``dist.init_process_group`` (and ``device_mesh``'s imported name) is the wrapper. In a
rank forked from a zygote that already imported torch, the loaded modules are patched in place.

The supervisor (local) and the job's agent (SLURM) read these files: the init deadline names
the ranks that never joined, and a run whose ranks all exited 0 with none joined is
COMPLETED with a warning.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable
from orchestrator.core.run_folder import RunFolder

TARGET = "torch.distributed.distributed_c10d"


def joined_path(run_dir: str | Path, rank: int) -> Path:
    return RunFolder.of(run_dir).joined(rank)


def calling_path(run_dir: str | Path, rank: int) -> Path:
    return RunFolder.of(run_dir).calling(rank)


def joined_ranks(run_dir: str | Path, world_size: int) -> list[int]:
    """The ranks whose marker is in ``<run>/joined``: one listing of the folder, not a look per rank."""
    return _listed(joined_path(run_dir, 0), world_size)


def calling_ranks(run_dir: str | Path, world_size: int) -> list[int]:
    """Ranks that called init_process_group (whether or not it has returned)."""
    return sorted(set(_listed(calling_path(run_dir, 0), world_size)) | set(joined_ranks(run_dir, world_size)))


def _listed(example: Path, world_size: int) -> list[int]:
    """The ranks below ``world_size`` with a file named like ``example`` (its number aside) in its folder."""
    head, tail = example.name.rsplit("-", 1)  # 'rank', '0' or '0.calling' (made with rank 0)
    prefix, suffix = head + "-", tail[1:]
    try:
        names = os.listdir(example.parent)
    except OSError:
        return []
    ranks = set()
    for name in names:
        if not (name.startswith(prefix) and name.endswith(suffix)):
            continue
        number = name[len(prefix):len(name) - len(suffix)]
        if number.isascii() and number.isdigit() and int(number) < world_size:
            ranks.add(int(number))
    return sorted(ranks)


def _touch(path: Path, what: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{time.time()}\n", encoding="utf-8")
    except OSError as exc:
        print(f"[launcher] could not record that this rank {what} ({exc}); the init deadline may "
              "end the job", file=sys.stderr, flush=True)


def _wrap(original: Callable[..., Any], markers: tuple[Path, Path]) -> Callable[..., Any]:
    marker, calling = markers
    if getattr(original, "__orch_join_hook__", False):
        return original

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        _touch(calling, "called init_process_group")
        result = original(*args, **kwargs)
        _touch(marker, "joined")
        return result

    init_process_group.__orch_join_hook__ = True  # type: ignore[attr-defined]
    return init_process_group


def _patch_loaded(module: Any, markers: tuple[Path, Path]) -> None:
    """Replace init_process_group in distributed_c10d and wherever a loaded torch module holds it."""
    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, "__orch_join_hook__", False):
        return
    wrapper = _wrap(original, markers)
    module.init_process_group = wrapper
    for name, mod in list(sys.modules.items()):
        if mod is not None and (name == "torch" or name.startswith("torch.")) and \
                getattr(mod, "init_process_group", None) is original:
            try:
                setattr(mod, "init_process_group", wrapper)
            except (AttributeError, TypeError):
                pass


class _Finder:
    """A meta path finder (``find_spec`` is the whole protocol; not derived from importlib.abc, which
    would cost every rank its import) that finds nothing itself: it wraps the real loader of
    distributed_c10d so its exec is followed by the patch."""

    def __init__(self, markers: tuple[Path, Path]) -> None:
        self.markers = markers

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                real_exec = spec.loader.exec_module
                markers = self.markers

                def exec_module(module: Any, _real: Callable[[Any], None] = real_exec) -> None:
                    _real(module)
                    _patch_loaded(module, markers)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def install(run_dir: str | Path, rank: int) -> None:
    """Record this rank's join into ``<run>/joined/rank-N`` when init_process_group returns."""
    markers = (joined_path(run_dir, rank), calling_path(run_dir, rank))  # (returned, entered)
    for old in markers:  # an earlier attempt's
        try:
            os.unlink(old)
        except OSError:
            pass
    loaded = sys.modules.get(TARGET)
    if loaded is not None:
        _patch_loaded(loaded, markers)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(markers))
