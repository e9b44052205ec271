"""A plain script (no orchestrator import, no process group): records what only variables read at
interpreter start-up decide: the hash of a string (PYTHONHASHSEED) and where a module on
PYTHONPATH was imported from."""
import argparse
import json
import os

import startup_probe_module  # found only through PYTHONPATH

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
with open(os.path.join(args.out, f"startup-{os.environ['RANK']}.json"), "w") as fh:
    json.dump({"hash": hash("the same string on every rank"), "module": startup_probe_module.__file__,
               "hashseed": os.environ.get("PYTHONHASHSEED")}, fh)
