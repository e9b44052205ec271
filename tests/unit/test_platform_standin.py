"""Every module imports on macOS, and native Windows gets one line: checked without a Mac or a
Windows machine, under the stand-ins of ``tests/integration/macos_standin.py`` (Linux-only names
removed from ``signal``, ``os``, ``select`` and the C library; the platform decided as macOS or
Windows), in a subprocess each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core import platform_caps
from tests.integration.macos_standin import REPO, hidden_proc_argv, proc_can_be_hidden, shim_dir, standin_env

#: Imports every module of orchestrator/ and jobs/ (the packages' own walk: a module added later is
#: imported too), then reports what the platform decided and every failure, as JSON.
IMPORT_ALL = r"""
import importlib, json, pkgutil, signal, sys, traceback
import orchestrator, jobs
failed, names = {}, []
for package in (orchestrator, jobs):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.endswith("__main__"):
            continue  # runs the CLI: imported by the CLI test below
        names.append(info.name)
        try:
            importlib.import_module(info.name)
        except BaseException:
            failed[info.name] = traceback.format_exc(limit=-3)
from orchestrator import platform_caps, procs, stack_requests
print(json.dumps({"failed": failed, "names": names, "caps": platform_caps.summary(),
                  "rtmin": hasattr(signal, "SIGRTMIN"), "table": procs.table().name,
                  "stack_signal": stack_requests.STACK_SIGNAL, "sigurg": int(signal.SIGURG)}))
"""


def _import_everything(tmp_path: Path, hide_proc: bool) -> dict:
    env = standin_env(shim_dir(tmp_path / "shim"))
    argv = [sys.executable, "-c", IMPORT_ALL]
    out = subprocess.run(hidden_proc_argv(argv) if hide_proc else argv, capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _assert_macos_decisions(result: dict) -> None:
    assert not result["failed"], "\n".join(f"{name}:\n{tb}" for name, tb in result["failed"].items())
    assert len(result["names"]) > 60 and "orchestrator.backends.local.zygote" in result["names"]
    assert "jobs.train" in result["names"]
    caps = result["caps"]
    assert result["rtmin"] is False  # the stand-in took the names away
    assert caps["system"] == "darwin" and caps["prctl"] is False and caps["fork_after_torch_safe"] is False
    assert caps["stack_signal"] == "SIGURG" and result["stack_signal"] == result["sigurg"]
    assert caps["stack_signal_harmless"] is True


def test_every_module_imports_under_the_macos_standin(tmp_path: Path) -> None:
    result = _import_everything(tmp_path, hide_proc=False)
    _assert_macos_decisions(result)
    assert result["table"] == "proc"  # /proc is still there: the same run reads it


def test_every_module_imports_without_proc(tmp_path: Path) -> None:
    reason = proc_can_be_hidden()
    if reason:
        pytest.skip(reason)
    result = _import_everything(tmp_path, hide_proc=True)
    _assert_macos_decisions(result)
    # psutil reads /proc on Linux: nothing can read a process here, and the platform says so
    assert result["caps"]["proc"] is False and result["caps"]["process_table"] is None
    assert result["table"] == "none"
    assert any("pip install psutil" in limit for limit in result["caps"]["local_limits"])


def test_native_windows_gets_one_line_pointing_to_wsl2(tmp_path: Path) -> None:
    env = standin_env(shim_dir(tmp_path / "shim", windows=True))
    (tmp_path / "spec.yaml").write_text("name: w\nentrypoint: train.py\n")
    for argv in (["validate", "spec.yaml"], ["run", "spec.yaml"], ["status"]):
        out = subprocess.run([sys.executable, "-m", "orchestrator", *argv], capture_output=True, text=True,
                             timeout=120, env=env, cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "WSL2" in lines[0], out.stderr
        assert "Traceback" not in out.stderr and out.stdout == ""
    api = subprocess.run([sys.executable, "-c", "import orchestrator\ntry:\n    from orchestrator import run\n"
                          "except ImportError as exc:\n    print(exc)\n"], capture_output=True, text=True,
                         timeout=120, env=env, cwd=tmp_path)
    assert api.returncode == 0 and "WSL2" in api.stdout and "fcntl" not in api.stdout, api.stderr


def test_the_windows_standin_really_lacks_posix_modules(tmp_path: Path) -> None:
    """The test above means something only if fcntl is really gone under the stand-in."""
    env = standin_env(shim_dir(tmp_path / "shim", windows=True))
    out = subprocess.run([sys.executable, "-c", "import fcntl"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode != 0 and "ModuleNotFoundError: import of fcntl halted" in out.stderr


#: Names that exist only on some platforms (code only: strings and comments may mention them).
PLATFORM_NAMES = {"SIGRTMIN", "SIGRTMAX", "SIGINFO", "prctl", "sched_getaffinity"}


def _platform_names_in(path: Path) -> list[str]:
    """Where a module's code (not its strings or comments) names a platform-only attribute or
    branches on ``sys.platform``."""
    import tokenize

    with path.open("rb") as fh:
        tokens = [t for t in tokenize.tokenize(fh.readline) if t.type == tokenize.NAME or t.string == "."]
    found = []
    for i, tok in enumerate(tokens):
        dotted = i >= 2 and tokens[i - 1].string == "." and tokens[i - 2].string == "sys"
        if tok.string in PLATFORM_NAMES or (tok.string == "platform" and dotted):
            found.append(f"{tok.start[0]}: {tok.line.strip()}")
    return found


def test_only_platform_caps_and_procs_touch_platform_names() -> None:
    """One module decides what the platform can do (platform_caps), one wraps prctl (procs): a
    branch on sys.platform or a real-time signal anywhere else would escape the stand-in. (The
    CPU-affinity callers in plan_model and rank_env guard it with a fallback already, and are listed.)"""
    allowed = {"orchestrator/core/platform_caps.py", "orchestrator/core/procs.py"}
    guarded = {"orchestrator/plan/plan_model.py": ["sched_getaffinity"], "orchestrator/node/rank_env.py": ["sched_getaffinity"]}
    found = []
    for root in ("orchestrator", "jobs"):
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in allowed:
                continue
            for hit in _platform_names_in(path):
                if not any(name in hit for name in guarded.get(rel, [])):
                    found.append(f"{rel}:{hit}")
    assert not found, "\n".join(found)


def test_the_name_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('import signal, sys\n"SIGRTMIN in a string"  # and sys.platform in a comment\n'
                     'x = signal.SIGRTMIN\nif sys.platform == "darwin":\n    pass\n')
    assert [hit.split(":")[0] for hit in _platform_names_in(probe)] == ["3", "4"]


def test_this_linux_keeps_every_capability() -> None:
    """On the Linux these tests run on, nothing changes: /proc, prctl, SIGRTMIN+4, forks."""
    import signal

    caps = platform_caps.summary()
    assert caps["system"] == "linux" and caps["proc"] and caps["prctl"] and caps["process_table"] == "proc"
    assert caps["fork_after_torch_safe"] and caps["local_limits"] == [] and caps["loopback"] == "lo"
    assert platform_caps.stack_signal().number == signal.SIGRTMIN + 4
    assert platform_caps.local_limits_line() is None
