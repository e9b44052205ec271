"""What runs on every rank. Reads only env:// variables; never imports submitit or the executors."""
