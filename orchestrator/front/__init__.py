"""What users call, below the command line: status and logs as printed, pipelines, reports, and
the housekeeping that needs the runs' states (docs/ARCHITECTURE.md, side `front`; the Python API
itself is `orchestrator.api`)."""
