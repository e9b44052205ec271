"""`orchestrator cancel` of an unmodified Lightning job (2 nodes x 2 ranks, gloo) on the site
profile: CANCELLED, and every rank gone within 10 s.

Lightning's SIGTERM handler broadcasts a flag from rank 0. The cancel's SIGTERM reaches rank 0
while it runs Python (its data pipeline is the slow one) and its peers inside DDP's all-reduce,
in C++, where no Python handler runs: the handler's broadcast meets their all-reduce and neither
completes. Before the stop's judge (orchestrator.node.stop_judge) the job's agent waited out
stop_grace_s (30 s), then scancel's KillWait: 63 s, ranks SIGKILLed. The agent now sees every
rank stuck in a collective (srun --overlap stacks) and scancels the job at once, which is what a
plain scancel does to such ranks (srun SIGKILLs its tasks on SIGTERM); end.json says why.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator.backends.slurm.executor import SlurmExecutor
from tests.integration.helpers import SCRIPTS
from tests.integration.test_frameworks import framework_spec

from .streams import belongs_to_another_stream
from .test_slurm import slurm_plan

WORLD = 4
#: The acceptance bound: every rank gone within this many seconds of `cancel`.
RANKS_GONE_S = 10.0


def rank_pids() -> list[str]:
    """Live rank processes (srun's tasks, ``orchestrator.backends.slurm.node.slurm_rank``; not srun itself, whose
    command line names it too) in the node namespaces (this session's, tests/cluster/streams.py)."""
    found = []
    for ns in ("orch-node1", "orch-node2"):
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            if belongs_to_another_stream(pid):
                continue
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                continue
            if any("orchestrator.backends.slurm.node.slurm_rank" in a for a in argv) and Path(argv[0]).name != "srun" and state != "Z":
                found.append(pid)
    return found


def time_until_ranks_gone(t0: float, limit_s: float, seen: list[float]) -> None:
    """Poll the rank processes from ``t0`` on; note when none is left (nothing if never)."""
    while time.monotonic() - t0 < limit_s:
        if not rank_pids():
            seen.append(time.monotonic() - t0)
            return
        time.sleep(0.1)


def test_cancel_of_an_unmodified_lightning_job_ends_every_rank_within_seconds(cluster: dict[str, str]) -> None:
    pytest.importorskip("lightning", reason="pip install '.[frameworks]'")
    out = Path(cluster["runs_dir"]) / "lit-cancel-out"
    out.mkdir()
    spec = {**framework_spec("lightning", out), "entrypoint": str(SCRIPTS / "lightning_until_cancelled.py")}
    launch = slurm_plan(cluster, **{**spec, "name": "lit-cancel"})
    ex = SlurmExecutor()
    record = ex.submit(launch)
    deadline = time.monotonic() + 120
    while not all((out / f"training-{r}").exists() for r in range(WORLD)):
        if time.monotonic() > deadline:
            ex.cancel(record)
            pytest.fail(f"the ranks never trained: {sorted(p.name for p in out.iterdir())}")
        time.sleep(0.2)
    assert len(rank_pids()) == WORLD, rank_pids()
    t0 = time.monotonic()
    gone: list[float] = []
    watcher = threading.Thread(target=time_until_ranks_gone, args=(t0, 60.0, gone))
    watcher.start()
    record = ex.cancel(record)
    returned = time.monotonic() - t0
    watcher.join()
    print(f"cancel -> every rank gone: {gone[0] if gone else 'never'}s; cancel returned after {returned:.1f}s")
    assert gone and gone[0] < RANKS_GONE_S, f"ranks gone after {gone}s (bound {RANKS_GONE_S}s): {record.error}"
    assert record.state == "CANCELLED", record
    if "stuck after SIGTERM" in (record.error or ""):  # the deadlock formed: the stop judge ended it
        assert record.waits.get("0") == "signal_connector.py:118 in _sigterm_notifier_fn, waiting in broadcast", \
            record.waits
    else:
        # Beside the other streams' jobs (2 cores), a peer was sometimes still in Python when SIGTERM
        # came: its own handler ran, Lightning raised SIGTERMException at its next step, it left, and
        # the others failed on the connection it closed (2.7 s after the cancel, before the judge's
        # 3 s). Also a cancel that works; the record must say it was one, not blame the bystander.
        # The deadlock itself is made certain in tests/integration/test_cancel_stuck_handlers.py.
        print(f"the deadlock did not form; the record says: {(record.error or '').splitlines()[:1]}")
        assert record.error is None or record.error.startswith("cancelled; while the ranks stopped, "), record.error
    assert not rank_pids()
