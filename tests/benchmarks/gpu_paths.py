"""The GPU paths, on a machine with a CUDA GPU: what the CPU-only CI cannot run.

    python tests/benchmarks/gpu_paths.py --out DIR

Runs, through the public Python API, exactly as a user would (no variable set that a user would
not set): one-GPU nccl DDP training (jobs.train), device selection (local.devices), DataParallel
(strategy dp), inference on cuda (jobs.infer), the spec's ``env`` (NCCL_DEBUG=INFO reaches the
rank), and PyTorch's NCCL flight recorder that the orchestrator turns on by default: a normal run
records entries, and a collective stuck behind a long kernel times out and dumps the trace into
``<run>/nccl-trace/``; a script that never destroys its nccl group ends without torch's warning. Prints one line per check and writes ``DIR/gpu_paths.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator import JobSpec, run  # noqa: E402

STUCK_COLLECTIVE = textwrap.dedent('''
    """A one-GPU nccl job whose all_reduce waits behind a kernel longer than the collective timeout."""
    import datetime, os, sys, torch, torch.distributed as dist
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=float(sys.argv[1])))
    torch.cuda.set_device(0)
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    import pickle
    trace = pickle.loads(torch._C._distributed_c10d._dump_nccl_trace())
    print("flight recorder entries after 5 all_reduce:", len(trace.get("entries", [])), flush=True)
    torch.cuda._sleep(int(float(sys.argv[2]) if len(sys.argv) > 2 else 8e10))  # 8e10: ~40 s of GPU time
    dist.all_reduce(x)            # NCCL's stream waits for it: the watchdog times the collective out
    torch.cuda.synchronize()
    print("not reached", flush=True)
''')

ENV_PROBE = textwrap.dedent('''
    import json, os, sys, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    t = torch.ones(4, device=dev)
    dist.all_reduce(t)
    keys = ["CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_FR_BUFFER_SIZE",
            "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "OMP_NUM_THREADS", "RANK", "WORLD_SIZE"]
    out = {k: os.environ.get(k) for k in keys}
    out.update(device_count=torch.cuda.device_count(), name=torch.cuda.get_device_name(0), sum=t.sum().item())
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh)
    dist.destroy_process_group()
''')

NO_TEARDOWN = textwrap.dedent('''
    """A one-GPU nccl script that ends without destroy_process_group(), as many do."""
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    print("sum", t.sum().item(), flush=True)
''')


def check(name: str, results: dict[str, Any], fn: Any) -> None:
    t0 = time.perf_counter()
    try:
        value = fn()
        results[name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 2), **value}
    except Exception as exc:  # a check that fails is reported, and the others still run
        results[name] = {"ok": False, "seconds": round(time.perf_counter() - t0, 2), "error": f"{type(exc).__name__}: {exc}"}
    print(f"{name}: {json.dumps(results[name])}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--runs-dir", default="/tmp/gpu-runs")
    p.add_argument("--only", nargs="*", default=None)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    scripts = Path(a.runs_dir) / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    (scripts / "stuck.py").write_text(STUCK_COLLECTIVE)
    (scripts / "env_probe.py").write_text(ENV_PROBE)
    (scripts / "no_teardown.py").write_text(NO_TEARDOWN)
    base = dict(runs_dir=a.runs_dir, nodes=1, gpus_per_node=1, local={"devices": [0]})
    results: dict[str, Any] = {}
    wanted = (lambda n: a.only is None or n in a.only)

    def ddp() -> dict[str, Any]:
        spec = JobSpec(name="gpu-ddp", entrypoint="jobs.train:main", **base,
                       args={"dataset": "fake", "fake-size": 8192, "model": "resnet18", "epochs": 2,
                             "batch-size": 128, "log-every": 20})
        r = run(spec)
        assert r.state == "COMPLETED", r.error
        summary = r.report()
        return {"state": r.state, "result": r.result(),
                "throughput": [ln for ln in summary.splitlines() if "samples/s" in ln]}

    def env_and_selection() -> dict[str, Any]:
        target = Path(a.runs_dir) / "env_probe.json"
        spec = JobSpec(name="gpu-env", entrypoint=str(scripts / "env_probe.py"), **base,
                       extra_args=[str(target)], env={"NCCL_DEBUG": "INFO"})
        r = run(spec)
        assert r.state == "COMPLETED", r.error
        seen = json.loads(target.read_text())
        log = r.logs(rank=0)
        assert seen["NCCL_DEBUG"] == "INFO" and seen["CUDA_VISIBLE_DEVICES"] == "0", seen
        assert "NCCL INFO" in log, "NCCL_DEBUG=INFO from the spec's env did not reach NCCL"
        return {"seen": seen, "nccl_info_lines": sum("NCCL INFO" in ln for ln in log.splitlines())}

    def dp() -> dict[str, Any]:
        spec = JobSpec(name="gpu-dp", entrypoint="jobs.train:main", strategy="dp", **base,
                       args={"dataset": "fake", "fake-size": 4096, "model": "resnet18", "epochs": 1, "batch-size": 128})
        r = run(spec)
        assert r.state == "COMPLETED", r.error
        return {"state": r.state, "result": r.result()}

    def infer() -> dict[str, Any]:
        ckpts = Path(a.runs_dir)
        found = sorted(ckpts.glob("gpu-ddp-*/checkpoints"))
        assert found, "no checkpoint from the ddp check"
        spec = JobSpec(name="gpu-infer", entrypoint="jobs.infer:main", **base,
                       args={"checkpoint": str(found[0]), "dataset": "fake", "model": "resnet18", "device": "cuda:0"})
        r = run(spec)
        assert r.state == "COMPLETED", r.error
        return {"state": r.state, "result": r.result()}

    def flight_recorder() -> dict[str, Any]:
        spec = JobSpec(name="gpu-stuck", entrypoint=str(scripts / "stuck.py"),
                       **{**base, "local": {"devices": [0], "timeout_s": 240}}, extra_args=["15"])
        t0 = time.monotonic()
        r = run(spec)
        took = time.monotonic() - t0
        trace_dir = Path(r.run_dir) / "nccl-trace"
        dumps = sorted(trace_dir.glob("rank-*")) if trace_dir.is_dir() else []
        log = r.logs(rank=0)
        entries = [ln for ln in log.splitlines() if "flight recorder entries" in ln]
        (out / "stuck-rank-0.log").write_text(log[-200000:])
        assert dumps, f"no flight-recorder dump in {trace_dir}; log tail:\n{log[-3000:]}"
        # state: whether torch's own watchdog ended the rank (TORCH_NCCL_ASYNC_ERROR_HANDLING)
        return {"state": r.state, "seconds_to_end": round(took, 1), "dumps": [f"{d.name} {d.stat().st_size} B" for d in dumps],
                "entries_line": entries[:1], "error": (r.error or "")[:300]}

    def stall_watchdog() -> dict[str, Any]:
        """torch's own watchdog does not end a rank whose collective waits behind a kernel (above);
        the orchestrator's stall watchdog does, with the stack of where it waited."""
        spec = JobSpec(name="gpu-stall", entrypoint=str(scripts / "stuck.py"), watchdog={"stall_s": 20},
                       **{**base, "local": {"devices": [0], "timeout_s": 400}}, extra_args=["15", "4e11"])
        t0 = time.monotonic()
        r = run(spec)
        took = time.monotonic() - t0
        stacks = sorted((Path(r.run_dir) / "stacks").glob("rank-*.txt"))
        assert r.state == "FAILED", f"expected the stall watchdog to end the run, got {r.state}"
        assert stacks, "no stacks saved"
        return {"state": r.state, "seconds_to_end": round(took, 1), "error": (r.error or "")[:400],
                "stack_head": stacks[0].read_text()[:600]}

    def no_teardown() -> dict[str, Any]:
        """The launcher destroys the group a script left (torch warns at exit otherwise)."""
        spec = JobSpec(name="gpu-left", entrypoint=str(scripts / "no_teardown.py"), **base)
        r = run(spec)
        log = r.logs(rank=0)
        said = [ln for ln in log.splitlines() if "destroy" in ln.lower()]
        assert r.state == "COMPLETED", r.error
        assert "sum 4.0" in log and not said, said or log[-2000:]
        return {"state": r.state, "destroy_lines": said}

    for name, fn in (("ddp_nccl_1gpu", ddp), ("env_and_device_selection", env_and_selection), ("dataparallel", dp),
                     ("inference_cuda", infer), ("nccl_flight_recorder", flight_recorder),
                     ("stall_watchdog_nccl", stall_watchdog), ("nccl_no_teardown", no_teardown)):
        if wanted(name):
            check(name, results, fn)
    (out / "gpu_paths.json").write_text(json.dumps(results, indent=2, default=str))
    return 0 if all(v["ok"] for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
