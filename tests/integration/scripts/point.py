"""One sweep point: record which x this array task got."""
import os
import sys

out = sys.argv[sys.argv.index("--out") + 1]
x = sys.argv[sys.argv.index("--x") + 1]
with open(os.path.join(out, f"point-{x}.txt"), "w") as fh:
    fh.write(x)
if x == os.environ.get("FAIL_AT_X"):  # a point that fails (test_local_runs: the others still run)
    raise SystemExit(f"point x={x} fails on purpose")
