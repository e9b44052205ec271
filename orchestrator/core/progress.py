"""Progress reports (the rank API's heartbeat): one small JSON file per node, one format.

Standard library only. A rank reports through ``ProgressWriter`` at most once per
``min_interval_s``. Inside a job (its node known: ``GROUP_RANK``/``LOCAL_RANK`` from the rank's
environment) the report goes to a staging folder on the node's own memory (``/dev/shm``, else
the temporary folder), and one of the node's ranks publishes all of them as
``<run>/progress/node-G.json``: one small atomic rename per node every two seconds on the shared
filesystem, whatever the ranks per node (a metadata server sees nodes, not ranks). The
publisher is whichever rank is due: each rank's first report is published at once, then local
rank ``L`` publishes once the node's last publication is ``PUBLISH_EVERY x (1 + L/2)`` report
intervals old, so local rank 0 does it while it runs, and a node whose local rank 0 is stopped
(SIGSTOP, stuck outside Python) is still published by the next one, with rank 0's frozen report
in it, which is how the watchdog names it. Without a node (the debug executor,
a script run by hand with ORCH_RUN_DIR) a rank writes ``<run>/progress/rank-N.json`` itself, as
every rank did before, and readers still read such files (jobs queued before the change).

The orchestrator reads them (``read_progress``: one listing of the folder, one read per node)
for the live progress line (``core.progress_line``), the stall watchdog (which rank stopped advancing)
and ``status``. What a file says is checked as the ranks' input: a report is kept only with the
right types and a rank inside the world.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from orchestrator.core import node_local

NODE_FILE = "node-{}.json"
#: A node's file is published every PUBLISH_EVERY report intervals (2 s at the 1 s default): with
#: the watchdog's read once a second, about 2 metadata operations a node a second in all.
PUBLISH_EVERY = 2
_MADE: set[Path] = set()
RANK_FILE = "rank-{}.json"


def progress_path(run_dir: str | Path, rank: int) -> Path:
    """A rank's own report file (written only where no node is known; see the module's doc)."""
    from orchestrator.core.run_folder import RunFolder

    return RunFolder.of(run_dir).progress(rank)


def node_progress_path(run_dir: str | Path, node: int) -> Path:
    return progress_path(run_dir, 0).with_name(NODE_FILE.format(int(node)))


#: The first steps left out of busy_s (a first step's lazy set-up: 200 ms against 10 ms once warm).
#: A report's busy_s is the mean over the steps since the one before (about a second): a mean over
#: a window, not a moving average of single steps, which a slow-down that hits some steps hard
#: (a stopped process, a GC) made flicker above and below the factor from one look to the next.
BUSY_WARMUP = 3


@dataclass(frozen=True)
class Progress:
    rank: int
    time: float  # wall clock of the report (time.time())
    step: int
    total: Optional[int]
    steps_per_s: Optional[float]  # since the previous report
    samples_per_s: Optional[float]  # steps_per_s x the samples of one step, when the rank said
    attempt: int
    first_time: Optional[float] = None  # this rank's first report of its attempt (orchestrator.core.attempt_times)
    first_step: Optional[int] = None  # ... and its step: where the attempt resumed
    #: A step's seconds outside collectives (data, forward), its mean since the last report: what names a
    #: straggler, where every rank's rate falls together (``orchestrator.core.stragglers``).
    busy_s: Optional[float] = None
    #: A survivor's last step in the attempt before this one (recovery.survivors: keep), at its own
    #: time: the reports are written at most once a second, so the last one written may be a second
    #: older than the failure's last step (goodput counted that second as recovery, per failure).
    kept_time: Optional[float] = None
    kept_step: Optional[int] = None
    #: The rank's resident memory when it reported (``top``'s RSS where the rank's host is not this one).
    rss_mb: Optional[float] = None
    #: A GPU rank's device when it reported: its utilisation (%, NVML) and the memory the rank's process
    #: holds on it (MiB); None for a CPU rank (the rank API's probe, ``jobs.progress``).
    gpu_util: Optional[float] = None
    gpu_mem_mb: Optional[float] = None


@dataclass(frozen=True)
class NodePlace:
    """Where a rank sits: its node's number in the job and its rank on that node."""

    node: int
    local_rank: int
    local_world_size: int = 0  # the node's ranks (0: not known)

    @classmethod
    def from_env(cls, environ: Optional[dict[str, str]] = None) -> Optional[NodePlace]:
        """From the torchrun variables every rank gets (None outside a job that set them)."""
        env = os.environ if environ is None else environ
        try:
            node = int(env.get("GROUP_RANK", env.get("NODE_RANK", "")))
            local = int(env["LOCAL_RANK"])
            size = int(env.get("LOCAL_WORLD_SIZE", "0") or 0)
        except (KeyError, ValueError):
            return None
        return cls(node, local, max(size, 0)) if node >= 0 and local >= 0 else None


