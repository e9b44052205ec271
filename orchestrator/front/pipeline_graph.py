"""A pipeline's graph, pure: the pipeline file as data (``parse_pipeline``: stages, their specs,
their ``after`` edges, every problem named at once), the order the stages go in
(``topological_order``, a cycle named), and the decision for each stage given the states its
run and its parents' runs are in (``decide``, ``decide_all``), and the state each stage stands in
(``standing_states``). Nothing here reads a file or a
record; ``orchestrator.front.pipeline`` does, and re-exports these names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional, Sequence

from orchestrator.spec.after import edge_status
from orchestrator.core.errors import SpecError
from orchestrator.core.states import State

WHEN = ("ok", "any", "notok")
_STAGE_KEYS = ("spec", "after", "set")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

Action = Literal["skip", "wait", "submit", "never"]


# ---- the file, as data ------------------------------------------------------------------------
@dataclass(frozen=True)
class Edge:
    """The stage waits for ``stage`` to end as ``when`` asks."""

    stage: str
    when: str = "ok"


@dataclass(frozen=True)
class StageDef:
    name: str
    specs: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    after: tuple[Edge, ...] = ()


@dataclass(frozen=True)
class Pipeline:
    source: str
    stages: tuple[StageDef, ...]

    def stage(self, name: str) -> StageDef:
        return next(s for s in self.stages if s.name == name)


class PipelineError(SpecError):
    """A pipeline file that cannot run (a SpecError: exit code 2), said as such."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        super().__init__(problems, source)
        self.args = (str(self).replace("invalid job spec", "invalid pipeline", 1),)


class CycleError(ValueError):
    """Stages that wait for each other; ``cycle`` names them in order, the first one repeated."""

    def __init__(self, cycle: list[str]) -> None:
        self.cycle = cycle
        super().__init__(" -> ".join(cycle))


