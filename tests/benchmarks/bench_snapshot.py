"""What the code snapshot adds to ``submit`` (issue 21), side by side with submitit's own snapshot.

Run: .venv/bin/python tests/benchmarks/bench_snapshot.py [--files 1000] [--rounds 5] [--changed-mb 100]

The project: a git repository of ``--files`` Python files of ~10 kB each (a mid-sized research
code base), committed. Two cases, each timed for both tools, alternated, in one process:

- unchanged: the project as it was at the previous submission. Ours: ``api.planned`` (scan: git,
  stat, the index) plus ``snapshot.store`` (nothing new to write), what ``submit`` adds. The peer:
  ``submitit.helpers.RsyncSnapshot`` into a new folder, as each submission with it does (a
  shallow ``git clone`` of the project, then ``rsync`` of the tracked files);
- changed: ``--changed-mb`` MB of new files (random bytes, ``git add``-ed so the peer ships them
  too) added since the previous submission, new ones each round.

Every figure is the median of the rounds; the ratio is the peer's time over ours.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator import api
from orchestrator.code.snapshot import store


def make_project(root: Path, files: int) -> None:
    root.mkdir(parents=True)
    for i in range(files):
        pkg = root / "src" / f"pkg{i % 20}"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / f"mod{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n" for j in range(250)))
    (root / "train.py").write_text("print('train')\n")
    (root / ".gitignore").write_text("runs/\n")
    git = ["git", "-C", str(root), "-c", "user.email=b@example.com", "-c", "user.name=bench"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "project"], check=True)


def ours(root: Path) -> float:
    spec = {"name": "bench", "entrypoint": str(root / "train.py"), "runs_dir": str(root / "runs"),
            "executor": "slurm", "slurm": {"assume_shared_paths": True}}
    start = time.perf_counter()
    _, code = api.planned(spec)
    assert code is not None
    store(code)
    return time.perf_counter() - start


def peer(root: Path, target: Path) -> float:
    from submitit.helpers import RsyncSnapshot

    cwd = os.getcwd()
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr), RsyncSnapshot(snapshot_dir=target, root_dir=root):
        pass
    took = time.perf_counter() - start
    os.chdir(cwd)
    return took


def add_changes(root: Path, mb: int, round_: int) -> None:
    """``mb`` MB of new files in place of the previous round's (the project stays its size)."""
    shutil.rmtree(root / "data-changes", ignore_errors=True)
    folder = root / "data-changes" / f"r{round_}"
    folder.mkdir(parents=True)
    for i in range(max(1, mb // 10)):
        (folder / f"blob{i}.bin").write_bytes(os.urandom(10 * 1000 * 1000))
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--files", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--changed-mb", type=int, default=100)
    p.add_argument("--dir", default="/var/tmp")
    a = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-snapshot-", dir=a.dir))
    try:
        root = base / "project"
        make_project(root, a.files)
        os.chdir(root)
        size = sum(f.stat().st_size for f in root.rglob("*.py"))
        print(f"project: {a.files} files, {size / 1e6:.1f} MB, git; {a.rounds} rounds")
        ours(root)  # the first submission: everything is new to the store
        times: dict[str, list[float]] = {"ours unchanged": [], "peer unchanged": [], "ours changed": [],
                                         "peer changed": []}
        for r in range(a.rounds):
            times["ours unchanged"].append(ours(root))
            times["peer unchanged"].append(peer(root, base / f"peer-u{r}"))
        for r in range(min(a.rounds, 3)):
            add_changes(root, a.changed_mb, r)
            times["ours changed"].append(ours(root))  # the store lacks the new blobs
            times["peer changed"].append(peer(root, base / f"peer-c{r}"))
            for folder in base.glob("peer-*"):
                shutil.rmtree(folder)  # keep the disk use bounded
        med = {k: statistics.median(v) for k, v in times.items()}
        for case in ("unchanged", "changed"):
            what = "the same tree as the last submission" if case == "unchanged" else f"{a.changed_mb} MB new"
            print(f"{case:9} ({what}): ours {med['ours ' + case]:.3f} s, submitit RsyncSnapshot "
                  f"{med['peer ' + case]:.3f} s, ratio {med['peer ' + case] / med['ours ' + case]:.1f}x  "
                  f"(ours per round: {', '.join(f'{t:.3f}' for t in times['ours ' + case])})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
