"""Pure checks on single values, shared by the spec models.

Each function returns the normalised value or raises ``ValueError`` with a message that says
how to fix the value. pydantic turns those into errors located at the field.

Every pattern is matched with ``fullmatch``: ``re.match(r"^...$")`` accepts a trailing newline
(``$`` matches before a final ``\\n``), which once let a name break the sbatch script.
Values are echoed back through ``shown``, never raw: a 50 MB value or an escape sequence in a
spec must not reach the terminal.
"""

from __future__ import annotations

import re
from typing import Any

# ---- limits (documented in the README; every one names itself in its error) ---------------
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
_SLURM_TIME = re.compile(
    r"(?P<d>\d{1,3})-(?P<dh>\d{1,2})(?::(?P<dm>\d{1,2})(?::(?P<ds>\d{1,2}))?)?"
    r"|(?P<h>\d{1,4}):(?P<m>\d{1,2}):(?P<s>\d{1,2})"
    r"|(?P<m2>\d{1,6}):(?P<s2>\d{1,2})"
    r"|(?P<m3>\d{1,6})"
)
_SLURM_MEM = re.compile(r"(\d{1,12})([KMGT]?)B?", re.IGNORECASE)
_SBATCH_OPTION = re.compile(r"[a-z][a-z0-9\-_]{0,63}")
# Characters that no spec string may hold: C0/C1 controls (newline, NUL, ESC...), lone
# surrogates, Unicode line/paragraph separators, zero-width and bidirectional controls.
_FORBIDDEN_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")
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
    bad = _FORBIDDEN_CHARS.search(value)
    if bad:
        ch = bad.group()
        name = _CHAR_NAMES.get(ch, f"the control character U+{ord(ch):04X}")
        raise ValueError(
            f"{what} {shown(value)} contains {name} at position {bad.start()}; spec values are "
            "single-line printable text (give one command or argument per list item)"
        )
    return value


def safe_name(value: str, what: str) -> str:
    if not _SAFE_NAME.fullmatch(value):
        raise ValueError(
            f"{shown(value)} is not a safe {what}: use letters, digits, '_', '.' and '-' only "
            "(starting with a letter or digit, at most 128 characters), so it cannot reach a shell"
        )
    return value


def arg_name(value: str, what: str) -> str:
    if not _ARG_NAME.fullmatch(value):
        hint = " without the leading dashes (the orchestrator adds '--')" if value.startswith("-") else ""
        raise ValueError(
            f"{what} {shown(value)} is not an argument name: use letters, digits, '_', '.' and '-'"
            f"{hint}, for example 'lr' for --lr; use extra_args for positional arguments and short flags"
        )
    return value


def constraint(value: str) -> str:
    if not _SAFE_CONSTRAINT.fullmatch(value):
        raise ValueError(
            f"{shown(value)} is not a SLURM constraint expression: use feature names joined by "
            "'&', '|' or ',' (no spaces, quotes or shell characters)"
        )
    return value


def entrypoint_syntax(value: str) -> str:
    """`module.path:function`, or a path to an existing ``.py`` script."""
    if _ENTRY_FUNCTION.fullmatch(value):
        return value
    from pathlib import Path

    if value.endswith(".py"):
        path = Path(value)
        if path.is_file():
            return value
        what = "is a directory" if path.is_dir() else "does not exist"
        raise ValueError(f"script {shown(value)} {what} (relative paths are from the current directory)")
    if "/" in value:
        raise ValueError(
            f"{shown(value)} is not a Python script: a script entrypoint must be a '.py' file "
            "(rename it, or give 'package.module:function')"
        )
    raise ValueError(
        f"{shown(value)} is neither 'package.module:function' nor a path to an existing .py script; "
        "for example 'jobs.train:main' or './train.py'"
    )


