"""The one module that touches submitit's internals (tests/unit/test_submitit_adapter.py checks
that no other module does).

Why not submitit's public API: ``SlurmExecutor.submit(fn)`` pickles a callable into the job's
folder and makes the batch script run ``python -m submitit.core._submit``, which unpickles it on
the compute node. We avoid that on purpose: nothing is unpickled on a rank, a rank starts on the
standard library alone (``orchestrator.backends.slurm.node.slurm_job``, then ``orchestrator.node.launcher``), and the
time-limit and cancel signals reach the user's script itself, not a wrapper. What we do want
from submitit is its sbatch rendering (every parameter and its quoting, the same text whether
``orchestrator plan`` shows it or ``submit`` sends it) and its sbatch call. Both are reached only
through private names:

- ``submitit.slurm.slurm._make_sbatch_string``: renders the batch script from the parameters;
- ``SlurmExecutor._submit_command(command)``: writes that script with our command as its last
  line, runs sbatch and reads the job id back;
- ``SlurmExecutor.parameters["map_count"]``: how submitit itself asks for a job array.

A submitit release may change any of them, so the versions they were checked against are named
here (``SUPPORTED``) and checked before any use, and the unit tests compare the rendering with
golden files and the submitted script with the rendered one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from orchestrator.core.errors import SubmissionError

#: The submitit versions whose private names above this module was checked against.
SUPPORTED = ">=1.5,<1.6"


class UnsupportedSubmititError(SubmissionError):
    """The installed submitit is missing, or outside ``SUPPORTED``."""


def _release(version: str) -> tuple[int, ...]:
    """'1.5.4' -> (1, 5, 4); '1.6.0rc1' -> (1, 6, 0); the leading numbers only."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def _satisfies(version: str, spec: str) -> bool:
    """Whether ``version`` is in ``spec`` (comma-separated ``>=``, ``>``, ``<=``, ``<``, ``==``, ``!=``
    clauses, compared on release numbers padded with zeros)."""
    have = _release(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        op, bound = re.match(r"(>=|<=|==|!=|>|<)\s*(.+)", clause).groups()  # type: ignore[union-attr]
        want = _release(bound)
        width = max(len(have), len(want))
        a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        if not {">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b, ">": a > b, "<": a < b}[op]:
            return False
    return True


def installed_version() -> str | None:
    """The installed submitit's version, or None when it cannot be imported."""
    try:
        import submitit
    except ImportError:
        return None
    version = getattr(submitit, "__version__", None)
    if isinstance(version, str):
        return version
    from importlib import metadata

    try:
        return metadata.version("submitit")
    except metadata.PackageNotFoundError:
        return None


def check_version(installed: str | None = None) -> str:
    """Return the installed submitit's version, or raise UnsupportedSubmititError naming it, the
    supported range and the fix. ``installed``: a version to judge instead (tests)."""
    version = installed if installed is not None else installed_version()
    if version is None:
        raise UnsupportedSubmititError(f"submitit is not installed, and SLURM jobs are rendered and submitted through it: "
                                       f"pip install 'submitit{SUPPORTED}'")
    try:
        ok = _satisfies(version, SUPPORTED)
    except ValueError:
        ok = False
    if not ok:
        raise UnsupportedSubmititError(
            f"submitit {version} is installed, but this orchestrator supports submitit{SUPPORTED} only (it renders "
            f"and submits sbatch scripts through submitit's internals, which other versions may change): "
            f"pip install 'submitit{SUPPORTED}'")
    return version


#: submitit's defaults that are not ours: it books every job to ``--wckey=submitit``, which sites
#: that enforce wckeys refuse and others charge to a key the user never chose. None: no --wckey
#: line (submitit leaves out every parameter that is None), unless the parameters name one.
NOT_SUBMITIT_DEFAULTS: dict[str, Any] = {"wckey": None}


def with_sbatch(params: dict[str, Any], extra_sbatch: dict[str, Any] | None) -> dict[str, Any]:
    """``params`` (over ``NOT_SUBMITIT_DEFAULTS``) with more sbatch options known only at
    submission (``--dependency`` and ``--kill-on-invalid-dep`` of ``after:``,
    ``orchestrator.spec.after``) in its additional_parameters."""
    params = {**NOT_SUBMITIT_DEFAULTS, **params}
    if not extra_sbatch:
        return params
    return {**params, "additional_parameters": {**(params.get("additional_parameters") or {}), **extra_sbatch}}


def render_sbatch(params: dict[str, Any], folder: str, command: str, n_points: int = 0,
                  extra_sbatch: dict[str, Any] | None = None) -> str:
    """The sbatch script, rendered with submitit's own template exactly as ``submit`` will send
    it: ``params`` by submitit's parameter names, ``command`` its last line, for a sweep an
    array of ``n_points`` tasks, and ``extra_sbatch`` as ``submit`` adds it."""
    check_version()
    from submitit.slurm.slurm import _make_sbatch_string

    extra: dict[str, Any] = {"map_count": n_points} if n_points else {}
    return _make_sbatch_string(command=command, folder=folder, **with_sbatch(params, extra_sbatch), **extra)


def submit(folder: Path, params: dict[str, Any], command: str, n_points: int = 0,
           extra_sbatch: dict[str, Any] | None = None) -> str:
    """sbatch the script ``render_sbatch(params, folder, command, n_points, extra_sbatch)``
    renders, through submitit (which writes it into ``folder`` and names the logs), and return
    the job id (for an array, its base id: task i is ``<id>_<i>``). submitit's errors pass through
    as it raises them (``submitit.core.utils.FailedJobError`` with sbatch's stderr)."""
    check_version()
    import submitit

    executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(**with_sbatch(params, extra_sbatch))
    if n_points:  # an array of n_points tasks, as submitit asks for one itself
        executor.parameters["map_count"] = n_points
    job = executor._submit_command(command)
    return str(job.job_id)
