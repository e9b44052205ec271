"""Commands we suggest to the user (``orchestrator status RUN``), quoted for a shell, so a run
folder whose path holds a space or a quote can be pasted as shown. Standard library only, and
nothing platform-bound: the CLI imports it before it knows it can run here."""

from __future__ import annotations

import shlex


def command_line(*words: object) -> str:
    """A command suggested to the user, as they can paste it into a shell: each word quoted only
    where it must be (``shlex.join``), so ``/tmp/my proj/runs/x`` is one word and a plain run id or
    path reads as written."""
    return shlex.join(str(word) for word in words)


def quoted_command(*words: object) -> str:
    """``command_line`` set off from the message around it in a quote that it does not hold:
    ``'orchestrator status x-1'`` as ever, ``"orchestrator status '/tmp/my proj/runs/x'"`` when a
    word had to be quoted."""
    line = command_line(*words)
    mark = next((q for q in "'\"`" if q not in line), "`")
    return f"{mark}{line}{mark}"
