"""The ``orchestrator`` subcommands (``cli`` parses the command line and calls one): each a thin
layer over the Python API (api.py) that prints.

Imports are deferred into the subcommands: ``--help``, ``validate``, ``plan``, ``submit`` and
``status`` never import torch, and ``validate`` stays cheap (docs/PERFORMANCE.md has its figures).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from orchestrator.core.errors import OrchestratorError, UsageError
from orchestrator.core.shell_words import command_line
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import State


def _load(args: argparse.Namespace) -> Any:
    from orchestrator.spec.loading import load_spec  # not through api: validate needs nothing else of it

    return load_spec(*args.spec, overrides=args.overrides, executor=getattr(args, "executor", None))


def cmd_validate(args: argparse.Namespace) -> int:
    spec = _load(args)
    if args.cluster:  # the spec's scheduler; for a spec run here, the cluster's it would be submitted to
        from orchestrator.backends import BACKENDS
        from orchestrator.backends.factory import scheduler

        for name in [spec.executor] if spec.runs_on.scheduled else [n for n, b in BACKENDS.items() if b.scheduled]:
            scheduler(name).check_against_cluster(spec)
    print(f"ok: {spec.name}: {spec.nodes} node(s) x {spec.ranks_per_node} rank(s), "
          f"{spec.resolved_backend}, {spec.distributed.init_method} init, executor {spec.executor}"
          + (f", sweep of {len(spec.sweep_points())}" if spec.sweep else ""))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from orchestrator.api import plan_for
    from orchestrator.front.operations import show_plan  # the login node answers plan --remote with it too

    show_plan(plan_for(_load(args)), as_json=args.json, node=args.node, rank=args.rank)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from orchestrator.spec.models import JobSpec

    print(json.dumps(JobSpec.model_json_schema(), indent=2))
    return 0


def _cwd_exists() -> bool:
    try:
        os.getcwd()
    except OSError:
        return False
    return True


def _emulated(executor: str | None) -> bool:
    """Whether the run's ranks are processes started on this machine (the spec's default executor,
    local, when the command line names none; a spec naming another one kills the early zygote)."""
    from orchestrator.backends import BACKENDS

    return executor is None or (executor in BACKENDS and BACKENDS[executor].emulated)


@contextlib.contextmanager
def _early_zygote(start: bool) -> Iterator[Any]:
    """The local ranks' parent, started before anything imports pydantic, so that torch imports
    while the spec is loaded and planned; killed here if the run never used it (an invalid spec,
    another executor, or local.preload_torch: false)."""
    zygote = None
    if start and _cwd_exists():  # else the command fails in one line; a zygote there only adds its own errors
        from orchestrator.backends.factory import start_zygote

        zygote = start_zygote()
    try:
        yield zygote
    finally:
        if zygote is not None and zygote.poll() is None and zygote.stdin is not None and not zygote.stdin.closed:
            zygote.kill()
            zygote.wait()


def cmd_run(args: argparse.Namespace) -> int:
    with _early_zygote(_emulated(args.executor) and not args.detach) as zygote:
        from orchestrator.api import run
        from orchestrator.spec.identity import plan_lines

        said: list[str] = []
        # In the foreground the identity line comes first (what follows may be a long run); a
        # detached run says it after it started, so a refusal stays one line.
        say = said.extend if args.detach else _say
        handle = run(_load(args), wait=not args.detach, executor=args.executor, fresh=args.fresh, zygote=zygote,
                     on_moved=_print_moved, on_plan=None if args.fresh else lambda launch: say(plan_lines(launch)))
    if args.detach:
        follow = command_line("orchestrator", "logs", "-f", handle.id)
        print(f"started {handle.id} in the background; follow it with: {follow}")
        _say(said)
        return 0
    _print_outcome(handle.record)
    return 0 if handle.state == State.COMPLETED else 1


def _print_outcome(record: Any) -> None:
    """A finished run's end, as ``run`` and ``submit --wait`` show it: its state, the error and
    where the ranks were, a warning, the result. A reader that went away (``| head``) loses it;
    the record keeps it, and the exit code still tells the outcome."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(f"{record.run_id}: {record.state}  (run folder {record.run_dir})")
        if record.state != State.COMPLETED:
            if record.error:
                print(record.error, file=sys.stderr)
            _print_waits(record)
            rank = record.failed_rank if record.failed_rank is not None else 0
            point = next((["--point", p] for p, s in (record.point_states or {}).items() if s != State.COMPLETED), [])
            print(f"see: {command_line('orchestrator', 'logs', record.run_id, '--rank', rank, *point)}", file=sys.stderr)
        if record.warning:
            print(f"warning: {record.warning}", file=sys.stderr)
        result = RunFolder.of(record.run_dir).result
        if record.state == State.COMPLETED and result.is_file():
            print(f"result: {json.loads(result.read_text(encoding='utf-8')).get('result')}")


