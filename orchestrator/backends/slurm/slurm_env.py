"""The environment sbatch runs in: which SBATCH_* defaults (the user's, the site's) it keeps,
which it must not see (those the batch script's own options would lose to, those that would break
what comes after sbatch), and a surrounding job's SLURM_*, which would describe that job to the
new one. A few variables cannot simply be left out, because leaving them out would quietly do
something else than the user asked (``_ENV_REFUSED``): a submission stops on them, naming each.
``plan`` shows it in one line (``sbatch_env_line``), every value from the environment with its
control characters escaped (an SBATCH_* value must not write to the terminal).

The SBATCH_* input variables of sbatch(1) that change what happens to our script, and their fate:

- kept, as the user's or the site's defaults for what the spec leaves out: SBATCH_ACCOUNT,
  SBATCH_PARTITION, SBATCH_QOS, SBATCH_RESERVATION, SBATCH_CONSTRAINT, SBATCH_EXCLUSIVE... and
  SBATCH_EXPORT (a site's NONE included: the job's agent rebuilds what the ranks need,
  ``slurm_job``), each dropped where the script sets its option (sbatch would let it win);
- dropped always (``_SBATCH_DROPPED``): SBATCH_WAIT, SBATCH_ARRAY_INX, SBATCH_CLUSTERS (only sbatch
  reads it), SBATCH_OUTPUT, SBATCH_ERROR, SBATCH_GPUS_PER_TASK, and SBATCH_QUIET / SBATCH_PARSABLE
  (no sbatch reads these today; a site's sbatch wrapper that did would hide the job id);
- refused (``_ENV_REFUSED``): SLURM_CLUSTERS, which squeue and scancel read too, and
  SBATCH_CONTAINER, whose user meant the ranks to run in an image.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from typing import Iterable, Iterator, Mapping, Sequence

from orchestrator.core.errors import SubmissionError
from orchestrator.spec.validators import printable, shown

#: sbatch input variables whose option is not the variable's name after SBATCH_, in lower case
#: with dashes (SBATCH_JOB_NAME: --job-name): sbatch(1), INPUT ENVIRONMENT VARIABLES.
_SBATCH_OPTION_OF = {"SBATCH_TIMELIMIT": "time", "SBATCH_MEM_PER_NODE": "mem", "SBATCH_ARRAY_INX": "array",
                     "SBATCH_DEBUG": "verbose", "SBATCH_REQ_SWITCH": "switches", "SBATCH_WAIT4SWITCH": "switches"}
#: Options that say one thing in several ways: a script that sets one of them sets them all.
_SBATCH_SAME = (frozenset({"mem", "mem-per-cpu", "mem-per-gpu"}), frozenset({"requeue", "no-requeue"}),
                frozenset({"cpus-per-task", "cpus-per-gpu"}), frozenset({"gpus", "gpus-per-node", "gpus-per-task"}))
#: SBATCH_* variables never passed on, whatever the spec: each would break what comes after sbatch.
_SBATCH_DROPPED = {
    "SBATCH_WAIT": "sbatch would not return until the job ended",
    "SBATCH_ARRAY_INX": "it would make the job an array whose tasks status never follows",
    "SBATCH_CLUSTERS": "the job would go to a cluster that status and cancel do not ask (no -M)",
    "SBATCH_OUTPUT": "it would send the job agent's log away from <run>/slurm, where status and logs read it",
    "SBATCH_ERROR": "it would split the job agent's errors from its log (the script sends them to --output, "
                    "where status and logs read them)",
    "SBATCH_GPUS_PER_TASK": "it would change the ranks' layout (gpus_per_node sets it; extra_sbatch refuses "
                            "--gpus-per-task too)",
    "SBATCH_QUIET": "were it read (sbatch -Q), no job id would come back and the queued job would be recorded FAILED",
    "SBATCH_PARSABLE": "were it read (sbatch --parsable), the job id would not come back in the line the "
                       "submission reads",
}
#: Variables a submission stops on, naming each: leaving them out of sbatch's environment would not
#: do what the user asked either.
_ENV_REFUSED = {
    "SLURM_CLUSTERS": "sbatch reads it as --clusters, so the job would go to that cluster, where the job's agent "
                      "(srun, scontrol: no -M) cannot follow it, and squeue and scancel read it too, so leaving it "
                      "out of sbatch's environment alone would make status ask another cluster than the job's; "
                      "unset it for the orchestrator ('env -u SLURM_CLUSTERS orchestrator ...'), and to run on that "
                      "cluster submit from its login node (or with SLURM_CONF naming its slurm.conf)",
    "SBATCH_CONTAINER": "sbatch reads it as --container, so the batch script, and with it the job's agent (which "
                        "needs the host's srun and scontrol), would run inside that image; unset it and set container: "
                        "in the spec instead (runtime: oci with image: the bundle, or apptainer / pyxis), which runs "
                        "only the ranks inside it",
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
    - the SBATCH_* of ``_SBATCH_DROPPED`` (SBATCH_WAIT, SBATCH_CLUSTERS, SBATCH_ERROR...).

    The variables of ``_ENV_REFUSED`` are in neither: a submission stops on them first
    (``check_submission_env``).
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
        if key in _ENV_REFUSED:
            continue
        if key.startswith("SLURM_") and key != "SLURM_CONF" and job:
            dropped[key] = f"it belongs to the job {printable(job)} this runs in"
        elif key.startswith("SBATCH_"):
            option = sbatch_option_of(key)
            if key in _SBATCH_DROPPED:
                dropped[key] = _SBATCH_DROPPED[key]
            elif option in setting:
                dropped[key] = f"the script sets --{option}"
            else:
                used[key] = env[key]
    return used, dropped


def env_problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per variable of ``_ENV_REFUSED`` set in this environment (an empty value too: sbatch
    reads a variable that is set), naming it with its value (escaped, shortened) and the fix: what
    ``check_submission_env`` raises and ``validate --cluster`` reports."""
    env = os.environ if environ is None else environ
    return [f"{name}={printable(shown(env[name]))} in this environment: {why}"
            for name, why in _ENV_REFUSED.items() if name in env]


