"""Training frameworks (``framework:``): what each framework's own launcher would export.

Lightning, Fabric, accelerate and the transformers Trainer all run on the torchrun contract that
every rank already gets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR,
MASTER_PORT), but each also reads a few variables of its own that its launcher (``fabric run``,
``accelerate launch``) would have exported, or takes the world's shape from its own settings.
Without them the ranks do not form one world: four accelerate ranks on CPU each ran alone (and
raced on one output file), because accelerate only goes distributed on CPU when told
``ACCELERATE_USE_CPU``. What each needs (read in the installed packages' sources):

- **fabric** (``lightning/fabric/cli.py``, ``connector.py``): ``fabric run`` exports LT_CLI_USED,
  LT_DEVICES, LT_NUM_NODES (and LT_ACCELERATOR / LT_STRATEGY / LT_PRECISION when given); the
  ``Fabric`` constructor takes them over its own defaults, and with LT_CLI_USED refuses code that
  says otherwise.
- **lightning** (the Trainer): no launcher of its own (srun or torchrun), but ``Trainer.__init__``
  takes PL_TRAINER_<ARG> variables as the defaults of its arguments
  (``lightning/pytorch/utilities/argparse.py``); arguments given in code or on its CLI win.
  Lightning picks its cluster environment by itself: SLURMEnvironment under srun (SLURM_NTASKS
  set, job name not 'bash'/'interactive'), which checks devices against SLURM_NTASKS_PER_NODE and
  num_nodes against SLURM_NNODES; locally LightningEnvironment (LOCAL_RANK set), which trusts
  devices x num_nodes blindly. So the shape it is given must be the run's.
- **accelerate** (``accelerate/utils/launch.py``, ``state.py``): on GPUs ``PartialState`` reads the
  world from LOCAL_RANK/RANK/WORLD_SIZE; on CPU it goes distributed only with ``cpu=True``, which
  ``AcceleratorState`` (so ``Accelerator()``) takes from ACCELERATE_USE_CPU, as ``accelerate launch
  --cpu`` exports it. Mixed precision and dynamo: the launcher's defaults ('no') are accelerate's
  defaults when unset, so nothing is exported (a user's own ACCELERATE_MIXED_PRECISION stays theirs).
  KMP_AFFINITY/KMP_BLOCKTIME (``--cpu``'s Intel OpenMP pinning) are left out: compact pinning
  puts every rank of a shared node on the same cores.
- **transformers** (``training_args.py``): ``TrainingArguments`` builds accelerate's PartialState
  and takes ``cpu=True`` from ``--use_cpu`` or ACCELERATE_USE_CPU.

``environment`` runs on every rank (via ``rank_env.rank_environment``): standard library only.
``problems`` is called by ``spec.cross_field_problems`` with the JobSpec, read through
``views.SpecView`` (this module imports nothing of the orchestrator at run time, and not spec.py
even for type checking: no import cycle). ``plan_lines`` is what ``plan`` shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # types only: this module imports nothing of the orchestrator when it runs
    from orchestrator.core.payload import Payload
    from orchestrator.core.views import LaunchView, SpecView

FRAMEWORKS = ("lightning", "fabric", "accelerate", "transformers")
#: Frameworks whose usual command-line parsers read a boolean as a value ('--flag false'):
#: LightningCLI (jsonargparse) and HfArgumentParser. With bool_args: flag a false is dropped.
VALUE_BOOLEANS = {"lightning": "LightningCLI (jsonargparse)", "transformers": "HfArgumentParser"}

#: Where each framework's world shape can be written in args (keys compared with '-' as '_').
DEVICE_KEYS = {"lightning": ("devices", "trainer.devices"), "fabric": ("devices", "fabric.devices")}
NODE_KEYS = {"lightning": ("num_nodes", "trainer.num_nodes"), "fabric": ("num_nodes", "fabric.num_nodes")}
#: ... and in env (the spec's env wins over ours, so a stale one there would break the world).
DEVICE_ENV = {"lightning": "PL_TRAINER_DEVICES", "fabric": "LT_DEVICES"}
NODE_ENV = {"lightning": "PL_TRAINER_NUM_NODES", "fabric": "LT_NUM_NODES"}


# ---- on every rank ---------------------------------------------------------------------------
def environment(payload: Payload, contract: Mapping[str, str]) -> dict[str, str]:
    """The variables the framework's launcher would set for a rank whose torchrun contract
    (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR...) is ``contract`` (none without ``framework``).
    The shape comes from the contract (LOCAL_WORLD_SIZE, NNODES), so a local downscale and the
    SLURM run each get their own; a rank with no GPU visible is a CPU rank."""
    name = getattr(payload, "framework", None)
    if not name:
        return {}
    return variables(name, contract.get("LOCAL_WORLD_SIZE", "1"), contract.get("NNODES", "1"), cpu_rank(contract))


def cpu_rank(contract: Mapping[str, str]) -> bool:
    """No GPU visible: the local executor hides them all (CUDA_VISIBLE_DEVICES=''), and a SLURM
    job without GRES gets none from SLURM."""
    return not contract.get("CUDA_VISIBLE_DEVICES")


def variables(name: str, devices: str, nodes: str, cpu: bool) -> dict[str, str]:
    """One framework's variables for a rank of ``nodes`` x ``devices`` (ranks per node)."""
    if name in DEVICE_ENV:  # fabric, lightning
        env = {"LT_CLI_USED": "1"} if name == "fabric" else {}
        env.update({DEVICE_ENV[name]: str(devices), NODE_ENV[name]: str(nodes)})
        if cpu:
            env["LT_ACCELERATOR" if name == "fabric" else "PL_TRAINER_ACCELERATOR"] = "cpu"
        return env
    if name in ("accelerate", "transformers"):
        return {"ACCELERATE_USE_CPU": "true"} if cpu else {}
    return {}


