"""Pipelines: a graph of specs (prepare, then train, then evaluate) run as one.

A pipeline file (YAML)::

    stages:
      prep:  {spec: prep.yaml}
      train: {spec: [base.yaml, train.yaml], after: [prep], set: ["args.lr=0.1"]}
      eval:  {spec: eval.yaml, after: [{stage: train, when: ok}]}
      report: {spec: report.yaml, after: [{stage: train, when: notok}]}

``spec``: one spec file or a list merged in order (as ``orchestrator run a.yaml b.yaml``), relative
to the pipeline file; ``set``: ``--set`` overrides for that stage; ``after``: the stages it waits
for, by name, or ``{stage: NAME, when: ok | any | notok}`` (default ok). A stage's own spec may
also have ``after:`` entries (``orchestrator.spec.after``); those that name another stage's run order
the graph too.

On SLURM every stage is submitted at once, parents first, each child with
``--dependency=afterok:J1:J2`` (afterany / afternotok) and ``--kill-on-invalid-dep=yes``, so a
failed parent cancels its ``ok`` dependents instead of leaving them pending. Locally the stages
run one after the other in the same order, through ``api.run``; an interrupt (Ctrl-C, SIGTERM,
SIGHUP) stops the whole pipeline: the stage it reaches ends CANCELLED, later ones do not start.
Either way a stage whose run (same identity: ``identity.run_id``) already COMPLETED is skipped,
and one queued or running is waited for, not started again.

From Python::

    from orchestrator.front.pipeline import pipeline_status, plan_pipeline, run_pipeline, succeeded

    results = run_pipeline("pipeline.yaml")          # [StageResult(name, run_id, action, state, ...)]
    succeeded(results), pipeline_status("pipeline.yaml")

The parsing, the order and every decision are pure functions (``parse_pipeline``,
``topological_order``, ``decide``, ``decide_all``: ``orchestrator.front.pipeline_graph``, re-exported
here); reading files and records, submitting and running are in this module.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from orchestrator.spec.after import after_lines, edge_status  # after_lines: plan's line for a spec's after:
from orchestrator.backends import backend
from orchestrator.core.errors import SpecError, SubmissionError, UsageError
from orchestrator.core.shell_words import command_line
from orchestrator.front.pipeline_graph import (WHEN, Action, CycleError, Decision, Edge, ParentView, Pipeline, PipelineError,
                                         StageDef, decide, decide_all, effective_state, parse_pipeline,
                                         standing_states, topological_order)
from orchestrator.core.records import RunRecord
from orchestrator.core.states import State

if TYPE_CHECKING:
    from orchestrator.spec.models import JobSpec

__all__ = ["PipelineError", "Pipeline", "StageDef", "Edge", "Decision", "Stage", "StageResult", "parse_pipeline",
           "topological_order", "decide", "decide_all", "load_pipeline", "load_stages", "run_pipeline",
           "plan_pipeline", "pipeline_status", "succeeded", "table_lines", "after_lines", "CycleError", "ParentView",
           "effective_state", "standing_states", "WHEN", "Action"]

# ---- side effects: files, records, the scheduler ----------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """A stage with its spec loaded: its run id and folder, and every stage it waits for (the
    pipeline's edges and its spec's after: entries that name another stage's run)."""

    name: str
    spec: JobSpec
    run_id: str
    run_dir: str
    edges: tuple[Edge, ...]


@dataclass
class StageResult:
    """What happened to one stage (or would: ``plan_pipeline``)."""

    name: str
    run_id: str
    #: skip, wait, submit, never (plan); skipped, waited, submitted, ran, cancelled, and after an interrupt
    #: interrupted (the stage it stopped) and not run (the stages after it) (done)
    action: str
    state: Optional[State]
    reason: str
    job_ids: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)  # "train (ok)"


def load_pipeline(path: str | Path) -> Pipeline:
    """Read and check a pipeline file (SpecError naming the file, the stage and the fix)."""
    from orchestrator.spec.loading import read_spec_file

    try:
        data = read_spec_file(path)
    except SpecError as exc:  # unreadable, not YAML, a stage named twice: the pipeline file's problem
        raise PipelineError(exc.problems, source=exc.source) from None
    return parse_pipeline(data, str(path), str(Path(path).resolve().parent))