def check_submission_env(environ: Mapping[str, str] | None = None) -> None:
    """Raise SubmissionError naming every refused variable (``_ENV_REFUSED``) this environment
    sets: called before anything of a submission is written, so a refused one leaves no trace."""
    problems = env_problems(environ)
    if problems:
        raise SubmissionError("cannot submit from this environment: " + "; ".join(problems))


@contextlib.contextmanager
def clean_submission_env(options: Iterable[str] = ()) -> Iterator[dict[str, str]]:
    """The environment sbatch runs in (``submission_env``): the user's and the site's SBATCH_*
    defaults stay, a surrounding job's SLURM_* go (inside a job only), and so does any SBATCH_*
    the script's own ``options`` would lose to. Yields the SBATCH_* sbatch will use. Raises
    SubmissionError, before changing anything, for a variable that is refused (``check_submission_env``)."""
    check_submission_env()
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
    env = os.environ if environ is None else environ
    used, dropped = submission_env(script_options(*scripts), env)
    values = " ".join(f"{printable(k)}={printable(shlex.quote(v))}" for k, v in used.items()) if used else "none"
    line = f"sbatch defaults from this environment (SBATCH_*, for what the spec leaves out): {values}"
    unused = [f"{printable(k)} ({why})" for k, why in dropped.items() if k.startswith("SBATCH_")]
    if unused:
        line += "; set but not used (the script's own option wins, or it would break the job): " + ", ".join(unused)
    job = [k for k in dropped if k.startswith("SLURM_")]
    if job:
        line += (f"; inside job {printable(env.get('SLURM_JOB_ID', ''))}: its "
                 f"{len(job)} SLURM_* variable(s) are not passed on (SLURM_CONF is)")
    refused = env_problems(env)
    if refused:
        line += "; submit refuses: " + "; ".join(refused)
    return line
