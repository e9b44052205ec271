"""How the orchestrator starts its own Python processes: never importing from where they start.

``python -m pkg.module`` puts the current directory first on ``sys.path``, so a ``json.py`` or
``typing.py`` in the user's directory would run inside our zygote, supervisor, launcher, SLURM
agent or stack probe before any of our code. ``-P`` (Python 3.11+) stops that, but
``slurm.python`` may name an older interpreter, so every process we start uses one form that
works on every version: a ``-c`` bootstrap that drops the ``''`` entry ``-c`` puts first (the
``site`` module has already run by then, without it), then runs the module under the name
``__main__``. ``alter_sys`` stays off: with it, runpy puts the previous ``sys.modules["__main__"]``
back while a ``SystemExit`` unwinds, which would drop the user's script module that the launcher
installed there (and with it the tail of a file the script left open). The user's own entrypoint still gets its directory on ``sys.path``: the
launcher adds it just before importing it, as plain ``python`` would.
"""

from __future__ import annotations

#: Double quotes only, so ``shlex.quote`` renders it as one plain single-quoted word.
BOOTSTRAP = ('import sys; sys.path[:1] == [""] and sys.path.pop(0); '
             'import runpy; runpy.run_module(sys.argv.pop(1), run_name="__main__")')


def module_argv(python: str, module: str, *args: str, unbuffered: bool = True) -> list[str]:
    """``python [-u] -m module args...``, without the current directory on ``sys.path``."""
    return [python, *(["-u"] if unbuffered else []), "-c", BOOTSTRAP, module, *args]



#: The same, for a process that needs the standard library and this package only (the health
#: gate): ``-S`` skips ``site`` (every ``.pth`` file of the environment, an editable install's
#: finder: 10-25 ms an interpreter), and the folder that holds the ``orchestrator`` package is put
#: last on ``sys.path`` (after the standard library: nothing there can shadow it).
LEAN_BOOTSTRAP = ('import sys; sys.path[:1] == [""] and sys.path.pop(0); sys.path.append(sys.argv.pop(1)); '
                  'import runpy; runpy.run_module(sys.argv.pop(1), run_name="__main__")')


def package_root() -> str:
    """The folder that holds this ``orchestrator`` package, as this interpreter imported it."""
    import os

    import orchestrator

    return os.path.dirname(os.path.dirname(os.path.abspath(orchestrator.__file__ or "")))


def lean_module_argv(python: str, module: str, *args: str, root: str | None = None) -> list[str]:
    """``python -S -m module args...`` importing only the standard library and ``root``'s
    ``orchestrator`` (this process's, by default: ``python`` must be the interpreter running it,
    or one that sees the same package), never the current directory."""
    return [python, "-S", "-c", LEAN_BOOTSTRAP, root or package_root(), module, *args]
