"""The interface every backend implements (``base.Executor``: submit, refresh, cancel, logs) and
what backends share: the run folder's preparation, a resubmission's previous attempt, the console
(docs/ARCHITECTURE.md, side `executor`). A backend's executor is made by the registry,
``orchestrator.backends.get_executor``; the backends themselves are in ``orchestrator/backends/``."""
