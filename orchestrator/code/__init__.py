"""The code snapshot: which files a job runs, frozen at submission, stored once, verified where
they run (docs/ARCHITECTURE.md, side `code`)."""
