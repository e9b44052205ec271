"""Pure checks on single values, shared by the spec models.

Each function returns the normalised value or raises ``ValueError`` with a message that says
how to fix the value. pydantic turns those into errors located at the field.
"""

from __future__ import annotations

import re

# Linux caps interface names at IFNAMSIZ - 1 = 15 bytes; '/', whitespace and ':' are refused
# by the kernel ("dev_valid_name"), and '.' / '..' are reserved.
_IFNAME = re.compile(r"^[A-Za-z0-9_.\-@]{1,15}$")
# Names that reach #SBATCH lines and the shell: keep them to a conservative alphabet.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
# SLURM constraints may combine features with & | , [] * and counts.
_SAFE_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.\-&|,\[\]*:()]{1,256}$")
_ENTRY_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_SLURM_TIME = re.compile(
    r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)"
    r"|(?P<m2>\d+):(?P<s2>\d+)"
    r"|(?P<m3>\d+))$"
)
_SLURM_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE)
_SBATCH_OPTION = re.compile(r"^[a-z][a-z0-9\-_]{0,63}$")

#: Linux's default ephemeral range (``net.ipv4.ip_local_port_range``). Ports in it may be taken
#: by any outgoing connection at any moment, so a rendezvous port there fails at random.
EPHEMERAL_PORTS = (32768, 60999)

#: Paths that are private to one machine: a file:// rendezvous there cannot be seen by other nodes.
NODE_LOCAL_PREFIXES = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/scratch/local", "/local")


def safe_name(value: str, what: str) -> str:
    if not _SAFE_NAME.match(value):
        raise ValueError(
            f"{value!r} is not a safe {what}: use letters, digits, '_', '.' and '-' only "
            "(starting with a letter or digit, at most 128 characters), so it cannot reach a shell"
        )
    return value


def constraint(value: str) -> str:
    if not _SAFE_CONSTRAINT.match(value):
        raise ValueError(
            f"{value!r} is not a SLURM constraint expression: use feature names joined by "
            "'&', '|' or ',' (no spaces, quotes or shell characters)"
        )
    return value


def entrypoint_syntax(value: str) -> str:
    """`module.path:function`, or a path to a Python script that exists."""
    if _ENTRY_FUNCTION.match(value):
        return value
    from pathlib import Path

    path = Path(value).expanduser()
    if value.endswith(".py") or "/" in value:
        if path.is_file():
            return value
        raise ValueError(f"script {value!r} does not exist (relative paths are from the current directory)")
    raise ValueError(
        f"{value!r} is neither 'package.module:function' nor a path to an existing .py script; "
        "for example 'jobs.train:main' or './train.py'"
    )


def interface_name(value: str, allow_exclusion: bool) -> str:
    name = value[1:] if value.startswith("^") else value
    if value.startswith("^") and not allow_exclusion:
        raise ValueError(
            f"{value!r} is an NCCL exclusion list; gloo does not accept '^': name the interface "
            "to use (for example 'eth0'), or set distributed.backend to nccl"
        )
    for part in name.split(","):
        if not _IFNAME.match(part) or part in {".", ".."}:
            raise ValueError(
                f"{part!r} is not a valid Linux interface name (1-15 characters of letters, digits, "
                "'_', '-', '.', no spaces or '/'); run 'ip -br link' on a node to list them, or use 'auto'"
            )
    return value


def port(value: int) -> int:
    lo, hi = EPHEMERAL_PORTS
    if not 1024 <= value <= 65535:
        raise ValueError(f"port {value} is out of range: pick one in 1024-{lo - 1}, or use 'auto'")
    if lo <= value <= hi:
        raise ValueError(
            f"port {value} is inside the ephemeral range {lo}-{hi}, where outgoing connections may "
            f"take it; pick one in 1024-{lo - 1}, or use 'auto'"
        )
    return value


def slurm_time_minutes(value: str) -> int:
    """Parse every format sbatch accepts for --time and return whole minutes (rounded up)."""
    m = _SLURM_TIME.match(value.strip())
    if not m:
        raise ValueError(
            f"{value!r} is not a SLURM time: use 'MM', 'MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM' or "
            "'D-HH:MM:SS', for example '02:00:00'"
        )
    g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    seconds = (
        g.get("d", 0) * 86400
        + (g.get("dh", 0) + g.get("h", 0)) * 3600
        + (g.get("dm", 0) + g.get("m", 0) + g.get("m2", 0) + g.get("m3", 0)) * 60
        + g.get("ds", 0)
        + g.get("s", 0)
        + g.get("s2", 0)
    )
    if seconds <= 0:
        raise ValueError(f"time limit {value!r} is zero: give the job at least one minute")
    return -(-seconds // 60)


def slurm_memory(value: str) -> str:
    m = _SLURM_MEM.match(value.strip())
    if not m or int(m.group(1)) == 0:
        raise ValueError(
            f"{value!r} is not a SLURM memory size: use a positive number with an optional K, M, G "
            "or T suffix, for example '32G' or '4000M'"
        )
    return f"{m.group(1)}{m.group(2).upper()}"


def sbatch_option(key: str, reserved: frozenset[str]) -> str:
    norm = key.replace("_", "-")
    if not _SBATCH_OPTION.match(key):
        raise ValueError(
            f"{key!r} is not an sbatch long option name; write it without dashes, e.g. 'mail-type'"
        )
    if norm in reserved:
        raise ValueError(
            f"sbatch option {norm!r} is set by the orchestrator; use the spec field for it instead"
        )
    return norm


def no_control_chars(value: str, what: str) -> str:
    if any(c in value for c in "\n\r\x00"):
        raise ValueError(f"{what} contains a newline or NUL, which would break the sbatch script")
    return value


def run_path(value: str, what: str) -> str:
    no_control_chars(value, what)
    if "%" in value:
        raise ValueError(
            f"{what} {value!r} contains '%', which SLURM expands in log file names (%j, %t); rename it"
        )
    return value


def is_node_local(path: str) -> bool:
    norm = path.rstrip("/") or "/"
    return any(norm == p or norm.startswith(p + "/") for p in NODE_LOCAL_PREFIXES)
