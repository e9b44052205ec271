"""A run's previous attempt, put aside while a new one starts, and put back if the new one never
starts. Standard library only.

A new attempt replaces the previous one's files (record, spec, plan, payload, code; every sweep
point's verdict, tracebacks, rank records, joins and live stacks) and moves its failure record to
``attempts/K`` and its SLURM logs to ``slurm.N``. Until the scheduler has taken the new attempt,
``restore`` undoes every one of those changes: a resubmission that sbatch refuses
(a typo in the account, a controller that is down) leaves the run exactly as it was, a COMPLETED
run still COMPLETED with its result, instead of a FAILED record and nothing else. ``drop`` forgets
the previous attempt once the new one is the scheduler's.

Everything put aside waits in ``<run>/.previous-attempt/`` (same file system: renames, but for
the run's own small files, copied so that a reader meanwhile still finds the run). A
start that was killed between the two leaves that folder behind; the next start removes it (the
run's record is then the killed start's, as it would have been without this module).

Nothing is moved, made or removed through a link: a run folder whose ``attempts/``, ``points/`` or
sweep point folder is a symbolic link (a teammate's folder, a hostile one) is refused with one line
before anything changes (``refused``), so that a rerun never moves its tracebacks into, nor
removes folders from, wherever the link points.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core.errors import SubmissionError
from orchestrator.core.fs_checks import shown
from orchestrator.core.run_folder import RunFolder

ASIDE = ".previous-attempt"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def refused(run_dir: Path, folder: RunFolder) -> str | None:
    """Why the previous attempt cannot be put aside from ``folder`` (the run's or a sweep point's):
    a level from the run folder down to it (``points/``, ``points/NNNN``) is a symbolic link, or
    its ``attempts/`` is no folder of its own (``RunFolder.attempts_problem``). lstat each level."""
    level = run_dir
    for part in folder.root.relative_to(run_dir).parts:
        level = level / part
        if os.path.islink(level):
            return (f"{shown(level)} is a symbolic link, and a rerun moves and removes an attempt's files only in the "
                    f"run's own folders: move the link out of {shown(run_dir)} and run again")
    return folder.attempts_problem()


def _attempt_paths(folder: RunFolder) -> list[Path]:
    """What one run or sweep point's folder holds of an attempt, beyond its run-level files."""
    return [folder.result, folder.errors, folder.point_payload, *folder.attempt_files()]


@dataclass
class PreviousAttempt:
    """What put a previous attempt aside (renames, and copies of the run's own files), in order."""

    run_dir: Path
    renames: list[tuple[Path, Path]] = field(default_factory=list)  # (from, to)
    absent: list[Path] = field(default_factory=list)  # managed paths that did not exist: a new one goes on restore
    made: list[Path] = field(default_factory=list)  # folders made to keep failures in: removed (once empty) on restore
    points: set[Path] = field(default_factory=set)  # the sweep point folders that existed
    emptied: list[Path] = field(default_factory=list)  # empty folders the new attempt may fill: emptied on restore

    @property
    def aside(self) -> Path:
        return self.run_dir / ASIDE

    @property
    def had_record(self) -> bool:
        """Whether there was a previous attempt to put back (a record), not only a folder."""
        record = RunFolder(self.run_dir).record
        return any(source == record for source, _ in self.renames)

    @classmethod
    def put_aside(cls, run_dir: Path, folders: list[RunFolder]) -> PreviousAttempt:
        """Move the previous attempt's files out of the way (``folders``: the run's and its sweep
        points', as they are now). Its failures go where a new attempt keeps them (``keep_failures``),
        the rest under ``.previous-attempt/``."""
        run = RunFolder(run_dir)
        for folder in folders:  # before anything is moved: a refused start leaves the run as it was
            why = refused(run_dir, folder)
            if why:
                raise SubmissionError(why)
        previous = cls(run_dir)
        _remove(previous.aside)  # a start killed before it knew whether the scheduler took it
        previous.points = {f.root for f in folders if f.root != run_dir}
        if not os.path.lexists(run.points):
            previous.absent.append(run.points)
        for folder in folders:
            if not folder.attempts.exists():
                previous.made.append(folder.attempts)
            kept = folder.keep_failures()
            if kept is not None:
                previous.made.append(kept)
                previous.moved(folder.errors, kept / "errors")
                previous.moved(folder.end, kept / "end.json")
            for path in _attempt_paths(folder):
                previous.move(path)
        for path in (run.record, run.spec, run.plan, run.payload, run.code):
            previous.move(path, copy=True)  # copied: a teammate's status meanwhile still finds the run
        return previous

    def move(self, path: Path, copy: bool = False) -> None:
        """Put ``path`` aside (a path that is not there is noted: one made later goes on restore).
        ``copy``: leave it in place too, for a file the new attempt replaces atomically."""
        if not os.path.lexists(path):
            self.absent.append(path)
            return
        target = self.aside / path.relative_to(self.run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        if copy and path.is_file() and not path.is_symlink():
            shutil.copy2(path, target)
        else:
            os.replace(path, target)
        self.renames.append((path, target))

    def moved(self, source: Path, target: Path | None) -> None:
        """A rename made for the new attempt (failures kept, a SLURM log folder rotated), undone on
        restore. None: nothing was there to move (an empty folder counts as nothing), and whatever
        the new attempt puts at ``source`` goes on restore."""
        if target is not None and os.path.lexists(target):
            self.renames.append((source, target))
        elif not os.path.lexists(source):
            self.absent.append(source)
        elif source.is_dir() and not any(source.iterdir()):
            self.emptied.append(source)

    def restore(self) -> None:
        """Put the previous attempt back as it was; what the new attempt wrote goes."""
        for path in self.absent:
            _remove(path)
        for folder in self.emptied:
            _remove(folder)
            folder.mkdir(parents=True, exist_ok=True)
        points = RunFolder(self.run_dir).points
        if points.is_dir() and not points.is_symlink():  # never removing folders where a link points
            for point in points.iterdir():
                if point not in self.points:
                    _remove(point)
        for source, target in reversed(self.renames):
            if os.path.lexists(target):
                _remove(source)
                source.parent.mkdir(parents=True, exist_ok=True)
                os.replace(target, source)
        for folder in reversed(self.made):  # emptied by the renames back
            try:
                folder.rmdir()
            except OSError:
                pass
        _remove(self.aside)

    def drop(self) -> None:
        """The new attempt is the scheduler's: the previous one's files go."""
        _remove(self.aside)
