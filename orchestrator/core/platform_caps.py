"""What this platform lets the orchestrator do: decided once per process, asked everywhere.

The local executor was built on Linux, where the kernel offers what it needs: ``/proc`` (a
process's start time, so a recorded PID is only ever signalled while it still names the same
process; its command line; whether it installed a signal handler), ``prctl`` (a parent-death
signal, a child subreaper), real-time signals (the stack request's signal) and ``fork`` after
``import torch``. macOS has none of these, or not safely; native Windows lacks POSIX itself.
Every module asks here instead of touching a Linux-only name, so one file says what a platform
can do, and no import fails on a platform that lacks something.

Each answer is computed on first use and kept (``functools.cache``): nothing here runs at
import, so a rank or ``validate`` pays only for what it asks. Standard library only (psutil is
tried only where there is no /proc).

``python -m orchestrator.core.platform_caps`` prints the answers, for a bug report.
"""

from __future__ import annotations

import functools
import os
import signal
import sys

from orchestrator.core.lean_record import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a rank imports this module)
if TYPE_CHECKING:
    from typing import IO, Optional


#: Where real-time signals exist (Linux), live stacks are asked for with this one past SIGRTMIN: no
#: library or user script uses it by convention, and the SLURM probe and every rank agree on it.
REALTIME_STACK_OFFSET = 4

WSL_HINT = ("the orchestrator needs a POSIX system and does not run on native Windows: run it inside WSL2 "
            "(in PowerShell: wsl --install; then pip install ddp-orchestrator in the Linux shell)")


@record
class StackSignal:
    """The signal a rank dumps its Python stacks on, and what it does to a process that has no
    handler for it (``harmless``: its default action is to ignore it)."""

    number: int
    name: str
    harmless: bool


@functools.cache
def system() -> str:
    """'linux', 'darwin' (macOS), 'windows' or what ``sys.platform`` says otherwise."""
    if sys.platform.startswith("linux"):
        return "linux"
    if sys.platform == "win32":
        return "windows"
    return sys.platform


def system_name() -> str:
    """The platform as a user calls it, for messages."""
    return {"linux": "Linux", "darwin": "macOS", "windows": "Windows"}.get(system(), system())


def unsupported_reason() -> Optional[str]:
    """Why the orchestrator cannot run here at all (native Windows: no fork, no POSIX signals, no
    flock), or None. The CLI prints it as its only line; ``import orchestrator`` stays possible."""
    return WSL_HINT if system() == "windows" else None


@functools.cache
def has_proc() -> bool:
    """``/proc/PID/stat`` and friends are readable (Linux; hidden in some sandboxes)."""
    return os.path.exists("/proc/self/stat")


@functools.cache
def has_prctl() -> bool:
    """The C library has ``prctl`` (Linux): a parent-death signal and a child subreaper."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl  # noqa: B018 -- the lookup is the probe
    except (OSError, AttributeError, ImportError):
        return False
    return True


@functools.cache
def stack_signal() -> StackSignal:
    """The signal ranks dump their stacks on.

    Linux: SIGRTMIN+4, as before (a real-time signal: nothing uses it by convention). Elsewhere
    (macOS has no real-time signals): SIGURG. What the rank's handler needs is a signal that
    ``faulthandler.register`` accepts (not one of the fatal ones it already handles), that
    neither Python, torch, gloo nor a training script uses (SIGUSR1/SIGUSR2 and SIGTERM are the
    stop signals; SIGINT, SIGHUP and SIGWINCH reach a terminal's processes), and whose default
    action is to ignore it: on macOS nothing can tell whether a process still has the handler
    (a rank that exec'd another program lost it), and SIGURG sent to such a process does nothing,
    where SIGRTMIN's default would kill it. The kernel sends SIGURG itself only to a process
    that asked for a socket's out-of-band data with F_SETOWN. SIGINFO (BSD, macOS) would do too,
    but Ctrl-T sends it to the terminal's foreground processes, and Linux has none: SIGURG is the
    choice the stand-in for macOS in CI exercises exactly.
    """
    rtmin = getattr(signal, "SIGRTMIN", None)
    if rtmin is not None:
        return StackSignal(int(rtmin) + REALTIME_STACK_OFFSET, f"SIGRTMIN+{REALTIME_STACK_OFFSET}", harmless=False)
    urgent = getattr(signal, "SIGURG", None)
    if urgent is None:  # native Windows, refused before any rank starts: signal 0 only probes
        return StackSignal(0, "no signal", harmless=True)
    return StackSignal(int(urgent), "SIGURG", harmless=True)


@functools.cache
def fork_after_torch_safe() -> bool:
    """Whether a process that imported torch may fork ranks. Not on macOS: the system libraries
    torch loads there (Accelerate, libdispatch, the Objective-C runtime) are not fork-safe once
    initialised, which is why Python itself starts multiprocessing workers fresh there since 3.8."""
    return system() != "darwin"


@functools.cache
def process_table() -> Optional[str]:
    """How other processes are looked up: 'proc' (Linux's /proc), 'psutil' (where /proc is
    missing, as on macOS), or None: no way to read another process's start time, so a recorded
    PID can never be confirmed to still name its process (and is never signalled)."""
    if has_proc():
        return "proc"
    try:
        import psutil

        psutil.Process(os.getpid()).create_time()
    except Exception:  # not installed, or it cannot read processes here (psutil on Linux needs /proc)
        return None
    return "psutil"


@functools.cache
def loopback_interface() -> str:
    """The loopback interface's name, which local ranks meet over (GLOO_SOCKET_IFNAME): 'lo' on
    Linux, 'lo0' on macOS and the BSDs. The name this host has, else the platform's usual one."""
    import socket

    try:
        names = {name for _, name in socket.if_nameindex()}
    except (OSError, AttributeError):
        names = set()
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return "lo" if system() == "linux" else "lo0"


def local_limits() -> list[str]:
    """What the local executor cannot do on this platform, each as a clause of one sentence;
    empty on Linux with /proc."""
    limits = []
    if not fork_after_torch_safe():
        limits.append("fork ranks after import torch (each rank starts a fresh interpreter, more slowly)")
    if not has_prctl():
        limits.append("stop what a rank moved out of its process group (a setsid daemon) when the run ends")
    if process_table() is None:
        limits.append("confirm that a PID is still a rank's (no /proc, and no working psutil: pip install psutil), "
                      "so 'orchestrator stacks' and the clean-up after a killed supervisor signal nothing")
    return limits


def local_limits_line() -> Optional[str]:
    """The one line a local run starts with where ``local_limits`` is not empty."""
    limits = local_limits()
    if not limits:
        return None
    return f"[orchestrator] on {system_name()} the local executor cannot: " + "; ".join(limits)


_ANNOUNCED: list[bool] = []


def announce_local_limits(stream: IO[str] | None = None) -> None:
    """Print ``local_limits_line`` once per process (a pipeline's stages share it), on stderr."""
    line = local_limits_line()
    if line is None or _ANNOUNCED:
        return
    _ANNOUNCED.append(True)
    print(line, file=stream or sys.stderr, flush=True)


def summary() -> dict[str, object]:
    """Every answer, by name."""
    sig = stack_signal()
    return {"system": system(), "proc": has_proc(), "prctl": has_prctl(), "process_table": process_table(),
            "fork_after_torch_safe": fork_after_torch_safe(), "loopback": loopback_interface(), "stack_signal": sig.name,
            "stack_signal_harmless": sig.harmless, "unsupported": unsupported_reason(),
            "local_limits": local_limits()}


if __name__ == "__main__":  # pragma: no cover
    for key, value in summary().items():
        print(f"{key}: {value}")