def interface_name(value: str, allow_exclusion: bool) -> str:
    name = value[1:] if value.startswith("^") else value
    if value.startswith("^") and not allow_exclusion:
        raise ValueError(
            f"{shown(value)} is an NCCL exclusion list; gloo does not accept '^': name the interface "
            "to use (for example 'eth0'), or set distributed.backend to nccl"
        )
    for part in name.split(","):
        if not _IFNAME.fullmatch(part) or part in {".", ".."}:
            raise ValueError(
                f"{shown(part)} is not a valid Linux interface name (1-15 characters of letters, digits, "
                "'_', '-', '.', no spaces or '/'); run 'ip -br link' on a node to list them, or use 'auto'"
            )
    return value


def port(value: int) -> int:
    lo, hi = PORT_RANGE
    if EPHEMERAL_PORTS[0] <= value <= EPHEMERAL_PORTS[1]:
        raise ValueError(
            f"port {value} is inside the ephemeral range {EPHEMERAL_PORTS[0]}-{EPHEMERAL_PORTS[1]}, where "
            f"outgoing connections may take it; pick one in {lo}-{hi}, or use 'auto'"
        )
    if not lo <= value <= hi:
        raise ValueError(f"port {value} is out of range: pick one in {lo}-{hi}, or use 'auto'")
    return value


def slurm_time_minutes(value: str) -> int:
    """Parse every format sbatch accepts for --time and return whole minutes (rounded up)."""
    m = _SLURM_TIME.fullmatch(value)
    if not m:
        raise ValueError(
            f"{shown(value)} is not a SLURM time: use 'MM', 'MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM' or "
            "'D-HH:MM:SS', for example '02:00:00'"
        )
    g = {k: int(val) for k, val in m.groupdict().items() if val is not None}
    over = [f"{unit} {g[k]}" for k, unit, top in (("dh", "hours", 24), ("dm", "minutes", 60), ("ds", "seconds", 60),
                                                   ("m", "minutes", 60), ("s", "seconds", 60), ("s2", "seconds", 60))
            if g.get(k, 0) >= top]
    if over:
        raise ValueError(f"time limit {shown(value)} has {over[0]}, which does not fit its place; "
                         "for example write '1-12:00:00' for a day and a half")
    seconds = (
        g.get("d", 0) * 86400
        + (g.get("dh", 0) + g.get("h", 0)) * 3600
        + (g.get("dm", 0) + g.get("m", 0) + g.get("m2", 0) + g.get("m3", 0)) * 60
        + g.get("ds", 0)
        + g.get("s", 0)
        + g.get("s2", 0)
    )
    if seconds <= 0:
        raise ValueError(f"time limit {shown(value)} is zero: give the job at least one minute")
    minutes = -(-seconds // 60)
    if minutes > MAX_TIME_MINUTES:
        raise ValueError(f"time limit {shown(value)} is longer than a year; the limit is '365-00:00:00'")
    return minutes


def slurm_memory(value: str) -> str:
    m = _SLURM_MEM.fullmatch(value)
    if not m or int(m.group(1)) == 0:
        raise ValueError(
            f"{shown(value)} is not a SLURM memory size: use a positive number with an optional K, M, G "
            "or T suffix, for example '32G' or '4000M'"
        )
    number, unit = int(m.group(1)), m.group(2).upper()
    mb = number * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
    if mb > MAX_MEMORY_MB:
        raise ValueError(f"memory {shown(value)} is more than any node has; the limit is 64T")
    return f"{number}{unit}"


def sbatch_option(key: str, reserved: frozenset[str]) -> str:
    """A long option name for ``slurm.extra_sbatch``. sbatch accepts any unique prefix of a long
    option (``--part`` is ``--partition``), so a prefix of a reserved option is reserved too."""
    if not _SBATCH_OPTION.fullmatch(key):
        raise ValueError(
            f"{shown(key)} is not an sbatch long option name; write it without dashes, e.g. 'mail-type'"
        )
    norm = key.replace("_", "-")
    if norm in reserved:
        raise ValueError(
            f"sbatch option {norm!r} is set by the orchestrator; use the spec field for it instead"
        )
    covered = sorted(r for r in reserved if r.startswith(norm))
    if covered:
        raise ValueError(
            f"{norm!r} is an abbreviation sbatch would read as {covered[0]!r}, which the orchestrator "
            "sets itself; write the full name of the option you mean"
        )
    return norm


def run_path(value: str, what: str) -> str:
    if not value.strip():
        raise ValueError(f"{what} is empty: give a directory path")
    if "%" in value:
        raise ValueError(
            f"{what} {shown(value)} contains '%', which SLURM expands in log file names (%j, %t); rename it"
        )
    return value


def is_node_local(path: str) -> bool:
    norm = path.rstrip("/") or "/"
    return any(norm == p or norm.startswith(p + "/") for p in NODE_LOCAL_PREFIXES)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: Variables the orchestrator sets on every rank (the rank contract); ``env:`` may not set them.
OWNED_ENV = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "NNODES",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
    "PYTHONUNBUFFERED", "TORCHELASTIC_RUN_ID",
})
#: Prefixes of variables that belong to the orchestrator or to SLURM.
OWNED_ENV_PREFIXES = ("ORCH_", "SLURM_", "SBATCH_", "SRUN_")


