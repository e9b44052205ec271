"""The rank's C heap: keep freed memory for the next training step instead of handing it back.

A CPU training step allocates its activations and frees them all at the end of backward. With
glibc's defaults the freed top of the heap (anything above 2x the dynamic mmap threshold, at most
64 MiB) goes back to the kernel after every step, and the next step takes it again page by page:
thousands of page faults in every step, time the kernel spends instead of the training
(measured: docs/PERFORMANCE.md).
Jobs get two glibc settings by default (``plan`` shows them; the spec's ``env`` or the user's
own exports win, as for ``OMP_NUM_THREADS``):

- ``MALLOC_MMAP_THRESHOLD_``: 32 MiB, glibc's largest; smaller blocks come from the heap;
- ``MALLOC_TRIM_THRESHOLD_``: 1 GiB of free heap top kept before any is returned.

A rank keeps up to its peak heap use (plus at most 1 GiB of free top) instead of shrinking
between steps; that is what PyTorch's own caching allocators do on GPUs. glibc reads these
variables once, when a process starts: processes a rank starts get them from the environment,
and the running rank (already started by srun, or forked from the zygote) gets them through
``mallopt``. Other C libraries (musl) ignore both.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a rank imports this module)
if TYPE_CHECKING:
    from typing import Mapping


#: name -> (default, glibc's mallopt parameter number from malloc.h)
_SETTINGS = {"MALLOC_MMAP_THRESHOLD_": (str(32 << 20), -3), "MALLOC_TRIM_THRESHOLD_": (str(1 << 30), -1)}

#: What every job's environment gets unless the user set it.
MALLOC_DEFAULTS = {name: default for name, (default, _) in _SETTINGS.items()}


def _whole(text: str) -> bool:
    """ASCII digits only: '²' is a digit to str.isdigit, not to int."""
    return text.isascii() and text.isdigit()


def apply(environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """Give this already running process the settings its environment names (what glibc would have
    read had the process started with them). Returns what was applied; a value that is not a
    whole number, or a C library without ``mallopt``, changes nothing."""
    wanted = {name: int(environ[name]) for name in _SETTINGS if _whole(environ.get(name, ""))}
    if not wanted:
        return {}
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return {}
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return {name: value for name, value in wanted.items()
            if value < 2**31 and mallopt(_SETTINGS[name][1], value) == 1}
