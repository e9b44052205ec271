"""The error hierarchy. Every message names what went wrong and what to do next."""

from __future__ import annotations

#: Exit status of an orchestrator whose version is not its client's (``--client-version``): a login
#: node's answer to ``--remote``.
VERSION_MISMATCH = 3


class OrchestratorError(Exception):
    """Base class: the CLI prints these without a traceback."""

    exit_code = 1


class SpecError(OrchestratorError):
    """A job spec that cannot run. Raised before anything is submitted."""

    exit_code = 2

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        prefix = f"{source}: " if source else ""
        lines = [f"{prefix}{p}" for p in self.problems]
        header = "invalid job spec" if len(lines) == 1 else f"invalid job spec ({len(lines)} problems)"
        super().__init__(header + ":\n  " + "\n  ".join(lines))


class SubmissionError(OrchestratorError):
    """The scheduler or the local machine refused to start the job."""


class JobFailedError(OrchestratorError):
    """A job ran and failed; the message names the first failing rank."""


class RunNotFoundError(OrchestratorError):
    """No run folder or registry entry matches what the user asked for."""


class UsageError(OrchestratorError):
    """A call that cannot do what was asked (``run`` on a SLURM spec); the message names the one that can."""

    exit_code = 2


class RunNotFinishedError(OrchestratorError):
    """A run's result was asked for before the run ended."""


class WaitTimeoutError(OrchestratorError, TimeoutError):
    """``Run.wait(timeout)`` ran out of time. The run itself goes on."""
