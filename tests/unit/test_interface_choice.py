"""Which socket interface NCCL and gloo get (issue 32, item 5): ``interface: auto`` leaves NCCL's
own choice and the user's or the site's NCCL_SOCKET_IFNAME alone, gloo keeps the interface that
reaches the master, a named interface still sets both, and ``plan`` says which and why.

The decision is one pure function (``netif.choose_interfaces``); these tests drive it directly,
then through the callers that build what ranks get (``plan``'s rows and line, a SLURM rank's
``rank_env_from_slurm``). NCCL's configuration files are read from temporary paths, never from
this machine's /etc or home folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.core import lean_record
from orchestrator.core import netif
from orchestrator.front.display import print_plan
from orchestrator.spec.loading import spec_from_dict
from orchestrator.core.netif import (GLOO_IFNAME, NCCL_IFNAME, NCCL_OWN_CHOICE, NcclConf, Route, choose_interfaces,
                                parse_nccl_conf, read_nccl_conf)
from orchestrator.core.payload import Payload
from orchestrator.plan import plan
from orchestrator.backends.slurm.slurm_plan import SLURM_RULES
from orchestrator.backends.slurm.node.slurm_task import rank_env_from_slurm
from orchestrator.node.rank_env import local_rank_env, rank_environment
from orchestrator.backends.slurm.node.slurm_task import SlurmTask

ETH0 = Route("eth0", "routes to the master node1")
LO_ONLY = Route("lo", "every rank runs on this machine", loopback_only=True)
NO_CONF = NcclConf()


@pytest.fixture(autouse=True)
def _no_site_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """This machine's /etc/nccl.conf, ~/.nccl.conf and socket variables never reach a test: the
    site's file is a temporary path, the home folder an empty temporary one."""
    etc, home = tmp_path / "etc-nccl.conf", tmp_path / "home"
    home.mkdir()
    monkeypatch.setattr(netif, "ETC_NCCL_CONF", str(etc))
    monkeypatch.setattr(netif, "_home_dir", lambda: str(home))
    for name in (NCCL_IFNAME, GLOO_IFNAME, "NCCL_CONF_FILE"):
        monkeypatch.delenv(name, raising=False)
    return {"etc": etc, "home": home}


def _spec(executor: str = "slurm", **fields: object):
    # runs_dir shared-looking: a SLURM plan refuses the default 'runs' from a checkout in /tmp.
    base: dict[str, object] = {"name": "iface", "entrypoint": "jobs.train:main", "nodes": 2, "gpus_per_node": 2,
                               "distributed": {"backend": "nccl"}, "executor": executor, "runs_dir": "/shared/runs"}
    base.update(fields)
    return spec_from_dict(base)


def _slurm_rank_env(payload: Payload) -> dict[str, str]:
    """What a rank of a one-node SLURM job on this machine adds to the environment it inherits
    (this process's); its master, localhost, is loopback here."""
    task = SlurmTask.from_environ({"SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "77", "SLURM_NTASKS": "2",
                                   "SLURM_JOB_NUM_NODES": "1", "SLURM_LOCALID": "0", "SLURM_PROCID": "0",
                                   "SLURM_NODEID": "0"})
    return rank_environment(rank_env_from_slurm(task, payload), payload, 0)


# ---- the decision --------------------------------------------------------------------------------

def test_auto_with_nccl_leaves_nccl_to_choose_and_gives_gloo_the_route() -> None:
    choice = choose_interfaces("auto", "nccl", {}, {}, NO_CONF, ETH0)
    assert choice.environ() == {GLOO_IFNAME: "eth0"}
    assert choice.nccl.uses is None and NCCL_OWN_CHOICE in choice.nccl.why
    assert choice.gloo.uses == "eth0" and choice.gloo.why == ETH0.why
    assert choose_interfaces(None, "nccl", {}, {}, NO_CONF, ETH0) == choice  # unset is auto


def test_only_loopback_names_lo_for_nccl_too() -> None:
    choice = choose_interfaces("auto", "nccl", {}, {}, NO_CONF, LO_ONLY)
    assert choice.environ() == {NCCL_IFNAME: "lo", GLOO_IFNAME: "lo"}
    assert choice.nccl.why == LO_ONLY.why


def test_env_in_the_spec_wins_for_the_variable_it_sets() -> None:
    spec_env = {NCCL_IFNAME: "ib0"}
    conf = NcclConf((("/etc/nccl.conf", ((NCCL_IFNAME, "eth9"),)),))
    for setting, route in (("auto", LO_ONLY), ("auto", ETH0), ("eth1", None)):
        choice = choose_interfaces(setting, "nccl", spec_env, {NCCL_IFNAME: "ib3"}, conf, route)
        assert NCCL_IFNAME not in choice.environ()  # env: sets it itself, as written
        assert choice.nccl.uses == "ib0" and f"env: sets {NCCL_IFNAME}=ib0" in choice.nccl.why
    gloo = choose_interfaces("eth1", "gloo", {GLOO_IFNAME: "eth2"}, {}, NO_CONF, None)
    assert gloo.environ() == {NCCL_IFNAME: "eth1"} and gloo.gloo.uses == "eth2"
    assert "wins over distributed.interface" in gloo.gloo.why


