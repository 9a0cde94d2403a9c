"""The drain circuit breaker: hetpatrol holds its drain when many nodes of the same
partitions are already drained with its own reason within the window (a fleet-wide false
positive must not take a partition down). Rules on hand-written sinfo output, the policy
on a scripted Slurm, then the real slurmctld with nodes declared without a slurmd."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from dataclasses import replace

import pytest
import slurm_cluster as cl
from test_slurm_drain import NODE, FakeSlurm, report, settings

from hetpatrol.config import load_config
from hetpatrol.slurm.breaker import hold_reason, parse_sinfo
from hetpatrol.slurm.drain import DrainPolicy
from hetpatrol.slurm.settings import BreakerSettings, DrainSettings, SlurmSettings
from hetpatrol.tool import ToolOutput

NOW = dt.datetime(2026, 12, 1, 8, 0, 0).timestamp()


def stamp(minutes_ago: float) -> str:
    return dt.datetime.fromtimestamp(NOW - 60 * minutes_ago).strftime("%Y-%m-%dT%H:%M:%S")


def rows(drained: dict[str, float], total: int = 10) -> str:
    lines = [f"{NODE}|idle|Unknown|none"]
    for i in range(1, total):
        name = f"n{i:02d}"
        if name in drained:
            lines.append(f"{name}|drained|{stamp(drained[name])}|hetpatrol: xid 79 nvidia/3")
        else:
            lines.append(f"{name}|idle|Unknown|none")
    return "\n".join(lines) + "\n"


def test_one_node_of_ten_may_be_drained_in_the_window():
    b = BreakerSettings()
    assert hold_reason(parse_sinfo(rows({})), NODE, NOW, b) is None
    held = hold_reason(parse_sinfo(rows({"n01": 2})), NODE, NOW, b)
    assert held == (
        "circuit breaker: 1 of 10 nodes of its partitions drained by hetpatrol in the last "
        "600 s (n01); at most 1 (10%) may be: the drain is held, look at the fleet"
    )
    # older than the window, someone else's reason, not drained: not counted
    assert hold_reason(parse_sinfo(rows({"n01": 11})), NODE, NOW, b) is None
    admin = rows({}).replace("n02|idle|Unknown|none", f"n02|drained|{stamp(1)}|admin: dimm")
    assert hold_reason(parse_sinfo(admin), NODE, NOW, b) is None
    # a node listed in two partitions counts once; 30 nodes allow 3
    many = rows({"n01": 1, "n02": 1}, total=30) + rows({"n01": 1}, total=2)
    assert hold_reason(parse_sinfo(many), NODE, NOW, b) is None
    assert hold_reason(parse_sinfo(many), NODE, NOW, replace(b, max_share=0.05)) is not None


def test_a_small_partition_can_always_drain_one_node():
    b = BreakerSettings(max_share=0.10)
    assert hold_reason(parse_sinfo(rows({}, total=2)), NODE, NOW, b) is None
    assert hold_reason(parse_sinfo(rows({"n01": 0}, total=2)), NODE, NOW, b) is not None


def test_unreadable_lines_are_skipped():
    text = "garbage\n|||\n" + rows({"n01": 1})
    assert [r.name for r in parse_sinfo(text)][:2] == [NODE, "n01"]


class SlurmWithPartition(FakeSlurm):
    def __init__(self, sinfo: str | None):
        super().__init__()
        self.sinfo = sinfo

    def __call__(self, argv, timeout):
        if argv[0] == "sinfo":
            self.calls.append(list(argv))
            if self.sinfo is None:
                return ToolOutput(tuple(argv), "", "slurm_load_partitions: timeout", 1, False, 0)
            return ToolOutput(tuple(argv), self.sinfo, "", 0, False, 0.01)
        out = super().__call__(argv, timeout)
        if "show" in argv:
            out = replace(out, stdout=out.stdout.replace(" Weight=1", " Partitions=gpu Weight=1"))
        return out


def test_the_policy_holds_the_drain_says_so_once_and_the_gauge_shows_it(base_config):
    slurm = SlurmWithPartition(rows({"n01": 1, "n02": 3}))
    config = replace(base_config, node="host07", slurm=settings())
    policy = DrainPolicy(runner=slurm, clock=lambda: NOW)
    events = [json.loads(x) for x in policy.on_report(report("critical"), config)]
    assert [e["event"] for e in events] == ["drain_held"]
    assert events[0]["detail"].startswith("circuit breaker: 2 of 10 nodes of its partitions")
    assert slurm.updates == [] and policy.breaker_open
    assert ["sinfo", "-h", "-N", "-p", "gpu", "-o", "%N|%T|%H|%E"] in slurm.calls
    assert policy.on_report(report("critical", seq=2), config) == []  # said once
    policy.on_report(report("ok", seq=3), config)
    assert not policy.breaker_open


@pytest.mark.parametrize("sinfo", [None, ""])
def test_without_a_count_the_drain_goes_ahead(base_config, sinfo):
    slurm = SlurmWithPartition(sinfo)
    config = replace(base_config, node="host07", slurm=settings())
    events = [
        json.loads(x) for x in DrainPolicy(runner=slurm).on_report(report("critical"), config)
    ]
    assert [e["event"] for e in events] == ["drain"]


def test_switched_off(base_config):
    slurm = SlurmWithPartition(rows({"n01": 1, "n02": 1}))
    drain = DrainSettings(enabled=True, breaker=BreakerSettings(enabled=False))
    config = replace(base_config, slurm=replace(settings(), drain=drain))
    events = [
        json.loads(x) for x in DrainPolicy(runner=slurm).on_report(report("critical"), config)
    ]
    assert [e["event"] for e in events] == ["drain"]


def test_config_section_is_checked(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("slurm:\n  drain:\n    breaker:\n      max_share: 1.5\n")
    with pytest.raises(Exception, match=r"c.yaml:4: slurm.drain.breaker.max_share"):
        load_config(path)
    path.write_text("slurm:\n  drain:\n    breaker: {max_share: 0.2, window_seconds: 900}\n")
    b = load_config(path).slurm.drain.breaker
    assert (b.enabled, b.max_share, b.window_seconds, b.sinfo) == (True, 0.2, 900.0, ("sinfo",))


# ------------------------------------------------------------------ the real slurmctld
EXTRA = """NodeName=bk[01-09] NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=batch Nodes={node},bk[01-09] State=UP
"""


@pytest.fixture(scope="module")
def breaker_cluster():
    missing = [b for b in cl.BINARIES if shutil.which(b) is None]
    if missing:
        cl._fail_or_skip(f"not installed: {', '.join(missing)}")
    if os.geteuid() != 0:
        cl._fail_or_skip("the Slurm test cluster runs SlurmUser=root: run as root")
    cluster = cl.start_cluster(extra_conf=EXTRA.format(node=cl.NODE_NAME))
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.mark.slurm
@pytest.mark.slow
def test_the_real_slurmctld_holds_the_third_drain_of_ten(breaker_cluster, tmp_path):
    c = breaker_cluster
    sinfo = ["env", f"SLURM_CONF={c.conf}", shutil.which("sinfo") or "sinfo"]
    config = replace(
        load_config(),
        node=c.node,
        slurm=SlurmSettings(
            enabled=True,
            node_name=c.node,
            scontrol=tuple(c.scontrol_argv),
            gres_conf=None,
            drain=DrainSettings(
                enabled=True, breaker=BreakerSettings(max_share=0.2, sinfo=tuple(sinfo))
            ),
        ),
    )
    for name in ("bk01", "bk02"):
        c.scontrol("update", f"NodeName={name}", "State=DRAIN", "Reason=hetpatrol: xid 79 nvidia/0")
    events = [json.loads(x) for x in DrainPolicy().on_report(report("critical"), config)]
    assert [e["event"] for e in events] == ["drain_held"], events
    assert events[0]["detail"].startswith(
        "circuit breaker: 2 of 10 nodes of its partitions drained by hetpatrol in the last 600 s"
    )
    assert "drain" not in c.state()
    # an admin's drain is not hetpatrol's: after one of ours is released, ours may drain
    c.scontrol("update", "NodeName=bk02", "State=DRAIN", "Reason=admin: dimm swap")
    events = [json.loads(x) for x in DrainPolicy().on_report(report("critical"), config)]
    assert [e["event"] for e in events] == ["drain"], events
    assert c.state().startswith("drain")
