"""GPU checks of issue 20 on a machine with NVIDIA GPUs: the health gate against the real driver,
and a local nccl job whose rank crashes once, restarted in place by recovery.

Run: python tests/benchmarks/gpu_recovery.py --out DIR   (writes DIR/gpu_recovery.json)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import textwrap
import time
from pathlib import Path

from orchestrator import api
from orchestrator.node import health, shared_folders
from orchestrator.core.recovery import History

SCRIPT = textwrap.dedent('''
    import os, sys, torch, torch.distributed as dist
    from pathlib import Path
    dist.init_process_group("nccl")
    local = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local)
    ckpt = Path(sys.argv[1]); ckpt.mkdir(parents=True, exist_ok=True)
    start = int((ckpt / "step").read_text()) if (ckpt / "step").exists() else 0
    print(f"start {start} on {torch.cuda.get_device_name(local)}", flush=True)
    for step in range(start, 10):
        t = torch.ones(1, device="cuda"); dist.all_reduce(t)
        if step == 6 and not (ckpt / "crashed").exists():
            (ckpt / "crashed").write_text("1"); raise RuntimeError("injected crash at step 6")
        if dist.get_rank() == 0 and step % 3 == 2:
            (ckpt / "step").write_text(str(step + 1))
    dist.destroy_process_group()
    (ckpt / "done").write_text(str(start))
''')


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out: dict = {}
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        run.mkdir()
        env = {"CUDA_VISIBLE_DEVICES": "0"}
        for want in (1, 2):
            shared_folders.write_agent_token(str(run), str(run / "ckpt"), want, "gpu-node")  # the agent's part
            h = health.check_node("gpu-node", str(run), str(run / "ckpt"), want, gpus=want, environ=env)
            out[f"gate_gpus_{want}"] = {"ok": h.ok, "problems": list(h.problems), "seconds": h.seconds}
        script = Path(d) / "crash_once_nccl.py"
        script.write_text(SCRIPT)
        ckpt = Path(d) / "ckpt"
        spec = {"name": "gpu-recovery", "entrypoint": str(script), "extra_args": [str(ckpt)], "gpus_per_node": 1,
                "runs_dir": str(Path(d) / "runs"), "local": {"devices": [0]}, "checkpoint": {"dir": str(ckpt)},
                "recovery": {"max_restarts": 1}}
        t0 = time.time()
        r = api.run(spec, wait=True, executor="local")
        out["nccl_crash_once"] = {"ok": str(r.state) == "COMPLETED", "state": str(r.state),
                                  "seconds": round(time.time() - t0, 2),
                                  "resumed_at": (ckpt / "done").read_text() if (ckpt / "done").exists() else None,
                                  "attempts": [(x.number, x.outcome, x.action, x.why) for x in
                                               History.load(r.run_dir).attempts],
                                  "log": (Path(r.run_dir) / "logs" / "rank-0.log").read_text()[-1500:]}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "gpu_recovery.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
