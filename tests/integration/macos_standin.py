"""A stand-in for macOS (and for native Windows) on Linux, for tests that have no Mac.

What a Mac lacks that the orchestrator used to touch, taken away from every Python process of a
test (the CLI, the detached supervisor, the zygote, the ranks) by a ``sitecustomize`` module on
``PYTHONPATH``, which every interpreter runs at start-up:

- ``signal.SIGRTMIN``/``SIGRTMAX`` and the other signal names macOS does not have;
- the ``os`` functions macOS's Python does not have (``sched_getaffinity``, ``pipe2``, ...) and
  ``select.epoll``;
- ``prctl`` (and glibc's ``mallopt``) in the C library as ``ctypes`` sees it;
- ``sys.platform`` is ``"darwin"`` while ``orchestrator.core.platform_caps`` decides, the one place the
  orchestrator branches on it (``tests/unit/test_platform_standin.py`` checks that): every
  decision takes macOS's side. It is put back afterwards, since the standard library and torch
  are Linux builds here and would take macOS branches they cannot run.

``/proc`` is hidden by running the command in a private mount namespace with an empty tmpfs
mounted over it (``hidden_proc_argv``; root only). Psutil needs /proc on Linux, so under the
stand-in no process table can be read at all: the stand-in is a Mac without psutil, the most
degraded case, which must still run, stop and clean up, and say what it cannot do.

The Windows stand-in also makes ``fcntl``, ``pwd``, ``grp``, ``termios`` and ``resource``
unimportable and lets the orchestrator decide on ``"win32"``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Mapping

REPO = Path(__file__).resolve().parents[2]

#: Names Linux's Python has and macOS's does not, by module.
SIGNAL_NAMES = ("SIGRTMIN", "SIGRTMAX", "SIGPOLL", "SIGPWR", "SIGSTKFLT", "SIGCLD")
OS_NAMES = ("sched_getaffinity", "sched_setaffinity", "sched_getscheduler", "sched_setscheduler",
            "sched_getparam", "sched_setparam", "sched_rr_get_interval", "pipe2", "posix_fadvise",
            "posix_fallocate", "getresuid", "getresgid", "setresuid", "setresgid", "memfd_create", "eventfd",
            "pidfd_open", "splice", "copy_file_range", "getxattr", "setxattr", "listxattr", "removexattr",
            "unshare", "setns", "fdatasync")
SELECT_NAMES = ("epoll",)
LIBC_NAMES = ("prctl", "mallopt")
WINDOWS_MISSING = ("fcntl", "pwd", "grp", "termios", "resource")

_SHIM = '''\
"""The macOS stand-in (tests/integration/macos_standin.py): Linux-only names removed at start-up."""
import ctypes
import os
import select
import signal
import sys

for _name in {signal_names!r}:
    if hasattr(signal, _name):
        delattr(signal, _name)
for _name in {os_names!r}:
    if hasattr(os, _name):
        delattr(os, _name)
for _name in {select_names!r}:
    if hasattr(select, _name):
        delattr(select, _name)


class _MacCDLL(ctypes.CDLL):
    """A C library without Linux's own functions, as macOS's libc is."""

    def __getattr__(self, name):
        if name in {libc_names!r}:
            raise AttributeError(f"dlsym(RTLD_DEFAULT, {{name}}): symbol not found (macOS stand-in)")
        return super().__getattr__(name)

    def __getitem__(self, name):
        if name in {libc_names!r}:
            raise AttributeError(f"dlsym(RTLD_DEFAULT, {{name}}): symbol not found (macOS stand-in)")
        return super().__getitem__(name)


ctypes.CDLL = _MacCDLL
ctypes.cdll = ctypes.LibraryLoader(_MacCDLL)
for _name in {missing_modules!r}:
    sys.modules[_name] = None  # import raises ImportError, as where the module does not exist

# The orchestrator decides everything that depends on the platform in one place, once per process
# (orchestrator.core.platform_caps): it decides here, on {platform!r}. sys.platform is put back then:
# the standard library and torch, built for Linux, would take branches for a platform whose
# modules they do not have (urllib imports _scproxy on darwin).
_real_platform = sys.platform
sys.platform = {platform!r}
try:
    from orchestrator import platform_caps as _caps

    _caps.system()
except ImportError:  # a Python without the orchestrator on its path: nothing to decide
    pass
finally:
    sys.platform = _real_platform
'''


def shim_dir(root: Path, windows: bool = False) -> Path:
    """Write the stand-in's ``sitecustomize.py`` into ``root`` (created) and return it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "sitecustomize.py").write_text(_SHIM.format(
        signal_names=SIGNAL_NAMES, os_names=OS_NAMES, select_names=SELECT_NAMES, libc_names=LIBC_NAMES,
        missing_modules=WINDOWS_MISSING if windows else (), platform="win32" if windows else "darwin"))
    return root


def standin_env(shims: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that puts the stand-in (``shim_dir``) into every Python process started with
    it, and this checkout first on the import path."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(shims), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def hidden_proc_argv(argv: list[str]) -> list[str]:
    """``argv`` run in a private mount namespace where /proc is an empty tmpfs (root only: see
    ``proc_can_be_hidden``). The processes stay in this host's PID namespace: a test outside
    still sees them in its own /proc, and can check that none is left."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs none /proc && exec "$@"', "sh", *argv]


@functools.cache
def proc_can_be_hidden() -> str | None:
    """None where ``hidden_proc_argv`` works here; else why not (for the skip reason)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return "hiding /proc needs root (a private mount namespace and a tmpfs mount)"
    try:
        out = subprocess.run(hidden_proc_argv(["sh", "-c", "test ! -e /proc/self/stat"]), capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if out.returncode != 0:
        return f"unshare --mount with a tmpfs over /proc failed: {out.stderr.strip() or out.returncode}"
    return None