def load_stages(pipeline: Pipeline, executor: str | None = None) -> list[Stage]:
    """Load every stage's spec (``executor`` overrides theirs), in the order they run. All specs are
    checked before anything runs; the stages must share one executor and be different runs."""
    from orchestrator.spec.after import is_spec_path, run_id_of
    from orchestrator.spec.identity import run_id
    from orchestrator.spec.loading import load_spec

    specs = {}
    for s in pipeline.stages:
        try:
            specs[s.name] = load_spec(*s.specs, overrides=s.overrides, executor=executor)
        except SpecError as exc:  # name the stage: its overrides come from the pipeline file
            raise SpecError([f"stage {s.name}: {_where_to_run(pipeline, s, p)}" for p in exc.problems],
                            source=exc.source) from None
    executors = {name: spec.executor for name, spec in specs.items()}
    if len(set(executors.values())) > 1:
        raise UsageError(f"{pipeline.source}: a pipeline runs on one executor, and its stages name several ("
                         + ", ".join(f"{n}: {e}" for n, e in executors.items()) +
                         "): set executor in the specs, or pass --executor")
    ids = {name: run_id(spec) for name, spec in specs.items()}
    by_id: dict[str, str] = {}
    for name, rid in ids.items():
        if rid in by_id:
            raise PipelineError([f"stages {by_id[rid]} and {name} are the same run ({rid}): one run folder cannot be two "
                             "stages; give one of them a different name or args"], source=pipeline.source)
        by_id[rid] = name
    # A stage's spec file names that stage (with the stage's own overrides, whatever the file alone gives).
    by_file = {os.path.realpath(s.specs[0]): s.name for s in pipeline.stages if len(s.specs) == 1}
    edges = {}
    for s in pipeline.stages:
        own, outside = [], []
        for entry in specs[s.name].after:  # the spec's own after: naming a stage of this pipeline
            if is_spec_path(entry.run) and os.path.realpath(entry.run) in by_file:
                parent: Optional[str] = by_file[os.path.realpath(entry.run)]
            else:
                rid = run_id_of(entry.run, specs[s.name].executor) if is_spec_path(entry.run) else entry.run
                parent = by_id.get(rid)
            if parent is None:
                outside.append(entry)
            elif parent != s.name:
                own.append(Edge(parent, entry.when))
        if len(outside) != len(specs[s.name].after):  # the pipeline orders these: the stage waits through its edges
            specs[s.name] = specs[s.name].model_copy(update={"after": outside})
        edges[s.name] = tuple(dict.fromkeys([*s.after, *own]))
    try:
        order = topological_order({n: [e.stage for e in es] for n, es in edges.items()})
    except CycleError as exc:
        raise PipelineError([f"stages.{exc.cycle[0]}: with their specs' after: entries, the stages {exc} wait for each "
                         "other (a cycle); remove one of these entries"], source=pipeline.source) from None
    return [Stage(n, specs[n], ids[n], _run_dir(specs[n], ids[n]), edges[n]) for n in order]


#: How a spec's script that is not found from the current folder ends its problem (``validators``).
_FROM_HERE = "(relative paths are from the current directory)"


def _where_to_run(pipeline: Pipeline, stage: StageDef, problem: str) -> str:
    """A stage's problem; for its script not found from the current folder that is found from the
    pipeline file's folder (or the stage spec's), where to run the pipeline from. A stage's spec
    paths are from the current directory, as any spec's: only the pipeline's spec paths are not."""
    entry = _entrypoint(stage) if problem.startswith("entrypoint: script ") and _FROM_HERE in problem else None
    if not entry or os.path.isabs(os.path.expanduser(entry)):
        return problem
    folders = [os.path.dirname(os.path.realpath(pipeline.source)), *(os.path.dirname(f) for f in stage.specs)]
    found = next((f for f in dict.fromkeys(folders) if os.path.isfile(os.path.join(f, entry))), None)
    if found is None:
        return problem
    here = os.path.relpath(os.path.join(found, entry))
    return problem.replace(_FROM_HERE, "(relative paths in a stage's spec are from the current directory, as for "
                                       f"any spec: run the pipeline from {command_line(found)}, or write "
                                       f"{command_line(entry)} relative to here: {command_line(here)})")


