"""Two users on one node: a stranger who plants folders and links where our node-local files would
go takes nothing over. Our run refuses the stranger's folder (naming it), writes nothing through
its links, removes nothing of the stranger's, and completes with its heartbeats intact."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from orchestrator.core import progress
from orchestrator.plan import plan
from orchestrator.spec.loading import load_spec

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "heartbeat_steps.py"
STRANGER = "orch-stranger"


def stranger_uid() -> int:
    """An ordinary user of this machine other than the one running the tests (made if missing)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        if os.environ.get("CI"):
            pytest.fail("the two-user test needs root and useradd in CI")
        pytest.skip("needs root and useradd to act as a second user")
    try:
        return pwd.getpwnam(STRANGER).pw_uid
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", STRANGER],
                       capture_output=True, timeout=30)
        return pwd.getpwnam(STRANGER).pw_uid  # made here, or by a worker beside this one


def as_stranger(uid: int, code: str) -> None:
    """Run ``code`` (Python) as the stranger: what another user's process on the node would do."""
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable  # ours may be in /root
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: (os.setgroups([]), os.setgid(uid), os.setuid(uid)))
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def shared_memory() -> Path:
    """A folder every user may create in, as /dev/shm (mode 1777), only for this test."""
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path("/tmp")
    folder = base / f"orch-test-shm-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_stranger_cannot_take_over_our_node_local_folders(tmp_path: Path, shared_memory: Path) -> None:
    uid = stranger_uid()
    runs = tmp_path / "runs"
    victim = tmp_path / "victim"  # ours, private: a planted link must never lead a write here
    victim.mkdir(mode=0o700)
    (victim / "secret").write_text("mine")
    (victim / "secret").chmod(0o600)
    squat = shared_memory / f"orch-u{os.geteuid()}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: shared\nentrypoint: {SCRIPT}\nextra_args: ['10']\nnodes: 1\ncpu_ranks_per_node: 2\n"
                    f"runs_dir: {runs}\n")
    prefix = progress._staging_prefix(plan(load_spec(spec), "local").run_dir)  # a stranger can work it out too
    planted = [f"{prefix}-a0-n0", f"{prefix}-a1-n0"]
    # The stranger takes the name our private folder would have, open to all, and plants a link
    # inside at the very names this run's staging folders have there.
    as_stranger(uid, f"""
import os
os.mkdir({str(squat)!r}, 0o777); os.chmod({str(squat)!r}, 0o777)
for name in {planted!r}:
    os.symlink({str(victim)!r}, os.path.join({str(squat)!r}, name))
""")
    tmp_path.chmod(0o755)  # the stranger may look, as on a shared filesystem
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_RUNTIME_DIR": str(shared_memory)}
    env.pop("SLURM_TMPDIR", None)
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(spec)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # Nothing through the stranger's links, nothing of the stranger's used or removed.
    assert sorted(p.name for p in victim.iterdir()) == ["secret"] and (victim / "secret").read_text() == "mine"
    assert sorted(p.name for p in squat.iterdir()) == sorted(planted)
    assert all(p.lstat().st_uid == uid for p in squat.iterdir())
    logs = "".join(p.read_text(errors="replace") for p in runs.glob("*/logs/*"))
    assert f"not using {squat}" in logs + proc.stderr, "the refused folder is not named"
    # The heartbeats still arrived (through our own private folder elsewhere, or the run folder).
    run_dir = next(p.parent for p in runs.rglob("record.json"))
    assert [r.step if r else None for r in progress.read_progress(run_dir, 2)] == [10, 10]
