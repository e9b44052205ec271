"""The code snapshot on a folder as people keep it (issue 31's acceptance folder), before and after.

A project outside git, two folders down: ``train.py``, ``helper.py``, ``spec.yaml``, a 300 MB
``lightning_logs/`` checkpoint, a ``wandb/`` folder, ``data/`` beside the script, and a log another
process appends to every 20 ms. Each version scans and stores it into a fresh store, then again
(nothing changed), with the log being written throughout; a second pass without the writer
shows what the old rule would have frozen had it not been refused.

"Before" is ``orchestrator/code/snapshot.py`` at ``--before`` (default c0972a7, the last commit before
issue 31), loaded from git; "after" is the working tree's module.

Usage: .venv/bin/python tests/benchmarks/bench_snapshot_messy.py [--mb 300] [--before REV]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load(source: str, name: str) -> ModuleType:
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def folder(top: Path, mb: int) -> Path:
    proj = top / "a" / "b" / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "train.py").write_text("import helper\nprint(helper.X)\n")
    (proj / "helper.py").write_text("X = 1\n")
    (proj / "spec.yaml").write_text("name: messy\nentrypoint: train.py\n")
    (proj / "data" / "numbers.npy").write_bytes(os.urandom(1 << 20))
    (proj / "lightning_logs" / "version_0").mkdir(parents=True)
    with open(proj / "lightning_logs" / "version_0" / "last.ckpt", "wb") as f:
        for _ in range(mb):
            f.write(os.urandom(1 << 20))
    (proj / "lightning_logs" / "version_0" / "hparams.yaml").write_text("lr: 0.1\n")
    (proj / "wandb" / "run-1").mkdir(parents=True)
    (proj / "wandb" / "run-1" / "config.yaml").write_text("a: 1\n")
    return proj


def stored_bytes(store: Path) -> int:
    seen, total = set(), 0
    for d, _, files in os.walk(store):
        for name in files:
            st = os.lstat(os.path.join(d, name))
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total


def measure(label: str, mod: ModuleType, proj: Path, store: Path, **kw: object) -> None:
    shutil.rmtree(store, ignore_errors=True)
    for trial in ("first", "again"):
        t = time.perf_counter()
        try:
            snap = mod.scan(str(proj), "folder", str(store), exclude=[str(proj / "runs")], **kw)
            mod.store(snap)
            what = f"{snap.files} files, {snap.bytes / 1e6:.3f} MB frozen"
        except Exception as exc:  # noqa: BLE001 - the refusal is the figure
            what = f"refused: {str(exc)[:100]}"
        took = time.perf_counter() - t
        print(f"| {label} | {trial} | {took:.3f} s | {stored_bytes(store) / 1e6:.3f} MB | {what} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--before", default="c0972a7")
    args = ap.parse_args()
    # --before is a commit from before the package move: the module was orchestrator/snapshot.py then
    before = load(subprocess.run(["git", "-C", str(ROOT), "show", f"{args.before}:orchestrator/snapshot.py"],
                                 capture_output=True, text=True, check=True).stdout, "snapshot_before")
    sys.path.insert(0, str(ROOT))
    from orchestrator.code import snapshot as after

    top = Path(tempfile.mkdtemp(prefix="messy-", dir=os.environ.get("BENCH_DIR")))
    try:
        proj = folder(top, args.mb)
        store = top / "store"
        writer = subprocess.Popen([sys.executable, "-c", "import sys, time\nwith open(sys.argv[1], 'a') as f:\n"
                                   "    while True:\n        f.write('step\\n'); f.flush(); time.sleep(0.02)",
                                   str(proj / "run.log")])
        print("| version | scan + store | time | stored | result |\n|---|---|---|---|---|")
        try:
            measure(f"before ({args.before}), log written", before, proj, store)
            measure(f"before ({args.before}), log written, max_mb=1000", before, proj, store, max_mb=1000)
            measure("after, log written", after, proj, store, stage=True)
        finally:
            writer.kill()
            writer.wait()
        measure(f"before ({args.before}), no writer, max_mb=1000", before, proj, store, max_mb=1000)
        measure("after, no writer", after, proj, store, stage=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
