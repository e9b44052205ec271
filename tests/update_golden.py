"""Rewrite the golden sbatch files from the current plan() output. Run by hand, never by a test:

    .venv/bin/python tests/update_golden.py          # write, then review with git diff tests/golden
    .venv/bin/python tests/update_golden.py --check  # exit 1 if any file would change
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.test_plan_golden import GOLDEN, golden_scripts  # noqa: E402


def main(argv: list[str]) -> int:
    check = "--check" in argv
    scripts = golden_scripts()
    changed = [name for name, text in scripts.items()
               if not (GOLDEN / f"{name}.sbatch").exists() or (GOLDEN / f"{name}.sbatch").read_text() != text]
    stale = [p for p in GOLDEN.glob("*.sbatch") if p.stem not in scripts]
    for name in changed:
        print(f"{'would change' if check else 'wrote'} {GOLDEN / name}.sbatch")
        if not check:
            (GOLDEN / f"{name}.sbatch").write_text(scripts[name])
    for path in stale:
        print(f"{'stale' if check else 'removed'} {path}")
        if not check:
            path.unlink()
    if not changed and not stale:
        print("golden files are up to date")
    return 1 if check and (changed or stale) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
