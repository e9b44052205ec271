"""The local backend: ranks as processes on this machine, under a supervisor (a dry run of the
cluster; docs/ARCHITECTURE.md, side `local`)."""
