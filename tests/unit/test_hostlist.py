"""The project's one SLURM host-list parser (orchestrator.core.hostlist), and every caller using it:
five parsers once disagreed on 4 of 9 expressions (issue 34). The cases were checked against
``scontrol show hostnames`` (22.05); tests/unit/test_slurm_checks_gres.py compares generated lists
with it, and tests/cluster/test_hostlist_scontrol.py on the cluster, multi-bracket lists included."""

from __future__ import annotations

import pytest

from orchestrator.node import container
from orchestrator.core import hostlist
from orchestrator.spec import validators
from orchestrator.backends.slurm import slurm_checks
from orchestrator.backends.slurm.node.slurm_controller import controller_hosts as _hostnames
from orchestrator.backends.slurm.node.slurm_task import expand_nodelist

AGREED = [  # what scontrol show hostnames prints, checked by hand on SLURM 22.05
    ("gpu-[1-2]-[3-4]", ["gpu-1-3", "gpu-1-4", "gpu-2-3", "gpu-2-4"]),
    ("n[1-2]x[3]", ["n1x3", "n2x3"]),
    ("n[01-03]", ["n01", "n02", "n03"]),
    ("n[1-3,5],m7", ["n1", "n2", "n3", "n5", "m7"]),
    ("a[1-2],b[9-11]", ["a1", "a2", "b9", "b10", "b11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    ("x", ["x"]),
]
REFUSED = ["n[1-2]a", "n[3-1]", "n[a-b]", "gpu[1-2]-ib", "n[]"]


@pytest.mark.parametrize("text,hosts", AGREED)
def test_every_caller_expands_as_scontrol_does(text: str, hosts: list[str]) -> None:
    assert hostlist.expand(text) == hosts
    assert hostlist.count(text) == len(hosts)
    assert expand_nodelist(text) == hosts  # the agent's and the ranks' SLURM_JOB_NODELIST
    assert _hostnames(text) == hosts  # the agent's ExcNodeList
    assert container._hosts(text) == hosts  # a container task's node list
    assert slurm_checks.expand_hostlist(text) == hosts  # validate --cluster
    assert validators.hostlist(text) == text and validators.hostlist_hosts(text) == set(hosts)  # the spec


@pytest.mark.parametrize("text", REFUSED)
def test_every_caller_refuses_what_scontrol_refuses(text: str) -> None:
    for parse in (hostlist.expand, hostlist.count, slurm_checks.expand_hostlist, validators.hostlist):
        with pytest.raises(ValueError):
            parse(text)


def test_huge_lists_are_counted_not_expanded() -> None:
    assert hostlist.count("n[0-999999]x[0-999]") == 1_000_000_000
    assert validators.hostlist_hosts("n[1-999999]") is None
    with pytest.raises(ValueError, match="more than"):
        hostlist.expand("n[0-999999]")


@pytest.mark.parametrize("text", ["n1;reboot", "n[1-2] ", "$(x)", "", ",", "-n1", "n1,,-x"])
def test_the_spec_refuses_what_is_no_host_list(text: str) -> None:
    with pytest.raises(ValueError, match="not a SLURM host list"):
        validators.hostlist(text)