def staging_dir(run_dir: str | Path, attempt: int, node: int) -> Path:
    """The node's staging folder for one run's attempt: in this user's private folder on the
    node's own memory (``orchestrator.core.node_local``: checked as ours, never another user's),
    named by the run folder (two runs, or two emulated nodes, on one machine never meet). Raises
    OSError where no private folder can be had (the rank then writes its own file)."""
    return node_local.private_root() / f"{_staging_prefix(run_dir)}-a{int(attempt)}-n{int(node)}"


def staging_dirs(run_dir: str | Path) -> list[Path]:
    """Every staging folder of this run on this machine, whatever the attempt and node (what a
    rank killed before it left its node leaves behind)."""
    try:
        root = node_local.private_root()
    except OSError:
        return []
    return sorted(root.glob(f"{_staging_prefix(run_dir)}-a*-n*"))


def node_local_file(run_dir: str | Path, name: str) -> Path:
    """A file of this run in the staging folders' place (this user's private folder on the node's
    own memory: what the health gate inside the ranks' step tells a node's other tasks,
    ``orchestrator.backends.slurm.node.gate_step``). Raises OSError where no private folder can be had."""
    return node_local.private_root() / f"{_staging_prefix(run_dir)}-{name}"


def _staging_prefix(run_dir: str | Path) -> str:
    return "orch-progress-" + hashlib.sha256(str(Path(run_dir).absolute()).encode()).hexdigest()[:16]


#: A GPU rank's utilisation (%) and the memory its process holds on the device (MiB); None: unknown.
GpuFigures = tuple[Optional[float], Optional[float]]


