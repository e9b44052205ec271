"""The code snapshot: what a job imports, frozen when it is run or submitted.

A queued job starts hours after ``submit``, and a requeued one starts again later still; ranks
that imported the live files would run whatever is on disk by then. So ``run`` and ``submit``
freeze the project: ``scan`` lists and hashes it (``plan`` shows the result; ``run``/``submit``
copy each new file into the store while hashing it, so what is frozen is exactly what was
hashed), ``store`` builds the tree the ranks import from (``code_redirect`` points their imports
there).

The *project*: the git work tree holding the entrypoint (a module entrypoint: holding the folder
the CLI runs in), else the entrypoint's folder. What is frozen of it (the rule docs/manual/code-snapshots.md states):

- in git, every tracked file, and untracked files git does not ignore *when they are code*;
- outside git, the files that are code;
- *code*: Python and C/CUDA sources (``SOURCE_SUFFIXES``), and configuration files
  (``CONFIG_SUFFIXES``) up to ``CONFIG_MAX_BYTES`` each (a larger one is data). Never frozen
  unless tracked: hidden folders, virtual environments, ``__pycache__``, the trackers' and
  frameworks' output folders (``OUTPUT_DIRS``), run folders; never at all: the runs folder, the
  store, ``ORCHESTRATOR_HOME``, what the ignore file or ``code.exclude`` lists.
  ``code.include`` patterns freeze files the rule leaves out.

A file that changes while it is read is read again (three tries), then left out with a warning
naming it; only the entrypoint itself is ever refused. Whatever is left out is still found at
the same place: every folder of the tree links the live files and folders it lacks, and the tree
mirrors the project's parent and grandparent folders the same way, so a script reading
``Path(__file__).parent / "data"`` or ``../../Datasets`` finds them.

The store, under ``<runs_dir>/.code`` (shared with the nodes wherever the runs are)::

    blobs/ab/<sha256>       each file's content, once, read-only (content-addressed)
    manifests/<id>.json     one snapshot: path -> [sha256, size, mode] (or a symlink's target)
    trees/<id>-<root hash>/<grandparent>/<parent>/<project>/
                            the snapshot as a folder of read-only *copies* of the blobs (a rank
                            writing there never reaches a blob), checked against the manifest each
                            time it is used and rebuilt when damaged; the ranks' import root
    index/<root hash>.json  (size, mtime, inode) -> sha256 of the last scan, so an unchanged file
                            is not read again

A blob is verified whenever it is copied: one that does not hash to its name is stored again from
the project when the project still holds that content, else the run is refused naming the file.
A snapshot's id is the hash of its manifest, so the same content is one blob set across runs.

The parts, one module each: ``snapshot_model`` (the rule, the entries, the manifest),
``snapshot_files`` (which files: git, a folder walk, the ignore file), ``snapshot_scan`` (hashing,
the index, staging), ``snapshot_store`` (blobs, manifests, trees); this module gathers their
public names and compares a run's snapshot with its project on disk (``changes_since``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Mapping, Optional

from orchestrator.code.snapshot_files import GIT_TIMEOUT_S, SHIPPED_NAME, project_root
from orchestrator.code.snapshot_model import (CONFIG_MAX_BYTES, CONFIG_SUFFIXES, LEFT_BIG_CONFIG, LEFT_CHANGING,
                                         LEFT_IGNORED, LEFT_NOT_CODE, LEFT_OUTPUT, LEFT_RUN, MIRROR_MAX_ENTRIES,
                                         MIRRORED_LEVELS, OUTPUT_DIRS, SOURCE_SUFFIXES, STORE_NAME, Entry, Snapshot,
                                         SnapshotError, blob_path, human_size, is_code, load_manifest,
                                         read_code_record, snapshot_id)
from orchestrator.code.snapshot_scan import scan, scan_project, write_index
from orchestrator.code.snapshot_store import put_blob, store

__all__ = ["CONFIG_MAX_BYTES", "CONFIG_SUFFIXES", "GIT_TIMEOUT_S", "LEFT_BIG_CONFIG", "LEFT_CHANGING", "LEFT_IGNORED",
           "LEFT_NOT_CODE", "LEFT_OUTPUT", "LEFT_RUN", "MIRROR_MAX_ENTRIES", "MIRRORED_LEVELS", "OUTPUT_DIRS",
           "SHIPPED_NAME", "SOURCE_SUFFIXES", "STORE_NAME", "Entry", "Snapshot", "SnapshotError", "blob_path",
           "changes_since", "human_size", "is_code", "load_manifest", "project_root", "put_blob", "read_code_record",
           "scan", "scan_project", "snapshot_id", "store", "unified_diff", "write_index"]


# ---- what changed on disk since ----------------------------------------------------------------
def changes_since(code: Mapping) -> tuple[list[tuple[str, str]], Snapshot, dict[str, Entry]]:
    """Compare a run's snapshot (its ``code.json``) with its project on disk now:
    [(status, path)] with status added / deleted / modified, the live scan and the frozen entries."""
    try:
        manifest, root = str(code["manifest"]), str(code["root"])
        how, ignore_file = str(code.get("how") or "folder"), str(code.get("ignore_file") or ".orchignore")
        exclude, include, patterns = ([str(x) for x in code.get(key) or []]
                                      for key in ("exclude", "include", "exclude_patterns"))
    except (KeyError, TypeError, AttributeError):
        raise SnapshotError("the run's code.json is damaged (no manifest or root, or a field of the wrong "
                            "kind): the snapshot cannot be compared") from None
    frozen = load_manifest(manifest)
    if not os.path.isdir(root):
        raise SnapshotError(f"the project {root} is no longer there; the snapshot itself is in {code.get('tree')}")
    store_dir = str(Path(manifest).parent.parent)
    live = scan(root, how, store_dir, ignore_file=ignore_file, max_mb=float("inf"),
                exclude=[*exclude, str(Path(store_dir).parent)], include_patterns=include,
                exclude_patterns=patterns)
    out: list[tuple[str, str]] = []
    for rel in sorted(set(frozen) | set(live.entries)):
        before, after = frozen.get(rel), live.entries.get(rel)
        if before is None:
            out.append(("added", rel))
        elif after is None:
            out.append(("deleted", rel))
        elif (before.sha, before.mode, before.link) != (after.sha, after.mode, after.link):
            out.append(("modified", rel))
    return out, live, frozen


def unified_diff(store_dir: str, root: str, status: str, rel: str, frozen: Optional[Entry]) -> str:
    """One file's change as ``diff -u`` shows it (the snapshot on the left, the disk on the right);
    a stored copy that is gone or damaged, or a file that cannot be read, is said in one line."""
    import difflib

    def lines(data: Optional[bytes]) -> Optional[list[str]]:
        if data is None:
            return []
        try:
            return data.decode("utf-8").splitlines(keepends=True)
        except UnicodeDecodeError:
            return None

    old: Optional[bytes] = None
    if status != "added" and frozen is not None and frozen.link is None:
        try:
            old = blob_path(store_dir, frozen.sha).read_bytes()
        except OSError as exc:
            return f"{rel}: the snapshot's copy cannot be read ({exc.strerror}): {status}\n"
        if hashlib.sha256(old).hexdigest() != frozen.sha:
            return f"{rel}: the snapshot's copy is damaged (it no longer matches its hash): {status}\n"
    new_path = Path(root) / rel
    try:
        new = None if status == "deleted" or new_path.is_symlink() else new_path.read_bytes()
    except OSError as exc:
        return f"{rel}: cannot be read on disk ({exc.strerror}): {status}\n"
    a, b = lines(old), lines(new)
    if a is None or b is None:
        return f"Binary file {rel} {status}\n"
    text = "".join(difflib.unified_diff(a, b, f"snapshot/{rel}", f"disk/{rel}"))
    return text if text.endswith("\n") or not text else text + "\n\\ No newline at end of file\n"