def env_name(name: str) -> str:
    """A variable ``env:`` may set on the ranks: a valid name the orchestrator does not own."""
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"{shown(name)} is not an environment variable name: letters, digits and '_', "
                         "not starting with a digit")
    if name in OWNED_ENV:
        fix = ("set distributed.interface" if name.endswith("SOCKET_IFNAME")
               else "set local.devices or gpus_per_node" if name == "CUDA_VISIBLE_DEVICES"
               else "it is part of the rank contract every rank gets (see 'orchestrator plan')")
        raise ValueError(f"{name} is set by the orchestrator on every rank, so env may not set it: {fix}")
    for prefix in OWNED_ENV_PREFIXES:
        if name.startswith(prefix):
            owner = "the orchestrator" if prefix == "ORCH_" else "SLURM"
            raise ValueError(f"{name}: variables starting with {prefix} belong to {owner}; env may not set them")
    return name


_HOST = r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}"
_HOST_RANGE = r"\[\d{1,6}(-\d{1,6})?(,\d{1,6}(-\d{1,6})?)*\]"
# Text after a bracket range ('gpu[1-2]-ib') is refused: scontrol 22.05 calls it an invalid hostlist.
_HOSTLIST = re.compile(rf"({_HOST}({_HOST_RANGE})?)(,{_HOST}({_HOST_RANGE})?)*")


def hostlist(value: str) -> str:
    """A SLURM host list: names, or compressed ranges such as 'gpu[01-04,7],cpu1'."""
    if not _HOSTLIST.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a SLURM host list; write names separated by commas, "
                         "with ranges in brackets at the end of a name: 'node1,node2' or 'gpu[01-04,07]'")
    for lo, hi in re.findall(r"(\d+)-(\d+)", "".join(re.findall(r"\[[^\]]*\]", value))):
        if int(lo) > int(hi):
            raise ValueError(f"the range {lo}-{hi} in {shown(value)} runs backwards; write {hi}-{lo}")
    return value


_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


def gpu_type(value: str) -> str:
    """A GRES type name as slurm.conf / gres.conf spell it ('a100', 'h100_80gb')."""
    if not _GPU_TYPE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a GPU type name: letters, digits, '_', '.', '-' as in the "
                         "cluster's gres.conf (e.g. 'a100'); 'sinfo -o %G' lists them")
    return value


def hostlist_hosts(value: str, limit: int = MAX_WORLD) -> set[str] | None:
    """The hosts of a valid host list, or None when it names more than ``limit`` (counted before
    anything is expanded, so 'n[1-999999]' costs nothing)."""
    count = 0
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", value):
        ranges = re.search(r"\[([^\]]*)\]", item)
        if not ranges:
            count += 1
            continue
        for part in ranges.group(1).split(","):
            lo, _, hi = part.partition("-")
            count += int(hi or lo) - int(lo) + 1
    if count > limit:
        return None
    from orchestrator.rank_env import expand_nodelist

    return set(expand_nodelist(value))