class ProgressWriter:
    """Writes one rank's reports; calls between two writes cost a clock read."""

    def __init__(self, run_dir: str | Path, rank: int, attempt: int = 0, min_interval_s: float = 1.0,
                 place: Optional[NodePlace] = None, gpu: Optional[Callable[[], GpuFigures]] = None) -> None:
        self.run_dir = Path(run_dir)
        self.gpu = gpu  # the rank's GPU figures, asked only when a report is written (once a second)
        self.path = progress_path(run_dir, rank)
        self.rank, self.attempt, self.min_interval_s = rank, attempt, min_interval_s
        self.place = place
        self._last_write = 0.0
        self._last_step: Optional[int] = None
        self._first: Optional[tuple[float, int]] = None
        self._seen: Optional[tuple[float, int]] = None  # the last step reported to this writer, written or not
        self._kept: Optional[tuple[float, int]] = None  # ``_seen`` when this rank rejoined (``rejoined``)
        self._busy: Optional[float] = None
        self._busy_steps, self._busy_sum, self._busy_n = 0, 0.0, 0
        self._staging: Optional[Path] = None
        self._published = False
        _WRITERS.append(self)

    def report(self, step: int, total: Optional[int] = None, samples: Optional[float] = None,
               force: bool = False, busy_s: Optional[float] = None) -> bool:
        """Record that this rank reached ``step`` of ``total`` (``samples``: how many samples a step is, for
        the rate; ``busy_s``: the step's seconds outside collectives, averaged here; every step counts,
        written or not). Returns whether a report was written. ``force``: now, and published at once."""
        self._busy_steps += busy_s is not None
        if busy_s is not None and self._busy_steps > BUSY_WARMUP:
            self._busy_sum, self._busy_n = self._busy_sum + busy_s, self._busy_n + 1
        now = time.time()
        self._seen = (now, int(step))
        if not force and now - self._last_write < self.min_interval_s:
            return False
        if self._busy_n:  # no step since the last report (a stopped rank): its last figure stands
            self._busy, self._busy_sum, self._busy_n = self._busy_sum / self._busy_n, 0.0, 0
        steps_per_s = None
        if self._last_step is not None and step > self._last_step and now > self._last_write:
            steps_per_s = (step - self._last_step) / (now - self._last_write)
        self._last_step, self._last_write = step, now
        if self._first is None:
            self._first = (now, int(step))
        util, mem = self.gpu() if self.gpu is not None else (None, None)
        report = Progress(rank=self.rank, time=now, step=int(step), total=total, steps_per_s=steps_per_s,
                          samples_per_s=steps_per_s * samples if steps_per_s and samples else None,
                          attempt=self.attempt, first_time=self._first[0], first_step=self._first[1],
                          busy_s=round(self._busy, 6) if self._busy is not None else None,
                          kept_time=self._kept[0] if self._kept else None, kept_step=self._kept[1] if self._kept else None,
                          rss_mb=own_rss_mb(), gpu_util=util, gpu_mem_mb=mem)
        if self.place is None or not self._stage(report, now, force):
            _write_atomic(self.path, asdict(report))
        return True

    def _stage(self, report: Progress, now: float, force: bool) -> bool:
        """The report into the node's staging folder, and the node's file published if this rank
        is due. False when there is no staging folder to use (the rank then writes its own file)."""
        assert self.place is not None
        try:
            if self._staging is None:
                self._staging = node_local.ensure_private(staging_dir(self.run_dir, self.attempt, self.place.node))
            node_local.write_private(self._staging / RANK_FILE.format(self.rank), json.dumps(asdict(report)).encode())
        except OSError:
            self.place = None  # no node-local memory to stage in: this rank's own file from now on
            return False
        due = PUBLISH_EVERY * self.min_interval_s * (1 + self.place.local_rank / 2)
        if force or not self._published or now - _published_at(self._staging) >= due:
            # A rank's first report is published at once: a rank the watchdog has no heartbeat
            # of is judged by its log instead, so none may wait on a publisher that got stuck.
            publish(self.run_dir, self._staging, self.place.node, now, self.place.local_world_size)
            self._published = True
        return True


    def leave(self) -> None:
        """This rank ends (each leaves a ``left-N`` mark): the node's last rank to leave publishes
        every rank's last report and removes the node's staging folder."""
        staging, place = self._staging, self.place
        if staging is None or place is None:
            return
        try:
            node_local.touch_private(staging / f"left-{self.rank}")
            names = os.listdir(staging)
        except OSError:
            return
        staged = {n[len("rank-"):-len(".json")] for n in names if n.startswith("rank-") and n.endswith(".json")}
        if staged <= {n[len("left-"):] for n in names if n.startswith("left-")}:
            # the node's last rank to leave: every rank's last report out, then the folder gone (the
            # others' last reports stay staged for the ranks still running to publish)
            publish(self.run_dir, staging, place.node, expect=place.local_world_size)
            import shutil

            shutil.rmtree(staging, ignore_errors=True)


#: The writers of this process (a rank has one; the debug executor one per run it runs).
_WRITERS: list[ProgressWriter] = []


def rejoined() -> None:
    """A survivor rejoined its peers (``jobs.heal``): its next report is the new attempt's first, where
    it resumed, as a restarted rank's would be (else status counts all its work so far as lost)."""
    for writer in _WRITERS:
        writer._first, writer._kept = None, writer._seen


def own_rss_mb() -> Optional[float]:
    """This process's resident memory in MiB (/proc/self/statm: a read, no psutil); None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            resident = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(resident * _PAGE / 2**20, 1)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def leave() -> None:
    """At a rank's end (the launcher calls it): every writer of this process leaves its node."""
    while _WRITERS:
        try:
            _WRITERS.pop().leave()
        except OSError:
            pass


