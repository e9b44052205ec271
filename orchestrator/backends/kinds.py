"""What each backend is, as plain facts (standard library only, importing nothing): the registry
(``orchestrator.backends``) adds each one's planner to these, and a spec answers from them
(``JobSpec.runs_on``) without importing the planners that read specs."""

from __future__ import annotations

from orchestrator.core.lean_record import record


@record
class Kind:
    """What one backend is. ``scheduled``: a batch scheduler queues its jobs, which have job ids,
    wait for each other (``after:``, pipelines), are requeued by it and are asked about (paced),
    and run the spec's own shape on its nodes; otherwise a supervisor on this machine runs the
    ranks and keeps the run folder current. ``foreground``: ``orchestrator run`` runs it in this
    terminal (else ``submit`` queues it). ``in_process``: the rank runs in this process (pdb): it
    imports the live files, no snapshot. ``emulated``: the spec's nodes are emulated on this
    machine (``JobSpec.local_shape``, its ``local:`` section). ``poll_s``: how often ``Run.wait``
    looks at a run."""

    name: str
    scheduled: bool
    foreground: bool
    in_process: bool
    emulated: bool
    poll_s: float


KINDS: dict[str, Kind] = {
    "local": Kind("local", scheduled=False, foreground=True, in_process=False, emulated=True, poll_s=0.2),
    "slurm": Kind("slurm", scheduled=True, foreground=False, in_process=False, emulated=False, poll_s=1.0),
    "debug": Kind("debug", scheduled=False, foreground=True, in_process=True, emulated=False, poll_s=0.2),
}
