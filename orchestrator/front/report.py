"""`orchestrator report RUN`: PNG plots of loss, accuracy and throughput per rank, the attempts' timeline
(start-up, training, failures), and a summary with each recovery's phases and the run's goodput."""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.core.errors import OrchestratorError
from orchestrator.core.records import RunRecord, resolve_run
from orchestrator.core.recovery import Attempt, History
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.safe_read import Damaged, NoPermission, read_regular

#: A rank's metrics file is a few records a step; past this it is not read (a link to a device
#: or a runaway writer must not exhaust the memory of the machine making the report).
METRICS_MAX_BYTES = 1 << 30


#: What each kind of record must hold to be plotted (jobs.MetricsWriter writes them so).
FIELDS = {"train": ("step", "loss"), "eval": ("epoch", "step", "accuracy", "loss"),
          "throughput": ("rank", "epoch", "samples", "seconds", "samples_per_s")}


def read_metrics(run_dir: Path) -> list[dict]:
    """The plottable records of ``<run>/metrics/rank-*.jsonl`` that describe the run as it stands:
    after resumes, one record per step, as the latest attempt trained it (``current_records``).
    A line cut short by a crash, or a record without its numbers, is skipped; a file that cannot be
    read at all (not a file, not UTF-8 text, no permission) raises OrchestratorError naming it."""
    return [record for records in _read_files(run_dir) for record in current_records(records)]


def current_records(records: list[Any]) -> list[dict]:
    """One rank's file, in the order written, less what later attempts superseded.

    ``jobs.MetricsWriter`` appends across attempts (never rewrites, see jobs/metrics.py), and at
    the start of an attempt writes a ``start`` record: the step it trains on from (and the epoch).
    Earlier records of later steps were rolled back (the attempt that wrote them was killed past
    its last checkpoint), and are dropped; so are earlier records without a step (``throughput``)
    of that epoch or later ones, which the new attempt measures again. Then each step (``train``)
    or epoch (``eval``; ``throughput`` per rank) keeps the record written last. Plottable records
    only, each where its kept record was written."""
    kept: list[dict] = []
    for record in records:
        if isinstance(record, dict) and record.get("kind") == "start" and _number(record.get("step")):
            kept = [r for r in kept if not _rolled_back(r, record)]
        elif _plottable(record):
            kept.append(record)
    last = {_key(r): i for i, r in enumerate(kept)}
    return [r for i, r in enumerate(kept) if last[_key(r)] == i]


def resumes(run_dir: Path) -> list[tuple[int, int]]:
    """(step, attempt) where each later attempt of the run started training again, from the
    ``start`` records of the lowest rank's file that has any (0-based attempts, as the ranks
    record them); a fresh start (step 0 of the first attempt) is not one."""
    for records in _read_files(run_dir):
        starts = [(int(r["step"]), int(r.get("attempt") or 0)) for r in records
                  if isinstance(r, dict) and r.get("kind") == "start" and _number(r.get("step"))
                  and _number(r.get("attempt") or 0)]
        if starts:
            return [(step, attempt) for i, (step, attempt) in enumerate(starts) if i > 0 or step > 0]
    return []


def _why_restarted(history: History, attempt: int) -> str:
    """What ended the attempt before ``attempt`` (counted from 1), from recovery.json."""
    earlier = {a.number: a for a in history.attempts}.get(attempt - 1)
    if earlier is None or not earlier.outcome:
        return ""
    return {"restart": f"restart after {earlier.outcome}", "requeue": "requeue"}.get(earlier.action, earlier.outcome)


def _rolled_back(record: dict, start: dict) -> bool:
    if _number(record.get("step")):
        return record["step"] > start["step"]
    return _number(start.get("epoch")) and record["epoch"] >= start["epoch"]