def clear_staging(run_dir: str | Path, attempt: int, nodes: set[int]) -> None:
    """Remove the staging folders of these nodes of an attempt on this machine (the local
    supervisor, once its ranks are gone: a rank killed never left its node)."""
    import shutil

    for node in nodes:
        try:
            shutil.rmtree(staging_dir(run_dir, attempt, node), ignore_errors=True)
        except OSError:
            return  # no private folder: nothing was staged


def publish(run_dir: str | Path, staging: Path, node: int, now: Optional[float] = None, expect: int = 0) -> None:
    """Every report staged on this node into ``<run>/progress/node-G.json`` (atomically). When
    fewer than ``expect`` (the node's ranks; 0: unknown) are staged, they are merged into what
    the file holds: a report there stays unless a newer one for its rank is staged, so ranks
    that do not share a staging folder (a container with a /dev/shm of its own each) still each
    keep their report in the node's file. A publication costs the shared filesystem a create
    and a rename (and a read while merging)."""
    now = time.time() if now is None else now
    with _publishing(staging):
        _publish_locked(run_dir, staging, node, now, expect)


@contextlib.contextmanager
def _publishing(staging: Path) -> Iterator[None]:
    """One publisher at a time on a node: an ``flock`` on a file in the node's own staging folder
    (node-local memory: no cost on the shared filesystem). Without it two ranks publishing at
    once could each write the node's file from a listing that lacked the other's first report,
    and the later rename dropped it: that rank then had no heartbeat the watchdog could see
    until its next turn. Where no lock can be had (no fcntl, the folder gone), unlocked."""
    try:
        import fcntl

        fd = node_local.open_private(staging / ".lock")
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _publish_locked(run_dir: str | Path, staging: Path, node: int, now: float, expect: int) -> None:
    target = node_progress_path(run_dir, node)
    try:
        names = os.listdir(staging)
    except OSError:
        return
    staged = [n for n in names if n.startswith("rank-") and n.endswith(".json")]
    held: Any = None
    if not expect or len(staged) < expect:
        try:
            held = json.loads(target.read_text(encoding="utf-8")).get("ranks")
        except (OSError, ValueError, AttributeError):
            held = None
    ranks: dict[str, Any] = {k: v for k, v in held.items() if isinstance(v, dict)} if isinstance(held, dict) else {}
    for name in staged:
        try:
            data = json.loads(node_local.read_private(staging / name))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "rank" in data and _newer(data, ranks.get(str(data["rank"]))):
            ranks[str(data["rank"])] = data
    try:
        node_local.write_private(staging / ".published", repr(now).encode())
        _write_atomic(target, {"node": int(node), "time": now, "ranks": ranks})
    except OSError:
        pass  # the next report tries again; the watchdog sees an old heartbeat, never a wrong one


def _newer(report: dict[str, Any], than: Any) -> bool:
    try:
        return not isinstance(than, dict) or float(report["time"]) >= float(than["time"])
    except (KeyError, ValueError, TypeError):
        return True


