"""The ``orchestrator`` command line: one small function per subcommand, each a thin layer over
the Python API (api.py) that parses arguments and prints.

Imports are deferred into the subcommands: ``--help``, ``validate``, ``plan``, ``submit`` and
``status`` never import torch, and ``validate`` stays cheap (docs/PERFORMANCE.md has its figures).

The parts: ``cli_commands`` (one function per subcommand), ``cli_streams`` (the process's output
and its one-line errors); this module parses the command line, sends a command to a login node
under ``--remote``, and calls the subcommand.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from orchestrator import __version__
from orchestrator.backends import BACKENDS
from orchestrator.cli.cli_commands import (cmd_cancel, cmd_chaos, cmd_demo, cmd_diff, cmd_gc, cmd_list, cmd_logs,
                                       cmd_pipeline, cmd_plan, cmd_preflight, cmd_remote_files, cmd_remote_receive, cmd_report, cmd_run, cmd_top,
                                       cmd_schema, cmd_status, cmd_stacks, cmd_submit, cmd_sync, cmd_validate)
from orchestrator.cli.cli_streams import not_utf8_line, os_error_line, process_streams
from orchestrator.core.errors import VERSION_MISMATCH, OrchestratorError, UsageError


def _spec_args(p: argparse.ArgumentParser, executor: bool = True) -> None:
    p.add_argument("spec", nargs="+", help="spec files (YAML or JSON); later files override earlier ones")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set distributed.port=29500 (repeatable; applied after files)")
    if executor:
        p.add_argument("--executor", choices=list(BACKENDS), help="override the spec's executor")


_PARSER: list[argparse.ArgumentParser] = []


def parser() -> argparse.ArgumentParser:
    """The command line's parser, built once per process (about 13 ms, most of it argparse's own
    gettext lookups): a process that calls ``main`` many times (the tests, a script) pays it once.
    Parsing keeps no state in it (``--set``'s default list is copied, never appended to)."""
    if not _PARSER:
        _PARSER.append(build_parser())
    return _PARSER[0]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description="Typed DDP jobs on SLURM or locally.",
                                     allow_abbrev=False)  # --rem would reach a login node as written
    parser.add_argument("--remote", metavar="HOST",
                        help="run submit, plan, status, list, logs, stacks, cancel or report on this login node "
                             "over SSH "
                             "(default: remote.host in ~/.config/orchestrator/config.yaml); see docs/manual/remote.md")
    parser.add_argument("--local", action="store_true", help="ignore remote.host from the config file")
    parser.add_argument("--client-version", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, func: Callable[[argparse.Namespace], int], **options: Any) -> argparse.ArgumentParser:
        """A subcommand that runs ``func`` (``help``: listed in --help; without it, hidden)."""
        found = sub.add_parser(name, **options)
        found.set_defaults(func=func)
        return found

    p = command("validate", cmd_validate, help="check a spec; exit code 2 if it is invalid")
    _spec_args(p)
    p.add_argument("--cluster", action="store_true", help="also check it against the live SLURM cluster")

    p = command("plan", cmd_plan, help="show the sbatch script and every rank's environment, without submitting")
    _spec_args(p)
    p.add_argument("--json", action="store_true", help="print the LaunchPlan as JSON (every rank)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--node", type=int, help="show this node's ranks in full")
    which.add_argument("--rank", type=int, help="show this rank's whole environment")

    command("schema", cmd_schema, help="print the JSON schema of job specs (for editors)")

    p = command("run", cmd_run, help="run a spec (local by default) in the foreground")
    _spec_args(p)
    p.add_argument("--detach", action="store_true", help="run in the background and return the run id")
    p.add_argument("--fresh", action="store_true",
                   help="start over: move an existing run folder of this spec aside (nothing is deleted)")

    p = command("demo", cmd_demo, help="train the embedded demo spec locally (2 nodes x 2 ranks, digits) and report")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")

    p = command("submit", cmd_submit, help="submit a spec to SLURM")
    _spec_args(p)
    p.add_argument("--wait", action="store_true", help="wait until the job ends; exit 1 unless it COMPLETED")
    p.add_argument("--follow", action="store_true", help="stream rank 0's log until the job ends")

    p = command("pipeline", cmd_pipeline, help="submit a graph of specs to SLURM at once (locally: run them in "
                                               "order); stages that completed are skipped")
    p.add_argument("file", help="the pipeline file (YAML): stages: {NAME: {spec: FILE, after: [STAGE], set: [K=V]}}")
    p.add_argument("--executor", choices=list(BACKENDS), help="override every stage's executor")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--plan", action="store_true", help="what would be submitted, skipped or waited for; start nothing")
    mode.add_argument("--status", action="store_true", help="each stage's run, state and what it waits for")
    p.add_argument("--json", action="store_true", help="with --plan or --status: print the stages as JSON")

    p = command("preflight", cmd_preflight,
                help="run the all-reduce bandwidth check on a spec's nodes and ranks, and report it")
    _spec_args(p)
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 16.0, 64.0], help="message sizes")

    p = command("status", cmd_status, help="state of one or more runs (one scheduler query for all)")
    p.add_argument("runs", nargs="*", help="run ids or folders; default: every registered run")
    p.add_argument("--json", action="store_true")

    p = command("top", cmd_top, help="every rank of a running job side by side: step, rate, last report, memory")
    p.add_argument("run")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit (scripts, a pipe)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (at most 1)")

    p = command("list", cmd_list, help="list registered runs")
    p.add_argument("--json", action="store_true")

    p = command("logs", cmd_logs, help="print a rank's log")
    p.add_argument("run")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--point", type=int, default=None,
                   help="sweep point index (default: the latest point that has a log)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    p.add_argument("--attempt", type=_attempt_number, default=None, metavar="K",
                   help="only attempt K's part of the log (from 1, as status counts the attempts); with -f, only "
                        "the latest attempt")

    p = command("stacks", cmd_stacks,
                help="print the Python stack of every thread of every live rank (they keep running)")
    p.add_argument("run")
    p.add_argument("--rank", type=int, default=None, help="only this rank")
    p.add_argument("--native", action="store_true",
                   help="local runs: C/C++ frames too, through py-spy (needs ptrace permission)")

    p = command("cancel", cmd_cancel, help="stop a run")
    p.add_argument("run")

    p = command("chaos", cmd_chaos, help="break your own running job on purpose (a rank killed or frozen, a node "
                                         "taken away) and see the recovery its spec asks for")
    p.add_argument("run")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--kill-rank", type=int, metavar="N", help="SIGKILL rank N (a crash with no traceback)")
    what.add_argument("--stop-rank", type=int, metavar="N",
                      help="SIGSTOP rank N (a hang: the watchdog's stall_s must find it)")
    what.add_argument("--node-down", metavar="NAME", help="SLURM: set the run's node NAME DOWN (needs the "
                                                          "administrator's rights)")
    what.add_argument("--slow-rank", type=int, metavar="N",
                      help="make rank N about --factor times slower (a SIGSTOP/SIGCONT duty cycle) for --for seconds: "
                           "a straggler, which status and top name")
    p.add_argument("--factor", type=float, default=4.0, help="with --slow-rank: how many times slower (default 4)")
    p.add_argument("--for", dest="seconds", type=float, default=600.0, metavar="SECONDS",
                   help="with --slow-rank: for how long (default 600)")

    p = command("report", cmd_report, help="write PNG plots and a text summary of a run's metrics")
    p.add_argument("run")

    p = command("gc", cmd_gc, help="remove the code snapshots no run needs any more (runs that may still run, "
                                   "the last few and the last hour's keep theirs)")
    p.add_argument("runs_dirs", nargs="*", metavar="RUNS_DIR",
                   help="runs folders whose snapshot store (RUNS_DIR/.code) to clean; default: every registered run's")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed, and its size; remove nothing")
    p.add_argument("--keep", type=_keep_count, default=None, metavar="N",
                   help="the N most recently used snapshots stay, whatever their runs' states (default 5)")

    command("remote-receive", cmd_remote_receive)  # the login node's side of --remote submit (remote_receive.py)
    p = command("remote-files", cmd_remote_files)  # the login node sends a run's report PNGs (tar on stdout)
    p.add_argument("run")
    p.add_argument("what", choices=["report"])

    p = command("diff", cmd_diff, help="what changed in the project on disk since the run's code snapshot")
    p.add_argument("run")
    p.add_argument("--stat", action="store_true", help="only the changed files' names")

    p = command("sync", cmd_sync, help="push a run's offline W&B runs (WANDB_MODE=offline) with wandb sync; "
                                       "say how to open its TensorBoard and MLflow folders")
    p.add_argument("run", help="run id (or a unique prefix) or run folder")
    p.add_argument("--dry-run", action="store_true", help="list the offline W&B folders and the command; push nothing")
    return parser