def _say(lines: list[str]) -> None:
    """run and submit: the identity line (and warnings) on stderr; stdout stays what scripts parse."""
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def _print_moved(moved: Any) -> None:
    print(f"moved the previous run folder to {moved}")


def cmd_demo(args: argparse.Namespace) -> int:
    demo = Path(__file__).parents[1] / "examples" / "demo.yaml"
    with _early_zygote(True) as zygote:
        from orchestrator.api import load_spec, run

        handle = run(load_spec(demo, overrides=args.overrides, executor="local"), fresh=True, zygote=zygote,
                     on_moved=_print_moved)
    _print_outcome(handle.record)
    if handle.state != State.COMPLETED:
        return 1
    print(handle.report())
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from orchestrator.api import submit
    from orchestrator.spec.identity import plan_lines

    said: list[str] = []
    handle = submit(_load(args), executor=args.executor or "slurm",
                    on_plan=lambda launch: said.extend(plan_lines(launch)))
    print(f"submitted {handle.id}: job(s) {', '.join(handle.job_ids) or '-'}; run folder {handle.run_dir}", flush=True)
    _say(said)  # after the submission: a refused one stays one line
    if args.follow or args.wait:
        state = handle.wait(follow=args.follow)
        _print_outcome(handle.record)
        return 0 if state == State.COMPLETED else 1
    return 0


def cmd_pipeline(args: argparse.Namespace) -> int:
    from orchestrator.front import pipeline

    if args.json and not (args.plan or args.status):
        raise UsageError("pipeline --json goes with --plan or --status; without them the pipeline is run, not shown")
    if args.plan or args.status:
        results = pipeline.plan_pipeline(args.file, args.executor)
        if args.json:
            from dataclasses import asdict

            print(json.dumps([asdict(r) for r in results], indent=2, default=str))
        else:
            pipeline.print_lines(pipeline.table_lines(results, args.file))
        return 0
    results = pipeline.run_pipeline(args.file, args.executor, say=lambda line: print(line, flush=True))
    return 0 if pipeline.succeeded(results) else 1


def _print_waits(record: Any) -> None:
    """Where each rank was at an abnormal end (from the stacks saved in the run folder)."""
    if record.waits:
        from orchestrator.core.stacks import wait_lines

        print(f"where the ranks were (stacks in {RunFolder.of(record.run_dir).stacks}):", file=sys.stderr)
        for line in wait_lines(record.waits):
            print(f"  {line}", file=sys.stderr)


