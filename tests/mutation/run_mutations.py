"""Hand-run mutation check: break the code on purpose and confirm that a test fails for each break.

Not part of the test suite (pytest does not collect it) and not run in CI: it takes minutes.

    .venv/bin/python tests/mutation/run_mutations.py             # every mutation, local tests only
    .venv/bin/python tests/mutation/run_mutations.py -k barrier  # mutations whose name contains 'barrier'
    .venv/bin/python tests/mutation/run_mutations.py --cluster   # also the SLURM tests (root; brings a cluster up)
    .venv/bin/python tests/mutation/run_mutations.py --baseline  # first check the tests pass unmutated
    .venv/bin/python tests/mutation/run_mutations.py --head      # the last commit, not edits in progress

Each mutation is applied to a copy of the working tree (tracked and untracked files that git does
not ignore), never to the tree itself; the tests run in that copy with PYTHONPATH pointing at it,
so every rank process (forked, spawned or started by SLURM) imports the mutated code.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCAL = "tests/integration/test_local_runs.py"
CKPT = "tests/integration/test_checkpoints_and_data.py"
SLURM = "tests/cluster/test_slurm.py"


@dataclass
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: list[str]
    cluster_tests: list[str] = field(default_factory=list)
    extra: list[tuple[str, str, str]] = field(default_factory=list)  # more (path, old, new) edits, same mutation


MUTATIONS = [
    Mutation("skip loading the checkpoint", "jobs/checkpoint.py",
             "        path = self.latest() if self.ctx.config.resume else None", "        path = None",
             [f"{LOCAL}::test_interrupt_and_resume_is_bit_identical"],
             [f"{SLURM}::test_requeue_resumes_to_the_same_weights"]),
    Mutation("load the checkpoint but not the model weights", "jobs/checkpoint.py",
             "        load_model_state(model, state[\"model\"])\n", "",
             [f"{LOCAL}::test_interrupt_and_resume_is_bit_identical"]),
    Mutation("skip set_epoch", "jobs/train.py",
             "            sampler.set_epoch(epoch)", "            pass",
             [f"{LOCAL}::test_ddp_matches_single_process_with_combined_batch"]),
    Mutation("no DDP bucket settling", "jobs/parallel.py", "    _settle_on_first_step(ddp)\n", "",
             ["tests/integration/test_rank_api.py::test_user_script_on_the_rank_api_resumes_bit_exactly_after_usr2",
              f"{LOCAL}::test_interrupt_and_resume_is_bit_identical"]),
    Mutation("no RNG restore on resume", "jobs/checkpoint.py", "            set_rng_state(rngs[self.ctx.rank])",
             "            pass",
             ["tests/integration/test_rank_api.py::test_user_script_on_the_rank_api_resumes_bit_exactly_after_usr2"]),
    Mutation("skip the barrier after the checkpoint", "jobs/checkpoint.py",
             "        prune(directory, keep)\n    barrier()\n", "        prune(directory, keep)\n",
             [f"{CKPT}::test_only_rank_0_writes_and_everyone_waits_for_the_file",
              f"{LOCAL}::test_every_rank_finds_the_checkpoint_when_save_returns"]),
    Mutation("drop --kill-on-bad-exit", "orchestrator/plan/__init__.py",
             '"--kill-on-bad-exit=1",', '',
             ["tests/unit/test_plan_golden.py", "tests/unit/test_planning.py"],
             [f"{SLURM}::test_killed_rank_fails_the_job_fast"]),
    Mutation("drop the interface variables (NCCL_ and GLOO_SOCKET_IFNAME)", "orchestrator/node/rank_env.py",
             "        if self.interfaces is not None:\n", "        if False:\n",
             ["tests/unit/test_planning.py", "tests/unit/test_interface_choice.py",
              f"{LOCAL}::test_torchrun_style_script_runs_unchanged"],
             [f"{SLURM}::test_torchrun_style_script_on_two_nodes"]),
    Mutation("drop GLOO_SOCKET_IFNAME only", "orchestrator/core/netif.py",
             "    return SocketInterface(GLOO_IFNAME, route.interface, route.interface, route.why)\n",
             "    return SocketInterface(GLOO_IFNAME, None, route.interface, route.why)\n",
             ["tests/unit/test_planning.py", "tests/unit/test_interface_choice.py",
              f"{LOCAL}::test_torchrun_style_script_runs_unchanged"]),
    Mutation("auto names NCCL's interface again (overrides NCCL's own choice)", "orchestrator/core/netif.py",
             "    if route.loopback_only:\n", "    if True:\n", ["tests/unit/test_interface_choice.py"]),
    Mutation("auto overrides the user's or the site's NCCL_SOCKET_IFNAME", "orchestrator/core/netif.py",
             "    if theirs:\n", "    if False:\n", ["tests/unit/test_interface_choice.py"]),
    Mutation("ranks never remove the rendezvous file (jobs teardown)", "jobs/distributed.py",
             "            if clean:\n                remove_rendezvous_file(cfg)\n", "",
             [f"{LOCAL}::test_ranks_remove_the_rendezvous_file_themselves"],
             [f"{SLURM}::test_two_nodes_file_init"]),
    Mutation("the launcher never removes the rendezvous file", "orchestrator/node/launcher.py",
             '        remove_rendezvous_file(os.environ.get("ORCH_INIT_METHOD", ""))\n', "        pass\n",
             [f"{LOCAL}::test_ranks_remove_the_rendezvous_file_themselves"]),
    Mutation("no stale rendezvous file removed before a SLURM restart", "orchestrator/node/launcher.py",
             "    for earlier in range(restart):", "    for earlier in []:",
             [], [f"{SLURM}::test_requeue_resumes_to_the_same_weights"]),
    Mutation("never prune orphaned .tmp checkpoints", "jobs/checkpoint.py",
             "    for tmp in orphaned_temporaries(directory):", "    for tmp in []:",
             [f"{CKPT}::test_kill_9_during_write_leaves_previous_checkpoint_loadable",
              f"{LOCAL}::test_interrupt_and_resume_is_bit_identical"]),
    Mutation("ranks forked even with local.preload_torch: false", "orchestrator/backends/local/executor.py",
             'self.preload = bool(launch.spec["local"].get("preload_torch", True))', "self.preload = True",
             [f"{LOCAL}::test_fresh_interpreters_when_preload_is_off"]),
]


def working_tree_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


def copy_tree(dest: Path, head: bool = False) -> None:
    if head:  # the last commit only, ignoring edits in progress
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    for rel in working_tree_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


def apply(tree: Path, m: Mutation) -> None:
    for rel, old, new in [(m.path, m.old, m.new), *m.extra]:
        path = tree / rel
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"mutation {m.name!r}: the text to replace occurs {text.count(old)} times in {rel}; "
                             "update this script to the code")
        path.write_text(text.replace(old, new))


def run_tests(tree: Path, tests: list[str], timeout: float) -> tuple[int, list[str], str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return 124, [f"(timed out after {timeout:.0f}s)"], str(exc.stdout or "")[-3000:]
    failed = sorted({m.group(1) for m in re.finditer(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)})
    return proc.returncode, failed, proc.stdout[-3000:]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-k", default="", help="only mutations whose name matches this regular expression")
    p.add_argument("--cluster", action="store_true", help="also run each mutation's SLURM tests")
    p.add_argument("--baseline", action="store_true", help="first run the selected tests on the unmutated tree")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per mutation")
    p.add_argument("--keep", action="store_true", help="keep the mutated copies (printed)")
    p.add_argument("--head", action="store_true", help="mutate the last commit instead of the working tree")
    args = p.parse_args(argv)
    chosen = [m for m in MUTATIONS if re.search(args.k, m.name, re.I)]
    rows = []
    base = Path(tempfile.mkdtemp(prefix="orch-mutants-"))
    try:
        if args.baseline:
            tree = base / "baseline"
            copy_tree(tree, args.head)
            tests = sorted({t for m in chosen for t in m.tests + (m.cluster_tests if args.cluster else [])})
            code, failed, tail = run_tests(tree, tests, args.timeout)
            print(f"baseline: exit {code}" + (f", failing: {failed}" if failed else ""), flush=True)
            if code != 0:
                print(tail)
                return 1
        for i, m in enumerate(chosen):
            tests = m.tests + (m.cluster_tests if args.cluster else [])
            if not tests:
                print(f"[skipped] {m.name}: only SLURM tests catch it; run with --cluster", flush=True)
                continue
            tree = base / f"mutant-{i}"
            copy_tree(tree, args.head)
            apply(tree, m)
            t0 = time.monotonic()
            code, failed, tail = run_tests(tree, tests, args.timeout)
            caught = code != 0 and bool(failed)
            rows.append((m.name, caught, failed, time.monotonic() - t0))
            print(f"[{'caught' if caught else 'MISSED'}] {m.name} ({time.monotonic() - t0:.0f}s): "
                  f"{', '.join(failed) or 'no test failed'}", flush=True)
            if not caught and code not in (0, 1):
                print(tail)
            if not args.keep:
                shutil.rmtree(tree, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"mutated copies kept under {base}")
    print("\n| mutation | caught by |\n| --- | --- |")
    for name, caught, failed, _ in rows:
        print(f"| {name} | {'<br>'.join(failed) if caught else 'MISSED'} |")
    return 0 if all(caught for _, caught, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
