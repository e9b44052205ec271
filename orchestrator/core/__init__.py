"""The run's vocabulary, shared by every process: states, the run folder's paths, the record, the
payload format, the errors (docs/ARCHITECTURE.md, side `core`). Standard library only: everything
here is read on compute nodes too, before the user's code."""