def _published_at(staging: Path) -> float:
    try:
        return float(node_local.read_private(staging / ".published"))
    except (OSError, ValueError):
        return 0.0


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    if path.parent not in _MADE:  # once a process: a mkdir is a metadata operation on a shared filesystem
        path.parent.mkdir(parents=True, exist_ok=True)
        _MADE.add(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def read_progress(run_dir: str | Path, world_size: int) -> list[Optional[Progress]]:
    """Every rank's latest report (None where a rank has sent none, or its report is unreadable):
    one listing of ``<run>/progress``, then the node files and any rank's own file, the newer
    report winning where both hold a rank."""
    out: list[Optional[Progress]] = [None] * world_size
    folder = progress_path(run_dir, 0).parent
    for entry in _entries(folder, report_files(folder)):
        report = _parse(entry)
        if report is not None and 0 <= report.rank < world_size:
            held = out[report.rank]
            if held is None or report.time > held.time:
                out[report.rank] = report
    return out


def report_files(folder: Path) -> list[str]:
    """The report files in ``<run>/progress`` (one listing), node files first."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    reports = [n for n in names if n.endswith(".json")]
    nodes = sorted(n for n in reports if n.startswith("node-"))  # plain sorts: no key function per name
    return nodes + sorted(n for n in reports if n.startswith("rank-"))


def heartbeats(folder: Path, names: list[str], world_size: int) -> dict[int, float]:
    """Rank -> the time of its latest report, from these report files only: what the watchdog
    needs, read without building a report per rank (at a thousand nodes the watchdog reads a
    hundred node files a look: this loop is most of a look's time)."""
    beats: dict[int, float] = {}
    for entry in _entries(folder, names):
        try:
            rank, t = entry["rank"], entry["time"]
            if type(rank) is not int or type(t) is not float:  # as the writers write them: no conversion
                rank, t = int(rank), float(t)
        except (KeyError, ValueError, TypeError, OverflowError):
            continue
        if 0 <= rank < world_size and (rank not in beats or t > beats[rank]):
            beats[rank] = t
    return beats


class HeartbeatReader:
    """The watchdog's reader of a run's heartbeats, at a bounded cost a look: all the report
    files when there are at most ``share_above``, else a share of them a look in turn, so that every file is read at
    least once every ``cover_looks`` looks (the watchdog looks once a second; what it has not
    re-read this look keeps its last time, an older one: never a heartbeat that did not happen).
    ``everything()`` reads them all: before a verdict, so a stale share never condemns a job."""

    def __init__(self, run_dir: str | Path, world_size: int, cover_looks: int = 1, share_above: int = 0) -> None:
        self.folder = progress_path(run_dir, 0).parent
        self.world_size = world_size
        self.cover_looks = max(1, cover_looks)
        self.share_above = share_above  # up to this many files, all of them every look
        self._cursor = 0

    def look(self) -> dict[int, float]:
        names = report_files(self.folder)
        share = -(-len(names) // self.cover_looks)  # ceil
        if share >= len(names) or len(names) <= self.share_above:
            return heartbeats(self.folder, names, self.world_size)
        start = self._cursor % len(names)
        chosen = (names + names)[start:start + share]
        self._cursor = start + share
        return heartbeats(self.folder, chosen, self.world_size)

    def everything(self) -> dict[int, float]:
        return heartbeats(self.folder, report_files(self.folder), self.world_size)


def _entries(folder: Path, names: list[str]) -> list[Any]:
    """The reports these files hold (a node file's ranks, a rank file's one), unchecked."""
    out: list[Any] = []
    where = os.fspath(folder)
    for name in names:
        try:
            data = json.loads(_read_small(os.path.join(where, name)))  # no Path a file: a hundred a look
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        if name.startswith("node-"):
            ranks = data.get("ranks")
            if isinstance(ranks, dict):
                out.extend(v for v in ranks.values() if isinstance(v, dict))
        else:
            out.append(data)
    return out


def _read_small(path: str | Path) -> bytes:
    """A small regular file's bytes in an open, an fstat, a read or two and a close (no text
    layer). Never a link, a FIFO or a device a rank (or anyone) put in the run folder: those are
    refused without blocking (a FIFO at progress/node-9.json once hung ``orchestrator run``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            if len(chunks) > 256:  # 16 MiB: no heartbeat file is that big
                raise ValueError(f"{path} is too large for a heartbeat file")
    finally:
        os.close(fd)


def _parse(d: Any) -> Optional[Progress]:
    try:
        return Progress(rank=int(d["rank"]), time=float(d["time"]), step=int(d["step"]),
                          total=_opt_int(d.get("total")), steps_per_s=_opt_float(d.get("steps_per_s")),
                          samples_per_s=_opt_float(d.get("samples_per_s")), attempt=int(d.get("attempt", 0)),
                          first_time=_opt_float(d.get("first_time")), first_step=_opt_int(d.get("first_step")),
                          busy_s=_opt_float(d.get("busy_s")), kept_time=_opt_float(d.get("kept_time")),
                          kept_step=_opt_int(d.get("kept_step")), rss_mb=_opt_float(d.get("rss_mb")),
                          gpu_util=_opt_float(d.get("gpu_util")), gpu_mem_mb=_opt_float(d.get("gpu_mem_mb")))
    except (KeyError, ValueError, TypeError, OverflowError):
        return None


def _opt_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _opt_float(value: Any) -> Optional[float]:
    return None if value is None else float(value)
