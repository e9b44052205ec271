"""The run folder and the registry of runs. Standard library only (ranks import it).

Run folder layout::

    <run_dir>/spec.yaml  plan.json  record.json  payload.json
    <run_dir>/logs/rank-N.log        (local)   <run_dir>/slurm/  (submitit's folder)
    <run_dir>/errors/rank-N.json     first traceback of a failing rank
    <run_dir>/checkpoints/  metrics/rank-N.jsonl  result.json

The registry is one JSON line per run in ``$ORCHESTRATOR_HOME/registry.jsonl`` (default
``~/.local/share/orchestrator``); it only maps run ids to run folders.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import RunNotFoundError

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"}


def write_json_atomic(path: str | Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


@dataclass
class RunRecord:
    run_id: str
    run_dir: str
    executor: str
    state: str = "PENDING"
    created: float = field(default_factory=time.time)
    ended: float | None = None
    job_ids: list[str] = field(default_factory=list)
    supervisor_pid: int | None = None
    rank_pids: list[int] = field(default_factory=list)
    master_port: int | None = None
    failed_rank: int | None = None
    error: str | None = None
    world_size: int = 1
    attempts: int = 1
    sweep_size: int = 0
    point_states: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return Path(self.run_dir) / "record.json"

    def save(self) -> None:
        write_json_atomic(self.path, asdict(self))

    @classmethod
    def load(cls, run_dir: str | Path) -> RunRecord:
        data = json.loads((Path(run_dir) / "record.json").read_text(encoding="utf-8"))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def update(self, **changes: Any) -> RunRecord:
        for key, value in changes.items():
            setattr(self, key, value)
        self.save()
        return self


def home() -> Path:
    return Path(os.environ.get("ORCHESTRATOR_HOME", Path.home() / ".local" / "share" / "orchestrator"))


def register(record: RunRecord) -> None:
    reg = home() / "registry.jsonl"
    reg.parent.mkdir(parents=True, exist_ok=True)
    with open(reg, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"run_id": record.run_id, "run_dir": record.run_dir,
                             "executor": record.executor, "created": record.created}) + "\n")


def registered_runs() -> list[dict[str, Any]]:
    """Latest entry per run folder, oldest first."""
    reg = home() / "registry.jsonl"
    if not reg.exists():
        return []
    latest: dict[str, dict[str, Any]] = {}
    for line in reg.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        latest.pop(entry["run_dir"], None)
        latest[entry["run_dir"]] = entry
    return list(latest.values())


def resolve_run(ref: str) -> Path:
    """A run folder path, a run id, or a unique prefix of a run id."""
    p = Path(ref)
    if (p / "record.json").is_file():
        return p.resolve()
    runs = registered_runs()
    exact = [r for r in runs if r["run_id"] == ref]
    matches = exact or [r for r in runs if r["run_id"].startswith(ref)]
    if not matches:
        raise RunNotFoundError(f"no run {ref!r}: give a run folder or an id from 'orchestrator list'")
    ids = {r["run_id"] for r in matches}
    if len(ids) > 1:
        raise RunNotFoundError(f"{ref!r} matches several runs ({', '.join(sorted(ids))}); give more of the id")
    return Path(matches[-1]["run_dir"])
