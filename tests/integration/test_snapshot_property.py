"""Generated project folders, changing while ``orchestrator run`` freezes them: the run starts,
every module the ranks import from the snapshot is byte for byte what the manifest froze, and
nothing outside the runs folder changes but what the test itself changed.

Each example is a real local run (one rank, no torch): a handful of examples, each a different
folder (odd names, links in and out, outputs and data beside the code) with files appearing,
growing and vanishing while the CLI scans it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.test_code_snapshot import ROOT, RUN_WAIT_S

ODD = st.sampled_from(["plain", "with space", "hash#tag", "dash-", "ünï", "semi;colon", "quote'd"])
MODULES = st.lists(st.text("abcdefgh", min_size=1, max_size=6), min_size=1, max_size=5, unique=True)

TRAIN = """\
import hashlib, importlib, json, os, sys
names = json.loads(open(os.path.join(os.path.dirname(__file__), "modules.json")).read())
seen = {}
for name in names:
    mod = importlib.import_module(name)
    seen[name] = [mod.__file__, hashlib.sha256(open(mod.__file__, "rb").read()).hexdigest()]
print("SEEN=" + json.dumps(seen), flush=True)
"""


def _listing(top: Path, skip: Path) -> dict[str, str]:
    out = {}
    for folder, dirs, files in os.walk(top):
        if Path(folder) == skip or skip in Path(folder).parents:
            dirs[:] = []
            continue
        for name in files:
            p = Path(folder) / name
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if not p.is_symlink() else os.readlink(p)
    return out


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(modules=MODULES, odd=ODD, churn=st.integers(1, 4), link_out=st.booleans(), data_mb=st.integers(0, 3))
def test_generated_folders_changing_during_the_scan_run_exactly_the_frozen_code(
        tmp_path_factory, modules: list[str], odd: str, churn: int, link_out: bool, data_mb: int) -> None:
    top = tmp_path_factory.mktemp("gen")
    proj = top / "proj"
    (proj / odd).mkdir(parents=True)
    names = [f"m_{m}" for m in modules]
    for i, name in enumerate(names):
        (proj / f"{name}.py").write_text(f"VALUE = {i!r}\n# {odd}\n")
    (proj / "modules.json").write_text(json.dumps(names))
    (proj / "train.py").write_text(TRAIN)
    (proj / odd / "notes.txt").write_text("n\n")
    (proj / odd / "blob.dat").write_bytes(os.urandom(1000))
    (proj / "data.bin").write_bytes(bytes(data_mb << 20))
    (proj / "lightning_logs").mkdir()
    (proj / "lightning_logs" / "x.yaml").write_text("a: 1\n")
    outside = top / "outside"
    outside.mkdir()
    (outside / "far.py").write_text("FAR = 1\n")
    if link_out:
        os.symlink(outside / "far.py", proj / "far_link.py")
        os.symlink("m_nothere.py", proj / "dangling.py")
    (proj / "spec.yaml").write_text(yaml.safe_dump({
        "name": "gen", "entrypoint": "train.py", "nodes": 1, "cpu_ranks_per_node": 1, "runs_dir": "runs",
        "local": {"preload_torch": False, "timeout_s": RUN_WAIT_S}}))
    touched: set[str] = set()
    stop = threading.Event()

    def churner() -> None:  # files growing, appearing and vanishing while the CLI scans
        k = 0
        while not stop.is_set():
            for j in range(churn):
                grow = proj / f"grow{j}.log"
                with open(grow, "a") as f:
                    f.write("x" * 100)
                fresh = proj / f"fresh_{k}_{j}.py"
                fresh.write_text(f"X = {k}\n")
                touched.update({str(grow), str(fresh)})
                if k:
                    (proj / f"fresh_{k - 1}_{j}.py").unlink(missing_ok=True)
            k += 1
            time.sleep(0.003)

    before = _listing(top, proj / "runs")
    thread = threading.Thread(target=churner, daemon=True)
    thread.start()
    try:
        out = subprocess.run([sys.executable, "-m", "orchestrator", "run", "spec.yaml"], cwd=proj, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                          "GIT_CEILING_DIRECTORIES": str(top)})
    finally:
        stop.set()
        thread.join(timeout=10)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run_id = re.search(r"^(\S+): COMPLETED", out.stdout, re.M)
    assert run_id, out.stdout
    code = json.loads((proj / "runs" / run_id[1] / "code.json").read_text())
    frozen = json.loads(Path(code["manifest"]).read_text())["files"]
    seen = json.loads(re.search(r"SEEN=(.*)", (proj / "runs" / run_id[1] / "logs" / "rank-0.log").read_text())[1])
    for name, (path, sha) in seen.items():
        assert Path(path).is_relative_to(proj / "runs" / ".code" / "trees"), path
        assert frozen[f"{name}.py"][0] == sha, name  # the ranks ran exactly what was frozen
    assert "data.bin" not in frozen and not any(rel.startswith("lightning_logs/") for rel in frozen)
    for sha in {item[0] for item in frozen.values() if len(item) < 4}:
        blob = proj / "runs" / ".code" / "blobs" / sha[:2] / sha
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == sha
    after = _listing(top, proj / "runs")
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)} - touched
    assert not changed, sorted(changed)[:5]
