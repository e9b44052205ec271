"""Stacks of ranks on SLURM nodes: ``python -m orchestrator.backends.slurm.node.stacks_probe RUN_DIR [--rank N]``.

Run once per node of a running job through ``srun --overlap`` (``request_slurm`` does that; so
do ``orchestrator stacks`` and the job's agent): on its node it signals, identity-checked, the
ranks whose own record names this host, and waits (bounded) until their dumps are written to
the shared run folder, where the caller reads them. Standard library only.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.node import stack_requests

#: srun has to create a step in the allocation; a busy controller takes its time.
SRUN_TIMEOUT_S = 20.0


def probe_argv(run_dir: str | Path, job_id: str, nodes: int, python: str, ranks: list[int] | None = None,
               hosts: Sequence[str] = ()) -> list[str]:
    """One task on each node of the job (on ``hosts``, the ranks' nodes, when the job holds others
    too: spares), sharing its CPUs (--overlap) so a busy job still lets it in."""
    from orchestrator.core.interpreter import module_argv

    if hosts:
        nodes = len(hosts)
    argv = ["srun", "--overlap", f"--jobid={job_id}", f"--nodes={nodes}", "--ntasks-per-node=1",
            f"--ntasks={nodes}", *([f"--nodelist={','.join(hosts)}"] if hosts else []), "--quiet", "--kill-on-bad-exit=0",
            *module_argv(python, "orchestrator.backends.slurm.node.stacks_probe", str(run_dir), unbuffered=False)]
    for rank in ranks or []:
        argv += ["--rank", str(rank)]
    return argv


def request_slurm(run_dir: str | Path, job_id: str, nodes: int, python: str, ranks: list[int] | None = None,
                  timeout_s: float = SRUN_TIMEOUT_S, hosts: Sequence[str] = ()) -> tuple[dict[int, str], str]:
    """Each rank's fresh dump ('' for a rank that did not answer), and srun's complaint if any.
    ``job_id``: the job's or a sweep point's (resolved to the allocation's number)."""
    known = stack_requests.rank_procs(run_dir)
    chosen = sorted(known if ranks is None else [r for r in ranks if r in known])
    if not chosen:
        return {}, "no rank has recorded itself yet (the job may still be starting)"
    before = stack_requests.sizes(run_dir, chosen)
    job_id = slurm_controller.numeric_job_id(job_id)  # a sweep point's '<array>_<task>': srun takes numbers
    out = slurm_controller.run(probe_argv(run_dir, job_id, nodes, python, ranks, hosts), timeout_s,
                               env=slurm_controller.outside_step_environment(), quiet_stdin=True)
    if out.returncode is None:
        problem = f"srun --overlap could not reach the job's nodes ({out.error})"
    else:
        problem = out.stderr.strip() if out.returncode != 0 else ""
    asked, refused = answers(out.stdout or "")
    if refused:
        problem = "\n".join([*([problem] if problem else []), *(f"rank {r}: not asked: {why}" for r, why in sorted(refused.items()))])
    waited = {r: before[r] for r in chosen if r not in refused or r in asked}  # a rank no probe asked sends nothing
    after = {**before, **stack_requests.wait_written(run_dir, waited, timeout_s=1.0)}  # the probes waited; this is the shared FS
    return {r: stack_requests.read_from(run_dir, r, before[r], after[r]) for r in chosen}, problem


#: How a probe tells the caller, one line on its stdout per rank of its node: ``asked N`` or
#: ``refused N WHY`` (``stack_requests.why_not_signalled``: a stopped rank, one that exec'd).
ASKED, REFUSED = "asked", "refused"


def answers(stdout: str) -> tuple[set[int], dict[int, str]]:
    """The ranks the probes asked, and why each refused one was not (their stdout, all nodes')."""
    asked: set[int] = set()
    refused: dict[int, str] = {}
    for line in stdout.splitlines():
        word, _, rest = line.strip().partition(" ")
        number, _, why = rest.partition(" ")
        if not (number.isascii() and number.isdigit()):
            continue
        if word == ASKED:
            asked.add(int(number))
        elif word == REFUSED:
            refused[int(number)] = why
    return asked, refused


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m orchestrator.backends.slurm.node.stacks_probe RUN_DIR [--rank N ...] (run by srun --overlap)",
              file=sys.stderr)
        return 2
    run_dir = args[0]
    ranks = [int(args[i + 1]) for i, a in enumerate(args) if a == "--rank" and i + 1 < len(args)] or None
    mine = [r for r, rp in stack_requests.rank_procs(run_dir).items() if rp.here() and (ranks is None or r in ranks)]
    before = stack_requests.sizes(run_dir, mine)
    sent, refused = stack_requests.signal_explained(run_dir, mine)
    for rank in sent:
        print(f"{ASKED} {rank}", flush=True)
    for rank, why in sorted(refused.items()):
        if why != stack_requests.ENDED:
            print(f"{REFUSED} {rank} {why}", flush=True)
    if sent:
        stack_requests.wait_written(run_dir, {r: before[r] for r in sent})
    return 0


if __name__ == "__main__":
    sys.exit(main())
