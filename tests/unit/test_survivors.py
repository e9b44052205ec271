"""The supervisor's decisions for recovery.survivors: keep (core.rejoins.Rejoins):
when lost ranks may be replaced beside the others, when a rejoin is stranded, what counts as
progress, and what a rejoin announces. The processes themselves are tests/integration's
test_survivors_keep.py and test_zygote_sets.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.backends.local.survivors import replace
from orchestrator.core.rejoins import Rejoins
from orchestrator.core.recovery import History
from orchestrator.plan import plan
from orchestrator.spec.loading import spec_from_dict


class Group:
    """The zygote's side as Rejoins sees it: alive or lost, and the ranks it is asked to add."""

    def __init__(self, lost: str | None = None) -> None:
        self.lost, self.added = lost, []

    def add(self, msg: dict[str, Any]) -> Any:
        self.added.append(msg)
        return ("forked", msg["rank"])


def _rejoins(tmp: Path, survivors: str = "keep") -> Rejoins:
    launch = plan(spec_from_dict({"name": "t", "entrypoint": "jobs.train:main", "runs_dir": str(tmp / "runs"),
                                  "recovery": {"max_restarts": 3, "survivors": survivors}}), "local")
    return Rejoins(launch.payload)


def _ready(r: Rejoins, *ranks: int) -> None:
    for rank in ranks:
        r.folder.heal_ready(rank).parent.mkdir(parents=True, exist_ok=True)
        r.folder.heal_ready(rank).touch()


CODES = st.lists(st.sampled_from([None, None, 0, 1, -9]), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(codes=CODES, ready=st.sets(st.integers(0, 5)), stopping=st.booleans(), lost=st.booleans(),
       survivors=st.sampled_from(["keep", "restart"]))
def test_lost_ranks_are_replaced_only_beside_running_ranks_that_can_rejoin(
        tmp_path_factory: Any, codes: list[int | None], ready: set[int], stopping: bool, lost: bool,
        survivors: str) -> None:
    r = _rejoins(tmp_path_factory.mktemp("r"), survivors)
    _ready(r, *ready)
    failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
    running = [i for i, c in enumerate(codes) if c is None]
    expected = (survivors == "keep" and not stopping and not lost and bool(failed) and bool(running)
                and all(i in ready for i in running))
    assert r.may_rejoin(failed, codes, stopping, not lost) == expected


def test_a_rejoin_that_never_completed_is_not_followed_by_another(tmp_path: Path) -> None:
    r = _rejoins(tmp_path)
    _ready(r, 0, 1, 2)
    group = Group()
    forks = [{"rank": i, "env": {}, "log": str(tmp_path / f"rank-{i}.log")} for i in range(3)]
    procs: list[Any] = ["p0", "p1", "p2"]
    r.lost = [1]
    replace(r, group, procs, forks, attempt=2)  # type: ignore[arg-type]
    assert json.loads(r.folder.heal_generation.read_text()) == {"generation": 1, "replaced": [1], "source": 0}
    assert procs == ["p0", ("forked", 1), "p2"] and r.lost == []
    assert group.added[0]["env"]["ORCH_HEAL_GENERATION"] == "1"
    for i in range(3):
        log = Path(forks[i]["log"]).read_text()
        assert log.startswith("=== attempt 2 started ") and ("replaced" if i == 1 else "kept its process") in log
    codes: list[int | None] = [None, 2, None]
    assert not r.may_rejoin([1], codes, False, True)  # rank 1 failed again before holding the state
    assert r.stranded([0, None, None]) is not None  # rank 0 ended: the replacement can never meet it
    for i in range(3):
        path = r.folder.heal_rejoined(1, i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    assert r.may_rejoin([1], codes, False, True)
    assert r.stranded([0, None, None]) is None  # complete: a rank ending now is an ordinary end
    r.lost = [0]
    replace(r, Group(), procs, forks, attempt=3)  # type: ignore[arg-type]
    assert json.loads(r.folder.heal_generation.read_text()) == {"generation": 2, "replaced": [0], "source": 1}


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.one_of(st.none(), st.integers(0, 50)), min_size=1, max_size=8))
def test_progress_is_a_step_past_every_earlier_attempt(tmp_path_factory: Any, steps: list[int | None]) -> None:
    r = _rejoins(tmp_path_factory.mktemp("p"))
    history = History.load(r.payload.run_dir)
    furthest = -1
    for n, last in enumerate(steps, start=1):
        attempt = history.begin(n, ["host"], r.payload.checkpoint.dir)
        times: dict[str, float] = {} if last is None else {"last_step": float(last)}
        assert r.progressed(history, attempt, times) == (last is not None and last > furthest)
        assert ("stepped" in times) == (last is not None and last > furthest)
        furthest = max(furthest, -1 if last is None else last)
        history.finish(attempt, "crash", "x", progress=False)
