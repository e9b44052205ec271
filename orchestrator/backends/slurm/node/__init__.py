"""SLURM's side on the nodes: the job's agent (started by the batch script), each srun task, what
SLURM tells a task, stacks through `srun --overlap`, and the one module every SLURM command runs
through (docs/ARCHITECTURE.md, side `slurm_node`). Standard library only."""
