"""The health gate (orchestrator.node.health), for real on this machine: folders, tokens, disk,
interfaces, GPU grants and the site's node_check. No SLURM: two "nodes" are two threads sharing
one run folder, and the GPU driver's listing is a folder the test makes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.node import health, shared_folders
from orchestrator.node.health import NodeHealth, check_node, health_dir, read_results, unhealthy, write_result

GPU_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "GPU_DEVICE_ORDINAL")


@pytest.fixture(autouse=True)
def _no_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No NVIDIA driver, whatever this machine has: each test says what the driver lists."""
    monkeypatch.setattr(health, "NVIDIA_GPUS_DIR", str(tmp_path / "no-driver"))


def _check(tmp_path: Path, node: str = "n1", agent: bool = True, **kwargs: Any) -> NodeHealth:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    kwargs.setdefault("checkpoint_dir", str(run / "checkpoints"))
    kwargs.setdefault("environ", {})
    kwargs.setdefault("token_wait_s", 0.3)
    if agent:  # the job agent's part, before the gate's tasks start
        shared_folders.write_agent_token(str(run), kwargs["checkpoint_dir"], 1, "agent-node")
    return check_node(node, str(run), attempt=1, **kwargs)


def test_a_healthy_node_passes_fast(tmp_path: Path) -> None:
    start = time.monotonic()
    h = _check(tmp_path, interface="lo")
    assert h.ok and h.problems == (), h
    assert time.monotonic() - start < 1.0 and h.seconds < 1.0, h
    assert (tmp_path / "run" / "checkpoints").is_dir()  # created, parents and all
    assert (health_dir(str(tmp_path / "run"), 1) / "agent" / "agent").read_text().startswith("agent-node ")
    assert sorted(p.name for p in health_dir(str(tmp_path / "run"), 1).iterdir()) == ["agent"]  # no token a node
    assert [p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".health-probe")] == []


def test_a_checkpoint_folder_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # mkdir under a file fails, also for root
    h = _check(tmp_path, checkpoint_dir=str(blocker / "ckpt"))
    assert not h.ok and len(h.problems) == 1, h
    assert "checkpoint folder" in h.problems[0] and str(blocker / "ckpt") in h.problems[0], h
    assert "ENOTDIR" in h.problems[0], h


def test_a_run_folder_that_is_a_file_is_named_once(tmp_path: Path) -> None:
    """No token can be looked for there, and that is not said a second time."""
    run = tmp_path / "run-file"
    run.write_text("x")
    ckpt = str(tmp_path / "ckpt")
    shared_folders.write_agent_token(str(run), ckpt, 1, "agent-node")  # the checkpoint folder's only
    h = check_node("n1", str(run), ckpt, 1, token_wait_s=0.3, environ={})
    assert not h.ok and len(h.problems) == 1 and "run folder" in h.problems[0], h
    assert h.seconds < 0.3, h  # no wait: the checkpoint folder's token was there, the run folder's not looked for


def test_a_node_that_does_not_see_the_agents_token_says_so_after_the_wait(tmp_path: Path) -> None:
    start = time.monotonic()
    h = _check(tmp_path, agent=False, token_wait_s=0.3)
    took = time.monotonic() - start
    assert not h.ok and len(h.problems) == 1 and h.unshared == ("runs_dir",), h
    assert h.problems[0].startswith("n1 does not see the job agent's health token under "), h
    assert "is runs_dir shared" in h.problems[0] and "0.3s" in h.problems[0], h
    assert 0.3 <= took < 1.5, took


def test_nodes_see_an_agent_token_written_after_they_started(tmp_path: Path) -> None:
    """The nodes look again until the token shows (a filesystem slow to show it): each waits for it,
    not the whole wait."""
    results: dict[str, NodeHealth] = {}

    def node(name: str) -> None:
        results[name] = _check(tmp_path, node=name, agent=False, token_wait_s=5.0)

    threads = [threading.Thread(target=node, args=(n,)) for n in ("a", "b")]
    start = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(0.3)
    shared_folders.write_agent_token(str(tmp_path / "run"), str(tmp_path / "run" / "checkpoints"), 1, "agent-node")
    for t in threads:
        t.join()
    assert results["a"].ok and results["b"].ok, results
    assert time.monotonic() - start < 3.0 and results["a"].seconds >= 0.2, results