def _entrypoint(stage: StageDef) -> Optional[str]:
    """The stage's entrypoint as its spec files and overrides give it (merged as ``load_spec``
    merges them); None when they cannot be read or give none."""
    from orchestrator.spec.loading import apply_override, deep_merge, parse_override, read_spec_file

    try:
        data: dict[str, Any] = {}
        for path in stage.specs:
            data = deep_merge(data, read_spec_file(path))
        for item in stage.overrides:
            data = deep_merge(data, apply_override({}, *parse_override(item)))
    except (SpecError, UsageError, OSError):
        return None
    entry = data.get("entrypoint")
    return entry if isinstance(entry, str) else None


def _run_dir(spec: JobSpec, rid: str) -> str:
    """Where the stage's run folder is (as ``plan`` places it)."""
    return os.path.abspath(os.path.join(os.path.expanduser(spec.runs_dir), rid))


def observe(stages: Sequence[Stage]) -> dict[str, Optional[RunRecord]]:
    """Each stage's run record now, refreshed from its scheduler (one query for all); None: no run."""
    from orchestrator import api
    from orchestrator.core.run_folder import RunFolder

    found = {s.name: api.Run(RunRecord.load(s.run_dir)) for s in stages if RunFolder.of(s.run_dir).record.is_file()}
    fresh = {r.run_dir: r for r in api.refresh(list(found.values()))} if found else {}
    return {s.name: (fresh[found[s.name].run_dir].record if s.name in found else None) for s in stages}


def _states(records: Mapping[str, Optional[RunRecord]]) -> dict[str, Optional[State]]:
    return {n: (r.state if r is not None else None) for n, r in records.items()}


def _result(stage: Stage, action: str, state: Optional[State], reason: str, jobs: Sequence[str] = ()) -> StageResult:
    return StageResult(stage.name, stage.run_id, action, state, reason, list(jobs),
                       [f"{e.stage} ({e.when})" for e in stage.edges])


def plan_pipeline(path: str | Path, executor: str | None = None) -> list[StageResult]:
    """What ``run_pipeline`` would do now, stage by stage: nothing is submitted or run. Each
    stage's state is its run's, or CANCELLED for one never started because a stage it waits for
    ended so that it could not run (``standing_states``)."""
    stages = load_stages(load_pipeline(path), executor)
    records = observe(stages)
    live = {n: r.job_ids for n, r in records.items() if r is not None}
    order, edges = [s.name for s in stages], {s.name: s.edges for s in stages}
    decisions = decide_all(order, edges, _states(records), live)
    states = standing_states(order, edges, _states(records))  # a stage its parent's end kept from running: CANCELLED
    return [_result(s, decisions[s.name].action, states[s.name], decisions[s.name].reason, live.get(s.name, ()))
            for s in stages]


def pipeline_status(path: str | Path, executor: str | None = None) -> list[StageResult]:
    """Each stage's run and its state now (from its folder and its scheduler), what it waits for,
    and for a stage not started what would become of it (``action``)."""
    return plan_pipeline(path, executor)


def run_pipeline(path: str | Path, executor: str | None = None,
                 say: Callable[[str], None] | None = None) -> list[StageResult]:
    """Submit the pipeline to SLURM (every stage at once, with dependencies), or run it locally
    stage by stage in the foreground. Returns what became of each stage. ``say``: progress lines."""
    stages = load_stages(load_pipeline(path), executor)
    say = say or (lambda line: None)
    _refuse_before_starting(stages)
    if backend(stages[0].spec.executor).scheduled:  # every stage queued at once, each with its --dependency
        return _submit_all(stages, say)
    return _run_in_order(stages, say)


def _refuse_before_starting(stages: Sequence[Stage]) -> None:
    """Everything that would stop the pipeline halfway, found before any stage runs or is submitted:
    a stage started outside the pipeline (locally it cannot be waited for), and runs outside the
    pipeline that a stage's own ``after:`` names and that are missing or can never be waited for."""
    from orchestrator.spec.after import local_problems, resolve, slurm_dependencies

    slurm = backend(stages[0].spec.executor).scheduled
    observed = _states(observe(stages))
    problems = []
    for s in stages:
        state = observed[s.name]
        if not slurm and state is not None and not state.terminal:
            problems.append(f"stage {s.name}: its run {s.run_id} is {state} (started outside this pipeline): wait "
                            f"for it to end ({command_line('orchestrator', 'status', s.run_id)}), then run the "
                            "pipeline again")
        if not s.spec.after or state == State.COMPLETED:
            continue
        parents = resolve(s.spec.after, s.spec.executor, None, s.run_id)
        if slurm:
            try:
                slurm_dependencies(parents)
            except SubmissionError as exc:
                problems.append(f"stage {s.name}: {exc}")
        else:
            problems += [f"stage {s.name}: {p}" for p in local_problems(parents)]
    if problems:
        raise UsageError("the pipeline was not started; nothing ran or was submitted:\n  " + "\n  ".join(problems))


