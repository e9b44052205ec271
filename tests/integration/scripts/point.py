"""One sweep point: record which x this array task got."""
import os
import sys

out = sys.argv[sys.argv.index("--out") + 1]
x = sys.argv[sys.argv.index("--x") + 1]
with open(os.path.join(out, f"point-{x}.txt"), "w") as fh:
    fh.write(x)
