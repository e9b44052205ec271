"""Pure checks on single values, shared by the spec models.

Each function returns the normalised value or raises ``ValueError`` with a message that says
how to fix the value. pydantic turns those into errors located at the field.

Every pattern is matched with ``fullmatch``: ``re.match(r"^...$")`` accepts a trailing newline
(``$`` matches before a final ``\\n``), which once let a name break the sbatch script.
Values are echoed back through ``shown``, never raw: a 50 MB value or an escape sequence in a
spec must not reach the terminal.
"""

from __future__ import annotations

import os
import re
import unicodedata
from typing import Any

# ---- limits (documented in docs/manual/specs.md; every one names itself in its error) ---------------
#: The longest string any spec field may hold (PATH_MAX on Linux).
MAX_TEXT = 4096
#: The largest world on any executor: far above today's biggest jobs, small enough that
#: planning (linear in the world) stays interactive.
MAX_WORLD = 65536
#: The most ranks the local executor starts on one machine.
MAX_LOCAL_RANKS = 128
#: The most points a sweep may have (each is a SLURM array task).
MAX_SWEEP_POINTS = 10000
#: The longest time limit accepted (SLURM's own INFINITE aside): one year.
MAX_TIME_MINUTES = 365 * 24 * 60
#: The most memory per node accepted, in MiB (64 TiB).
MAX_MEMORY_MB = 64 * 1024 * 1024
#: Timeouts: one week.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
#: The longest file name (one path component) Linux filesystems take, in bytes (NAME_MAX).
NAME_MAX = 255
#: The longest path the kernel takes, in bytes (PATH_MAX, the terminating NUL included).
PATH_MAX = 4096

# Linux caps interface names at IFNAMSIZ - 1 = 15 bytes; '/', whitespace and ':' are refused
# by the kernel ("dev_valid_name"), and '.' / '..' are reserved.
_IFNAME = re.compile(r"[A-Za-z0-9_.\-@]{1,15}")
# Names that reach #SBATCH lines and the shell: keep them to a conservative alphabet.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
# Argument names: what argparse accepts after '--' in practice.
_ARG_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
# SLURM constraints may combine features with & | , [] * and counts.
_SAFE_CONSTRAINT = re.compile(r"[A-Za-z0-9_.\-&|,\[\]*:()]{1,256}")
_ENTRY_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
# A script's path with ':function' after it ('train.py:main'): the two entrypoint forms mixed.
_SCRIPT_FUNCTION = re.compile(r"(?P<script>.+\.py):(?P<function>[A-Za-z_][A-Za-z0-9_]*)")
# A relative script path that names a module too ('pkg/train' is 'pkg.train').
_MODULE_FILE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*")
_SLURM_TIME = re.compile(r"(?P<d>\d{1,3})-(?P<dh>\d{1,2})(?::(?P<dm>\d{1,2})(?::(?P<ds>\d{1,2}))?)?"
                         r"|(?P<h>\d{1,4}):(?P<m>\d{1,2}):(?P<s>\d{1,2})"
                         r"|(?P<m2>\d{1,6}):(?P<s2>\d{1,2})"
                         r"|(?P<m3>\d{1,6})")
_SLURM_MEM = re.compile(r"(\d{1,12})([KMGT]?)B?", re.IGNORECASE)
_SBATCH_OPTION = re.compile(r"[a-z][a-z0-9\-_]{0,63}")
# Characters that no spec string may hold, by Unicode general category (not by a list of code
# points, which always misses one): Cc, the C0/C1 controls (newline, NUL, ESC...); Cf, the
# invisible format characters, which include every bidirectional control (U+061C, U+200E/F,
# U+202A-E, U+2066-9), the zero-width characters and U+FEFF; Cs, lone surrogates; Zl/Zp, the
# line and paragraph separators. ``str.isprintable()`` is False for all of these, so printable
# text (nearly every value) is accepted without a scan.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_CHAR_NAMES = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte", "\t": "a tab",
               "\x1b": "an escape character (terminal escape sequence)"}

#: Linux's default ephemeral range (``net.ipv4.ip_local_port_range``). Ports in it may be taken
#: by any outgoing connection at any moment, so a rendezvous port there fails at random.
EPHEMERAL_PORTS = (32768, 60999)
#: The ports a spec may name: above the privileged ones, below the ephemeral range.
PORT_RANGE = (1024, EPHEMERAL_PORTS[0] - 1)

