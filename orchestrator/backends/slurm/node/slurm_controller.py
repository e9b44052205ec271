"""Every SLURM command the orchestrator runs, in one place: scontrol, sinfo, squeue, sacct,
scancel, sacctmgr, and the sruns that are checks or probes (``srun --overlap`` for stacks, the
container check, the health gate). Standard library only: the job's agent imports it on compute
nodes.

One owner for what every caller needs: the SLURM_CONF check (``check_slurm_conf``), timeouts,
bounded retries while the controller is busy (``BUSY``: "Socket timed out", "Unable to contact
slurm controller", "Resource temporarily unavailable"), and the mapping of a tool's complaint to
one line that says what to do (``controller_problem``). A call answers an ``Answer``, never raises
for a tool that could not run; the callers decide what a failure means for them.

Two SLURM commands are not here: sbatch, which submitit runs (``orchestrator.backends.slurm.submitit_adapter``),
and the agent's srun that starts the ranks (``orchestrator.backends.slurm.node.slurm_job``: a long-lived Popen whose
messages it reads).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from orchestrator.core.errors import SubmissionError

#: The commands that go through here (tests/unit/test_slurm_controller.py holds every other
#: module to it).
TOOLS = frozenset({"scontrol", "sinfo", "squeue", "sacct", "scancel", "sacctmgr", "srun", "sbatch"})
#: What a tool prints when the controller is busy or restarting: worth asking again a moment later.
BUSY = ("Socket timed out", "Unable to contact slurm controller", "Resource temporarily unavailable")
#: The waits between tries while the controller is busy (within the call's own timeout).
BUSY_BACKOFF_S: tuple[float, ...] = (1.0, 2.0)
#: The waits for the agent's calls that must not be lost (scontrol requeue): any failure retried.
PERSIST_BACKOFF_S: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
#: The default time a query may take.
QUERY_TIMEOUT_S = 60.0
#: The agent's queries from a compute node: short, the controller may be the one that is slow.
AGENT_TIMEOUT_S = 15.0

#: What SLURM's tools print when they find no configuration, no slurmdbd, or no controller.
NO_CONFIG = ("Could not establish a configuration source", "DNS SRV lookup failed", "fetch_config",
             "Unable to process configuration file")
NO_DBD = ("Problem talking to the database", "slurmdbd")
NO_CONTROLLER = ("Unable to contact slurm controller", "connect failure", "Connection refused",
                 "Socket timed out", "Zero Bytes were transmitted")
#: Node states (sinfo %t) that say a node is gone: down, drained or failing, not responding (*).
#: sinfo's short states of a node that no longer runs our ranks. Not a draining node (drng): a drain
#: stops new jobs, never a running one's steps, so a node an administrator drains for later
#: maintenance while our job holds it keeps serving the job (counted lost, a crash's restart gave
#: up a good node). A drained one (drain: it holds no job) is not ours any more.
NODE_GONE = re.compile(r"^(down|drain|fail|failg|boot|powered|pow_dn|npc)|\*$")


def check_slurm_conf() -> None:
    """A SLURM_CONF naming a missing file makes every SLURM tool retry for a minute: say so at once."""
    conf = os.environ.get("SLURM_CONF")
    if conf is not None and not conf.strip():
        raise SubmissionError("SLURM_CONF is set but empty (every SLURM tool would retry for a minute); unset it to "
                              "use this machine's slurm.conf, or point it at the cluster's")
    if conf and not os.path.isfile(conf):
        raise SubmissionError(f"SLURM_CONF={conf} does not exist; point it at the cluster's slurm.conf "
                              "(for the deploy/ cluster: source /var/tmp/orch-cluster/env)")


def controller_problem(tool: str, stderr: str) -> str | None:
    """One line with the fix, when a SLURM tool failed for want of a cluster to talk to; else None."""
    conf = os.environ.get("SLURM_CONF")
    if any(s in stderr for s in NO_CONFIG):
        where = f"SLURM_CONF={conf}" if conf else "SLURM_CONF is not set and this machine has no slurm.conf"
        return (f"{tool} found no SLURM cluster ({where}): set SLURM_CONF to the cluster's slurm.conf or run "
                "this on a login node (for the deploy/ cluster: source /var/tmp/orch-cluster/env)")
    if any(s in stderr for s in NO_DBD):
        return (f"{tool} could not reach the accounting daemon (slurmdbd): check that it is running "
                "('sacctmgr show cluster' answers when it is)")
    if any(s in stderr for s in NO_CONTROLLER):
        named = f"named in {conf}" if conf else "named in this machine's slurm.conf"
        return (f"{tool} could not reach the SLURM controller {named}: check that slurmctld is running "
                "('scontrol ping') and that SLURM_CONF names this cluster")
    return None


def one_line(text: object) -> str:
    """An error (or a tool's complaint) on one line, at most 500 characters."""
    return " ".join(str(text).split())[:500]


@dataclass(frozen=True)
class Answer:
    """What one SLURM command answered. ``returncode`` None: it could not run (``error`` says
    why; ``missing``: the tool is not installed here)."""

    argv: tuple[str, ...]
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    error: str = ""
    missing: bool = False

    @property
    def tool(self) -> str:
        return self.argv[0] if self.argv else "?"

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def complaint(self) -> str:
        """Why the command failed, for a message ('' when it did not)."""
        if self.ok:
            return ""
        return self.stderr.strip() or self.error or f"exit code {self.returncode}"

    @property
    def problem(self) -> str | None:
        """``controller_problem`` of its complaint: no cluster, no slurmdbd, no controller."""
        return controller_problem(self.tool, self.stderr) if not self.ok else None

    @property
    def busy(self) -> bool:
        return not self.ok and any(s in self.stderr for s in BUSY)


def _once(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None, quiet_stdin: bool,
          capture: bool, cwd: str | None = None) -> Answer:
    try:
        out = subprocess.run(list(argv), capture_output=capture, text=True, timeout=max(1.0, timeout_s), check=False,
                             env=dict(env) if env is not None else None, cwd=cwd,
                             stdin=subprocess.DEVNULL if quiet_stdin else None)
    except FileNotFoundError as exc:
        return Answer(tuple(argv), None, error=f"{argv[0]} not found ({exc})", missing=True)
    except (subprocess.TimeoutExpired, OSError) as exc:
        return Answer(tuple(argv), None, error=str(exc))
    return Answer(tuple(argv), out.returncode, out.stdout or "", out.stderr or "")


def run(argv: Sequence[str], timeout_s: float = QUERY_TIMEOUT_S, *, backoff_s: Sequence[float] = BUSY_BACKOFF_S,
        retry_any: bool = False, env: Mapping[str, str] | None = None, quiet_stdin: bool = False,
        capture: bool = True, on_retry: Callable[[Answer], None] | None = None, cwd: str | None = None,
        done: Callable[[Answer], bool] | None = None) -> Answer:
    """Run one SLURM command, asked again after each of ``backoff_s`` while the controller is busy
    (any failure with ``retry_any``), all within ``timeout_s``. ``on_retry`` hears each failed try
    that is tried again; ``done`` says of a failed answer that asking again is pointless (it is
    returned as it is). ``capture`` False: its output goes where ours goes (the health gate's
    srun, whose tasks' lines belong in the batch log)."""
    if not argv or argv[0] not in TOOLS:
        raise ValueError(f"not a SLURM command: {list(argv)[:3]}")
    deadline = time.monotonic() + timeout_s
    for delay in (*backoff_s, None):
        answer = _once(argv, deadline - time.monotonic(), env, quiet_stdin, capture, cwd)
        again = (not answer.ok and not answer.missing and (retry_any or answer.busy)
                 and not (done is not None and done(answer)))
        if not again or delay is None or time.monotonic() + delay >= deadline:
            return answer
        if on_retry is not None:
            on_retry(answer)
        time.sleep(delay)
    return answer  # not reached: the last delay is None


def start(argv: Sequence[str], env: Mapping[str, str] | None = None, *, stdin: int | None = subprocess.DEVNULL,
          stdout: int | None = None, stderr: int | None = None,
          new_session: bool = False) -> subprocess.Popen[bytes]:
    """Start a SLURM command that outlives this call (an ``srun --overlap`` step beside the ranks':
    a replaced rank, a warm standby, chaos's slow-down) and return its process; the caller waits
    for it. Never retried: a step that cannot start says so on its stderr and exits."""
    if not argv or argv[0] not in TOOLS:
        raise ValueError(f"not a SLURM command: {list(argv)[:3]}")
    return subprocess.Popen(list(argv), env=None if env is None else dict(env), stdin=stdin, stdout=stdout,
                            stderr=stderr, start_new_session=new_session)


# ---- the questions several modules ask ------------------------------------------------------
def key_values(text: str) -> dict[str, str]:
    """'Key=value Key2=value2' (scontrol's one-line records) as a dict."""
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def controller_hosts(hostlist: str) -> list[str]:
    """A host list the controller wrote ('node[1-3],gpu7', ExcNodeList) as names
    (``orchestrator.core.hostlist``); [] for '(null)' or none, and the text itself for one the parser
    refuses (the controller wrote it: it names hosts)."""
    from orchestrator.core.hostlist import expand

    if not hostlist or hostlist == "(null)":
        return []
    try:
        return expand(hostlist)
    except ValueError:
        return [hostlist]


def show_job(job_id: str, timeout_s: float = AGENT_TIMEOUT_S, persist: bool = False) -> dict[str, str]:
    """``scontrol show job -o`` as key=value pairs ({} when the controller does not answer in time).
    ``persist``: asked again on any failure within ``timeout_s`` (see ``set_excluded``)."""
    argv = ["scontrol", "show", "job", "-o", job_id]
    answer = run(argv, timeout_s, backoff_s=PERSIST_BACKOFF_S, retry_any=True) if persist else run(argv, timeout_s)
    return key_values(answer.stdout) if answer.ok else {}


def partition_preempt_mode(partition: str, timeout_s: float = AGENT_TIMEOUT_S) -> str:
    """The partition's PreemptMode as the controller states it (REQUEUE, CANCEL, SUSPEND,GANG...;
    the cluster's default where the partition sets none); '' when it does not answer. For a job
    listed in several partitions, the first."""
    name = partition.split(",")[0]
    if not name:
        return ""
    answer = run(["scontrol", "show", "partition", "-o", name], timeout_s)
    return key_values(answer.stdout).get("PreemptMode", "") if answer.ok else ""


def node_states(nodes: Sequence[str] = (), partition: str = "",
                timeout_s: float = AGENT_TIMEOUT_S) -> list[tuple[str, str]] | None:
    """``sinfo -N``'s (node, state) rows for these nodes or this partition; None: no answer."""
    which = ["-n", ",".join(nodes)] if nodes else ["-p", partition]
    answer = run(["sinfo", "-h", "-N", *which, "-o", "%N %t"], timeout_s)
    if answer.returncode is None:
        return None
    return [(p[0], p[1] if len(p) > 1 else "") for p in (line.split() for line in answer.stdout.splitlines()) if p]


def nodes_gone(nodes: Sequence[str]) -> set[str]:
    """Which of ``nodes`` SLURM says are down, drained, failing or not responding."""
    if not nodes:
        return set()
    return {node for node, state in node_states(nodes) or [] if state and NODE_GONE.search(state)}


def scancel(*args: str, timeout_s: float = QUERY_TIMEOUT_S) -> Answer:
    """``scancel ARGS`` (a job id, ``--signal=...``, ``--state=...``)."""
    return run(["scancel", *args], timeout_s)


#: An array task as SLURM names it: the array's job id, '_', the task's index.
ARRAY_TASK = re.compile(r"^(?P<array>\d+)_(?P<task>\d+)$")


def job_id_from_show(job: str, fields: Mapping[str, str]) -> str | None:
    """The numeric JobId in ``scontrol show job -o A_T``'s fields, when they are that task's."""
    task = ARRAY_TASK.match(job)
    if task is None:
        return None
    if fields.get("ArrayJobId", task["array"]) != task["array"] or \
            fields.get("ArrayTaskId", task["task"]) != task["task"]:
        return None  # a record of the array's pending tasks ('3-5'), not of this running task
    found = fields.get("JobId", "")
    return found if found.isdigit() else None


def job_id_from_squeue(stdout: str) -> str | None:
    """The one numeric job id ``squeue -h -o %A -j A_T`` printed, else None."""
    ids = {line.strip() for line in stdout.splitlines() if line.strip()}
    return ids.pop() if len(ids) == 1 and next(iter(ids)).isdigit() else None


def resolve_job_id(job_id: str, timeout_s: float = AGENT_TIMEOUT_S) -> tuple[str | None, str]:
    """The allocation's own number for ``job_id`` and, when there is none, why: a plain number is
    itself (nothing asked); an array task 'A_T' (a sweep's point) is asked of the controller
    (``scontrol show job``'s JobId, else ``squeue -o %A``). ``srun --jobid`` on SLURM 22.05 refuses
    the array form ("Invalid numeric value"), and no file of a run holds the task's SLURM_JOB_ID."""
    if job_id.isdigit():
        return job_id, ""
    if ARRAY_TASK.match(job_id) is None:
        return None, f"{job_id!r} is no SLURM job id"
    found = job_id_from_show(job_id, show_job(job_id, timeout_s))
    if found:
        return found, ""
    answer = run(["squeue", "-h", "-o", "%A", "-j", job_id], timeout_s)
    found = job_id_from_squeue(answer.stdout) if answer.ok else None
    return (found, "") if found else (None, one_line(answer.complaint) if not answer.ok else "")


def numeric_job_id(job_id: str, timeout_s: float = AGENT_TIMEOUT_S) -> str:
    """``resolve_job_id``, or ``job_id`` itself where the controller names none (the srun that
    follows then says why)."""
    return resolve_job_id(job_id, timeout_s)[0] or job_id


def running_steps(job_id: str, timeout_s: float = AGENT_TIMEOUT_S) -> list[str] | None:
    """The job's numbered steps that SLURM lists now ('123.0', '123.4'): the ranks', a health
    gate's, a stack probe's; never the batch step (the agent) or the extern step. None when
    squeue does not answer. ``job_id``: the numeric one (``numeric_job_id``)."""
    answer = run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"], timeout_s)
    if not answer.ok:
        return None
    return steps_of(job_id, answer.stdout)


def steps_of(job_id: str, listing: str) -> list[str]:
    """The numbered steps of ``job_id`` in squeue's ``-s -o %i`` lines."""
    prefix = f"{job_id}."
    return [line for line in listing.split() if line.startswith(prefix) and line[len(prefix):].isdigit()]


#: What ``scontrol requeue`` answers for a job that pends already: requeued (by an earlier try of
#: ours whose answer was lost, or by SLURM itself), so it will run again, which is what was asked.
ALREADY_PENDING = "pending execution"


def requeue(job_id: str, timeout_s: float, on_retry: Callable[[Answer], None] | None = None) -> Answer:
    """``scontrol requeue``, asked again on any failure within ``timeout_s`` (a controller
    restarting, a socket timeout): a requeue that is due must not be lost to a busy moment.

    The requeue's own SIGTERM to the job's processes can kill the very scontrol that asked for it
    (exit code -15) after the controller did it; the next try then hears that the job pends. That
    answer is the requeue done (exit 0, its words kept in ``stderr``), not a failure to retry until
    the bound: the agent then excludes the blamed nodes while the job still pends (seen on the test
    cluster: taken as a failure, the exclusion was skipped and the job ran on the blamed node again)."""
    answer = run(["scontrol", "requeue", job_id], timeout_s, backoff_s=PERSIST_BACKOFF_S, retry_any=True,
                 on_retry=on_retry, done=lambda a: ALREADY_PENDING in a.stderr)
    if not answer.ok and ALREADY_PENDING in answer.stderr:
        return replace(answer, returncode=0)
    return answer


def set_excluded(job_id: str, names: Sequence[str], timeout_s: float) -> Answer:
    """Set the (pending) job's ExcNodeList, asked again on any failure within ``timeout_s``: it comes
    right after ``scontrol requeue``, whose SIGTERM to the job's processes can kill this very
    scontrol (exit code -15; the agent itself survives it), and a requeued job that forgot the
    exclusion would land on the blamed node again."""
    return run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(names)}"], timeout_s,
               backoff_s=PERSIST_BACKOFF_S, retry_any=True)