def _submit_all(stages: Sequence[Stage], say: Callable[[str], None]) -> list[StageResult]:
    """SLURM: parents first, each child submitted with the job ids of the parents it waits for."""
    from orchestrator.api import planned
    from orchestrator.backends.factory import scheduler

    records = observe(stages)
    observed = _states(records)
    job_ids: dict[str, list[str]] = {n: list(r.job_ids) for n, r in records.items() if r is not None}
    states: dict[str, Optional[State]] = {}
    out = []
    for s in stages:
        parents = [ParentView(e.stage, e.when, states[e.stage], tuple(job_ids.get(e.stage, ()))) for e in s.edges]
        decision = decide(observed[s.name], parents)
        states[s.name] = effective_state(decision, observed[s.name])
        result = _result(s, decision.action, observed[s.name], decision.reason, job_ids.get(s.name, ()))
        if decision.action == "submit":
            _check_known_jobs(s, decision, parents)
            executor = s.spec.executor  # one for every stage (checked when the pipeline was read)
            record = scheduler(executor).submit(planned(s.spec, executor, stage_for=(executor,))[0], after=decision.depends)
            job_ids[s.name] = list(record.job_ids)
            result = _result(s, "submitted", record.state, decision.reason, record.job_ids)
        else:
            result.action = {"skip": "skipped", "wait": "waited", "never": "cancelled"}[decision.action]
            if decision.action == "never":
                result.state = State.CANCELLED
        say(_result_line(result))
        out.append(result)
    return out


def _check_known_jobs(stage: Stage, decision: Decision, parents: Sequence[ParentView]) -> None:
    """A parent not ended must have job ids to wait for: without them the child would not wait."""
    for p in parents:
        if edge_status(p.when, p.state) == "wait" and not p.job_ids:
            raise SubmissionError(f"stage {stage.name} waits for {p.name}, whose run is not ended but has no SLURM job "
                                  f"id (its submission was cut short?): check 'orchestrator status' for it, cancel or "
                                  "move its run folder aside, then submit the pipeline again")


def _run_in_order(stages: Sequence[Stage], say: Callable[[str], None]) -> list[StageResult]:
    """Local (or debug): one stage after the other, in the foreground, each once its parents have
    ended; a stage whose parents ended so that it cannot run is not started (CANCELLED).

    An interrupt (Ctrl-C, SIGTERM, SIGHUP) stops the whole pipeline: the stage it reaches is
    stopped in order by its supervisor (CANCELLED), no later stage starts (each is reported
    ``not run``), and once every stage has been said the signal is passed on to whatever handled
    it before (``_Interrupts``: the CLI then exits 130 on Ctrl-C)."""
    from orchestrator.api import run

    out: list[StageResult] = []
    with _Interrupts() as interrupts:
        current: Optional[Stage] = None  # the stage being run, while it is
        try:
            observed = _states(observe(stages))
            ended: dict[str, State] = {}
            for s in stages:
                parents = [ParentView(e.stage, e.when, ended[e.stage]) for e in s.edges]
                decision = decide(observed[s.name], parents)
                if decision.action == "wait":
                    raise UsageError(f"stage {s.name}: its run {s.run_id} is {observed[s.name]} (started outside this "
                                     "pipeline): wait for it to end "
                                     f"({command_line('orchestrator', 'status', s.run_id)}), then run the "
                                     "pipeline again")
                if decision.action == "submit":
                    say(f"[pipeline] stage {s.name}: running {s.run_id} ({decision.reason})")
                    current = s
                    handle = run(s.spec, wait=True)
                    result = _result(s, "ran", handle.state, decision.reason)
                elif decision.action == "skip":
                    result = _result(s, "skipped", State.COMPLETED, decision.reason)
                else:
                    result = _result(s, "cancelled", State.CANCELLED, decision.reason)
                ended[s.name] = result.state  # type: ignore[assignment]
                out.append(result)
                current = None
                say(_result_line(result))
        except KeyboardInterrupt:
            interrupts.note()
            said = {r.name for r in out}
            for s in stages:
                if s.name in said:
                    continue
                if s is current:
                    state = _state_now(s)
                    if state == State.COMPLETED:  # it ended just before the signal came
                        result = _result(s, "ran", state, f"ended before {interrupts.name} stopped the pipeline")
                    else:
                        result = _result(s, "interrupted", state,
                                         f"stopped by {interrupts.name}; the pipeline stops here")
                else:
                    result = _result(s, "not run", _state_now(s),
                                     f"not started: the pipeline was interrupted by {interrupts.name}")
                out.append(result)
                say(_result_line(result))
    interrupts.pass_on()
    return out