def _key(record: dict) -> tuple:
    kind = record["kind"]
    if kind == "train":
        return kind, record["step"]
    if kind == "throughput":
        return kind, record["rank"], record["epoch"]
    return kind, record["epoch"]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _read_files(run_dir: Path) -> list[list[Any]]:
    """The records of each metrics file, as parsed (lines that are not JSON skipped)."""
    out = []
    for path in RunFolder(run_dir).metrics_files():
        try:  # never a FIFO (it would block for ever), never unbounded (a link to /dev/zero)
            data = read_regular(path, METRICS_MAX_BYTES, follow=True)
        except NoPermission as exc:
            raise OrchestratorError(exc.line()) from None
        except Damaged as exc:
            what = "is a directory, not a metrics file" if path.is_dir() else f"is not a metrics file ({exc.why})"
            raise OrchestratorError(f"{path} {what}; move it out of {path.parent} and run the report again") from None
        if data is None:
            continue  # removed since it was listed
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise OrchestratorError(f"{path} is not a metrics file (not UTF-8 text: byte 0x{exc.object[exc.start]:02x} "
                                    f"at offset {exc.start}); move it out of {path.parent} and run the report "
                                    "again") from None
        records = []
        for line in text.splitlines():
            try:
                records.append(json.loads(line))
            except (json.JSONDecodeError, RecursionError):
                continue  # a line cut short by a crash
        out.append(records)
    return out


def _plottable(record: Any) -> bool:
    if not isinstance(record, dict) or not isinstance(record.get("kind"), str) or record["kind"] not in FIELDS:
        return False
    return all(_number(record.get(name)) for name in FIELDS[record["kind"]])


def recovery_lines(history: History, submitted: float | None) -> list[str]:
    """The summary's lines on recovery: each one's phases, and the run's goodput."""
    from orchestrator.core.attempt_times import goodput, phases_line, recovery_shown

    lines = []
    for before, after in zip(history.attempts, history.attempts[1:]):
        phases = recovery_shown(before, after)  # none for a restart cancelled before it trained
        if phases is not None:
            lines.append(f"attempt {after.number}: {phases_line(phases, before.number)} ({before.outcome or 'a failure'})")
    measured = goodput(history.attempts, submitted, time.time()) if submitted is not None else None
    if measured is not None:
        lines.append(measured.line())
    return lines


def plot_timeline(ax: Any, attempts: list[Attempt]) -> None:
    """One row per attempt, from the first attempt's start: start-up (grey), training (green), a failed
    attempt's time without progress before its failure was seen (orange: a hang's ``stall_s``), the
    failure's teardown (red); the gaps between rows are the waits (a requeue's hold, the queue)."""
    from orchestrator.core.attempt_times import back_at, trained_until

    t0 = attempts[0].started
    for row, a in enumerate(attempts):
        back = back_at(a)
        end = a.ended or time.time()
        failed = a.times.get("failed_at") or end
        segments = [(a.started, (back or end), "lightgrey")]
        if back is not None:
            trained = min(failed, max(back, trained_until(a, failed))) if a.times.get("failed_at") else failed
            segments.append((back, trained, "tab:green"))
            if trained < failed:
                segments.append((trained, failed, "tab:orange"))
        if failed < end:
            segments.append((failed, end, "tab:red"))
        for start, stop, colour in segments:
            ax.broken_barh([(start - t0, max(0.0, stop - start))], (row - 0.4, 0.8), facecolors=colour)
    ax.set_yticks(range(len(attempts)), [f"attempt {a.number}" for a in attempts])
    ax.invert_yaxis()
    ax.set(title="attempts: start-up, training, no progress, failure",
           xlabel="seconds since the first attempt started")


