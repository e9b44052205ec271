"""What runs on a node before and around the user's code, for any backend: the rank's environment
and launcher, the watchdog, stacks, the health gate, containers, what a framework's launcher would
export (docs/ARCHITECTURE.md, side `node`). Standard library only."""