def _keep_count(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"--keep takes a count of snapshots (0 or more), not {text[:40]!r}")
    return int(text)


def _attempt_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an attempt: attempts are counted from 1, as "
                                         "'orchestrator status' lists them")
    return value


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
    out: list[str] = []
    skip = False
    for i, word in enumerate(argv):
        if skip:
            skip = False
        elif word == "--remote":
            skip = True
        elif word.startswith("--remote=") or word == "--local":
            continue
        elif not out and not word.startswith("-"):
            return list(argv[i:])
        else:
            out.append(word)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    # Where the orchestrator cannot run at all (native Windows), the one line that says what to use
    # instead; checked before any subcommand imports what such a platform lacks (fcntl).
    from orchestrator.core.platform_caps import unsupported_reason

    unsupported = unsupported_reason()
    if unsupported:
        print(f"error: {unsupported}", file=sys.stderr)
        return 2
    with process_streams():
        words = list(sys.argv[1:] if argv is None else argv)
        client = words[1] if words[:1] == ["--client-version"] and len(words) > 1 else None
        if client is not None and client != __version__:  # before parsing: a newer client's options are unknown here
            print(f"error: this login node runs orchestrator {__version__}, and your machine {client}: install the "
                  f"same version on both (pip install ddp-orchestrator=={client} here, or {__version__} there)",
                  file=sys.stderr)
            return VERSION_MISMATCH
        args = parser().parse_args(words)
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
            # (a BrokenPipeError too: our own stdout and stderr never raise it, see process_streams,
            # so this pipe is another one, a subprocess's or a socket's)
            print(f"error: {os_error_line(exc)}", file=sys.stderr)
            return 1
        except ValueError as exc:
            if "surrogates not allowed" not in str(exc):  # only text that is not UTF-8; the rest are bugs
                raise
            print(f"error: {not_utf8_line()}", file=sys.stderr)
            return 1


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