def write_report(ref: str) -> str:
    run_dir = resolve_run(ref)
    folder = RunFolder(run_dir)
    metrics = read_metrics(run_dir)
    if not metrics:
        raise OrchestratorError(f"no metrics in {folder.metrics}: has the run trained yet?")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        why = " ".join(str(exc).split())[:200]
        raise OrchestratorError(f"the report needs matplotlib, which cannot be imported here ({why}): "
                                "pip install matplotlib") from None

    train = sorted((m for m in metrics if m["kind"] == "train"), key=lambda m: m["step"])
    evals = sorted((m for m in metrics if m["kind"] == "eval"), key=lambda m: m["epoch"])
    thr: dict[int, list[dict]] = defaultdict(list)
    for m in sorted((m for m in metrics if m["kind"] == "throughput"), key=lambda m: m["epoch"]):
        thr[m["rank"]].append(m)
    out_dir = folder.report
    try:
        out_dir.mkdir(exist_ok=True)
    except OSError as exc:
        raise OrchestratorError(f"cannot create {out_dir} ({exc.strerror}): the report is written there; "
                                "make the run folder writable, or move what is in the way") from None
    history, unreadable = History.shown(run_dir)  # damaged: one line in the summary, the plots still made
    timed = [a for a in history.attempts if a.started and isinstance(a.times, dict)]
    fig, axes = plt.subplots(1, 4 if timed else 3, figsize=(20 if timed else 15, 4))
    axes[0].plot([m["step"] for m in train], [m["loss"] for m in train], label="train (rank 0)")
    axes[0].plot([m["step"] for m in evals], [m["loss"] for m in evals], "o-", label="test")
    marks = resumes(run_dir)
    for i, (step, attempt) in enumerate(marks):  # every restart or requeue, where training resumed
        why = _why_restarted(history, attempt + 1)
        axes[0].axvline(step, color="grey", linestyle="--", linewidth=1,
                        label="resumed (restart or requeue)" if i == 0 else None)
        axes[0].annotate(f"attempt {attempt + 1}" + (f"\n{why}" if why else ""), (step, 0.02), xycoords=("data", "axes fraction"),
                         fontsize="x-small", ha="right", va="bottom", rotation=90)
    axes[0].set(title="loss", xlabel="step")
    axes[0].legend()
    axes[1].plot([m["epoch"] for m in evals], [m["accuracy"] for m in evals], "o-")
    axes[1].set(title="test accuracy", xlabel="epoch", ylim=(0, 1))
    for rank, rows in sorted(thr.items()):
        axes[2].plot([m["epoch"] for m in rows], [m["samples_per_s"] for m in rows], "o-", label=f"rank {rank}")
    axes[2].set(title="throughput (samples/s)", xlabel="epoch")
    axes[2].legend(fontsize="small")
    if timed:
        plot_timeline(axes[3], timed)
    fig.tight_layout()
    try:
        fig.savefig(folder.report_plot, dpi=90)
    except OSError as exc:
        raise OrchestratorError(f"cannot write {folder.report_plot} ({exc.strerror}); make it writable") from None
    finally:
        plt.close(fig)
    lines = [f"run {run_dir.name}"]
    rec = RunRecord.load(run_dir) if folder.record.exists() else None
    if rec is not None:
        lines.append(f"state {rec.state}, {rec.world_size} rank(s), attempt {rec.attempts}")
    if train:
        lines.append(f"steps {train[-1]['step']}, final train loss {train[-1]['loss']:.4f}")
    for step, attempt in marks:
        why = _why_restarted(history, attempt + 1)
        lines.append(f"attempt {attempt + 1} resumed at step {step}" + (f" ({why})" if why else ""))
    if evals:
        best = max(evals, key=lambda m: m["accuracy"])
        lines.append(f"final test accuracy {evals[-1]['accuracy']:.4f} (best {best['accuracy']:.4f} at epoch {best['epoch']})")
    for rank, rows in sorted(thr.items()):
        total = sum(r["samples"] for r in rows)
        secs = sum(r["seconds"] for r in rows)
        lines.append(f"rank {rank}: {total / secs if secs else 0:.0f} samples/s over {len(rows)} epoch(s)")
    if unreadable:
        lines.append(f"warning: {unreadable}")
    lines += recovery_lines(history, rec.created if rec is not None else None)
    lines.append(f"plots: {folder.report_plot}")
    summary = "\n".join(lines)
    try:
        folder.report_summary.write_text(summary + "\n")
    except OSError as exc:
        raise OrchestratorError(f"cannot write {folder.report_summary} ({exc.strerror}); make it writable") from None
    return summary