#: Paths that are private to one machine: a file:// rendezvous there cannot be seen by other nodes.
NODE_LOCAL_PREFIXES = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/scratch/local", "/local")


def shown(value: Any, limit: int = 60) -> str:
    """``repr`` for messages, shortened: a huge or hostile value is never echoed whole."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
    return f"{text[: limit - 20]}... ({size})"


def text(value: str, what: str) -> str:
    """The rule for every string in a spec: bounded, and no control characters."""
    if len(value) > MAX_TEXT:
        raise ValueError(f"{what} is {len(value)} characters long; the limit is {MAX_TEXT}")
    if value.isprintable():
        return value
    for position, ch in enumerate(value):
        if unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            raise ValueError(f"{what} {shown(value)} contains {_char_name(ch)} at position {position}; spec values are "
                             "single-line printable text (give one command or argument per list item)")
    return value


def printable(value: str) -> str:
    """``value`` with every character ``text`` refuses (ESC and the other controls, the invisible and
    bidirectional format characters, the line separators) as its Python escape (``\\x1b``): for text
    from the environment, not a spec (SBATCH_* values...), which ``plan`` and errors print. Such a
    value cannot be refused where it is read, but must not move the cursor or rewrite the terminal."""
    if value.isprintable():
        return value
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in _FORBIDDEN_CATEGORIES
                   else ch for ch in value)


def _char_name(ch: str) -> str:
    if ch in _CHAR_NAMES:
        return _CHAR_NAMES[ch]
    code = f"U+{ord(ch):04X}"
    if unicodedata.category(ch) == "Cf":
        bidi = unicodedata.bidirectional(ch) in _BIDI_CLASSES or ch in "\u061c\u200e\u200f"
        kind = "the bidirectional control" if bidi else "the invisible format character"
        return f"{kind} {code} ({unicodedata.name(ch, 'unnamed')})"
    return f"the control character {code}"


#: The bidirectional classes of the explicit embedding, override and isolate controls (the
#: marks U+061C, U+200E and U+200F have the classes of letters; they are named above).
_BIDI_CLASSES = frozenset({"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"})


def safe_name(value: str, what: str) -> str:
    if not _SAFE_NAME.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a safe {what}: use letters, digits, '_', '.' and '-' only "
                         "(starting with a letter or digit, at most 128 characters), so it cannot reach a shell")
    return value


def safe_names(value: str, what: str) -> str:
    """A comma-separated list of safe names (``slurm.partition: gpu,gpu-preempt``: sbatch takes the
    first that can start the job), each checked as ``safe_name``."""
    names = value.split(",")
    if len(names) > 1 and any(not n for n in names):
        raise ValueError(f"{shown(value)} has an empty name in it; separate the names with single commas, "
                         "e.g. 'gpu,gpu-preempt'")
    for name in names:
        safe_name(name, what)
    if len(set(names)) < len(names):
        raise ValueError(f"{shown(value)} names {next(n for n in names if names.count(n) > 1)!r} twice")
    return value


def arg_name(value: str, what: str) -> str:
    if not _ARG_NAME.fullmatch(value):
        hint = " without the leading dashes (the orchestrator adds '--')" if value.startswith("-") else ""
        raise ValueError(f"{what} {shown(value)} is not an argument name: use letters, digits, '_', '.' and '-'"
                         f"{hint}, for example 'lr' for --lr; use extra_args for positional arguments and short flags")
    return value


def constraint(value: str) -> str:
    if not _SAFE_CONSTRAINT.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a SLURM constraint expression: use feature names joined by "
                         "'&', '|' or ',' (no spaces, quotes or shell characters)")
    return value


def entrypoint_syntax(value: str) -> str:
    """`module.path:function`, or a path to an existing ``.py`` script. Every name that becomes a
    file name (each module of the path, with '.py'; each folder and file of a script path) must
    fit the filesystem, or the import fails later with a traceback instead of here. (The models
    apply ``text`` to every string before this.) A script's path with a function after it is
    refused, though ``train.py:main`` reads as module ``py`` of a package ``train``."""
    mixed = _mixed_forms(value)
    if mixed:
        raise ValueError(mixed)
    if _ENTRY_FUNCTION.fullmatch(value):
        for module in value.split(":")[0].split("."):
            if len(module) + len(".py") > NAME_MAX:
                raise ValueError(
                    f"the module name {shown(module)} is {len(module)} characters long; its file name "
                    f"({len(module) + 3} bytes with '.py') exceeds the {NAME_MAX}-byte limit on file names, so it "
                    "cannot be imported: shorten it")
        return value
    from pathlib import Path

    if value.endswith(".py"):
        path_lengths(value, "script")
        path = Path(value)
        try:
            if path.is_file():
                return value
            what = "is a directory" if path.is_dir() else "does not exist"
        except OSError as exc:
            what = f"cannot be read ({exc.strerror})"
        raise ValueError(f"script {shown(value)} {what} (relative paths are from the current directory)")
    if "/" in value:
        raise ValueError(f"{shown(value)} is not a Python script: a script entrypoint must be a '.py' file "
                         "(rename it, or give 'package.module:function')")
    raise ValueError(f"{shown(value)} is neither 'package.module:function' nor a path to an existing .py script; "
                     "for example 'jobs.train:main' or './train.py'")


def _mixed_forms(value: str) -> str | None:
    """Why ``value`` (``train.py:main``, ``sub/train.py:main``) is neither form, with each form it
    may have meant; None for any other value."""
    mixed = _SCRIPT_FUNCTION.fullmatch(value)
    if mixed is None:
        return None
    script, function = mixed["script"], mixed["function"]
    stem = script[: -len(".py")].removeprefix("./")
    module = stem.replace("/", ".") if _MODULE_FILE.fullmatch(stem) else "package.module"
    return (f"{shown(value)} mixes the two forms: a script runs as a whole ({shown(script)}), a function is "
            f"named by its module ({shown(f'{module}:{function}')})")


def interface_name(value: str, allow_exclusion: bool) -> str:
    name = value[1:] if value.startswith(("^", "=")) else value  # NCCL's exclusion and exact-match forms
    if value.startswith("^") and not allow_exclusion:
        raise ValueError(f"{shown(value)} is an NCCL exclusion list; gloo does not accept '^': name the interface "
                         "to use (for example 'eth0'), or set distributed.backend to nccl")
    for part in name.split(","):
        if not _IFNAME.fullmatch(part) or part in {".", ".."}:
            raise ValueError(
                f"{shown(part)} is not a valid Linux interface name (1-15 characters of letters, digits, "
                "'_', '-', '.', no spaces or '/'); run 'ip -br link' on a node to list them, or use 'auto'")
    return value


def port(value: int) -> int:
    lo, hi = PORT_RANGE
    if EPHEMERAL_PORTS[0] <= value <= EPHEMERAL_PORTS[1]:
        raise ValueError(f"port {value} is inside the ephemeral range {EPHEMERAL_PORTS[0]}-{EPHEMERAL_PORTS[1]}, where "
                         f"outgoing connections may take it; pick one in {lo}-{hi}, or use 'auto'")
    if not lo <= value <= hi:
        raise ValueError(f"port {value} is out of range: pick one in {lo}-{hi}, or use 'auto'")
    return value


def slurm_time_minutes(value: str) -> int:
    """Parse every format sbatch accepts for --time and return whole minutes (rounded up)."""
    m = _SLURM_TIME.fullmatch(value)
    if not m:
        raise ValueError(f"{shown(value)} is not a SLURM time: use 'MM', 'MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM' or "
                         "'D-HH:MM:SS', for example '02:00:00'")
    g = {k: int(val) for k, val in m.groupdict().items() if val is not None}
    over = [f"{unit} {g[k]}" for k, unit, top in (("dh", "hours", 24), ("dm", "minutes", 60), ("ds", "seconds", 60),
                                                   ("m", "minutes", 60), ("s", "seconds", 60), ("s2", "seconds", 60))
            if g.get(k, 0) >= top]
    if over:
        raise ValueError(f"time limit {shown(value)} has {over[0]}, which does not fit its place; "
                         "for example write '1-12:00:00' for a day and a half")
    seconds = (g.get("d", 0) * 86400 + (g.get("dh", 0) + g.get("h", 0)) * 3600
               + sum(g.get(k, 0) for k in ("dm", "m", "m2", "m3")) * 60 + sum(g.get(k, 0) for k in ("ds", "s", "s2")))
    if seconds <= 0:
        raise ValueError(f"time limit {shown(value)} is zero: give the job at least one minute")
    minutes = -(-seconds // 60)
    if minutes > MAX_TIME_MINUTES:
        raise ValueError(f"time limit {shown(value)} is longer than a year; the limit is '365-00:00:00'")
    return minutes


def slurm_memory(value: str) -> str:
    m = _SLURM_MEM.fullmatch(value)
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"{shown(value)} is not a SLURM memory size: use a positive number with an optional K, M, G "
                         "or T suffix, for example '32G' or '4000M'")
    number, unit = int(m.group(1)), m.group(2).upper()
    mb = number * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
    if mb > MAX_MEMORY_MB:
        raise ValueError(f"memory {shown(value)} is more than any node has; the limit is 64T")
    return f"{number}{unit}"


#: The spec fields behind some reserved sbatch options, for the error's hint.
_SBATCH_FIELDS = {
    "requeue": "set slurm.max_requeues above 0 (the job then asks for --requeue) and slurm.requeue (auto, always)",
    "no-requeue": "set slurm.max_requeues: 0",
    "signal": "set slurm.signal_margin_s",
    "time": "set slurm.time",
    "cpus-per-task": "set slurm.cpus_per_task",
    "cpus-per-gpu": "set slurm.cpus_per_gpu",
    "mem": "set slurm.mem",
    "mem-per-cpu": "set slurm.mem_per_cpu",
    "mem-per-gpu": "set slurm.mem_per_gpu",
    "partition": "set slurm.partition (a list too: 'gpu,gpu-preempt')",
    "reservation": "set slurm.reservation",
    "wckey": "set slurm.wckey (without it the job has no wckey and the site's default applies)",
    "gpus-per-node": "set gpus_per_node (and slurm.gpu_type)",
    "gres": "set gpus_per_node (and slurm.gpu_type)",
    "dependency": "list the runs it waits for in after: ([{run: RUN_ID_OR_SPEC, when: ok}]), or submit them "
                  "together with 'orchestrator pipeline FILE'",
    "kill-on-invalid-dep": "after: always sets --kill-on-invalid-dep=yes",
}


#: sbatch options no spec may give, with why: each would leave the job where the orchestrator's
#: later calls (squeue, sacct, scontrol, scancel, srun --jobid) cannot see it.
REFUSED_SBATCH = {
    "clusters": "submits the job to another cluster, and every later scontrol, squeue, sacct, scancel and srun "
                "call about it would need -M too (the orchestrator makes none with -M), so status would say "
                "UNKNOWN for ever and cancel would not reach it; submit from that cluster (its login node, or "
                "SLURM_CONF naming its slurm.conf) instead",
    "quiet": "silences sbatch's 'Submitted batch job N' line, the job id the orchestrator reads back, so the job "
             "would be queued but recorded FAILED and never followed; leave it out",
    "container": "runs the whole batch script inside the image, and with it the job's agent, which needs the "
                 "host's srun and scontrol; set container: in the spec instead (runtime: oci with image: the "
                 "bundle, or apptainer / pyxis), which runs only the ranks inside it",
}
#: Short options that are the same as a refused long one.
_REFUSED_SHORT = {"M": "clusters", "Q": "quiet"}


#: Reserved options the orchestrator renders only from their spec field (never on its own).
_OWN_FIELDS = frozenset({"wckey", "reservation", "mem-per-cpu", "mem-per-gpu", "cpus-per-gpu"})


def sbatch_option(key: str, reserved: frozenset[str]) -> str:
    """A long option name for ``slurm.extra_sbatch``. sbatch accepts any unique prefix of a long
    option (``--part`` is ``--partition``), so a prefix of a reserved option is reserved too."""
    norm = _REFUSED_SHORT.get(key) or key.replace("_", "-")
    if norm in REFUSED_SBATCH:
        shown_key = f"-{key} (--{norm})" if key in _REFUSED_SHORT else f"--{norm}"
        raise ValueError(f"sbatch option {shown_key} is refused: it {REFUSED_SBATCH[norm]}")
    meant = sorted(r for r in REFUSED_SBATCH if r.startswith(norm)) if len(norm) > 1 else []
    if meant:  # getopt_long reads a unique prefix as the option: 'qu' is --quiet, 'cluster' --clusters
        raise ValueError(f"{shown(key)} abbreviates --{meant[0]} (sbatch reads a unique prefix as the option), which "
                         f"is refused: it {REFUSED_SBATCH[meant[0]]}")
    if not _SBATCH_OPTION.fullmatch(key):
        raise ValueError(f"{shown(key)} is not an sbatch long option name; write it without dashes, e.g. 'mail-type'")
    if norm in reserved:
        hint = _SBATCH_FIELDS.get(norm, "use the spec field for it instead")
        what = "has a spec field of its own" if norm in _OWN_FIELDS else "is set by the orchestrator"
        raise ValueError(f"sbatch option {norm!r} {what}; {hint}")
    covered = sorted(r for r in reserved if r.startswith(norm))
    if covered:
        raise ValueError(f"{norm!r} is an abbreviation sbatch would read as {covered[0]!r}, which the orchestrator "
                         "sets itself; write the full name of the option you mean")
    return norm


def local_path(value: str, what: str, expand: bool = True, home_elsewhere: bool = False,
               run_folder: bool = False) -> str:
    """A path the ranks use: not empty, '~' expanded as a shell would (the path is never read by
    a shell, so '~/x' would otherwise make a folder named '~'), and every name in it short enough
    for the filesystem. ``expand=False`` checks that '~' can be expanded but keeps the text (for
    runs_dir, which names the run id and is expanded when planned). ``home_elsewhere``: the job
    runs on another machine (``--remote``), whose users and homes this one does not know, so '~'
    is kept as written and not checked here; that machine's own validation expands it.
    ``run_folder``: a folder the job writes in (runs_dir, workdir, the rendezvous folder), where
    '%' is refused: SLURM expands it in the log file names made from it."""
    if not value.strip():
        raise ValueError(f"{what} is empty: give a directory path")
    if value.startswith("~") and not home_elsewhere:
        expanded = os.path.expanduser(value)
        if expanded.startswith("~"):
            user = value[1:].split("/")[0]
            raise ValueError(f"{what} {shown(value)}: '~{user}' names no user on this machine, so '~' cannot "
                             "be expanded; write the absolute path")
        value = expanded if expand else value
    path_lengths(value, what)
    if run_folder and "%" in value:
        raise ValueError(
            f"{what} {shown(value)} contains '%', which SLURM expands in log file names (%j, %t); rename it")
    return value


def folder_or_absent(value: str, what: str) -> str:
    """A folder the ranks will enter (or create): refused when something else is already there.
    (On a cluster the path may not exist where the spec is written; that is left to the rank.)"""
    if os.path.exists(value) and not os.path.isdir(value):
        raise ValueError(f"{what} {shown(value)} exists and is not a folder: name a folder (it is created if missing)")
    return value


def path_lengths(value: str, what: str) -> str:
    """Every name in a path fits a file name (NAME_MAX bytes) and the whole path fits PATH_MAX:
    the kernel refuses longer ones only when the job is already starting."""
    raw = os.fsencode(value)
    if len(raw) >= PATH_MAX:
        raise ValueError(f"{what} {shown(value)} is {len(raw)} bytes long; a path holds at most "
                         f"{PATH_MAX - 1} bytes")
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            raise ValueError(f"{what} {shown(value)} holds a name of {len(part)} bytes "
                             f"({shown(os.fsdecode(part), 40)}); a file or folder name holds at most "
                             f"{NAME_MAX} bytes: shorten it")
    return value


def is_node_local(path: str) -> bool:
    norm = path.rstrip("/") or "/"
    return any(norm == p or norm.startswith(p + "/") for p in NODE_LOCAL_PREFIXES)


def node_local_from(path: str, cwd: str) -> str | None:
    """Where ``path`` lands from the folder ``cwd`` ('~' expanded, relative to ``cwd``, '..'
    resolved, as the planner makes it absolute), when that place is node-local though the path
    as written is not: the default ``runs`` in a project under /tmp, or '../../x' reaching /tmp.
    None otherwise (a path node-local as written is for ``is_node_local`` itself). ``cwd`` must be
    the folder the job is submitted from, on the host that submits it."""
    if is_node_local(path):
        return None
    resolved = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    return resolved if is_node_local(resolved) else None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: Variables the orchestrator sets on every rank (the rank contract); ``env:`` may not set them.
OWNED_ENV = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "NNODES",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED", "TORCHELASTIC_RUN_ID",
})
#: Prefixes of variables that belong to the orchestrator or to SLURM.
OWNED_ENV_PREFIXES = ("ORCH_", "SLURM_", "SBATCH_", "SRUN_")


#: Variables the orchestrator itself reads back as whole numbers (the launcher and
#: ``orchestrator.node.malloc``): ``env:`` may set them, to ASCII digits only. ('²' is a digit to
#: ``str.isdigit`` but not to ``int``.) OMP_NUM_THREADS may also be OpenMP's list form, '8,2'.
NUMERIC_ENV = {"OMP_NUM_THREADS": re.compile(r"[0-9]{1,9}(,[0-9]{1,9})*"),
               "MALLOC_MMAP_THRESHOLD_": re.compile(r"[0-9]{1,19}"),
               "MALLOC_TRIM_THRESHOLD_": re.compile(r"[0-9]{1,19}")}


def env_value(name: str, value: str) -> str:
    """A value ``env:`` gives a variable that the orchestrator reads as a number."""
    pattern = NUMERIC_ENV.get(name)
    if pattern is not None and not pattern.fullmatch(value):
        example = "'8' (or OpenMP's list form '8,2')" if name == "OMP_NUM_THREADS" else "'1073741824'"
        raise ValueError(f"{name} is {shown(value)}; it is read as a whole number, so give ASCII digits such as "
                         f"{example}")
    return value


def env_name(name: str) -> str:
    """A variable ``env:`` may set on the ranks: a valid name the orchestrator does not own."""
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"{shown(name)} is not an environment variable name: letters, digits and '_', "
                         "not starting with a digit")
    if name in OWNED_ENV:
        fix = ("set local.devices or gpus_per_node" if name == "CUDA_VISIBLE_DEVICES"
               else "it is part of the rank contract every rank gets (see 'orchestrator plan')")
        raise ValueError(f"{name} is set by the orchestrator on every rank, so env may not set it: {fix}")
    for prefix in OWNED_ENV_PREFIXES:
        if name.startswith(prefix):
            owner = "the orchestrator" if prefix == "ORCH_" else "SLURM"
            raise ValueError(f"{name}: variables starting with {prefix} belong to {owner}; env may not set them")
    return name


#: What a host list may hold: host-name characters, and the brackets, digits, '-' and ',' of ranges.
_HOSTLIST_CHARS = re.compile(r"[A-Za-z0-9_.\-\[\],]{1,4096}")


def hostlist(value: str) -> str:
    """A SLURM host list: names, or compressed ranges such as 'gpu[01-04,7],cpu1' or
    'rack[1-2]-n[01-16]', as ``orchestrator.core.hostlist`` (the project's one parser) and SLURM read it."""
    from orchestrator.core import hostlist as hosts

    fix = "write names separated by commas, with ranges in brackets: 'node1,node2' or 'gpu[01-04,07]'"
    if _HOSTLIST_CHARS.fullmatch(value):
        try:
            named = hosts.count(value)
        except ValueError as exc:
            raise ValueError(f"{exc}; {fix}") from None
        if named and all(item[:1].isalnum() for item in value.split(",") if item):
            return value
    raise ValueError(f"{shown(value)} is not a SLURM host list; {fix}")


_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


def gpu_type(value: str) -> str:
    """A GRES type name as slurm.conf / gres.conf spell it ('a100', 'h100_80gb')."""
    if not _GPU_TYPE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a GPU type name: letters, digits, '_', '.', '-' as in the "
                         "cluster's gres.conf (e.g. 'a100'); 'sinfo -o %G' lists them")
    return value


def hostlist_hosts(value: str) -> set[str] | None:
    """The hosts of a valid host list, or None when it names more than MAX_WORLD (counted before
    anything is expanded, so 'n[1-999999]' costs nothing). ValueError for an invalid list."""
    from orchestrator.core import hostlist

    if hostlist.count(value) > MAX_WORLD:
        return None
    return set(hostlist.expand(value))