def test_a_checkpoint_folder_of_its_own_must_be_shared_too(tmp_path: Path) -> None:
    """Three nodes share the run folder; the agent (on node a) wrote its token in the shared
    checkpoint folder. Node c's checkpoint folder is its own (node-local disk at another path here):
    c alone is blamed. With two nodes, b's folder its own: b is more than half of the nodes besides
    the agent's, so the folder is not one the nodes share, and both are blamed, with that line."""
    shared, local = tmp_path / "shared", tmp_path / "local-c"
    folders = {"runs_dir": str(tmp_path / "run"), "checkpoint.dir": str(shared)}
    shared_folders.write_agent_token(str(tmp_path / "run"), str(shared), 1, "a")
    results = {n: _check(tmp_path, node=n, agent=False, token_wait_s=0.5, checkpoint_dir=str(ckpt))
               for n, ckpt in (("a", shared), ("b", shared), ("c", local))}
    assert results["a"].ok and results["b"].ok, results
    assert results["c"].problems == (f"c does not see the job agent's health token under {local} after 0.5s: is "
                                     "checkpoint.dir shared between the nodes? (or that folder is unreadable there)",)
    assert results["c"].unshared == ("checkpoint.dir",)
    assert unhealthy(results, "a", folders) == {"c": results["c"].problems[0]}
    assert health.checkpoint_tokens(str(shared), 1).is_dir()  # hidden, for the agent to remove

    two = {"a": results["a"], "b": NodeHealth("b", False, results["c"].problems, 0.5, ("checkpoint.dir",))}
    bad = unhealthy(two, "a", folders)
    line = (f"checkpoint.dir {shared} is not one folder the nodes share: 1 of the 1 node(s) besides a (the job "
            "agent's) do not see what the agent wrote there; give checkpoint.dir a path on a filesystem every node mounts")
    assert bad == {"a": line, "b": f"{two['b'].problems[0]}; {line}"}, bad


def test_a_disk_floor_above_the_free_space_is_reported(tmp_path: Path) -> None:
    h = _check(tmp_path, disk_floor_mb=10**9)
    assert not h.ok and len(h.problems) == 1, h  # the run and checkpoint folders share one filesystem
    assert "free disk under" in h.problems[0] and f"floor of {10**9} MB" in h.problems[0], h
    assert "--disk-floor-mb" in h.problems[0], h


def test_a_missing_interface_is_named_with_those_the_node_has(tmp_path: Path) -> None:
    h = _check(tmp_path, interface="nosuchif9")
    assert not h.ok and len(h.problems) == 1, h
    assert "nosuchif9" in h.problems[0] and "lo" in h.problems[0].split("it has:")[1], h
    assert _check(tmp_path, interface="auto").ok
    assert _check(tmp_path, interface="nosuchif9,lo").ok is False  # every name must exist, as the ranks need


@pytest.mark.parametrize(("env", "ok"), [({"CUDA_VISIBLE_DEVICES": "0"}, False),
                                         ({"CUDA_VISIBLE_DEVICES": "0,1"}, True),
                                         ({"SLURM_STEP_GPUS": "0,1"}, True),
                                         ({"SLURM_JOB_GPUS": "3"}, False),
                                         ({"CUDA_VISIBLE_DEVICES": "0,-1,2"}, False),
                                         ({"CUDA_VISIBLE_DEVICES": ""}, False),
                                         ({}, False)])
def test_gpus_granted(tmp_path: Path, env: dict[str, str], ok: bool) -> None:
    h = _check(tmp_path, gpus=2, environ=env)
    assert h.ok is ok, h
    if not ok:
        assert len(h.problems) == 1 and "the job needs 2 per node" in h.problems[0], h
    assert _check(tmp_path, gpus=0, environ=env).ok  # no GPUs asked for: nothing to check


