"""What a code snapshot *is* (see ``orchestrator.code.snapshot`` for the whole story): the rule for
what counts as code, the reasons a file is left out, a snapshot's entries and their manifest, and
the run's ``code.json``. Data and small pure helpers only; the parts that read the project
(``snapshot_files``, ``snapshot_scan``) and write the store (``snapshot_store``) build on it."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from orchestrator.core.errors import OrchestratorError

STORE_NAME = ".code"
CHUNK = 1 << 20
#: Sources: always code, whatever their size.
SOURCE_SUFFIXES = frozenset({".py", ".pyi", ".pyx", ".pxd", ".pxi", ".c", ".cc", ".cpp", ".cxx", ".h", ".hpp",
                             ".cu", ".cuh"})
#: Configuration: code up to CONFIG_MAX_BYTES (a 50 MB ``.json`` is a dataset, not a setting).
CONFIG_SUFFIXES = frozenset({".yaml", ".yml", ".toml", ".cfg", ".ini", ".json", ".conf", ".sh", ".txt", ".jinja",
                             ".j2", ".env"})
CONFIG_MAX_BYTES = 1_000_000
#: Folders that hold what jobs and tools write, never frozen unless git tracks their files.
OUTPUT_DIRS = frozenset({"__pycache__", "node_modules", "lightning_logs", "wandb", "mlruns", "tb_logs",
                         "tensorboard", "outputs", "multirun", "checkpoints"})
#: How many folders above the project the tree mirrors with links (``../../Datasets``).
MIRRORED_LEVELS = 2
#: An ancestor folder with more entries than this is not mirrored (a login node's /home).
MIRROR_MAX_ENTRIES = 256

# Reasons a file is left out, as plan names them.
LEFT_IGNORED = "listed in the ignore file or code.exclude"
LEFT_NOT_CODE = "not code (neither a source nor a configuration file)"
LEFT_BIG_CONFIG = f"configuration over {CONFIG_MAX_BYTES // 1_000_000} MB (data)"
LEFT_OUTPUT = "an output, hidden or environment folder"
LEFT_CHANGING = "changed while it was read"
LEFT_RUN = "a run folder or the orchestrator's home"


class SnapshotError(OrchestratorError):
    """The project cannot be frozen as asked (too large, unreadable, the entrypoint ignored)."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class Entry:
    """One file of a snapshot: its content's hash, size and mode (0o644 or 0o755); a symlink
    has ``link`` (its target, kept as written) and no content."""

    sha: str
    size: int
    mode: int
    link: Optional[str] = None

    def to_json(self) -> list:
        return [self.sha, self.size, oct(self.mode), self.link] if self.link is not None else \
            [self.sha, self.size, oct(self.mode)]

    @classmethod
    def from_json(cls, item: list) -> Entry:
        return cls(sha=item[0], size=int(item[1]), mode=int(item[2], 8), link=item[3] if len(item) > 3 else None)


