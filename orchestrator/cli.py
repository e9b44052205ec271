"""The ``orchestrator`` command line: one small function per subcommand, each a thin layer over
the Python API (api.py) that parses arguments and prints.

Imports are deferred into the subcommands: ``--help``, ``validate``, ``plan``, ``submit`` and
``status`` never import torch, and ``validate`` stays cheap (docs/PERFORMANCE.md has its figures).
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from orchestrator import __version__
from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.run_folder import RunFolder
from orchestrator.states import State

EXECUTORS = ("local", "slurm", "debug")


def _spec_args(p: argparse.ArgumentParser, executor: bool = True) -> None:
    p.add_argument("spec", nargs="+", help="spec files (YAML or JSON); later files override earlier ones")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set distributed.port=29500 (repeatable; applied after files)")
    if executor:
        p.add_argument("--executor", choices=EXECUTORS, help="override the spec's executor")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description="Typed DDP jobs on SLURM or locally.",
                                     allow_abbrev=False)  # --rem would reach a login node as written
    parser.add_argument("--remote", metavar="HOST",
                        help="run submit, plan, status, list, logs, stacks, cancel or report on this login node "
                             "over SSH "
                             "(default: remote.host in ~/.config/orchestrator/config.yaml); see README 'Remote'")
    parser.add_argument("--local", action="store_true", help="ignore remote.host from the config file")
    parser.add_argument("--client-version", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a spec; exit code 2 if it is invalid")
    _spec_args(p)
    p.add_argument("--cluster", action="store_true", help="also check it against the live SLURM cluster")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="show the sbatch script and every rank's environment, without submitting")
    _spec_args(p)
    p.add_argument("--json", action="store_true", help="print the LaunchPlan as JSON (every rank)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--node", type=int, help="show this node's ranks in full")
    which.add_argument("--rank", type=int, help="show this rank's whole environment")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("schema", help="print the JSON schema of job specs (for editors)")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("run", help="run a spec (local by default) in the foreground")
    _spec_args(p)
    p.add_argument("--detach", action="store_true", help="run in the background and return the run id")
    p.add_argument("--fresh", action="store_true",
                   help="start over: move an existing run folder of this spec aside (nothing is deleted)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="train the embedded demo spec locally (2 nodes x 2 ranks, digits) and report")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("submit", help="submit a spec to SLURM")
    _spec_args(p)
    p.add_argument("--wait", action="store_true", help="wait until the job ends; exit 1 unless it COMPLETED")
    p.add_argument("--follow", action="store_true", help="stream rank 0's log until the job ends")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("pipeline", help="submit a graph of specs to SLURM at once (locally: run them in order); "
                                        "stages that completed are skipped")
    p.add_argument("file", help="the pipeline file (YAML): stages: {NAME: {spec: FILE, after: [STAGE], set: [K=V]}}")
    p.add_argument("--executor", choices=EXECUTORS, help="override every stage's executor")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--plan", action="store_true", help="what would be submitted, skipped or waited for; start nothing")
    mode.add_argument("--status", action="store_true", help="each stage's run, state and what it waits for")
    p.add_argument("--json", action="store_true", help="with --plan or --status: print the stages as JSON")
    p.set_defaults(func=cmd_pipeline)

    p = sub.add_parser("preflight", help="run the all-reduce bandwidth check on a spec's nodes and ranks, and report it")
    _spec_args(p)
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 16.0, 64.0], help="message sizes")
    p.set_defaults(func=cmd_preflight)

    p = sub.add_parser("status", help="state of one or more runs (one scheduler query for all)")
    p.add_argument("runs", nargs="*", help="run ids or folders; default: every registered run")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("list", help="list registered runs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("logs", help="print a rank's log")
    p.add_argument("run")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--point", type=int, default=None,
                   help="sweep point index (default: the latest point that has a log)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    p.add_argument("--attempt", type=_attempt_number, default=None, metavar="K",
                   help="only attempt K's part of the log (from 1, as status counts the attempts); with -f, only "
                        "the latest attempt")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("stacks", help="print the Python stack of every thread of every live rank (they keep running)")
    p.add_argument("run")
    p.add_argument("--rank", type=int, default=None, help="only this rank")
    p.add_argument("--native", action="store_true",
                   help="local runs: C/C++ frames too, through py-spy (needs ptrace permission)")
    p.set_defaults(func=cmd_stacks)

    p = sub.add_parser("cancel", help="stop a run")
    p.add_argument("run")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("report", help="write PNG plots and a text summary of a run's metrics")
    p.add_argument("run")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("remote-receive")  # the login node's side of --remote submit (remote_receive.py)
    p.set_defaults(func=cmd_remote_receive)
    p = sub.add_parser("remote-files")  # the login node sends a run's report PNGs (tar on stdout)
    p.add_argument("run")
    p.add_argument("what", choices=["report"])
    p.set_defaults(func=cmd_remote_files)

    p = sub.add_parser("diff", help="what changed in the project on disk since the run's code snapshot")
    p.add_argument("run")
    p.add_argument("--stat", action="store_true", help="only the changed files' names")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("sync", help="push a run's offline W&B runs (WANDB_MODE=offline) with wandb sync; "
                                    "say how to open its TensorBoard and MLflow folders")
    p.add_argument("run", help="run id (or a unique prefix) or run folder")
    p.add_argument("--dry-run", action="store_true", help="list the offline W&B folders and the command; push nothing")
    p.set_defaults(func=cmd_sync)
    return parser


# ---- subcommands: each one a call into the Python API (api.py) ------------------------------
def _load(args: argparse.Namespace) -> Any:
    from orchestrator.loading import load_spec  # not through api: validate needs nothing else of it

    return load_spec(*args.spec, overrides=args.overrides, executor=getattr(args, "executor", None))


def cmd_validate(args: argparse.Namespace) -> int:
    spec = _load(args)
    if args.cluster:
        from orchestrator.executors.slurm_checks import check_against_cluster

        check_against_cluster(spec)
    print(f"ok: {spec.name}: {spec.nodes} node(s) x {spec.ranks_per_node} rank(s), "
          f"{spec.resolved_backend}, {spec.distributed.init_method} init, executor {spec.executor}"
          + (f", sweep of {len(spec.sweep_points())}" if spec.sweep else ""))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from orchestrator.api import plan_for
    from orchestrator.operations import show_plan  # the login node answers plan --remote with it too

    show_plan(plan_for(_load(args)), as_json=args.json, node=args.node, rank=args.rank)
    return 0


def _run_lines(launch: Any) -> list[str]:
    from orchestrator.identity import plan_lines

    return plan_lines(launch)


def cmd_schema(args: argparse.Namespace) -> int:
    from orchestrator.spec import JobSpec

    print(json.dumps(JobSpec.model_json_schema(), indent=2))
    return 0


@contextlib.contextmanager
def _early_zygote(start: bool) -> Iterator[Any]:
    """The local ranks' parent, started before anything imports pydantic, so that torch imports
    while the spec is loaded and planned; killed here if the run never used it (an invalid spec,
    another executor, or local.preload_torch: false)."""
    zygote = None
    if start:
        from orchestrator.executors.forked import start_zygote

        zygote = start_zygote()
    try:
        yield zygote
    finally:
        if zygote is not None and zygote.poll() is None and zygote.stdin is not None and not zygote.stdin.closed:
            zygote.kill()
            zygote.wait()


def cmd_run(args: argparse.Namespace) -> int:
    with _early_zygote(args.executor in (None, "local") and not args.detach) as zygote:
        from orchestrator.api import run

        said: list[str] = []
        # In the foreground the identity line comes first (what follows may be a long run); a
        # detached run says it after it started, so a refusal stays one line.
        on_plan = _say_run_lines if not args.detach else (lambda launch: said.extend(_run_lines(launch)))
        handle = run(_load(args), wait=not args.detach, executor=args.executor, fresh=args.fresh, zygote=zygote,
                     on_moved=_print_moved, on_plan=None if args.fresh else on_plan)
    if args.detach:
        print(f"started {handle.id} in the background; follow it with: orchestrator logs -f {handle.id}")
        _say(said)
        return 0
    _print_outcome(handle.record)
    return 0 if handle.state == State.COMPLETED else 1


def _print_outcome(record: Any) -> None:
    """A finished run's end, as ``run`` and ``submit --wait`` show it: its state, the error and
    where the ranks were, a warning, the result. A reader that went away (``| head``) loses it;
    the record keeps it, and the exit code still tells the outcome."""
    try:
        print(f"{record.run_id}: {record.state}  (run folder {record.run_dir})")
        if record.state != State.COMPLETED:
            if record.error:
                print(record.error, file=sys.stderr)
            _print_waits(record)
            rank = record.failed_rank if record.failed_rank is not None else 0
            print(f"see: orchestrator logs {record.run_id} --rank {rank}", file=sys.stderr)
        if record.warning:
            print(f"warning: {record.warning}", file=sys.stderr)
        result = RunFolder.of(record.run_dir).result
        if record.state == State.COMPLETED and result.is_file():
            print(f"result: {json.loads(result.read_text(encoding='utf-8')).get('result')}")
    except (OSError, ValueError, AttributeError):
        pass


def _say_run_lines(launch: Any) -> None:
    _say(_run_lines(launch))


def _say(lines: list[str]) -> None:
    """run and submit: the identity line (and warnings) on stderr; stdout stays what scripts parse."""
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def _print_moved(moved: Any) -> None:
    print(f"moved the previous run folder to {moved}")


def cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    demo = Path(__file__).parent / "examples" / "demo.yaml"
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

    said: list[str] = []
    handle = submit(_load(args), executor=args.executor or "slurm",
                    on_plan=lambda launch: said.extend(_run_lines(launch)))
    print(f"submitted {handle.id}: job(s) {', '.join(handle.job_ids) or '-'}; run folder {handle.run_dir}", flush=True)
    _say(said)  # after the submission: a refused one stays one line
    if args.follow or args.wait:
        state = handle.wait(follow=args.follow)
        _print_outcome(handle.record)
        return 0 if state == State.COMPLETED else 1
    return 0


def cmd_pipeline(args: argparse.Namespace) -> int:
    from orchestrator import pipeline

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
        from orchestrator.stacks import wait_lines

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
    if spec.executor == "slurm":
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
    from orchestrator.operations import status

    return status(args.runs, as_json=args.json)


def cmd_list(args: argparse.Namespace) -> int:
    from orchestrator.operations import list_runs

    return list_runs(as_json=args.json)


def _attempt_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an attempt: attempts are counted from 1, as "
                                         "'orchestrator status' lists them")
    return value


def cmd_logs(args: argparse.Namespace) -> int:
    from orchestrator.operations import logs

    if args.attempt is None:
        return logs(args.run, args.rank, args.follow, args.point)
    return logs(args.run, args.rank, args.follow, args.point, attempt=args.attempt)


def cmd_stacks(args: argparse.Namespace) -> int:
    from orchestrator.api import Run

    sys.stdout.write(Run.get(args.run).stacks(rank=args.rank, native=args.native))
    sys.stdout.flush()
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from orchestrator.operations import cancel

    return cancel(args.run)


def cmd_remote_receive(args: argparse.Namespace) -> int:
    from orchestrator.remote_receive import serve

    return serve(sys.stdin.buffer, sys.stdout.buffer)


def cmd_remote_files(args: argparse.Namespace) -> int:
    from orchestrator.remote_receive import send_files

    return send_files(args.run, args.what, sys.stdout.buffer)


def _remote_target(args: argparse.Namespace) -> str | None:
    """The login node a command goes to: --remote, else the config file's remote.host for the
    commands that run there (never with --local, never on the login node itself)."""
    from orchestrator.remote import REMOTE_COMMANDS, check_host, config_path

    if args.remote is not None:  # --remote '' would otherwise run here, --remote=-o... reach ssh as an option
        check_host(args.remote)
    if args.command not in REMOTE_COMMANDS or args.local or args.client_version:
        if args.remote and args.command not in REMOTE_COMMANDS:
            raise UsageError(f"--remote works with {', '.join(REMOTE_COMMANDS)}; '{args.command}' runs here "
                             "(validate a SLURM spec here with --executor slurm)")
        return None
    if args.command == "plan":  # a SLURM plan is the cluster's; a local one stays here
        from orchestrator.remote import plan_host

        return plan_host(args)
    if args.remote:
        return args.remote
    if config_path().is_file():
        from orchestrator.remote import load_settings

        return load_settings().host
    return None


def _command_argv(argv: Sequence[str]) -> list[str]:
    """The command line without the global options (what the login node is given)."""
    out, skip = [], False
    for i, word in enumerate(argv):
        if skip:
            skip = False
        elif word in ("--remote",):
            skip = True
        elif word.startswith("--remote=") or word == "--local":
            continue
        elif not out and not word.startswith("-"):
            return list(argv[i:])
        else:
            out.append(word)
    return out


def cmd_diff(args: argparse.Namespace) -> int:
    """The run's snapshot against the project on disk now: the files added, deleted and modified
    since, and for each its unified diff (snapshot on the left)."""
    from orchestrator.api import Run
    from orchestrator.snapshot import changes_since, read_code_record, unified_diff

    run = Run.get(args.run)
    path = RunFolder.of(run.run_dir).code
    if not path.is_file():
        raise OrchestratorError(f"run {run.id} has no code snapshot (it ran the live files: code.snapshot was false, "
                                "the entrypoint is an installed package, or an older version ran it)")
    code = read_code_record(path)
    changed, _, frozen = changes_since(code)
    commit = f", git {code['commit'][:12]}{' + uncommitted changes' if code.get('dirty') else ''}" \
        if code.get("commit") else ""
    if not changed:
        print(f"{code['root']}: no change since snapshot {code['id']}{commit}")
        return 0
    print(f"{code['root']}: {len(changed)} file(s) changed since snapshot {code['id']}{commit}")
    for status, rel in changed:
        print(f"  {status:9} {rel}")
    if not args.stat:
        store_dir = str(Path(code["manifest"]).parent.parent)
        for status, rel in changed:
            sys.stdout.write("\n" + unified_diff(store_dir, code["root"], status, rel, frozen.get(rel)))
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    from orchestrator.api import Run
    from orchestrator.sync import sync

    run = Run.get(args.run)
    return sync(run.run_dir, run.id, dry_run=args.dry_run)


def cmd_report(args: argparse.Namespace) -> int:
    from orchestrator.api import Run
    from orchestrator.fs_checks import problem, shown

    run = Run.get(args.run)
    for path in RunFolder.of(run.run_dir).metrics_files():
        why = problem(path, folder=False)  # a FIFO there would block the report's read forever
        if why:
            raise OrchestratorError(f"{shown(path)} {why}; fix or move it out of {shown(path.parent)} and run the "
                                    "report again")
    print(run.report())
    return 0


#: Exit status of a login node whose orchestrator version is not the client's (remote.py).
VERSION_MISMATCH = 3


def main(argv: Sequence[str] | None = None) -> int:
    unsupported = _unsupported_platform()
    if unsupported:
        print(f"error: {unsupported}", file=sys.stderr)
        return 2
    with _process_streams():
        words = list(sys.argv[1:] if argv is None else argv)
        client = words[1] if words[:1] == ["--client-version"] and len(words) > 1 else None
        if client is not None and client != __version__:  # before parsing: a newer client's options are unknown here
            print(f"error: this login node runs orchestrator {__version__}, and your machine {client}: install the "
                  f"same version on both (pip install ddp-orchestrator=={client} here, or {__version__} there)",
                  file=sys.stderr)
            return VERSION_MISMATCH
        args = build_parser().parse_args(words)
        func: Callable[[argparse.Namespace], int] = args.func
        try:
            if args.remote and args.local:
                raise UsageError("--remote and --local contradict each other: give one")
            host = _remote_target(args)
            if host:
                from orchestrator.remote import run_command

                return run_command(host, args.command, _command_argv(words), args)
            return func(args)
        except OrchestratorError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except OSError as exc:  # the environment, not a bug: one line naming the path and the fix
            # (a BrokenPipeError too: our own stdout and stderr never raise it, see _process_streams,
            # so this pipe is another one, a subprocess's or a socket's)
            print(f"error: {_os_error_line(exc)}", file=sys.stderr)
            return 1
        except ValueError as exc:
            if "surrogates not allowed" not in str(exc):  # only text that is not UTF-8; the rest are bugs
                raise
            print(f"error: {_not_utf8_line()}", file=sys.stderr)
            return 1


def _unsupported_platform() -> str | None:
    """Where the orchestrator cannot run at all (native Windows), the one line that says what to
    use instead; checked before any subcommand imports what such a platform lacks (fcntl)."""
    from orchestrator.platform_caps import unsupported_reason

    return unsupported_reason()


#: What to do about an errno, after the path and the errno's meaning.
_ERRNO_FIX = {
    "EACCES": "check its owner and permissions (ls -ld), or use a location you can write",
    "EPERM": "check its owner and permissions (ls -ld), or use a location you can write",
    "ENOSPC": "the filesystem is full: free space there (df -h), or use another location",
    "EDQUOT": "your disk quota there is used up: free space, or use another location",
    "EROFS": "that filesystem is mounted read-only: use a writable location (the registry: ORCHESTRATOR_HOME; "
             "run folders: runs_dir in the spec)",
    "ENAMETOOLONG": "a name on that path is too long for the filesystem: use a shorter spec name, runs_dir or "
                    "ORCHESTRATOR_HOME",
    "ELOOP": "a symbolic link on that path points back to itself: fix or remove the link",
    "ENOTDIR": "a file stands where a folder belongs: remove or rename it",
    "EISDIR": "a folder stands where a file belongs: remove or rename it",
    "EMFILE": "too many open files: raise the limit (ulimit -n)",
    "ENFILE": "the system has too many open files: try again later",
    "EIO": "the disk or network filesystem reported an I/O error: check it (dmesg)",
}


def _os_error_line(exc: OSError) -> str:
    """One line for an OSError that escaped a subcommand: the path(s), the errno's meaning, the fix."""
    import errno

    from orchestrator.fs_checks import cwd_gone, errno_text, shown

    names = [f for f in (exc.filename, exc.filename2) if f is not None]
    if exc.errno == errno.ENOENT and cwd_gone() and not any(isinstance(f, (str, bytes)) and os.path.isabs(f)
                                                            for f in names):
        return ("the current folder no longer exists (it was deleted or moved): cd to an existing folder "
                "and run the command again")
    where = " -> ".join(shown(f) for f in names)
    fix = _ERRNO_FIX.get(errno.errorcode.get(exc.errno, "") if isinstance(exc.errno, int) else "", "")
    text = " ".join(errno_text(exc).split())
    line = f"{where}: {text}" if where else text
    return f"{line}; {fix}" if fix else line


