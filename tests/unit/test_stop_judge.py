"""The stop's judge (orchestrator.node.stop_judge): ranks told to stop are stuck only when every rank
waits in a collective, not all in the same one, and they stay so for STUCK_S; a stop under way
(a rank writing its checkpoint, every rank in one all-reduce, a rank that did not answer) keeps
its grace, and the looks space out while nothing is stuck."""

from __future__ import annotations

import sysconfig
from pathlib import Path

from orchestrator.core import stacks
from orchestrator.node.stop_judge import FIRST_LOOK_S, MOST_GAP_S, STUCK_S, StopJudge

SITE = sysconfig.get_paths()["purelib"]
OURS = str(Path(stacks.__file__).parents[1] / "node")  # the launcher's folder


def dump(*frames: str) -> str:
    """A faulthandler dump of one main thread, innermost frame first, under the launcher."""
    lines = "".join(f'  File "{f}\n' for f in frames)
    return f'Current thread 0x00007f0000000001 (most recent call first):\n{lines}  File "{OURS}/launcher.py", line 50 in call_entrypoint\n'


HANDLER_BROADCAST = dump(f'{SITE}/torch/distributed/distributed_c10d.py", line 2700 in broadcast',
                         '/home/u/train.py", line 20 in on_term', '/home/u/train.py", line 61 in <module>')
DDP_BACKWARD = dump(f'{SITE}/torch/autograd/graph.py", line 1072 in _engine_run_backward',
                    f'{SITE}/torch/autograd/__init__.py", line 395 in backward', '/home/u/train.py", line 64 in <module>')
AGREE = dump(f'{SITE}/torch/distributed/distributed_c10d.py", line 3913 in all_reduce',
             '/home/u/train.py", line 70 in <module>')
SAVING = dump(f'{SITE}/torch/serialization.py", line 900 in save', '/home/u/train.py", line 30 in on_term')

STUCK = {0: HANDLER_BROADCAST, 1: DDP_BACKWARD, 2: DDP_BACKWARD, 3: DDP_BACKWARD}


def test_mismatched_collectives_that_hold_for_stuck_s_are_stuck() -> None:
    judge = StopJudge(started=100.0, world=4)
    assert not judge.due(100.0 + FIRST_LOOK_S - 0.1) and judge.due(100.0 + FIRST_LOOK_S)
    assert judge.look(101.0, STUCK) is None  # once is not enough: a collective may be just starting
    assert not judge.due(101.0 + STUCK_S - 0.1) and judge.due(101.0 + STUCK_S)
    stuck = judge.look(101.0 + STUCK_S, STUCK)
    assert stuck is not None and stuck.after_s == 1.0 + STUCK_S
    assert stuck.waits["0"] == "train.py:20 in on_term, waiting in broadcast"
    assert stuck.waits["1"] == "train.py:64 in <module>, waiting in backward (DDP's gradient all-reduce)"
    assert "stop_grace_s (30s)" in stuck.message(30.0) and "killed 3s after SIGTERM" in stuck.message(30.0)


def test_a_stop_under_way_keeps_its_grace() -> None:
    cases = {
        "every rank in one all-reduce (the rank API agreeing on the stop)": {r: AGREE for r in range(4)},
        "rank 0 writes its checkpoint while the others wait for it": {0: SAVING, 1: AGREE, 2: AGREE, 3: AGREE},
        "a rank did not answer": {0: HANDLER_BROADCAST, 1: DDP_BACKWARD, 2: DDP_BACKWARD},
        "a rank's answer is empty": {**STUCK, 3: ""},
    }
    for why, dumps in cases.items():
        judge = StopJudge(started=0.0, world=4)
        assert [judge.look(t, dumps) for t in (1.0, 5.0, 20.0)] == [None, None, None], why


def test_a_picture_that_changes_starts_over() -> None:
    judge = StopJudge(started=0.0, world=4)
    assert judge.look(1.0, STUCK) is None
    moved = {**STUCK, 2: AGREE}  # rank 2 moved on: the first picture was a moment, not a hang
    assert judge.look(3.0, moved) is None
    assert judge.look(4.0, moved) is None  # held 1 s only
    assert judge.look(5.0, moved) is not None


def test_looks_space_out_while_nothing_is_stuck() -> None:
    judge = StopJudge(started=0.0, world=2)
    at, gaps = FIRST_LOOK_S, []
    for _ in range(6):
        assert judge.due(at)
        judge.look(at, {0: SAVING, 1: AGREE})
        nxt = next(t / 10 for t in range(int(at * 10), 1000) if judge.due(t / 10))
        gaps.append(round(nxt - at, 1))
        at = nxt
    assert gaps == sorted(gaps) and gaps[-1] == MOST_GAP_S and gaps[0] > FIRST_LOOK_S, gaps


def test_one_rank_alone_is_never_stuck() -> None:
    judge = StopJudge(started=0.0, world=1)
    assert judge.look(1.0, {0: HANDLER_BROADCAST}) is None and judge.look(9.0, {0: HANDLER_BROADCAST}) is None