def test_gpus_the_driver_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = tmp_path / "driver-gpus"
    (driver / "0000:01:00.0").mkdir(parents=True)
    monkeypatch.setattr(health, "NVIDIA_GPUS_DIR", str(driver))
    h = _check(tmp_path, gpus=2, environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert not h.ok and "NVIDIA driver on n1 lists 1 GPU(s)" in h.problems[0], h
    (driver / "0000:02:00.0").mkdir()
    assert _check(tmp_path, gpus=2, environ={"CUDA_VISIBLE_DEVICES": "0,1"}).ok
    assert _check(tmp_path, gpus=2, environ={}).ok  # no variable: CUDA sees every GPU the driver lists


@pytest.mark.parametrize(("argv", "wanted"), [
    (["false"], ["recovery.node_check (false) failed on n1: exit code 1"]),
    (["sh", "-c", "echo fine; echo bad disk >&2; exit 3"], ["exit code 3: bad disk"]),
    (["/no/such/check-program"], ["program not found", "/no/such/check-program"]),
    (["sh", "-c", 'echo "node=$ORCH_HEALTH_NODE"; exit 5'], ["exit code 5: node=n1"]),
    (["sh", "-c", "kill -9 $$"], ["killed by SIGKILL"]),
])
def test_node_check_failures(tmp_path: Path, argv: list[str], wanted: list[str]) -> None:
    h = _check(tmp_path, node_check=argv)
    assert not h.ok and len(h.problems) == 1, h
    for text in wanted:
        assert text in h.problems[0], h


def test_node_check_passes_and_keeps_the_environment(tmp_path: Path) -> None:
    script = 'test "$ORCH_HEALTH_NODE" = n1 && test "$SITE" = yes'
    assert _check(tmp_path, node_check=["sh", "-c", script], environ={"SITE": "yes", "PATH": "/usr/bin:/bin"}).ok
    assert not _check(tmp_path, node_check=["sh", "-c", script], environ={"PATH": "/usr/bin:/bin"}).ok


def test_node_check_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "NODE_CHECK_TIMEOUT_S", 0.5)
    start = time.monotonic()
    h = _check(tmp_path, node_check=["sh", "-c", "echo checking; sleep 30; echo never"])
    assert time.monotonic() - start < 5.0  # the shell's sleep was killed with it
    assert not h.ok and "timed out after 0.5s: checking" in h.problems[0], h


def test_every_check_runs(tmp_path: Path) -> None:
    h = _check(tmp_path, agent=False, interface="nosuchif9", gpus=1, node_check=["false"], disk_floor_mb=10**9)
    assert len(h.problems) == 5, h


