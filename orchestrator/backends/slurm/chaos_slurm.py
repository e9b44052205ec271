"""``orchestrator chaos`` on SLURM: what only the scheduler can do for it (``SlurmExecutor.chaos``,
the ``executors.base.SchedulerChaos`` the front asks). The rank's node is reached through ``srun
--overlap`` inside the run's own job (so only a node the job holds, with the job's rights); a node
is set DOWN with ``scontrol``. What to break and whether it may be broken is the front's
(``orchestrator.front.chaos``); the node's side is ``orchestrator.node.chaos_node``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional, Sequence

from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.core import fs_checks
from orchestrator.core.errors import UsageError
from orchestrator.core.interpreter import module_argv
from orchestrator.node.chaos_node import SENT

#: How long one srun or scontrol of chaos may take.
SRUN_TIMEOUT_S = 30.0
#: How long chaos waits for the controller to name a task's job id.
QUERY_TIMEOUT_S = 30.0


def on_its_node(job: str, host: str) -> tuple[list[str], dict[str, str]]:
    """The head of an ``srun --overlap`` of one task on ``host`` inside job ``job`` (numeric), and its
    environment (``slurm_controller.outside_step_environment``)."""
    return (["srun", "--overlap", f"--jobid={job}", f"--nodelist={host}", "--nodes=1", "--ntasks=1", "--quiet"],
            slurm_controller.outside_step_environment())


class SlurmChaos:
    """What ``orchestrator chaos`` asks of SLURM."""

    def job_id(self, recorded: str) -> str:
        """The job's numeric SLURM id: itself, or for an array task ('A_T') the controller's answer
        (``slurm_controller.resolve_job_id``). UsageError when it names none (srun cannot be
        pointed at the task)."""
        found, why = slurm_controller.resolve_job_id(recorded, QUERY_TIMEOUT_S)
        if found:
            return found
        if slurm_controller.ARRAY_TASK.match(recorded) is None:
            raise UsageError(f"chaos refused: the run's SLURM job is recorded as {fs_checks.shown(recorded)}, which "
                             "is no job id; nothing was broken")
        said = f": {why}" if why else ""
        raise UsageError(f"chaos refused: neither scontrol nor squeue named the numeric job id of array task "
                         f"{recorded}{said} (srun needs it on SLURM 22.05); the task may have just ended: check "
                         "'orchestrator status', then try again; nothing was broken")

    def signal(self, folder: Path, job: str, python: str, host: str, rank: int, name: str) -> Optional[str]:
        """``chaos_node`` on the rank's node, through ``srun --overlap`` in the job (its numeric id).
        None once the node said it sent the signal (``SENT``), whatever srun's exit says afterwards:
        the job's agent may end every step of the job as it restarts the ranks, ours included."""
        head, env = on_its_node(job, host)
        argv = [*head, *module_argv(python, "orchestrator.node.chaos_node", str(folder), str(rank), name,
                                    unbuffered=False)]
        answer = slurm_controller.run(argv, SRUN_TIMEOUT_S, env=env, quiet_stdin=True,
                                      done=lambda a: SENT in a.stdout)  # sent: never ask again
        if SENT in answer.stdout:
            return None
        return answer.complaint or "srun ended without a word from the node"

    def start(self, job: str, host: str, argv: Sequence[str]) -> subprocess.Popen:
        """``argv`` on ``host`` inside the job, in a session of its own (it outlives chaos), with
        its output piped."""
        head, env = on_its_node(job, host)
        return slurm_controller.start([*head, "--unbuffered", *argv], env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, new_session=True)

    def jobs_on(self, node: str) -> list[str]:
        """The jobs running on ``node`` now (``squeue -w``), one id each; UsageError when squeue
        does not answer."""
        answer = slurm_controller.run(["squeue", "-h", "-w", node, "-o", "%A"], SRUN_TIMEOUT_S)
        if not answer.ok:
            raise UsageError(f"chaos refused: could not list the jobs on {node} "
                             f"({slurm_controller.one_line(answer.complaint)}), and it is set DOWN only when no one "
                             "else's job runs there; try again")
        return [line.strip() for line in answer.stdout.splitlines() if line.strip()]

    def set_down(self, node: str, reason: str) -> None:
        down = slurm_controller.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={reason}"],
                                    SRUN_TIMEOUT_S)
        if not down.ok:
            raise UsageError(f"chaos: could not take {node} down ({slurm_controller.one_line(down.complaint)}); "
                             "setting a node DOWN needs the SLURM administrator's rights: use --kill-rank or "
                             "--stop-rank instead")