def test_an_inherited_nccl_socket_ifname_is_kept_even_over_loopback() -> None:
    for route in (ETH0, LO_ONLY):
        choice = choose_interfaces("auto", "nccl", {}, {NCCL_IFNAME: "ib0"}, NO_CONF, route)
        assert NCCL_IFNAME not in choice.environ() and choice.environ()[GLOO_IFNAME] == route.interface
        assert choice.nccl.uses == "ib0" and "your environment sets NCCL_SOCKET_IFNAME=ib0" in choice.nccl.why


def test_nccl_conf_is_kept_and_read_as_nccl_reads_it(_no_site_files: dict[str, Path]) -> None:
    etc, home = _no_site_files["etc"], _no_site_files["home"]
    etc.write_text("# the site\nNCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME=ib0\nNCCL_SOCKET_IFNAME=eth9\n")
    conf = read_nccl_conf({}, etc_path=str(etc), home=str(home))
    assert conf.setting(NCCL_IFNAME) == ("ib0", str(etc))  # NCCL's setenv(..., 0): the first line wins
    for route in (ETH0, LO_ONLY):
        choice = choose_interfaces("auto", "nccl", {}, {}, conf, route)
        assert NCCL_IFNAME not in choice.environ() and choice.nccl.uses == "ib0"
        assert f"{etc} sets NCCL_SOCKET_IFNAME=ib0" in choice.nccl.why
    # the user's ~/.nccl.conf comes before the site's; NCCL_CONF_FILE replaces ~/.nccl.conf
    (home / ".nccl.conf").write_text("NCCL_SOCKET_IFNAME=ib1\n")
    assert read_nccl_conf({}, etc_path=str(etc), home=str(home)).setting(NCCL_IFNAME) == ("ib1", str(home / ".nccl.conf"))
    own = home / "mine.conf"
    own.write_text("NCCL_SOCKET_IFNAME=ib2\n")
    assert read_nccl_conf({"NCCL_CONF_FILE": str(own)}, etc_path=str(etc), home=str(home)).setting(NCCL_IFNAME) == \
        ("ib2", str(own))
    # the environment wins over every file (NCCL never overwrites a variable that is set)
    choice = choose_interfaces("auto", "nccl", {}, {NCCL_IFNAME: "ib5"}, conf, ETH0)
    assert choice.nccl.uses == "ib5" and "your environment" in choice.nccl.why


def test_nccl_conf_lines_parse_as_nccl_parses_them(tmp_path: Path) -> None:
    assert parse_nccl_conf("#NCCL_SOCKET_IFNAME=eth0\nNCCL_SOCKET_IFNAME = ib0\nno equals sign\nA=b=c\n") == \
        (("NCCL_SOCKET_IFNAME ", " ib0"), ("A", "b=c"))
    assert NcclConf((("f", parse_nccl_conf("NCCL_SOCKET_IFNAME = ib0\n")),)).setting(NCCL_IFNAME) is None
    missing = read_nccl_conf({"NCCL_CONF_FILE": str(tmp_path / "nope")}, etc_path=str(tmp_path / "absent"),
                             home=str(tmp_path))
    assert missing == NcclConf()  # NCCL skips files it cannot open, and so do we


def test_a_named_interface_sets_both_over_the_users_and_the_sites() -> None:
    conf = NcclConf((("/etc/nccl.conf", ((NCCL_IFNAME, "ib0"),)),))
    choice = choose_interfaces("eth1", "nccl", {}, {GLOO_IFNAME: "eth7"}, conf, None)
    assert choice.environ() == {NCCL_IFNAME: "eth1", GLOO_IFNAME: "eth1"}
    assert "over NCCL_SOCKET_IFNAME=ib0 from /etc/nccl.conf" in choice.nccl.why
    assert "over GLOO_SOCKET_IFNAME=eth7 from your environment" in choice.gloo.why
    # an NCCL exclusion is NCCL's alone: gloo cannot take '^'
    excl = choose_interfaces("^docker0", "nccl", {}, {}, NO_CONF, None)
    assert excl.environ() == {NCCL_IFNAME: "^docker0"} and "export GLOO_SOCKET_IFNAME" in excl.gloo.why


def test_the_gloo_backend_still_gets_gloo_socket_ifname() -> None:
    choice = choose_interfaces("auto", "gloo", {}, {}, NO_CONF, ETH0)
    assert choice.environ() == {GLOO_IFNAME: "eth0"}
    assert choice.line().startswith("interface: gloo: eth0 (routes to the master node1) · ")


def test_a_users_gloo_socket_ifname_wins_under_auto() -> None:
    for backend in ("gloo", "nccl"):
        choice = choose_interfaces("auto", backend, {}, {GLOO_IFNAME: "eth3"}, NO_CONF, ETH0)
        assert GLOO_IFNAME not in choice.environ() and choice.gloo.uses == "eth3"
        assert "your environment sets GLOO_SOCKET_IFNAME=eth3" in choice.gloo.why