def _not_utf8_line() -> str:
    from orchestrator.fs_checks import shown

    try:
        cwd = os.getcwd()
    except OSError:
        cwd = ""
    if any("\udc80" <= c <= "\udcff" for c in cwd):  # os.getcwd() escapes bytes that are not UTF-8 so
        return (f"the current folder's name is not valid UTF-8 ({shown(cwd)}), and the run's files record it "
                "as text: run from a folder whose name is UTF-8")
    return ("a path or name here is not valid UTF-8 and cannot be written as JSON: rename it, or run from a folder "
            "whose name is UTF-8")


class _PipeEnd(io.RawIOBase):
    """fd 1 or 2 for the CLI's own output. When the reader goes away (``orchestrator status |
    head -1``), the write that meets EPIPE and every later one go to /dev/null and
    ``reader_gone`` is set, so the command runs to its end and exits with its own code,
    instead of a BrokenPipeError in whatever print() happened to meet it."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self.gone = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        if self.gone:
            return len(data)
        try:
            view, done = memoryview(data).cast("B"), 0
            while done < len(view):  # all of it: without a buffer above (python -u), nobody retries the rest
                done += os.write(self._fd, view[done:])
            return done
        except BrokenPipeError:
            self.gone = True
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._fd)
            os.close(null)
            return len(data)


class _Text(io.TextIOWrapper):
    @property
    def reader_gone(self) -> bool:
        raw = getattr(self.buffer, "raw", self.buffer)
        return bool(getattr(raw, "gone", False))


def _wrapped(stream: Any) -> Any:
    """The process's stdout or stderr behind a _PipeEnd, and text that is not UTF-8 (a folder's
    name, surrogate-escaped by Python) written as its own bytes instead of raising
    UnicodeEncodeError; None when it is not a plain file descriptor stream."""
    try:
        fd = stream.fileno()
        encoding, errors = stream.encoding, stream.errors
    except (AttributeError, OSError, ValueError):
        return None
    if errors == "strict":
        errors = "surrogateescape" if codecs.lookup(encoding).name == "utf-8" else "backslashreplace"
    stream.flush()
    raw = _PipeEnd(fd)
    unbuffered = not isinstance(getattr(stream, "buffer", None), io.BufferedWriter)  # python -u, PYTHONUNBUFFERED
    return _Text(raw if unbuffered else io.BufferedWriter(raw), encoding=encoding, errors=errors,
                 line_buffering=stream.line_buffering, write_through=unbuffered or stream.write_through)


@contextlib.contextmanager
def _process_streams() -> Iterator[None]:
    """While main() runs as the process itself (its stdout and stderr are the process's own, not
    a test's StringIO), write them through _wrapped."""
    saved = sys.stdout, sys.stderr
    new = [_wrapped(s) if s is not None and s is real else None
           for s, real in ((sys.stdout, sys.__stdout__), (sys.stderr, sys.__stderr__))]
    if new[0] is not None:
        sys.stdout = new[0]
    if new[1] is not None:
        sys.stderr = new[1]
    try:
        yield
    finally:
        for stream in new:
            if stream is not None:
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
        sys.stdout, sys.stderr = saved


def console_main() -> None:
    """The ``orchestrator`` command (and ``python -m orchestrator``): ``main``, then exit.

    Before the interpreter shuts down, every object left is moved out of the cycle collector's
    reach (``gc.freeze``): its collections at shutdown would otherwise walk every object the
    process holds (pydantic's schemas, a 32,768-rank plan) only to free memory the process is
    about to give back anyway (a measurable share of a 4096-node ``plan``; docs/PERFORMANCE.md). Files are closed by then, and
    Python flushes stdout and stderr itself. Not done by ``main``, which tests and scripts call
    in a process that goes on."""
    code = main()
    import gc

    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    console_main()