# ---- spec checks -----------------------------------------------------------------------------
def problems(spec: SpecView) -> list[str]:
    """Where the framework's world settings in the spec disagree with the run's shape (each
    message names the field and the fix)."""
    name = getattr(spec, "framework", None)
    if not name:
        return []
    if spec.strategy == "dp":
        return [f"strategy: dp runs one process per node, but framework: {name} runs one process per device "
                "(its own DDP); use strategy: ddp (the default)"]
    nodes, rpn, where = _shape(spec)
    gpu = _gpu_run(spec)
    found: list[str] = []
    if name in DEVICE_KEYS:
        for field, value in _settings(spec, DEVICE_KEYS[name], DEVICE_ENV[name]):
            count = _device_count(value, gpu, rpn)
            if count is None and _shown(value) != repr(value):
                found.append(_mismatch(field, _shown(value), rpn, "per node", where, name))
            elif count is not None and count != rpn:
                counted = "" if _as_int(value) == count else f" ({count} device(s) {'per node' if gpu else 'on CPU'})"
                found.append(_mismatch(field, f"{value!r}{counted}", rpn, "per node", where, name))
        for field, value in _settings(spec, NODE_KEYS[name], NODE_ENV[name]):
            if _as_int(value) != nodes:
                found.append(_mismatch(field, _shown(value), nodes, "nodes", where, name))
    elif name == "accelerate":
        found += _accelerate_problems(spec, nodes, rpn, where)
    elif name == "transformers":
        found += _transformers_problems(spec)
    return found


def _shape(spec: SpecView) -> tuple[int, int, str]:
    """(nodes, ranks per node) of the run the spec's executor makes, and how to name it."""
    if spec.runs_on.scheduled:
        return spec.nodes, spec.ranks_per_node, f"the job runs {spec.nodes} node(s) x {spec.ranks_per_node} rank(s)"
    if spec.runs_on.in_process:
        return 1, 1, "the debug executor runs 1 rank"
    nodes, rpn = spec.local_shape()
    also = "" if (nodes, rpn) == (spec.nodes, spec.ranks_per_node) else \
        f" (on SLURM {spec.nodes} x {spec.ranks_per_node})"
    return nodes, rpn, f"a local run of this spec is {nodes} node(s) x {rpn} rank(s){also}"


def _gpu_run(spec: SpecView) -> bool:
    """Whether the ranks see GPUs: SLURM gives them with GRES; locally only local.devices does."""
    if spec.runs_on.scheduled:
        return spec.gpus_per_node > 0
    return bool(spec.local.devices)


