"""The environment sbatch runs in: which SBATCH_* defaults (the user's, the site's) it keeps,
which it must not see (those the batch script's own options would lose to, those that would break
what comes after sbatch), and a surrounding job's SLURM_*, which would describe that job to the
new one. ``plan`` shows it in one line (``sbatch_env_line``)."""

from __future__ import annotations

import contextlib
import os
import shlex
from typing import Iterable, Iterator, Mapping, Sequence

#: sbatch input variables whose option is not the variable's name after SBATCH_, in lower case
#: with dashes (SBATCH_JOB_NAME: --job-name): sbatch(1), INPUT ENVIRONMENT VARIABLES.
_SBATCH_OPTION_OF = {"SBATCH_TIMELIMIT": "time", "SBATCH_MEM_PER_NODE": "mem", "SBATCH_ARRAY_INX": "array",
                     "SBATCH_DEBUG": "verbose", "SBATCH_REQ_SWITCH": "switches", "SBATCH_WAIT4SWITCH": "switches"}
#: Options that say one thing in several ways: a script that sets one of them sets them all.
_SBATCH_SAME = (frozenset({"mem", "mem-per-cpu", "mem-per-gpu"}), frozenset({"requeue", "no-requeue"}),
                frozenset({"cpus-per-task", "cpus-per-gpu"}), frozenset({"gpus", "gpus-per-node", "gpus-per-task"}))
#: SBATCH_* variables never passed on, whatever the spec: each would break what comes after sbatch.
_SBATCH_REFUSED = {
    "SBATCH_WAIT": "sbatch would not return until the job ended",
    "SBATCH_ARRAY_INX": "it would make the job an array whose tasks status never follows",
    "SBATCH_CLUSTERS": "the job would go to a cluster that status and cancel do not ask (no -M)",
}


def sbatch_option_of(name: str) -> str:
    """The sbatch long option an SBATCH_* input variable stands for: SBATCH_QOS -> 'qos'."""
    return _SBATCH_OPTION_OF.get(name) or name[len("SBATCH_"):].lower().replace("_", "-")


def script_options(*scripts: str) -> set[str]:
    """The long options the ``#SBATCH`` lines of the batch scripts set (before their first command)."""
    found: set[str] = set()
    for script in scripts:
        for line in script.splitlines():
            line = line.strip()
            if line.startswith("#SBATCH"):
                word = line[len("#SBATCH"):].strip()
                if word.startswith("--"):
                    found.add(word[2:].split("=", 1)[0].strip())
            elif line and not line.startswith("#"):
                break  # sbatch reads no #SBATCH line after the first command
    return found


def submission_env(options: Iterable[str],
                   environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """What of this environment sbatch reads as defaults, and what is kept from it.

    ``options``: the long options the batch script sets. Returns (used, dropped): ``used`` the
    SBATCH_* variables sbatch will apply (the account, partition, QOS, reservation, export... the
    user or the site set for what the spec leaves out), ``dropped`` {name: why} for every
    SLURM_*/SBATCH_* taken out of sbatch's environment:

    - inside a job (SLURM_JOB_ID set), the surrounding job's own SLURM_* (but SLURM_CONF), which
      would otherwise describe that job to the new one; outside a job every SLURM_* stays;
    - an SBATCH_* whose option the script sets: sbatch would let the variable win over the
      script, and the spec (or what the orchestrator needs) is what the job asks for;
    - SBATCH_WAIT, SBATCH_ARRAY_INX, SBATCH_CLUSTERS (``_SBATCH_REFUSED``).
    """
    env = os.environ if environ is None else environ
    setting = set(options)
    for same in _SBATCH_SAME:
        if setting & same:
            setting |= same
    used: dict[str, str] = {}
    dropped: dict[str, str] = {}
    job = env.get("SLURM_JOB_ID")  # set: this runs inside a job, whose own SLURM_* describe that job
    for key in sorted(env):
        if key.startswith("SLURM_") and key != "SLURM_CONF" and job:
            dropped[key] = f"it belongs to the job {job} this runs in"
        elif key.startswith("SBATCH_"):
            option = sbatch_option_of(key)
            if key in _SBATCH_REFUSED:
                dropped[key] = _SBATCH_REFUSED[key]
            elif option in setting:
                dropped[key] = f"the script sets --{option}"
            else:
                used[key] = env[key]
    return used, dropped


@contextlib.contextmanager
def clean_submission_env(options: Iterable[str] = ()) -> Iterator[dict[str, str]]:
    """The environment sbatch runs in (``submission_env``): the user's and the site's SBATCH_*
    defaults stay, a surrounding job's SLURM_* go (inside a job only), and so does any SBATCH_*
    the script's own ``options`` would lose to. Yields the SBATCH_* sbatch will use."""
    used, dropped = submission_env(options)
    saved = {k: os.environ[k] for k in dropped if k in os.environ}
    for key in saved:
        del os.environ[key]
    try:
        yield used
    finally:
        os.environ.update(saved)


def sbatch_env_line(scripts: Sequence[str], environ: Mapping[str, str] | None = None) -> str:
    """``plan``'s line about the submission's environment: the SBATCH_* defaults sbatch will use
    (names and values), those set but not used and why, and a surrounding job's SLURM_* left out."""
    used, dropped = submission_env(script_options(*scripts), environ)
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in used.items()) if used else "none"
    line = f"sbatch defaults from this environment (SBATCH_*, for what the spec leaves out): {shown}"
    unused = [f"{k} ({why})" for k, why in dropped.items() if k.startswith("SBATCH_")]
    if unused:
        line += "; set but not used (the script's own option wins, or it would break the job): " + ", ".join(unused)
    job = [k for k in dropped if k.startswith("SLURM_")]
    if job:
        line += (f"; inside job {(os.environ if environ is None else environ).get('SLURM_JOB_ID')}: its "
                 f"{len(job)} SLURM_* variable(s) are not passed on (SLURM_CONF is)")
    return line