def _text_list(value: Any, where: str, what: str, problems: list[str]) -> tuple[str, ...]:
    """One text or a list of texts."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items and what == "spec" or \
            not all(isinstance(x, str) and x.strip() for x in items):
        problems.append(f"{where}: give {'a spec file or a list of them' if what == 'spec' else 'a list of KEY=VALUE texts'}"
                        f", e.g. {what}: {'train.yaml' if what == 'spec' else '[args.lr=0.1]'}")
        return ()
    return tuple(items)


def _edges(value: Any, where: str, problems: list[str]) -> tuple[Edge, ...]:
    """``after``: a stage name, or a list of names and {stage, when} mappings."""
    items = [value] if isinstance(value, (str, dict)) else value
    if not isinstance(items, list):
        problems.append(f"{where}: give a list of stage names or {{stage: NAME, when: ok|any|notok}}, e.g. after: [prep]")
        return ()
    out = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if isinstance(item, str):
            out.append(Edge(item))
        elif isinstance(item, dict) and isinstance(item.get("stage"), str) and set(item) <= {"stage", "when"}:
            when = item.get("when", "ok")
            if when not in WHEN:
                problems.append(f"{at}.when: {when!r} is not one of ok, any, notok")
                continue
            out.append(Edge(item["stage"], when))
        else:
            problems.append(f"{at}: give a stage name, or {{stage: NAME, when: ok|any|notok}}")
    return tuple(out)


def _stage(name: Any, body: Any, base_dir: str, problems: list[str]) -> Optional[StageDef]:
    where = f"stages.{name}"
    if not isinstance(name, str) or not _NAME.match(name):
        problems.append(f"{where}: a stage name is letters, digits, '_', '.' and '-' (up to 64), e.g. train")
        return None
    if isinstance(body, str):  # a stage can be just its spec file
        body = {"spec": body}
    if not isinstance(body, dict):
        problems.append(f"{where}: give a mapping with spec (and after, set), e.g. {{spec: train.yaml, after: [prep]}}")
        return None
    unknown = sorted(str(k) for k in body if k not in _STAGE_KEYS)
    if unknown:
        problems.append(f"{where}: unknown key(s) {', '.join(unknown)}; a stage has {', '.join(_STAGE_KEYS)}")
    if "spec" not in body:
        problems.append(f"{where}: no spec; give its spec file, e.g. spec: {name}.yaml")
    specs = _text_list(body.get("spec"), f"{where}.spec", "spec", problems) if "spec" in body else ()
    specs = tuple(os.path.normpath(os.path.join(base_dir, os.path.expanduser(s))) for s in specs)
    overrides = _text_list(body.get("set", []), f"{where}.set", "set", problems)
    return StageDef(name, specs, overrides, _edges(body.get("after", []), f"{where}.after", problems))


def parse_pipeline(data: Any, source: str, base_dir: str) -> Pipeline:
    """A pipeline file's data -> a Pipeline (spec paths made relative to ``base_dir``). Every
    problem (an unknown key or stage, a stage waiting for itself, a cycle) is collected into one
    SpecError naming the stage and the fix. Pure."""
    problems: list[str] = []
    if not isinstance(data, dict) or not isinstance(data.get("stages"), dict) or not data["stages"]:
        raise PipelineError(["give 'stages:', a mapping of stage name -> {spec: FILE, after: [STAGE], set: [K=V]}"],
                        source=source)
    extra = sorted(str(k) for k in data if k != "stages")
    if extra:
        problems.append(f"unknown key(s) {', '.join(extra)}; a pipeline file has only 'stages'")
    stages = [s for name, body in data["stages"].items() if (s := _stage(name, body, base_dir, problems))]
    names = [s.name for s in stages]
    for s in stages:
        for edge in s.after:
            if edge.stage == s.name:
                problems.append(f"stages.{s.name}.after: {s.name} waits for itself; remove that entry")
            elif edge.stage not in names:
                problems.append(f"stages.{s.name}.after: {edge.stage!r} is not a stage of this pipeline (its stages: "
                                f"{', '.join(names)}); fix the name or add that stage")
    if not problems:
        try:
            topological_order({s.name: [e.stage for e in s.after] for s in stages})
        except CycleError as exc:
            problems.append(f"stages.{exc.cycle[0]}.after: the stages {exc} wait for each other (a cycle); "
                            "remove one of these after: entries")
    if problems:
        raise PipelineError(problems, source=source)
    return Pipeline(source, tuple(stages))


def topological_order(deps: Mapping[str, Sequence[str]]) -> list[str]:
    """Every stage after the stages it waits for; among stages free to go, the order they were
    written in (so the order is stable and readable). Raises CycleError naming a cycle. Pure."""
    order: list[str] = []
    done: set[str] = set()
    remaining = list(deps)
    while remaining:
        ready = [n for n in remaining if all(d in done or d not in deps for d in deps[n])]
        if not ready:
            raise CycleError(_cycle(deps, remaining))
        order.append(ready[0])
        done.add(ready[0])
        remaining.remove(ready[0])
    return order


def _cycle(deps: Mapping[str, Sequence[str]], stuck: list[str]) -> list[str]:
    """One cycle among stages that cannot go: follow a parent still stuck until one repeats."""
    path = [stuck[0]]
    while True:
        nxt = next(d for d in deps[path[-1]] if d in stuck)
        if nxt in path:
            return path[path.index(nxt):] + [nxt]
        path.append(nxt)


# ---- decisions (pure) ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    """What to do with one stage. skip: its run COMPLETED already. wait: its run is queued or
    running (depended on, not started again). submit: start it, once ``depends`` (when, job ids)
    have ended (SLURM; locally it is empty). never: a stage it waits for ended so that it cannot
    run (reported CANCELLED, as SLURM's --kill-on-invalid-dep would)."""

    action: Action
    reason: str
    depends: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class ParentView:
    """A parent stage as its child sees it: the state it is (or will be) in, and its job ids."""

    name: str
    when: str
    state: Optional[State]  # None: not ended (about to be submitted, queued or running)
    job_ids: tuple[str, ...] = ()


def decide(observed: Optional[State], parents: Sequence[ParentView]) -> Decision:
    """One stage: ``observed`` is the state its run folder holds now (None: no run yet)."""
    if observed == State.COMPLETED:
        return Decision("skip", "COMPLETED earlier (same run identity): not run again")
    if observed is not None and not observed.terminal:
        return Decision("wait", f"already {observed}: waited for, not submitted again")
    depends = []
    for p in parents:
        status = edge_status(p.when, p.state)
        if status == "never":
            need = {"ok": "it to complete", "notok": "it to fail", "any": "it to end"}[p.when]
            return Decision("never", f"{p.name} ended {p.state}, and when: {p.when} needs {need}")
        if status == "wait":
            depends.append((p.when, p.job_ids))
    why = ", ".join(f"{p.name} ({p.when})" for p in parents)
    return Decision("submit", f"after {why}" if why else "no dependency", tuple(depends))


def effective_state(decision: Decision, observed: Optional[State]) -> Optional[State]:
    """The state a stage's children can count on when their turn comes (SLURM: all submitted at
    once): skip -> COMPLETED; never -> CANCELLED (what SLURM makes of it); else not ended."""
    return {"skip": State.COMPLETED, "never": State.CANCELLED}.get(decision.action)


def decide_all(order: Sequence[str], edges: Mapping[str, Sequence[Edge]], observed: Mapping[str, Optional[State]],
               job_ids: Mapping[str, Sequence[str]] | None = None) -> dict[str, Decision]:
    """Every stage's decision before anything is submitted (``--plan``, and SLURM's submission):
    a parent that will be submitted or is queued counts as not ended; ``job_ids``: the job ids of
    those known so far (queued ones, or submitted ones). Pure."""
    job_ids = job_ids or {}
    out: dict[str, Decision] = {}
    states: dict[str, Optional[State]] = {}
    for name in order:
        parents = [ParentView(e.stage, e.when, states[e.stage], tuple(job_ids.get(e.stage, ()))) for e in edges[name]]
        out[name] = decide(observed.get(name), parents)
        states[name] = effective_state(out[name], observed.get(name))
    return out


def standing_states(order: Sequence[str], edges: Mapping[str, Sequence[Edge]],
                    observed: Mapping[str, Optional[State]]) -> dict[str, Optional[State]]:
    """Each stage's state as things stand (``pipeline --status``): its run's, else CANCELLED when a
    stage it waits for ended so that it can never run (what the pipeline reported: locally such a
    stage is never started, so no run records it; on SLURM its job is cancelled), else None (no
    run). Pure."""
    states: dict[str, Optional[State]] = {}
    for name in order:
        state = observed.get(name)
        if state is None and any(edge_status(e.when, states.get(e.stage)) == "never" for e in edges[name]):
            state = State.CANCELLED
        states[name] = state
    return states
