"""Sleep for --seconds (a job that stays RUNNING long enough to be looked at and cancelled)."""
import sys
import time

time.sleep(float(sys.argv[sys.argv.index("--seconds") + 1]))