def shrink_job(job_id: str, keep: Sequence[str], timeout_s: float, cwd: str | None) -> Answer:
    """Give a running job's other nodes back to SLURM: its NodeList becomes ``keep`` (a subset).
    scontrol writes ``slurm_job_<id>_resize.sh`` and ``.csh`` (the variables a resized job's shell
    would reset) into its working folder: ``cwd`` (the run's slurm folder; None: the agent's own), never
    the user's."""
    return run(["scontrol", "update", f"JobId={job_id}", f"NodeList={','.join(keep)}"], timeout_s, cwd=cwd)


def outside_step_environment() -> dict[str, str]:
    """The environment of an ``srun --overlap`` into a job from outside it (``stacks``, ``chaos``):
    ours without the SLURM variables of wherever this runs (a job of its own, say), SLURM_CONF
    kept, and ``SLURM_EXPORT_ENV=ALL``: the step needs this PATH and Python on the node, also where
    sites default to --export=NONE."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_")) or k == "SLURM_CONF"}
    env["SLURM_EXPORT_ENV"] = "ALL"
    return env


def scontrol_text(*args: str, timeout_s: float = 30.0) -> str:
    """``scontrol ARGS``'s output; a SubmissionError that says what to do when it fails."""
    answer = run(["scontrol", *args], timeout_s)
    if answer.missing:
        raise SubmissionError("scontrol not found: run 'validate --cluster' on a SLURM login node")
    if not answer.ok:
        raise SubmissionError(answer.problem or
                              f"scontrol {' '.join(args)} failed: {one_line(answer.complaint)} (is SLURM_CONF set?)")
    return answer.stdout
