"""Issue 52's test of the backend seam: a third backend, known only to this test, is added by
touching the registry alone (its facts in ``kinds.KINDS``, its planner in ``backends._PLANNERS``
and ``BACKENDS``, its executor in ``factory.EXECUTORS``), and a spec naming it validates, plans
and runs to COMPLETED, its ranks started through the local path. Nothing else in the product
names it: the spec's ``executor``, the records, the CLI's choices and every decision ask the
registry. Run in a process of its own, so the registration never leaks into another test."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent("""
    import json, sys
    from orchestrator import backends
    from orchestrator.backends import factory, kinds
    from orchestrator.backends.local.local_plan import LocalPlanner

    # the registry's three parts, and nothing else: a backend whose ranks run on this machine
    kinds.KINDS["stub"] = kinds.Kind("stub", scheduled=False, foreground=True, in_process=False, emulated=True,
                                     poll_s=0.2)
    backends._PLANNERS["stub"] = LocalPlanner
    backends.BACKENDS["stub"] = backends.Backend(**vars(kinds.KINDS["stub"]), make_planner=LocalPlanner)
    factory.EXECUTORS["stub"] = factory.EXECUTORS["local"]

    from orchestrator import api
    from orchestrator.cli import build_parser

    spec = {"name": "stub", "entrypoint": sys.argv[1], "nodes": 2, "cpu_ranks_per_node": 1, "executor": "stub",
            "runs_dir": sys.argv[2], "distributed": {"backend": "gloo"}, "code": {"snapshot": False}}
    launch, _ = api.planned(api.as_spec(spec))
    run = api.run(spec)
    parser = build_parser()
    known = parser.parse_args(["run", "x.yaml", "--executor", "stub"]).executor
    print(json.dumps({"executor": launch.executor, "world": launch.world_size, "state": str(run.state),
                      "record": run.record.executor, "cli": known, "again": str(api.Run.get(run.run_dir).status())}))
""")

SCRIPT = textwrap.dedent("""
    import os
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "on", os.environ.get("ORCH_EXECUTOR", "?"))
    dist.destroy_process_group()
""")


def test_a_third_backend_touches_only_the_registry_and_runs_a_job(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(script), str(tmp_path / "runs")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said == {"executor": "stub", "world": 2, "state": "COMPLETED", "record": "stub", "cli": "stub",
                    "again": "COMPLETED"}, said
