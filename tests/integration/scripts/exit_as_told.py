"""A rank that sleeps ``T_SLEEP`` seconds and exits with ``T_CODE`` (its environment, set per rank)."""

import os
import time

time.sleep(float(os.environ.get("T_SLEEP", "0")))
raise SystemExit(int(os.environ.get("T_CODE", "0")))
