"""`validate --cluster` for GPU types and node selection: the GRES and host-list parsing, and the
check itself against a stand-in scontrol that prints what SLURM 22.05 prints.

The host-list cases are what `scontrol show hostnames` of SLURM 22.05.8 printed on this project's
machine; where scontrol is installed, generated host lists are also compared with it directly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import SpecError
from orchestrator.backends.slurm.slurm_checks import (
    MAX_HOSTS,
    check_against_cluster,
    expand_hostlist,
    gres_gpus,
)
from orchestrator.spec.loading import spec_from_dict

SETTINGS = settings(max_examples=200, deadline=None, derandomize=os.environ.get("CI") == "true")


# ---- GRES strings ------------------------------------------------------------------------------
@pytest.mark.parametrize("gres, gpus", [
    ("gpu:a100:2", {"a100": 2}),                      # the deploy cluster (scontrol show node, sinfo %G)
    ("gpu:2", {None: 2}),                             # untyped
    ("gpu", {None: 1}),                               # slurm.conf's Gres=gpu means one
    ("(null)", {}),
    ("", {}),
    ("gpu:a100:4(S:0-1)", {"a100": 4}),               # socket affinity, as scontrol shows it
    ("gpu:a100:2(S:0,1),gpu:v100:1(S:1)", {"a100": 2, "v100": 1}),  # a comma inside the parentheses
    ("gpu:a100:2,gpu:a100:2", {"a100": 4}),
    ("mps:400K,gpu:h100:8(S:0-1)", {"h100": 8}),      # other GRES are not GPUs
    ("shard:8,gpu:1g.5gb:7", {"1g.5gb": 7}),          # a MIG profile type
    ("gpu:no_consume:2", {None: 2}),
    ("gpus:2", {}),                                   # another GRES name, not 'gpu'
])
def test_gres_gpus(gres: str, gpus: dict[Any, int]) -> None:
    assert gres_gpus(gres) == gpus


_TYPES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,11}", fullmatch=True).filter(lambda t: not t.isdigit())
_ITEM = st.tuples(st.sampled_from(["gpu", "mps", "shard", "nic"]), st.none() | _TYPES,
                  st.integers(1, 4096), st.sampled_from(["", "(S:0)", "(S:0-1)", "(S:0,1)"]))


@SETTINGS
@given(st.lists(_ITEM, max_size=6))
def test_gres_gpus_sums_the_gpu_items_by_type(items: list[tuple[str, Any, int, str]]) -> None:
    text = ",".join(f"{name}:{kind}:{n}{sockets}" if kind else f"{name}:{n}{sockets}"
                    for name, kind, n, sockets in items)
    expected: dict[Any, int] = {}
    for name, kind, n, _ in items:
        if name == "gpu":
            expected[kind] = expected.get(kind, 0) + n
    assert gres_gpus(text) == expected


# ---- host lists --------------------------------------------------------------------------------
@pytest.mark.parametrize("text, hosts", [  # scontrol show hostnames, SLURM 22.05.8
    ("node1", ["node1"]),
    ("gpu[01-04]", ["gpu01", "gpu02", "gpu03", "gpu04"]),
    ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
    ("gpu[09-10]", ["gpu09", "gpu10"]),
    ("gpu[001-3]", ["gpu001", "gpu002", "gpu003"]),
    ("n[02-3]", ["n02", "n03"]),
    ("n[2-03]", ["n2", "n3"]),                        # the low end sets the width
    ("n[00]", ["n00"]),
    ("n[1-2],m[3,5-6]", ["n1", "n2", "m3", "m5", "m6"]),
    ("n[1,1]", ["n1", "n1"]),
    ("a-[1-2]", ["a-1", "a-2"]),
    ("n[1-2],", ["n1", "n2"]),
    (",n1", ["n1"]),
    ("[1-2]", ["1", "2"]),
    ("n[1-2]x[3]", ["n1x3", "n2x3"]),
    ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    ("Node1", ["Node1"]),
])
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", [  # SLURM 22.05.8 refuses these: "Invalid hostlist"
    "gpu[01-02]a", "gpu[1-2]-ib", "n[1-2]x", "n[1-2]x[1-2]y", "n[3-1]", "n[]",
    # SLURM reads these two as single odd names ("n]", "n1]"); no node is called that
    "n[1-2", "n1]",
])
def test_expand_hostlist_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="host list|backwards|not a number"):
        expand_hostlist(text)


def test_expand_hostlist_refuses_huge_ranges_before_expanding() -> None:
    with pytest.raises(ValueError, match=f"more than {MAX_HOSTS}"):
        expand_hostlist("n[0-999999]")
    with pytest.raises(ValueError, match=f"more than {MAX_HOSTS}"):
        expand_hostlist("n[0-999]x[0-999]")


_PREFIX = st.from_regex(r"[a-z][a-z0-9\-]{0,6}[a-z\-]", fullmatch=True)
_RANGE = st.tuples(st.integers(0, 120), st.integers(0, 30), st.integers(1, 4))  # lo, length - 1, width


def _render(prefix: str, ranges: list[tuple[int, int, int]]) -> tuple[str, list[str]]:
    body = ",".join(f"{lo:0{w}d}" if n == 0 else f"{lo:0{w}d}-{lo + n}" for lo, n, w in ranges)
    hosts = [f"{prefix}{i:0{w}d}" for lo, n, w in ranges for i in range(lo, lo + n + 1)]
    return f"{prefix}[{body}]", hosts


@SETTINGS
@given(st.lists(st.tuples(_PREFIX, st.lists(_RANGE, min_size=1, max_size=3)), min_size=1, max_size=4))
def test_expand_hostlist_generated(groups: list[tuple[str, list[tuple[int, int, int]]]]) -> None:
    rendered = [_render(prefix, ranges) for prefix, ranges in groups]
    assert expand_hostlist(",".join(text for text, _ in rendered)) == [h for _, hosts in rendered for h in hosts]


@pytest.fixture(scope="module")
def scontrol_conf(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A minimal slurm.conf: `scontrol show hostnames` needs one to parse, but no controller."""
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed (deploy/cluster.sh installs it)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=ALL\n")
    return str(conf)


