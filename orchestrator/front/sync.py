"""``orchestrator sync RUN``: push a run's offline W&B runs from a machine with network.

Compute nodes often have no internet: a job run with ``WANDB_MODE=offline`` leaves one
``offline-run-<time>-<id>`` folder per attempt under WANDB_DIR (<run>/wandb/wandb, and each sweep
point's <run>/points/NNNN/wandb/wandb). The attempts of one run carry one run id
(``orchestrator.node.tracking``), and ``wandb sync`` given all of them uploads them in order of start time
into that one W&B run. This module finds them and runs the user's own ``wandb sync``: the network
boundary stays wandb's. TensorBoard and MLflow need no push: the lines printed say how to read them.
"""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.node import tracking
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.run_folder import RunFolder


@dataclass(frozen=True)
class OfflineRun:
    """One attempt's offline W&B folder."""

    path: Path
    run_id: str  # the W&B run id, the folder name's last part
    synced: bool  # ``wandb sync`` marks a pushed folder with run-<id>.wandb.synced

    @classmethod
    def of(cls, path: Path) -> OfflineRun:
        run_id = path.name.split("-", 3)[-1]  # offline-run-YYYYMMDD_HHMMSS-<id>; the id may hold dashes
        return cls(path=path, run_id=run_id, synced=(path / f"run-{run_id}.wandb.synced").exists())


class _RunFolderOnly:
    """Where sync may look: inside the run folder. A symbolic link leading out of it (a folder of the
    run, or one on the way there, pointing elsewhere) is never followed; each one is noted once."""

    def __init__(self, run_dir: str | Path) -> None:
        self.root = self._real(Path(run_dir))
        self.skipped: dict[Path, str] = {}  # path -> the line that says so

    @staticmethod
    def _real(path: Path) -> Path | None:
        try:
            return path.resolve(strict=False)
        except (OSError, RuntimeError):  # a loop of links
            return None

    def inside(self, path: Path) -> bool:
        real = self._real(path)
        if real is not None and self.root is not None and (real == self.root or self.root in real.parents):
            return True
        if path not in self.skipped:
            to = f"to {real}" if real is not None else "a loop of links"
            self.skipped[path] = (f"warning: skipped {path}: a symbolic link leads it out of the run folder ({to}), "
                                  "and sync never follows one")
        return False


def run_roots(run_dir: str | Path, guard: _RunFolderOnly | None = None) -> list[Path]:
    """The run folder and its sweep points' folders: each has its own tracker folders."""
    guard = guard or _RunFolderOnly(run_dir)
    folder = RunFolder.of(run_dir)
    points = sorted(p for p in folder.points.iterdir() if p.is_dir() and guard.inside(p)) \
        if folder.points.is_dir() and guard.inside(folder.points) else []
    return [folder.root, *points]


def offline_runs(run_dir: str | Path, guard: _RunFolderOnly | None = None) -> list[OfflineRun]:
    """Every offline W&B run folder of the run and its sweep points, in order of start time per folder.
    One reached through a symbolic link leading out of the run folder is left out (``guard`` notes it)."""
    guard = guard or _RunFolderOnly(run_dir)
    found: list[OfflineRun] = []
    for root in run_roots(run_dir, guard):
        wandb_dir = Path(tracking.folders(str(root))["wandb"]) / "wandb"  # WANDB_DIR/wandb/offline-run-*
        if wandb_dir.is_dir() and guard.inside(wandb_dir):
            for p in sorted(wandb_dir.glob("offline-run-*")):
                if p.is_dir() and guard.inside(p):
                    run = OfflineRun.of(p)  # and the run's own log, which wandb sync uploads
                    if guard.inside(p / f"run-{run.run_id}.wandb"):
                        found.append(run)
    return found


def wandb_command() -> list[str] | None:
    """The ``wandb`` CLI on PATH, else this interpreter's wandb package; None when neither exists."""
    exe = shutil.which("wandb")
    if exe:
        return [exe]
    found = importlib.util.find_spec("wandb")
    return [sys.executable, "-m", "wandb"] if found is not None and found.origin is not None else None


def viewer_lines(run_dir: str | Path, guard: _RunFolderOnly | None = None) -> list[str]:
    """How to read the run's TensorBoard events and MLflow store (neither needs a push); none
    reached through a symbolic link leading out of the run folder."""
    guard = guard or _RunFolderOnly(run_dir)
    roots = run_roots(run_dir, guard)
    lines = []
    if [b for b in (Path(tracking.folders(str(r))["tensorboard"]) for r in roots) if b.is_dir() and guard.inside(b)]:
        lines.append(f"TensorBoard: tensorboard --logdir {shlex.quote(str(Path(run_dir)))}  (reads every "
                     "tensorboard/ folder under it, sweep points included)")
    for root in roots:
        store = Path(tracking.folders(str(root))["mlflow"])
        if store.is_dir() and guard.inside(store):
            lines.append(f"MLflow: mlflow ui --backend-store-uri {shlex.quote(tracking.file_uri(str(store)))}  (the full "
                         "mlflow package; MLFLOW_ALLOW_FILE_STORE=true for MLflow 3)")
    return lines


def sync(run_dir: str | Path, run_name: str, dry_run: bool = False) -> int:
    """List the run's offline W&B folders and push them with ``wandb sync`` (not with ``dry_run``)."""
    guard = _RunFolderOnly(run_dir)
    runs = offline_runs(run_dir, guard)
    for line in viewer_lines(run_dir, guard):
        print(line)
    for line in guard.skipped.values():
        print(line, file=sys.stderr, flush=True)
    if not runs:
        raise OrchestratorError(
            f"run {run_name} has no offline W&B runs (no offline-run-* folder under {Path(run_dir) / 'wandb' / 'wandb'} "
            "or its sweep points'): set WANDB_MODE=offline in the spec's env for jobs.MetricsWriter (or your own "
            "wandb.init) to write them; runs logged online are on the W&B server already")
    ids = sorted({r.run_id for r in runs})
    print(f"W&B: {len(runs)} offline folder(s) of {len(ids)} run(s) ({', '.join(ids)}):")
    for r in runs:
        print(f"  {r.path}{'  (synced already: wandb skips it)' if r.synced else ''}")
    command = wandb_command()
    if command is None:
        hint = "pip install wandb (or ddp-orchestrator[tracking]), then run orchestrator sync again"
        if dry_run:
            print(f"wandb is not installed here: {hint}")
            return 0
        raise OrchestratorError(f"wandb is not installed here, so nothing was pushed: {hint}")
    argv = [*command, "sync", *(str(r.path) for r in runs)]
    print(("would run: " if dry_run else "running: ") + shlex.join(argv), flush=True)
    if dry_run:
        return 0
    code = subprocess.run(argv).returncode
    if code != 0:
        raise OrchestratorError(f"wandb sync exited with status {code}: check its output above (wandb login, or "
                                "WANDB_API_KEY and the network), then run orchestrator sync again; pushed folders "
                                "are skipped")
    return 0
