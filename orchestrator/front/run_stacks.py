"""A run's stacks as ``Run.stacks`` (and so ``orchestrator stacks``) returns them: asked of the
live ranks the way the run's executor reaches them, or read from the files saved at its end.

Local ranks are signalled from here (``orchestrator.node.stack_requests``); a SLURM run's ranks are
on other nodes, reached by its scheduler's executor (``ScheduledExecutor.live_stacks``: ``srun --overlap``). ``--native``
asks py-spy instead (local runs only). A run that has ended shows what
``orchestrator.core.stack_files`` saved at its end. Every failure is an ``OrchestratorError`` whose
message names the next step.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.backends import backend
from orchestrator.core import procs
from orchestrator.core.errors import RunNotFinishedError, UsageError
from orchestrator.core.shell_words import command_line, quoted_command
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.stack_files import saved_files
from orchestrator.node.stack_requests import (ENDED, UNCONFIRMED, RankProc, rank_procs, request_local_explained,
                                         why_not_signalled)
from orchestrator.core.stacks import where

if TYPE_CHECKING:
    from orchestrator.core.records import RunRecord


def live_stacks(record: RunRecord, folder: Path, ranks: list[int] | None, timeout: float) -> tuple[dict[int, str], str]:
    """Each live rank's fresh dump ('' for a rank that did not answer; all of them, or ``ranks``)
    and, when that is known, why they did not answer: srun's complaint on SLURM, or that local
    ranks run where this process cannot signal them. ``folder`` is where the ranks record
    themselves (the run folder, or the current sweep point's)."""
    if backend(record.executor).scheduled:
        from orchestrator.backends.factory import scheduler

        return scheduler(record.executor).live_stacks(record, folder, ranks, timeout)
    dumps, refused = request_local_explained(folder, ranks, timeout_s=timeout)
    known = rank_procs(folder)
    elsewhere = sorted({rp.host for rp in known.values() if not rp.here()})
    if not dumps and known and elsewhere:
        return dumps, (f"its ranks run on {', '.join(elsewhere)} (another host, boot or PID namespace), where only "
                       f"{quoted_command('orchestrator', 'stacks', record.run_id)} can reach them")
    reasons = sorted({why for why in refused.values() if why != ENDED})
    return dumps, "; ".join(reasons) if not dumps else ""


def live_text(record: RunRecord, folder: Path, rank: int | None, timeout: float) -> str:
    """Every rank's fresh dump (or ``rank``'s) under a line saying where it was; a rank that did
    not answer says why it may not have. Raises RunNotFinishedError when none answered."""
    dumps, problem = live_stacks(record, folder, None if rank is None else [rank], timeout)
    if not dumps:
        again = "" if problem and not procs.can_identify() else "try again in a moment, or "
        raise RunNotFinishedError(
            f"no rank of {record.run_id} ({record.state}) answered: "
            + (problem or "none has started yet, or all have ended")
            + f"; {again}see {command_line('orchestrator', 'logs', record.run_id)}")
    known = rank_procs(folder)
    parts = []
    for r in range(max(1, record.world_size)) if rank is None else [rank]:
        text = dumps.get(r, "")
        rp = known.get(r)
        who = f"rank {r}" + (f" (host {rp.host}, pid {rp.pid})" if rp else "")
        if not text:
            parts.append(f"=== {who}: no answer ({_silence(record, rp, timeout)}) ===\n")
            continue
        parts.append(f"=== {who}: {where(text).text()} ===\n{text.rstrip()}\n")
    if problem:
        parts.append(f"(srun said: {problem.splitlines()[-1]})\n")
    return "\n".join(parts)


def _silence(record: RunRecord, rp: RankProc | None, timeout: float) -> str:
    """Why a rank gave no dump: not asked (``why_not_signalled``), or asked and silent."""
    if backend(record.executor).scheduled or rp is None or not rp.here():
        return "not started, ended, or not reachable"
    why = why_not_signalled(rp)
    if why is not None:
        return "not started or ended" if why == ENDED else why
    if not procs.can_see_handlers():
        return (f"asked, silent for {timeout:g}s: this system cannot tell whether its process still has the "
                "launcher's stack handler (it exec'd another program?); try --native")
    return f"asked, silent for {timeout:g}s"


def saved_text(record: RunRecord, rank: int | None) -> str:
    """The stacks saved at the end of a run that has ended (or ``rank``'s). Raises
    RunNotFinishedError when none were saved."""
    folder = RunFolder.of(record.run_dir).stacks
    files = saved_files(record.run_dir, rank)
    if not files:
        raise RunNotFinishedError(f"{record.run_id} has ended ({record.state}) and no stacks were saved at its "
                                  f"end; live stacks need a running run")
    head = f"{record.run_id} has ended ({record.state}); the stacks saved at its end ({folder}):\n"
    return head + "\n".join(f"=== {p.stem.replace('-', ' ')} ===\n{p.read_text(errors='replace').rstrip()}\n"
                             for p in files)


def py_spy(executor: str) -> str:
    """The py-spy that ``--native`` runs. Raises UsageError on SLURM, or when py-spy is missing."""
    import shutil
    import sys

    if backend(executor).scheduled:
        raise UsageError("--native (py-spy) works for local runs only; on SLURM use 'orchestrator stacks' "
                         "without it (Python stacks from every node)")
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise UsageError("--native needs py-spy: pip install py-spy (or drop --native for the Python stacks)")
    return spy


def native_text(run_id: str, spy: str, folder: Path, rank: int | None) -> str:
    """Every running rank's stacks (or ``rank``'s), C/C++ frames included, from ``spy dump
    --native``; it needs ptrace permission. Raises RunNotFinishedError when no rank runs."""
    import subprocess

    parts = []
    for r, rp in sorted(rank_procs(folder).items()):
        if rank is not None and r != rank:
            continue
        if not procs.can_identify():
            parts.append(f"=== rank {r} (pid {rp.pid}): not asked: {UNCONFIRMED} ===\n")
            continue
        if not procs.same_process(rp.pid, rp.start_ticks):
            parts.append(f"=== rank {r}: no longer running ===\n")
            continue
        try:
            out = subprocess.run([spy, "dump", "--native", "--pid", str(rp.pid)], capture_output=True,
                                 text=True, timeout=30)
            text = out.stdout if out.returncode == 0 else (
                f"py-spy failed: {out.stderr.strip() or out.stdout.strip()} (it needs ptrace permission: "
                "root, CAP_SYS_PTRACE or kernel.yama.ptrace_scope=0; without --native no permission is needed)")
        except subprocess.TimeoutExpired:
            text = "py-spy did not answer within 30 s"
        parts.append(f"=== rank {r} (pid {rp.pid}, py-spy --native) ===\n{text.rstrip()}\n")
    if not parts:
        raise RunNotFinishedError(f"no rank of {run_id} is running; try again once it has started")
    return "\n".join(parts)