def cmd_preflight(args: argparse.Namespace) -> int:
    """Same nodes, ranks, backend, interface and SLURM options as the job; only the entrypoint differs."""
    from orchestrator.api import run, submit

    spec = _load(args)
    data = spec.model_dump(mode="json")
    data.update(name=f"{spec.name}-preflight", entrypoint="jobs.allreduce:main", extra_args=[], sweep={},
                args={"sizes-mb": list(args.sizes_mb)})
    if not spec.runs_on.foreground:  # queued: wait for it
        handle = submit(data)
        print(f"preflight submitted as job {', '.join(handle.job_ids)}; waiting")
        handle.wait()
    else:
        handle = run(data)
    report = RunFolder.of(handle.run_dir).allreduce
    if handle.state != State.COMPLETED or not report.exists():
        print(f"preflight {handle.state}: {handle.error or 'no report written'}", file=sys.stderr)
        return 1
    result = json.loads(report.read_text())
    print(f"all-reduce over {result['world_size']} ranks ({result['backend']}):")
    print(f"{'size MB':>8} {'time ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for r in result["rows"]:
        print(f"{r['size_mb']:8.1f} {r['seconds'] * 1e3:9.2f} {r['algbw_gbps']:11.3f} {r['busbw_gbps']:11.3f}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from orchestrator.front.operations import status

    return status(args.runs, as_json=args.json)


def cmd_top(args: argparse.Namespace) -> int:
    from orchestrator.front.top import top

    return top(args.run, args.once, args.interval)


def cmd_list(args: argparse.Namespace) -> int:
    from orchestrator.front.operations import list_runs

    return list_runs(as_json=args.json)


def cmd_logs(args: argparse.Namespace) -> int:
    from orchestrator.front.operations import logs

    return logs(args.run, args.rank, args.follow, args.point, attempt=args.attempt)


def cmd_stacks(args: argparse.Namespace) -> int:
    from orchestrator.api import Run

    print(Run.get(args.run).stacks(rank=args.rank, native=args.native), end="", flush=True)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from orchestrator.front.operations import cancel

    return cancel(args.run)


def cmd_chaos(args: argparse.Namespace) -> int:
    from orchestrator.front.chaos import Injection, inject

    if args.kill_rank is not None:
        injection = Injection("kill-rank", rank=args.kill_rank)
    elif args.stop_rank is not None:
        injection = Injection("stop-rank", rank=args.stop_rank)
    elif args.slow_rank is not None:
        injection = Injection("slow-rank", rank=args.slow_rank, factor=args.factor, seconds=args.seconds)
    else:
        injection = Injection("node-down", node=args.node_down)
    print(inject(args.run, injection))
    return 0


def cmd_remote_receive(args: argparse.Namespace) -> int:
    from orchestrator.remote.remote_receive import serve

    return serve(sys.stdin.buffer, sys.stdout.buffer)


def cmd_remote_files(args: argparse.Namespace) -> int:
    from orchestrator.remote.remote_receive import send_files

    return send_files(args.run, args.what, sys.stdout.buffer)


def cmd_diff(args: argparse.Namespace) -> int:
    """The run's snapshot against the project on disk now: the files added, deleted and modified
    since, and for each its unified diff (snapshot on the left)."""
    from orchestrator.api import Run
    from orchestrator.code.snapshot import changes_since, read_code_record, unified_diff
    from orchestrator.core.safe_read import Damaged, NoPermission, read_regular

    run = Run.get(args.run)
    path = RunFolder.of(run.run_dir).code
    try:  # never a FIFO, a link or a huge file; a file this user may not read is said so, never "damaged"
        present = read_regular(path) is not None
    except NoPermission as exc:
        raise OrchestratorError(exc.line()) from None
    except Damaged as exc:
        raise OrchestratorError(exc.line(f"the run's code record {path}") + "; the run itself is unaffected, but its "
                                "snapshot cannot be compared") from None
    if not present:
        raise OrchestratorError(f"run {run.id} has no code snapshot (it ran the live files: code.snapshot was false, "
                                "the entrypoint is an installed package, or an older version ran it)")
    code = read_code_record(path)
    changed, _, frozen = changes_since(code)
    commit = f", git {code['commit'][:12]}{' + uncommitted changes' if code.get('dirty') else ''}" \
        if code.get("commit") else ""
    said = f"{len(changed)} file(s) changed" if changed else "no change"
    print(f"{code['root']}: {said} since snapshot {code['id']}{commit}")
    for status, rel in changed:
        print(f"  {status:9} {rel}")
    if not args.stat:
        store_dir = str(Path(code["manifest"]).parent.parent)
        for status, rel in changed:
            sys.stdout.write("\n" + unified_diff(store_dir, code["root"], status, rel, frozen.get(rel)))
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    from orchestrator.api import Run
    from orchestrator.front.sync import sync

    run = Run.get(args.run)
    return sync(run.run_dir, run.id, dry_run=args.dry_run)


def cmd_gc(args: argparse.Namespace) -> int:
    """``orchestrator gc``: each store's snapshots that no run may still use, and that are not
    among the last few or the last hour's, removed (``snapshot_prune``), with what that freed."""
    from orchestrator.front import snapshot_prune

    found = snapshot_prune.stores(args.runs_dirs)
    if not found:
        where = ", ".join(args.runs_dirs) if args.runs_dirs else "the registered runs' folders"
        print(f"no code snapshots to clean in {where} (no .code store there)")
        return 0
    keep = snapshot_prune.KEEP if args.keep is None else args.keep
    failed = 0
    for store in found:
        report = snapshot_prune.prune(store, keep=keep, every_s=0, dry_run=args.dry_run)
        if report is None:
            print(f"{store}: {len(list((store / 'trees').glob('*')))} snapshot(s), none beyond the {keep} kept")
            continue
        print(report.line().removeprefix("[orchestrator] "))
        failed += report.skipped is not None
    return 1 if failed else 0


def cmd_report(args: argparse.Namespace) -> int:
    from orchestrator.api import Run
    from orchestrator.core.fs_checks import problem, shown

    run = Run.get(args.run)
    for path in RunFolder.of(run.run_dir).metrics_files():
        why = problem(path, folder=False)  # a FIFO there would block the report's read forever
        if why:
            raise OrchestratorError(f"{shown(path)} {why}; fix or move it out of {shown(path.parent)} and run the "
                                    "report again")
    print(run.report())
    return 0
