"""Entry point for fail-fast tests: rank CRASH_RANK raises after joining; the others wait."""
from __future__ import annotations

import os
import time


def main(argv: list[str]) -> None:
    from jobs.distributed import distributed

    with distributed() as ctx:
        if ctx.rank == int(os.environ.get("CRASH_RANK", "1")):
            time.sleep(1.0)
            raise ValueError(f"boom on rank {ctx.rank}")
        time.sleep(600)