@dataclass(frozen=True)
class Snapshot:
    """A scanned project: what ``store`` will freeze, and what ``plan`` shows."""

    root: str  # the live project folder
    how: str  # "git" or "folder"
    entries: Mapping[str, Entry]  # posix path relative to root -> entry
    store_dir: str  # <runs_dir>/.code
    commit: Optional[str] = None
    diff: str = ""  # git diff HEAD: the uncommitted changes to tracked files
    missing: frozenset[str] = frozenset()  # blob hashes the store lacks
    ignore_file: str = ".orchignore"
    exclude: tuple[str, ...] = ()  # folders left out (the runs folder...)
    hashed: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)  # rel -> (size, mtime_ns, ino) as hashed
    left_out: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # reason -> paths (a folder ends in '/')
    staged: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)  # blobs this scan wrote: sha -> their stat
    include: tuple[str, ...] = ()  # code.include
    exclude_patterns: tuple[str, ...] = ()  # code.exclude
    notes: tuple[str, ...] = ()  # warnings about the project itself (a stray record of a shipment above it)

    @property
    def id(self) -> str:
        return snapshot_id(self.entries)

    @property
    def view(self) -> str:
        """The folder holding this project's tree and its mirrored parents (one per id and root:
        the live links differ between roots)."""
        key = hashlib.sha256(os.fsencode(self.root)).hexdigest()[:8]
        return str(Path(self.store_dir) / "trees" / f"{self.id}-{key}")

    @property
    def tree(self) -> str:
        return str(Path(self.view, *mirror_names(self.root)))

    @property
    def manifest_path(self) -> str:
        return str(Path(self.store_dir) / "manifests" / f"{self.id}.json")

    @property
    def files(self) -> int:
        return len(self.entries)

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries.values())

    @property
    def new_bytes(self) -> int:
        return sum({e.sha: e.size for e in self.entries.values() if e.sha in self.missing}.values())

    @property
    def diff_sha(self) -> Optional[str]:
        return hashlib.sha256(self.diff.encode()).hexdigest() if self.diff else None

    @property
    def warnings(self) -> list[str]:
        """One line per file that kept changing while it was read (left out, found live), and the
        scan's notes about the project."""
        return [*self.notes, *(f"{rel} changed while it was read and is not frozen: the ranks read it live"
                               for rel in self.left_out.get(LEFT_CHANGING, ()))]

    def in_tree(self, live_path: str) -> Optional[str]:
        """Where a live path inside the project lies in the snapshot's tree (None: outside it)."""
        rel = relative_inside(live_path, self.root)
        return None if rel is None else (self.tree if rel == "." else str(Path(self.tree) / rel))

    def pythonpath(self, value: str) -> str:
        """``PYTHONPATH`` as the ranks get it: each entry inside the project is preceded by its
        place in the tree (what the ranks' imports and their children then find first)."""
        out: list[str] = []
        folders = {"."} | {rel.rsplit("/", 1)[0] for rel in self.entries if "/" in rel}
        folders |= {f.rsplit("/", i)[0] for f in list(folders) for i in range(1, f.count("/") + 1)}
        for item in value.split(os.pathsep):
            rel = relative_inside(os.path.realpath(item), self.root) if item and os.path.isabs(item) else None
            moved = self.in_tree(os.path.realpath(item)) if rel in folders else None  # a folder the snapshot holds
            if moved is not None and moved not in out:
                out.append(moved)
            out.append(item)
        return os.pathsep.join(out)

    def summary(self) -> dict:
        """What the run records (``<run>/code.json``) and the plan carries."""
        return {"id": self.id, "root": self.root, "how": self.how, "tree": self.tree, "manifest": self.manifest_path,
                "commit": self.commit, "dirty": bool(self.diff), "diff": self.diff_sha, "files": self.files,
                "bytes": self.bytes, "new_files": len(self.missing), "new_bytes": self.new_bytes,
                "ignore_file": self.ignore_file, "exclude": list(self.exclude), "include": list(self.include),
                "exclude_patterns": list(self.exclude_patterns),
                "left_out": {why: {"count": len(paths), "examples": list(paths[:5])}
                             for why, paths in self.left_out.items() if paths}}


def snapshot_id(entries: Mapping[str, Entry]) -> str:
    lines = "\n".join(f"{rel}\0{e.sha}\0{e.mode:o}\0{e.link or ''}" for rel, e in sorted(entries.items()))
    return hashlib.sha256(lines.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def mirror_names(root: str) -> list[str]:
    """The last folders of ``root``'s path: its mirrored ancestors and itself."""
    parts = list(Path(root).parts[1:]) or ["_"]
    return parts[-(MIRRORED_LEVELS + 1):]


def is_code(rel: str, size: int) -> Optional[str]:
    """None when ``rel`` (a file of ``size`` bytes) is code by the rule, else why it is not."""
    suffix = os.path.splitext(rel)[1].lower()
    if suffix in SOURCE_SUFFIXES:
        return None
    if suffix in CONFIG_SUFFIXES:
        return None if size <= CONFIG_MAX_BYTES else LEFT_BIG_CONFIG
    return LEFT_NOT_CODE


def output_part(rel: str) -> bool:
    """A path under a hidden, output or cache folder (its folders only, not its own name)."""
    return any(p.startswith(".") or p in OUTPUT_DIRS for p in rel.split("/")[:-1])


def relative_inside(path: str, root: str) -> Optional[str]:
    """``path`` relative to ``root`` in posix form, or None when it is not inside."""
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        return None
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        return None
    return rel.replace(os.sep, "/")


def human_size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def blob_path(store_dir: str | Path, sha: str) -> Path:
    return Path(store_dir) / "blobs" / sha[:2] / sha


def load_manifest(path: str | Path) -> dict[str, Entry]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        entries = {rel: Entry.from_json(item) for rel, item in data["files"].items()}
        if not all(isinstance(rel, str) and isinstance(e.sha, str) and re.fullmatch(r"[0-9a-f]{64}", e.sha)
                   and (e.link is None or isinstance(e.link, str)) for rel, e in entries.items()):
            raise ValueError("an entry is not [sha256, size, mode(, link)]")
        return entries
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise SnapshotError(f"cannot read the snapshot's manifest {path}: {exc}") from None


def read_code_record(path: str | Path) -> dict:
    """A run's ``code.json`` (``Snapshot.summary()``), checked: a damaged one is one line."""
    try:
        code = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(code, dict) or not all(isinstance(code.get(k), str) for k in ("id", "root", "manifest")):
            raise ValueError("id, root or manifest is missing")
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"the run's code record {path} is damaged ({exc}); the run itself is unaffected, "
                            "but its snapshot cannot be compared") from None
    return code