def _settings(spec: SpecView, keys: tuple[str, ...], env_name: str | None = None) -> list[tuple[str, Any]]:
    """(field, value) for each of ``keys`` set in args or sweep (every sweep value), written in
    extra_args ('--num_nodes=2', or '--num_nodes' then '2': the script's parser reads them as it
    reads args), and the framework's own variable in env."""
    wanted = set(keys)
    out = [(f"args.{k}", v) for k, v in spec.args.items() if _norm(k) in wanted]
    out += [(f"sweep.{k}", v) for k, values in spec.sweep.items() if _norm(k) in wanted for v in values]
    out += [(field, v) for field, k, v in _extra_settings(getattr(spec, "extra_args", ())) if _norm(k) in wanted]
    if env_name and env_name in spec.env:
        out.append((f"env.{env_name}", spec.env[env_name]))
    return out


def _extra_settings(extra: Sequence[str]) -> list[tuple[str, str, str]]:
    """(field, key, value) for each long option with a value in extra_args: '--key=value' in one
    item, or '--key' followed by an item that is not an option. A '--' ends the options (what
    follows is positional), as argparse and jsonargparse read it."""
    found: list[tuple[str, str, str]] = []
    for i, item in enumerate(extra):
        if item == "--":
            break
        if not item.startswith("--") or len(item) == 2:
            continue
        key, eq, value = item[2:].partition("=")
        if eq:
            found.append((f"extra_args[{i}] --{key}", key, value))
        elif i + 1 < len(extra) and not extra[i + 1].startswith("--"):
            found.append((f"extra_args[{i}] --{key}", key, extra[i + 1]))
    return found


def _norm(key: str) -> str:
    return key.lower().replace("-", "_")