@settings(max_examples=25, deadline=None, derandomize=os.environ.get("CI") == "true")
@given(st.lists(st.tuples(_PREFIX, st.lists(_RANGE, min_size=1, max_size=3)), min_size=1, max_size=3))
def test_expand_hostlist_agrees_with_scontrol(scontrol_conf: str,
                                              groups: list[tuple[str, list[tuple[int, int, int]]]]) -> None:
    text = ",".join(_render(prefix, ranges)[0] for prefix, ranges in groups)
    out = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "SLURM_CONF": scontrol_conf}, check=True)
    assert expand_hostlist(text) == out.stdout.split()


# ---- the check, against a stand-in scontrol ------------------------------------------------------
PARTITIONS = ("PartitionName=debug AllowGroups=ALL Default=YES MaxTime=UNLIMITED Nodes=node[1-2] State=UP\n"
              "PartitionName=big AllowGroups=ALL Default=NO MaxTime=UNLIMITED Nodes=node[1-4] State=UP\n")


def _node(name: str, gres: str, partitions: str) -> str:  # the fields scontrol show node -o prints, abridged
    return (f"NodeName={name} Arch=x86_64 CoresPerSocket=4  CPUAlloc=0 CPUTot=4 AvailableFeatures=(null) "
            f"Gres={gres} NodeAddr={name} Version=22.05.8 OS=Linux 6.1 #1 SMP  RealMemory=8000 State=IDLE "
            f"Partitions={partitions}  CfgTRES=cpu=4,mem=8000M,billing=4\n")


NODES = (_node("node1", "gpu:a100:2", "debug,big") + _node("node2", "gpu:a100:2", "debug,big")
         + _node("node3", "gpu:v100:4(S:0-1),gpu:a100:1(S:0)", "big") + _node("node4", "(null)", "big"))


@pytest.fixture
def fake_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "partition").write_text(PARTITIONS)
    (tmp_path / "node").write_text(NODES)
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\ncase \"$2\" in partition) cat {tmp_path}/partition ;; "
                                      f"node) cat {tmp_path}/node ;; *) echo MaxArraySize=1001 ;; esac\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def _check(**fields: Any) -> list[str]:
    slurm = fields.pop("slurm", {})
    spec = spec_from_dict({"name": "v", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 1,
                           "runs_dir": "/shared/runs",  # not the default 'runs', refused from a checkout in /tmp
                           "gpus_per_node": 2, "distributed": {"backend": "gloo"}, "slurm": slurm, **fields})
    try:
        check_against_cluster(spec)
    except SpecError as exc:
        return exc.problems
    return []


