"""A catalogue of bad specs. Each is refused with exit code 2 and a message naming its field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main

BASE = {"name": "ok", "entrypoint": "jobs.train:main"}

# (id, changes merged into BASE (None deletes a key), text the message must contain)
CATALOGUE: list[tuple[str, dict, str]] = [
    ("missing-name", {"name": None}, "name: required field is missing"),
    ("missing-entrypoint", {"entrypoint": None}, "entrypoint: required field is missing"),
    ("name-with-space", {"name": "my job"}, "name: "),
    ("name-with-semicolon", {"name": "a;rm -rf ~"}, "name: "),
    ("name-with-subshell", {"name": "$(reboot)"}, "name: "),
    ("name-with-quote", {"name": "it's"}, "name: "),
    ("name-with-newline", {"name": "a\nb"}, "name: "),
    ("entry-neither", {"entrypoint": "not a thing"}, "entrypoint: "),
    ("entry-missing-script", {"entrypoint": "./nope/train.py"}, "entrypoint: script"),
    ("entry-bad-module", {"entrypoint": "jobs.train:"}, "entrypoint: "),
    ("entry-dash-module", {"entrypoint": "my-pkg.train:main"}, "entrypoint: "),
    ("survivors-keep-requeued", {"executor": "slurm", "recovery": {"max_restarts": 1, "survivors": "keep",
                                                                   "in_allocation": False}},
     "recovery.survivors: keep replaces a rank inside the job"),
    ("survivors-keep-in-a-container", {"executor": "slurm", "recovery": {"max_restarts": 1, "survivors": "keep"},
                                       "container": {"runtime": "apptainer", "image": "/i.sif"}},
     "recovery.survivors: keep on SLURM starts a replaced rank on the host"),
    ("survivors-keep-without-restarts", {"recovery": {"survivors": "keep"}}, "recovery.survivors: keep acts on a restart"),
    ("survivors-unknown", {"recovery": {"max_restarts": 1, "survivors": "some"}}, "recovery.survivors: "),
    ("nodes-zero", {"nodes": 0}, "nodes: "),
    ("nodes-string", {"nodes": "two"}, "nodes: "),
    ("gpus-negative", {"gpus_per_node": -1}, "gpus_per_node: "),
    ("cpu-ranks-zero", {"cpu_ranks_per_node": 0}, "cpu_ranks_per_node: "),
    ("strategy-unknown", {"strategy": "fsdp"}, "strategy: got 'fsdp'"),
    ("nccl-without-gpus", {"distributed": {"backend": "nccl"}}, "distributed.backend: nccl needs GPUs"),
    ("backend-unknown", {"distributed": {"backend": "mpi"}}, "distributed.backend: got 'mpi'"),
    ("dp-multi-node", {"strategy": "dp", "nodes": 2, "gpus_per_node": 2}, "strategy: dp"),
    ("file-init-tmp-multi-node", {"nodes": 2, "executor": "slurm",
                                  "distributed": {"init_method": "file", "rendezvous_dir": "/tmp/rdv"}},
     "distributed.rendezvous_dir: file:// init across 2 nodes"),
    ("file-init-shm-runs-dir", {"nodes": 2, "executor": "slurm", "runs_dir": "/dev/shm/runs",
                                "distributed": {"init_method": "file"}},
     "runs_dir: file:// init"),
    ("slurm-runs-dir-tmp", {"executor": "slurm", "runs_dir": "/tmp/runs"}, "runs_dir: '/tmp/runs' is node-local"),
    ("slurm-checkpoint-dir-node-local", {"executor": "slurm", "nodes": 2, "checkpoint": {"dir": "/var/tmp/ck"}},
     "checkpoint.dir: '/var/tmp/ck' is node-local"),
    ("init-method-unknown", {"distributed": {"init_method": "mpi"}}, "distributed.init_method: got 'mpi'"),
    ("port-too-low", {"distributed": {"port": 80}}, "distributed.port: port 80 is out of range"),
    ("port-too-high", {"distributed": {"port": 70000}}, "distributed.port: port 70000 is out of range"),
    ("port-ephemeral", {"distributed": {"port": 40000}}, "distributed.port: port 40000 is inside the ephemeral range"),
    ("port-word", {"distributed": {"port": "any"}}, "distributed.port"),
    ("iface-too-long", {"distributed": {"interface": "averyveryverylongname0"}}, "distributed.interface: "),
    ("iface-slash", {"distributed": {"interface": "eth0/1"}}, "distributed.interface: "),
    ("iface-space", {"distributed": {"interface": "eth 0"}}, "distributed.interface: "),
    ("iface-exclusion-gloo", {"distributed": {"interface": "^docker0,lo"}}, "gloo does not accept '^'"),
    ("iface-empty-list", {"distributed": {"interface": []}}, "distributed.interface: the interface list is empty"),
    ("iface-dup-list", {"distributed": {"interface": ["eth0", "eth0"]}}, "distributed.interface: "),
    ("init-timeout-zero", {"distributed": {"init_timeout_s": 0}}, "distributed.init_timeout_s: "),
    ("slurm-time-bad", {"slurm": {"time": "2 hours"}}, "slurm.time: '2 hours' is not a SLURM time"),
    ("slurm-time-zero", {"slurm": {"time": "0"}}, "slurm.time: "),
    ("slurm-time-colons", {"slurm": {"time": "1:2:3:4"}}, "slurm.time: "),
    ("slurm-mem-bad", {"slurm": {"mem": "lots"}}, "slurm.mem: 'lots' is not a SLURM memory size"),
    ("slurm-mem-zero", {"slurm": {"mem": "0G"}}, "slurm.mem: "),
    ("slurm-partition-shell", {"slurm": {"partition": "gpu;id"}}, "slurm.partition: "),
    ("slurm-account-subshell", {"slurm": {"account": "$(id)"}}, "slurm.account: "),
    ("slurm-qos-space", {"slurm": {"qos": "high prio"}}, "slurm.qos: "),
    ("slurm-constraint-quote", {"slurm": {"constraint": "a100'&&id"}}, "slurm.constraint: "),
    ("slurm-setup-newline", {"slurm": {"setup": ["module load x\nid"]}}, "slurm.setup"),
    ("slurm-signal-margin-small", {"slurm": {"signal_margin_s": 1}}, "slurm.signal_margin_s: "),
    ("slurm-requeues-negative", {"slurm": {"max_requeues": -1}}, "slurm.max_requeues: "),
    ("slurm-extra-reserved", {"slurm": {"extra_sbatch": {"nodes": 3}}}, "slurm.extra_sbatch: sbatch option 'nodes'"),
    ("slurm-extra-dashes", {"slurm": {"extra_sbatch": {"--mail-type": "END"}}}, "slurm.extra_sbatch: "),
    ("slurm-extra-newline", {"slurm": {"extra_sbatch": {"comment": "a\nb"}}}, "slurm.extra_sbatch: "),
    ("slurm-cpus-zero", {"slurm": {"cpus_per_task": 0}}, "slurm.cpus_per_task: "),
    ("sweep-empty-values", {"sweep": {"lr": []}}, "sweep: sweep.lr is empty"),
    ("sweep-duplicate", {"sweep": {"lr": [0.1, 0.1]}}, "sweep: sweep.lr repeats 0.1"),
    ("sweep-dashed-key", {"sweep": {"--lr": [0.1]}}, "sweep: "),
    ("sweep-also-in-args", {"args": {"lr": 0.1}, "sweep": {"lr": [0.1, 0.2]}}, "sweep.lr: also set in args"),
    ("unknown-top-key", {"gpu_per_node": 2}, "gpu_per_node: unknown key; did you mean 'gpus_per_node'?"),
    ("unknown-nested-key", {"distributed": {"backnd": "gloo"}}, "distributed.backnd: unknown key; did you mean 'backend'?"),
    ("unknown-slurm-key", {"slurm": {"partiton": "gpu"}}, "slurm.partiton: unknown key; did you mean 'partition'?"),
    ("executor-unknown", {"executor": "k8s"}, "executor: unknown executor 'k8s': use local, slurm or debug"),
    ("keep-last-zero", {"checkpoint": {"keep_last": 0}}, "checkpoint.keep_last: "),
    ("local-devices-dup", {"local": {"devices": [0, 0]}}, "local.devices: "),
    ("runs-dir-percent", {"runs_dir": "/data/%j"}, "runs_dir: "),
    ("runs-dir-newline", {"runs_dir": "/data/a\nb"}, "runs_dir: "),
    # Issue 7: one example per class (the generated tests in test_hostile_input.py cover the classes).
    ("partition-trailing-newline", {"slurm": {"partition": "gpu\n"}}, "slurm.partition: "),
    ("name-trailing-newline", {"name": "job\n"}, "name: "),
    ("python-empty", {"slurm": {"python": ""}}, "slurm.python: "),
    ("python-subshell", {"slurm": {"python": "x$(touch /tmp/p)"}}, "slurm.python: "),
    ("nodes-bool", {"nodes": True}, "nodes: Input should be a valid integer"),
    ("timeout-inf", {"distributed": {"init_timeout_s": float("inf")}}, "distributed.init_timeout_s: "),
    ("entry-not-python", {"entrypoint": "/etc/passwd"}, "entrypoint: '/etc/passwd' is not a Python script"),
    ("time-unquoted", {"slurm": {"time": 43200}}, "slurm.time: got the number 43200; YAML reads an unquoted"),
    ("time-absurd", {"slurm": {"time": "99999:99:99"}}, "slurm.time: "),
    ("time-too-long", {"slurm": {"time": "400-00:00:00"}}, "longer than a year"),
    ("mem-absurd", {"slurm": {"mem": "99999999999T"}}, "slurm.mem: "),
    ("port-above-range", {"distributed": {"port": 62000}}, "distributed.port: port 62000 is out of range"),
    ("margin-over-limit", {"slurm": {"time": "2", "signal_margin_s": 120}}, "slurm.signal_margin_s: 120s is not shorter"),
    ("extra-abbreviation", {"slurm": {"extra_sbatch": {"part": "x"}}}, "abbreviation sbatch would read as 'partition'"),
    ("extra-wait", {"slurm": {"extra_sbatch": {"wait": True}}}, "sbatch option 'wait' is set by the orchestrator"),
    ("arg-empty-name", {"args": {"": 1}}, "args: args key ''"),
    ("arg-dashed-name", {"args": {"-a": "resnet18"}}, "without the leading dashes"),
    ("args-as-list", {"args": ["a", "b"]}, "put positional arguments and short flags in extra_args"),
    ("arg-escape", {"args": {"x": "\x1b[31m"}}, "escape character"),
    ("sweep-same-argv", {"sweep": {"x": [1, "1"]}}, "sweep.x repeats '1' (as 1: the same command line)"),
    ("sweep-huge", {"sweep": {"a": list(range(101)), "b": list(range(100))}}, "the limit is 10000"),
    ("world-huge", {"nodes": 4096, "cpu_ranks_per_node": 256}, "the limit is 65536 ranks"),
    ("local-too-many", {"local": {"emulate_nodes": 100, "ranks_per_node": 100}}, "the limit on one machine is 128"),
    ("local-devices-nccl-short", {"gpus_per_node": 2, "nodes": 2, "local": {"devices": [0], "ranks_per_node": 2}},
     "local.devices: 1 GPU(s) for 4 local rank(s) with nccl"),
    ("extra-args-newline", {"extra_args": ["--x\nid"]}, "extra_args: "),
    # The red team's report (one example per class; test_hostile_input_api.py generates the classes).
    ("env-superscript-digit", {"env": {"OMP_NUM_THREADS": "\u00b2"}}, "env: OMP_NUM_THREADS is '²'"),
    ("arg-arabic-letter-mark", {"args": {"x": "a\u061cb"}}, "bidirectional control U+061C (ARABIC LETTER MARK)"),
    ("python-srun-option", {"slurm": {"python": "--overlap"}}, "slurm.python: '--overlap' starts with '-'"),
    ("workdir-unknown-user", {"workdir": "~no-such-user-orch/x"}, "names no user on this machine"),
    ("workdir-a-file", {"workdir": "/etc/hostname"}, "exists and is not a folder"),
    ("extra-sbatch-requeue", {"slurm": {"extra_sbatch": {"requeue": True}}}, "set slurm.max_requeues above 0"),
    ("workdir-a-device", {"workdir": "/dev/null"}, "exists and is not a folder"),
    ("entry-module-too-long", {"entrypoint": "pkg." + "m" * 300 + ":main"}, "exceeds the 255-byte limit"),
    ("entry-script-too-long", {"entrypoint": "./" + "s" * 300 + ".py"}, "a file or folder name holds at most 255"),
    ("checkpoint-dir-too-long", {"checkpoint": {"dir": "/c/" + "d" * 256}}, "checkpoint.dir: "),
    ("args-yaml-boolean-key", {"args": {False: True}}, "the key 'false' became the boolean False"),
    # The hostile-input review: sbatch options that hide the job id or put the job's agent in an image.
    ("extra-sbatch-quiet", {"slurm": {"extra_sbatch": {"quiet": True}}},
     "slurm.extra_sbatch: sbatch option --quiet is refused: it silences sbatch's 'Submitted batch job N' line"),
    ("extra-sbatch-quiet-short", {"slurm": {"extra_sbatch": {"Q": True}}}, "slurm.extra_sbatch: sbatch option -Q (--quiet)"),
    ("extra-sbatch-quiet-prefix", {"slurm": {"extra_sbatch": {"qui": True}}}, "slurm.extra_sbatch: 'qui' abbreviates --quiet"),
    ("extra-sbatch-container", {"slurm": {"extra_sbatch": {"container": "/bundles/torch"}}},
     "slurm.extra_sbatch: sbatch option --container is refused: it runs the whole batch script inside the image, "
     "and with it the job's agent"),
    ("extra-sbatch-container-prefix", {"slurm": {"extra_sbatch": {"contain": "/b"}}}, "set container: in the spec instead"),
    ("extra-sbatch-cluster-prefix", {"slurm": {"extra_sbatch": {"cluster": "other"}}}, "'cluster' abbreviates --clusters"),
    ("container-image-option", {"container": {"runtime": "apptainer", "image": "--fakeroot"}},
     "container.image: '--fakeroot' starts with '-', so apptainer would read it as an option"),
    ("container-python-words", {"container": {"runtime": "apptainer", "image": "/i.sif", "python": "python3 -u"}},
     "container.python: 'python3 -u' holds whitespace"),
    ("container-python-option", {"container": {"runtime": "pyxis", "image": "img", "python": "-c"}},
     "container.python: '-c' starts with '-'"),
    ("framework-extra-args-nodes", {"framework": "lightning", "extra_args": ["fit", "--trainer.num_nodes=4"]},
     "extra_args[1] --trainer.num_nodes: '4', but a local run of this spec is 1 node(s)"),
    ("framework-extra-args-processes", {"framework": "accelerate", "extra_args": ["--num_processes", "8"]},
     "extra_args[0] --num_processes: '8', but a local run of this spec is 1 node(s) x 1 rank(s): not 1 processes"),
    ("framework-superscript-nodes", {"framework": "lightning", "args": {"trainer.num_nodes": "\u00b2"}},
     "args.trainer.num_nodes: '²' (not ASCII digits: write the count as 0-9)"),
    ("framework-superscript-devices", {"framework": "fabric", "env": {"LT_DEVICES": "\u00b2"}},
     "env.LT_DEVICES: '²' (not ASCII digits"),
]


def _spec(changes: dict) -> dict:
    spec = dict(BASE)
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


def test_catalogue_is_large_and_unique() -> None:
    ids = [c[0] for c in CATALOGUE]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("case_id,changes,expected", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_bad_spec_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], case_id: str,
                             changes: dict, expected: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec(changes)))
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err, err
    assert str(path) in err  # the file is named
    assert "Traceback" not in err


def test_good_base_validates(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert main(["validate", str(path)]) == 0


def test_bad_override_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert main(["validate", str(path), "--set", "distributed.port=40000"]) == 2
    assert "distributed.port: port 40000" in capsys.readouterr().err
    assert main(["validate", str(path), "--set", "novalue"]) == 2
    assert "expected key.path=value" in capsys.readouterr().err


def test_unparseable_yaml_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: a\n  entrypoint: [\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "broken.yaml: cannot parse" in err and "line" in err


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "/nonexistent/spec.yaml"]) == 2
    assert "file not found" in capsys.readouterr().err


def test_cli_process_exits_2_without_traceback(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec({"distributed": {"backend": "nccl"}})))
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "validate", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "nccl needs GPUs" in proc.stderr and "Traceback" not in proc.stderr


def test_node_local_paths_declared_shared_are_accepted(tmp_path: Path) -> None:
    """slurm.assume_shared_paths is the escape for a cluster whose nodes share /tmp (one host)."""
    from orchestrator.spec.loading import spec_from_dict

    spec = spec_from_dict({"name": "shared", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2,
                           "runs_dir": "/tmp/runs", "checkpoint": {"dir": "/dev/shm/ck"},
                           "slurm": {"assume_shared_paths": True}})
    assert spec.slurm.assume_shared_paths