def _as_int(value: Any) -> int | None:
    """A whole number as Python's int() and the frameworks' parsers read it: an int, or text of ASCII
    digits with an optional '-' (None otherwise). ``str.isdigit`` alone is not enough: it accepts
    '²', which int() refuses with a traceback instead of a message naming the field."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    digits = text[1:] if text.startswith("-") else text
    return int(text) if digits.isascii() and digits.isdigit() else None


def _shown(value: Any) -> str:
    """A setting's value for a message: its repr, and for text that holds a digit int() does not
    read ('²', '٣'), what to write instead."""
    text = repr(value)
    if isinstance(value, str) and any(ch.isdigit() and not ch.isascii() for ch in value):
        text += " (not ASCII digits: write the count as 0-9)"
    return text


def _device_count(value: Any, gpu: bool, rpn: int) -> int | None:
    """How many devices per node Lightning/Fabric would use for ``value`` (None: not knowable here).
    'auto' and -1 mean every visible GPU (each rank sees its node's: ``rpn``), but 1 on CPU; a
    list or '0,1' names devices."""
    if isinstance(value, list):
        return len(value)
    text = str(value).strip().lower()
    if text in ("auto", "-1"):
        return rpn if gpu else 1
    if "," in text:
        return len([part for part in text.split(",") if part.strip()])
    return _as_int(value)


def _mismatch(field: str, shown: str, right: int, what: str, where: str, name: str) -> str:
    """A shape setting that disagrees with the run: the ranks would compute another world (and
    hang at init, or fail Lightning's own check on SLURM)."""
    fix = "remove it from env" if field.startswith("env.") else \
        f"remove it, or make it {right} (local.emulate_nodes and local.ranks_per_node set a local run's shape)"
    return (f"{field}: {shown}, but {where}, {right} {what}: the ranks would not form one world. framework: "
            f"{name} gives every rank the run's own shape ({DEVICE_ENV[name]}, {NODE_ENV[name]}); {fix}")


def _accelerate_problems(spec: SpecView, nodes: int, rpn: int, where: str) -> list[str]:
    """`accelerate launch`'s own options, if a script takes them too: num_processes is the whole
    world, num_machines the nodes; machine_rank differs per node, so no spec value can be right."""
    found = []
    fix = "accelerate reads the world from each rank's RANK, WORLD_SIZE and LOCAL_RANK; remove it or make it match"
    for key, right, what in (("num_processes", nodes * rpn, "processes"), ("num_machines", nodes, "machine(s)")):
        found += [f"{field}: {_shown(value)}, but {where}: not {right} {what}; {fix}"
                  for field, value in _settings(spec, (key,)) if _as_int(value) != right]
    for field, _ in _settings(spec, ("machine_rank",)):
        found.append(f"{field}: each node has its own machine rank (NODE_RANK on every rank); remove it from the spec")
    return found


def _transformers_problems(spec: SpecView) -> list[str]:
    """TrainingArguments' ddp_backend must be the process group the ranks are set up for."""
    backend = spec.resolved_backend if spec.runs_on.scheduled else spec.local_backend()
    return [f"{field}: {value!r}, but the ranks' backend is {backend} (distributed.backend, on this executor); "
            f"remove it (the Trainer then picks {backend}) or set distributed.backend: {value}"
            for field, value in _settings(spec, ("ddp_backend",)) if str(value).lower() != backend]


# ---- what plan shows -------------------------------------------------------------------------
def plan_lines(launch: LaunchView) -> list[str]:
    """The plan's lines for ``framework:``: what rank 0 gets and the launcher command it stands
    for, and a note when a false in args is dropped for a framework whose CLI reads values.
    """
    name = launch.payload.framework
    if not name or not launch.ranks:
        return []
    env = launch.ranks[0].env
    mine = variables(name, "", "", cpu_rank(env))
    shown = " ".join(f"{k}={env.get(k, '')}" for k in mine)
    lines = [f"framework: {name}: " + (f"each rank gets {shown} " if shown else "nothing to add on GPUs ")
             + _what_it_stands_for(name, launch, cpu_rank(env))]
    note = _bool_note(name, launch.spec)
    if note:
        lines.append(note)
    return lines


def _what_it_stands_for(name: str, launch: LaunchView, cpu: bool) -> str:
    n, rpn, world = launch.nodes, launch.ranks_per_node, launch.world_size
    if name == "fabric":
        acc = "--accelerator cpu " if cpu else ""
        return (f"(what `fabric run {acc}--devices {rpn} --num-nodes {n}` would set; the script must not call "
                "fabric.launch(), as under `fabric run`)")
    if name == "lightning":
        acc = "accelerator='cpu', " if cpu else ""
        return (f"(Trainer's defaults from the environment: as Trainer({acc}devices={rpn}, num_nodes={n}); arguments "
                "in code or on LightningCLI win, and must match)")
    if name == "accelerate":
        how = "--cpu" if cpu else "--multi_gpu"
        return (f"(what `accelerate launch {how} --num_machines {n} --num_processes {world}` would set; the world "
                "comes from RANK/WORLD_SIZE; set ACCELERATE_MIXED_PRECISION in env for --mixed_precision; "
                "a script that builds only PartialState() passes cpu=True itself)" if cpu else
                f"(as `accelerate launch {how} --num_machines {n} --num_processes {world}`: the world comes from "
                "RANK/WORLD_SIZE/LOCAL_RANK; set ACCELERATE_MIXED_PRECISION in env for --mixed_precision)")
    return ("(TrainingArguments then trains on CPU in one world, as --use_cpu would)" if cpu else
            "(TrainingArguments reads the world from RANK/WORLD_SIZE/LOCAL_RANK, as under torchrun)")


def _bool_note(name: str, spec: SpecView) -> str | None:
    """With bool_args: flag, a false in args or sweep is left off the command line: right for
    argparse's store_true, silently wrong for a CLI that reads '--flag false' (a field whose
    default is true stays true)."""
    if name not in VALUE_BOOLEANS or spec.bool_args != "flag":
        return None
    dropped = [k for k, v in spec.args.items() if v is False]
    dropped += [k for k, vals in spec.sweep.items() if any(v is False for v in vals) and k not in dropped]
    if not dropped:
        return None
    return (f"framework: {name}: {', '.join(dropped[:3])}: false is left off the command line (bool_args: flag); "
            f"{VALUE_BOOLEANS[name]} reads '--{dropped[0]} false': set bool_args: value if the script parses with it")