def test_auto_without_a_route_is_a_programming_error_named() -> None:
    with pytest.raises(ValueError, match="needs the route to the master"):
        choose_interfaces("auto", "nccl", {}, {}, NO_CONF, None)


# ---- what ranks get: plan's rows and a SLURM rank, built from the same decision -------------------

def test_slurm_plan_rows_leave_nccl_unset_under_auto_and_a_rank_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = plan(_spec())
    for row in launch.ranks:
        assert NCCL_IFNAME not in row.env and row.env[GLOO_IFNAME] == SLURM_RULES["interface"]
    # a rank of a one-node job whose master is loopback here: gloo gets lo, NCCL is still its own
    env = _slurm_rank_env(launch.payload)
    assert env[GLOO_IFNAME] == "lo" and NCCL_IFNAME not in env
    # with NCCL_SOCKET_IFNAME exported, the rank keeps it (nothing of ours replaces it)
    monkeypatch.setenv(NCCL_IFNAME, "ib0")
    assert NCCL_IFNAME not in _slurm_rank_env(launch.payload)


def test_slurm_named_interface_sets_both_on_the_rank_and_in_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NCCL_IFNAME, "ib0")
    launch = plan(_spec(distributed={"backend": "nccl", "interface": "lo"}))
    assert all(r.env[NCCL_IFNAME] == r.env[GLOO_IFNAME] == "lo" for r in launch.ranks)
    env = _slurm_rank_env(launch.payload)
    assert env[NCCL_IFNAME] == env[GLOO_IFNAME] == "lo"


def test_slurm_gloo_backend_rank_gets_gloo_socket_ifname(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = plan(_spec(gpus_per_node=0, cpu_ranks_per_node=2, distributed={"backend": "gloo"}))
    env = _slurm_rank_env(launch.payload)
    assert env[GLOO_IFNAME] == "lo" and NCCL_IFNAME not in env
    monkeypatch.setenv(GLOO_IFNAME, "eth3")
    assert GLOO_IFNAME not in _slurm_rank_env(launch.payload)  # the rank keeps the user's


def test_local_rows_name_lo_unless_the_user_or_the_site_named_one(_no_site_files: dict[str, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec("local", nodes=1, gpus_per_node=0, cpu_ranks_per_node=2, distributed={"backend": "gloo"})
    assert all(r.env[NCCL_IFNAME] == r.env[GLOO_IFNAME] == "lo" for r in plan(spec).ranks)
    _no_site_files["etc"].write_text("NCCL_SOCKET_IFNAME=ib0\n")
    launch = plan(spec)
    assert all(NCCL_IFNAME not in r.env and r.env[GLOO_IFNAME] == "lo" for r in launch.ranks)
    _no_site_files["etc"].unlink()
    monkeypatch.setenv(GLOO_IFNAME, "eth3")  # exported by the user: the ranks inherit it as it is
    assert all(r.env[NCCL_IFNAME] == "lo" and GLOO_IFNAME not in r.env for r in plan(spec).ranks)
    # env: in the payload (what the spec's env: becomes) is set as written, over lo
    payload = lean_record.replace(launch.payload, env={**launch.payload.env, NCCL_IFNAME: "ib9", GLOO_IFNAME: "eth4"})
    env = rank_environment(local_rank_env(payload, 0, 20001, None), payload, 0)
    assert env[NCCL_IFNAME] == "ib9" and env[GLOO_IFNAME] == "eth4"


# ---- plan's line ----------------------------------------------------------------------------------

def test_plan_says_which_interface_each_backend_uses_and_why(_no_site_files: dict[str, Path]) -> None:
    _no_site_files["etc"].write_text("NCCL_SOCKET_IFNAME=ib0\n")
    launch = plan(_spec())
    assert launch.interfaces == (
        f"interface: NCCL: ib0 (auto keeps it: {_no_site_files['etc']} sets NCCL_SOCKET_IFNAME=ib0) · "
        f"gloo (CPU side groups): {SLURM_RULES['interface']} (auto: found on each node when the job starts)")
    _no_site_files["etc"].unlink()
    assert plan(_spec()).interfaces == (
        f"interface: NCCL chooses (auto: {NCCL_OWN_CHOICE}) · "
        f"gloo (CPU side groups): {SLURM_RULES['interface']} (auto: found on each node when the job starts)")
    named = plan(_spec(distributed={"backend": "nccl", "interface": ["eth0", "ib0"]}))
    assert named.interfaces == ("interface: NCCL: eth0,ib0 (distributed.interface) · "
                                "gloo (CPU side groups): eth0,ib0 (distributed.interface)")
    local = plan(_spec("local", nodes=1, gpus_per_node=0, cpu_ranks_per_node=2, distributed={"backend": "gloo"}))
    assert local.interfaces == ("interface: gloo: lo (every rank runs on this machine) · if the script makes NCCL "
                                "groups, NCCL: lo (every rank runs on this machine)")
    console = Console(record=True, width=400, highlight=False, emoji=False)
    print_plan(launch, console=console)
    assert launch.interfaces in console.export_text()
