"""Typed PyTorch DDP jobs, run on SLURM or as a local dry run. Kept import-free: ranks import it."""

__version__ = "0.1.0"