def _state_now(stage: Stage) -> Optional[State]:
    """The state the stage's run folder holds now (refreshed), None when it has no run; never raises
    (the pipeline is saying what became of its stages after an interrupt)."""
    from orchestrator.core.errors import OrchestratorError

    try:
        record = observe([stage])[stage.name]
    except (OrchestratorError, OSError):
        return None
    return record.state if record is not None else None


class _Interrupts:
    """SIGINT, SIGTERM and SIGHUP while a local pipeline runs (main thread only: elsewhere no
    handler can be installed). The first is noted and raised as KeyboardInterrupt, wherever the
    pipeline is; a stage's supervisor, which handles them itself while its ranks run (it stops them
    in order and records CANCELLED), passes it on here once it has. Later ones are only noted: the
    pipeline is already stopping. ``pass_on``, after the handlers before ours are back, delivers
    the signal to them: Ctrl-C becomes the caller's KeyboardInterrupt, SIGTERM ends the process."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.prev: dict[int, Any] = {}

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            self.prev = {s: signal.signal(s, self._on_signal) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.prev.items():
            if handler is not None:  # None: a handler not installed from Python, which cannot be put back
                signal.signal(s, handler)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            raise KeyboardInterrupt

    def note(self) -> None:
        """A KeyboardInterrupt that came another way (a stage's own) is a Ctrl-C."""
        self.signum = self.signum or signal.SIGINT

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "an interrupt"

    def pass_on(self) -> None:
        if self.signum is None:
            return
        prev = self.prev.get(self.signum)
        # No handler of ours was in place, or a Ctrl-C whose earlier disposition was not a handler
        # (SIG_IGN inherited from a parent that ignores SIGINT, as a shell does for a background
        # job): the interrupt is ours to say, so the CLI exits 130, never 1 as if a stage failed.
        if prev is None or (self.signum == signal.SIGINT and not callable(prev)):
            raise KeyboardInterrupt
        signal.raise_signal(self.signum)


def succeeded(results: Sequence[StageResult]) -> bool:
    """A pipeline run (local) went well when every stage that ran COMPLETED and none was interrupted.
    A stage not started is the consequence of one that did not (or a ``notok`` stage not needed):
    never counted twice."""
    return all(r.state == State.COMPLETED and r.action != "interrupted" for r in results
               if r.action in ("ran", "interrupted"))


# ---- lines, as the CLI prints them ---------------------------------------------------------------
def _result_line(r: StageResult) -> str:
    jobs = f" job(s) {', '.join(r.job_ids)}" if r.job_ids else ""
    return f"{r.name}: {r.action} {r.run_id}{jobs}: {r.state or 'no run'} ({r.reason})"


def table_lines(results: Sequence[StageResult], source: str) -> list[str]:
    """The graph as ``pipeline --status`` and ``--plan`` print it: each stage, its run, its state,
    its jobs, what it waits for, and what would become of it."""
    width = max(len(r.name) for r in results)
    rid = max(len(r.run_id) for r in results)
    lines = [f"pipeline {source}: {len(results)} stage(s), in order"]
    for r in results:
        jobs = ",".join(r.job_ids) if len(r.job_ids) <= 3 else f"{r.job_ids[0]}..{r.job_ids[-1]}"
        lines.append(f"  {r.name:{width}}  {r.run_id:{rid}}  {str(r.state or '-'):11} jobs={jobs or '-':10} "
                     f"after: {', '.join(r.after) or '-'}")
        lines.append(f"  {'':{width}}  next run: {_NEXT.get(r.action, r.action)} ({r.reason})")
    return lines


_NEXT = {"skip": "skipped", "wait": "depended on, not started again", "submit": "started",
         "never": "not started (CANCELLED)"}


def print_lines(lines: Sequence[str], stream: Any = None) -> None:
    for line in lines:
        print(line, file=stream or sys.stdout)
