"""The SLURM backend on the submitting side: sbatch through submitit, state from the scheduler,
`validate --cluster` (docs/ARCHITECTURE.md, side `slurm`). Its `node` package is what runs on the
allocation. Empty on purpose: importing `orchestrator.backends.slurm.node` on a compute node runs
this file too, so it imports nothing."""
