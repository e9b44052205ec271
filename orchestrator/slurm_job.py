"""The job's agent on SLURM: ``python -m orchestrator.slurm_job RUN/payload.json [--point-base N]``.

It is the batch script's one command (standard library only). It starts the ranks with srun
(one task per rank, ``--kill-on-bad-exit``), and it alone receives the time-limit signal
(``#SBATCH --signal=B:USR2@margin``): it forwards USR2 through srun to every rank, where the
user's handlers or the rank API see it, and decides about requeue by ``slurm.requeue``:

- ``always``: requeue as soon as USR2 arrives; the script resumes from its own snapshot.
- ``auto``: requeue once srun has ended and the ranks stopped on a signal and checkpointed
  through the rank API (it writes ``ORCH_REQUEUE_MARKER``), unless the job was cancelled.
- ``never``: let the job end.

Requeues are bounded by ``slurm.max_requeues``. scancel (``orchestrator cancel``) signals the
ranks directly, as under plain srun, and never leads to a requeue. Being outside the job step,
the agent is not killed by ``--kill-on-bad-exit`` and decides once per attempt, in one place;
the decision never depends on what the entrypoint returns.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Mapping

from orchestrator.rank_env import slurm_job_id
from orchestrator.slurm_rank import payload_path, point_base, requeue_marker

POLL_S = 0.2


class JobAgent:
    def __init__(self, payload: Mapping[str, Any], environ: Mapping[str, str]) -> None:
        self.payload = payload
        self.job_id = slurm_job_id(environ)
        self.restart = int(environ.get("SLURM_RESTART_COUNT", "0"))
        self.received: list[str] = []
        self.marker = requeue_marker(str(payload["run_dir"]), self.job_id, self.restart)
        self.requeued = False  # decided (once per attempt)
        self.requeue_done = False  # scontrol accepted it
        self.srun: subprocess.Popen | None = None

    def _on_signal(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if signum == signal.SIGUSR2 and self.srun is not None and self.srun.poll() is None:
            self.srun.send_signal(signal.SIGUSR2)  # srun forwards it to every task (rank)

    def run(self, srun_argv: list[str]) -> int:
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self.srun = subprocess.Popen(srun_argv)
        # Requeue while the job is still running, as soon as the evidence is there (SLURM then
        # ends the ranks that are still exiting); checked once more after srun, since every rank
        # may have ended before the loop looked.
        while (code := self.srun.poll()) is None:
            self._requeue_if_due()
            time.sleep(POLL_S)
        self._requeue_if_due()
        if self.policy == "auto" and not self.requeued and "SIGUSR2" in self.received:
            self._say("SIGUSR2 arrived but the ranks did not checkpoint through the rank API, so the job is "
                      "not requeued (slurm.requeue: auto); a script that resumes from its own snapshot "
                      "wants slurm.requeue: always")
        if self.requeue_done:
            return 0  # the ranks' ends were the requeue's doing; SLURM runs the next attempt
        return code if code >= 0 else 128 - code

    def _requeue_if_due(self) -> None:
        if self.requeued or "SIGTERM" in self.received:  # scancel / orchestrator cancel: never
            return
        if self.policy == "always" and "SIGUSR2" in self.received:
            self._requeue("SIGUSR2 (time limit or preemption), slurm.requeue: always")
        # The ranks may also have been signalled directly (scancel --signal=USR2 reaches the steps,
        # not this shell): the rank API's checkpoint marker is the evidence either way.
        elif self.policy == "auto" and os.path.exists(self.marker):
            self._requeue("the ranks stopped on a signal and checkpointed, slurm.requeue: auto")

    @property
    def policy(self) -> str:
        return str(self.payload.get("requeue", "auto"))

    def _requeue(self, why: str) -> None:
        if self.requeued:
            return
        self.requeued = True
        limit = int(self.payload.get("max_requeues", 0))
        if self.restart >= limit:
            self._say(f"{why}; no requeues left ({self.restart} of {limit} used)")
            return
        self._say(f"{why}: requeueing {self.job_id} (restart {self.restart + 1} of {limit})")
        try:
            out = subprocess.run(["scontrol", "requeue", self.job_id], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._say(f"scontrol requeue failed: {exc}")
            return
        if out.returncode != 0:
            self._say(f"scontrol requeue {self.job_id} failed: {out.stderr.strip()}")
            return
        self.requeue_done = True

    def _say(self, text: str) -> None:
        print(f"[launcher] {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m orchestrator.slurm_job PAYLOAD.json [--point-base N] (the batch script's command)",
              file=sys.stderr)
        return 2
    payload = json.loads(payload_path(args[0], point_base(args), os.environ).read_text(encoding="utf-8"))
    srun = list(payload["srun"]) + (["--point-base", str(point_base(args))] if point_base(args) else [])
    return JobAgent(payload, os.environ).run(srun)


if __name__ == "__main__":
    sys.exit(main())