def test_results_round_trip_and_a_silent_node(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    good = NodeHealth("n1", True, (), 0.01)
    bad = NodeHealth("n2", False, ("disk full", "no GPU"), 0.5)
    assert write_result(run, 2, good) == health_dir(run, 2) / "n1.json"
    write_result(run, 2, bad)
    (health_dir(run, 2) / "n4.json").write_text('{"node": "n4", "ok": tr')  # torn: as good as absent
    got = read_results(run, 2, ["n1", "n2", "n3", "n4"])
    assert got["n1"] == good and got["n2"] == bad
    for silent in ("n3", "n4"):
        assert not got[silent].ok
        assert got[silent].problems == (
            f"the health check did not report from {silent} (it never started there, or died)",)
    assert unhealthy(got) == {"n2": "disk full; no GPU", "n3": got["n3"].problems[0], "n4": got["n4"].problems[0]}
    assert read_results(run, 1, ["n1"])["n1"].ok is False  # another attempt's folder


def test_main_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    for name in GPU_VARS:
        monkeypatch.delenv(name, raising=False)
    run = tmp_path / "run"
    run.mkdir()
    shared_folders.write_agent_token(str(run), str(run / "ckpt"), 3, "n1")
    args = ["--run-dir", str(run), "--checkpoint-dir", str(run / "ckpt"), "--attempt", "3",
            "--token-wait-s", "0.3", "--node-check-json", json.dumps(["sh", "-c", 'test "$ORCH_HEALTH_NODE" = n1'])]
    assert health.main(args) == 0
    assert capsys.readouterr().err == ""
    got = read_results(str(run), 3, ["n1", "n2"])
    assert got["n1"].ok and got["n1"].node == "n1", got
    assert unhealthy(got) == {"n2": "the health check did not report from n2 (it never started there, or died)"}

    assert health.main(args + ["--gpus", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("health: n1: no GPUs were granted on n1"), err
    again = read_results(str(run), 3, ["n1"])["n1"]
    assert not again.ok and again.problems[0] in err, again


def test_main_refuses_a_bad_node_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        health.main(["--run-dir", str(tmp_path), "--checkpoint-dir", str(tmp_path), "--attempt", "1",
                     "--node-check-json", '"false"'])
    assert exc.value.code == 2
    assert "list of strings" in capsys.readouterr().err


def test_the_wait_for_the_agents_token_lists_its_folder_less_and_less_often(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node lists one folder, which holds the agent's token alone: once when the token is there;
    waiting out the whole token wait, a bounded number of times (at once, after 0.01 s, then each
    pause half again as long, up to 0.5 s), not every 0.1 s."""
    listings: list[tuple[float, str]] = []
    real_listdir = shared_folders.os.listdir

    def counting(path: Any) -> list[str]:
        listings.append((time.monotonic(), str(path)))
        return real_listdir(path)

    monkeypatch.setattr(shared_folders.os, "listdir", counting)
    assert _check(tmp_path).ok
    agent_folder = str(health_dir(str(tmp_path / "run"), 1) / "agent")
    assert [p for _, p in listings] == [agent_folder]  # one listing, of a folder of one name
    listings.clear()
    h = _check(tmp_path, agent=False, token_wait_s=2.0, checkpoint_dir=str(tmp_path / "ckpt-elsewhere"))
    assert not h.ok and h.unshared == ("checkpoint.dir",), h  # the run folder's token is there from the first call
    times = [t for t, p in listings if p.endswith(".orch-health/attempt-1/agent")]
    pauses = [b - a for a, b in zip(times, times[1:])]
    assert 5 <= len(times) <= 15, (len(times), pauses)  # every 0.1 s: 20
    assert pauses[0] < 0.05 and all(p < 0.65 for p in pauses) and max(pauses) > 0.4, pauses


def test_the_gate_process_starts_lean_and_still_gives_a_verdict(tmp_path: Path) -> None:
    """The agent starts the gate with ``lean_module_argv``: no site (no .pth files, no editable
    finder), the package found by its folder, and none of what only a failing node or a
    node_check needs. What it leaves out is the gate's cost on every node of every attempt
    (docs/PERFORMANCE.md); each name here came back once through a shared import."""
    import subprocess
    import sys

    from orchestrator.core.interpreter import lean_module_argv

    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "gate_probe.py").write_text(
        "import sys\nimport orchestrator.node.health\n"
        "print(sys.flags.no_site, sorted(m for m in ('typing', 'orchestrator.core.records', 'subprocess', "
        "'socket', 'shutil', 'shlex', 'site') if m in sys.modules))\n")
    seen = subprocess.run(lean_module_argv(sys.executable, "gate_probe"), capture_output=True, text=True, cwd=tmp_path,
                          timeout=60, env={"PYTHONPATH": str(probes), "PATH": "/usr/bin:/bin"})
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.split(maxsplit=1) == ["1", "[]\n"], seen.stdout
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "json.py").write_text("raise SystemExit('the submit folder was imported')\n")
    shared_folders.write_agent_token(str(run), str(run / "ckpt"), 1, "n1")
    done = subprocess.run(lean_module_argv(sys.executable, "orchestrator.node.health", "--run-dir", str(run),
                                           "--checkpoint-dir", str(run / "ckpt"), "--attempt", "1",
                                           "--node-check-json", '["/bin/true"]'),
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={"SLURMD_NODENAME": "n1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert read_results(str(run), 1, ["n1"])["n1"].ok