@pytest.mark.usefixtures("fake_scontrol")
def test_typed_requests_that_fit_pass() -> None:
    assert _check(nodes=2, slurm={"gpu_type": "a100"}) == []
    assert _check(nodes=2) == []                                       # untyped asks match typed GPUs
    assert _check(gpus_per_node=4, slurm={"gpu_type": "v100", "partition": "big"}) == []
    assert _check(nodes=2, slurm={"gpu_type": "a100", "nodelist": "node[1-2]"}) == []
    assert _check(slurm={"gpu_type": "a100", "exclude": "node1"}) == []


@pytest.mark.usefixtures("fake_scontrol")
def test_a_type_the_partition_lacks_names_the_types_it_has() -> None:
    [problem] = _check(slurm={"gpu_type": "h100"})
    assert problem.startswith("slurm.gpu_type: partition debug has no 'h100' GPUs"), problem
    assert "a100 (up to 2 per node, on 2 node(s))" in problem and "set slurm.gpu_type to one of a100" in problem
    [problem] = _check(slurm={"gpu_type": "h100", "partition": "big"})
    assert "a100 (up to 2 per node, on 3 node(s)), v100 (up to 4 per node, on 1 node(s))" in problem, problem


@pytest.mark.usefixtures("fake_scontrol")
def test_a_type_in_another_case_is_refused_with_the_spelling() -> None:
    [problem] = _check(slurm={"gpu_type": "A100"})  # sbatch 22.05 refuses A100 on a100 nodes
    assert "did you mean slurm.gpu_type: a100?" in problem and "case-sensitively" in problem, problem


@pytest.mark.usefixtures("fake_scontrol")
def test_more_typed_gpus_than_a_node_has() -> None:
    [problem] = _check(gpus_per_node=3, slurm={"gpu_type": "a100", "partition": "big"})
    assert problem.startswith("gpus_per_node: 3 a100 GPU(s) requested but partition big's nodes have at most 2"), problem
    # v100 x4 exists on one node of big only
    [problem] = _check(nodes=2, gpus_per_node=4, slurm={"gpu_type": "v100", "partition": "big"})
    assert problem.startswith("nodes: 2 requested with 4 v100 GPU(s) each, but only 1 node(s)"), problem
    assert "node3" in problem


@pytest.mark.usefixtures("fake_scontrol")
def test_untyped_gpus_do_not_answer_a_typed_request(tmp_path: Path) -> None:
    (tmp_path / "node").write_text(_node("node1", "gpu:2", "debug") + _node("node2", "gpu:2", "debug"))
    [problem] = _check(slurm={"gpu_type": "a100"})
    assert "its nodes have untyped GPUs only; remove slurm.gpu_type" in problem, problem
    assert _check(nodes=2) == []


@pytest.mark.usefixtures("fake_scontrol")
def test_unknown_hosts_are_named() -> None:
    [problem] = _check(nodes=3, slurm={"nodelist": "node[2-3],gpu7", "partition": "big"})  # node3 exists
    assert problem.startswith("slurm.nodelist: gpu7 is not a node of this cluster"), problem
    assert "nodes here: node1, node2, node3, node4" in problem
    problems = _check(slurm={"exclude": "node[5-6]"})
    assert problems == [p for p in problems if p.startswith("slurm.exclude: node5, node6 are not nodes")], problems


@pytest.mark.usefixtures("fake_scontrol")
def test_node_selection_against_the_request() -> None:
    # A node list longer than nodes, or overlapping exclude, is refused by the spec itself
    # (tests/unit/test_spec_fields.py), before any cluster is asked.
    [problem] = _check(slurm={"nodelist": "node3"})
    assert problem.startswith("slurm.nodelist: node3 not in partition debug"), problem
    [problem] = _check(nodes=2, slurm={"exclude": "node2"})
    assert problem.startswith("slurm.exclude: leaves 1 of partition debug's 2 node(s), fewer than nodes: 2"), problem
    [problem] = _check(slurm={"partition": "big", "gpu_type": "a100", "nodelist": "node3"})
    assert problem.startswith("slurm.nodelist: node3 has fewer than 2 a100 GPU(s); nodes that fit: node1, node2"), problem
    [problem] = _check(nodes=2, slurm={"partition": "big", "gpu_type": "a100", "exclude": "node1"})
    assert "only 1 node(s) of partition big have them once slurm.exclude is applied: node2" in problem, problem
