"""hetpatrol against a real slurmctld + slurmd (tests/slurm_cluster.py): GRES check, drain,
resume, an admin's drain left alone, dry run. The node is registered as
``Gres=gpu:a100:8,ascend:910b:8`` under NodeName ``hp-gpu01`` (not the host name)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import slurm_cluster as cluster
from prometheus_client.parser import text_string_to_metric_families

from hetpatrol.config import load_config
from hetpatrol.daemon import Daemon
from hetpatrol.patrol import Patroller
from hetpatrol.schema import jsonl_json_schema
from hetpatrol.slurm.gres import gres_conf_for_node, parse_gres_conf
from hetpatrol.slurm.settings import DrainSettings, SlurmSettings

pytestmark = pytest.mark.slurm

# the session's cluster (started once) and the per-test "node idle, no reason" fixture
slurm_cluster = cluster.slurm_cluster
slurm_node = cluster.slurm_node
NODES, make_replay = cluster.NODES, cluster.make_replay

VALIDATOR = jsonschema.Draft202012Validator(jsonl_json_schema())


def slurm_config(cluster, tmp_path: Path, *, drain: bool = True, dry_run: bool = False):
    config = load_config()
    return replace(
        config,
        node="mixed-node",
        listen=None,
        jsonl_path=tmp_path / "patrol.jsonl",
        state_path=tmp_path / "state.json",
        slurm=SlurmSettings(
            enabled=True,
            node_name=cluster.node,
            scontrol=tuple(cluster.scontrol_argv),
            timeout_seconds=10,
            gres_conf=cluster.gres_conf,
            registration_cache_seconds=300,
            drain=DrainSettings(enabled=drain, dry_run=dry_run, resume_after_patrols=2),
        ),
    )


def read_lines(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        VALIDATOR.validate(line)
    return lines


def events(path: Path) -> list[dict]:
    return [line for line in read_lines(path) if line["kind"] == "event"]


def use_replay(daemon: Daemon, replay: Path) -> None:
    """The node's cards change: the patroller now reads another replay directory."""
    daemon.patroller.close()
    daemon.patroller = Patroller(daemon.config, replay_dir=replay)
    daemon.replay_dir = replay


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    base = tmp_path_factory.mktemp("replays")
    return {
        "healthy": make_replay(base / "a100x8", 8),
        "six": make_replay(base / "a100x6", 6),
        "sick": NODES / "sick-mixed",
    }


def test_gres_registration_matches_gres_conf(slurm_node):
    """The cluster's own gres.conf (File= ranges) reads as the registration scontrol shows."""
    reg = slurm_node.scontrol("show", "node", "-o", slurm_node.node)
    assert "Gres=gpu:a100:8,ascend:910b:8" in reg
    conf = gres_conf_for_node(parse_gres_conf(slurm_node.gres_conf.read_text()), slurm_node.node)
    assert {(e.name, e.type, e.count) for e in conf.entries} == {
        ("gpu", "a100", 8),
        ("ascend", "910b", 8),
    }


def test_gres_mismatch_six_of_eight_gpus(slurm_node, replays, tmp_path):
    """The registration is read for this node alone: slurmctld logs (at debug2) one
    REQUEST_NODE_INFO_SINGLE (sinfo --nodes=<node>) and no REQUEST_NODE_INFO (the whole
    node table, which scontrol show node <node> loads)."""
    log = slurm_node.root / "log" / "slurmctld.log"
    with slurm_node.explain():
        config = slurm_config(slurm_node, tmp_path, drain=False)
        daemon = Daemon(config, replay_dir=replays["six"])
        slurm_node.run("scontrol", "setdebug", "debug2")  # each RPC logged (put back below)
        try:
            seen = len(log.read_text())
            report = daemon.patrol_once()
            rpcs = log.read_text()[seen:]
        finally:
            slurm_node.run("scontrol", "setdebug", "info")
            daemon.shutdown()
        assert "Processing RPC: REQUEST_NODE_INFO from" not in rpcs, rpcs[-3000:]
        assert rpcs.count("Processing RPC: REQUEST_NODE_INFO_SINGLE from") == 1, rpcs[-3000:]
        assert report.health == "critical"
        assert all(c.health == "ok" for c in report.cards)
        (finding,) = [f for f in report.node_findings if f.check == "gres_mismatch"]
        assert finding.severity == "critical"
        assert finding.message.startswith("gpu:a100: Slurm has 8 registered, 6 healthy")
        assert (finding.value, finding.threshold) == (6, 8)
        patrol = [x for x in read_lines(tmp_path / "patrol.jsonl") if x["kind"] == "patrol"][0]
        assert patrol["gres"]["source"] == "sinfo"
        assert patrol["gres"]["slurm_node"] == slurm_node.node
        assert patrol["gres"]["entries"] == [
            {"name": "gpu", "type": "a100", "configured": 8, "found": 6, "healthy": 6},
            {"name": "ascend", "type": "910b", "configured": 8, "found": 8, "healthy": 8},
        ]
        metrics = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(daemon.exposition.body.decode())
            for s in fam.samples
        }
        labels = (("gres", "gpu"), ("gres_type", "a100"))
        assert metrics[("hetpatrol_gres_configured", labels)] == 8
        assert metrics[("hetpatrol_gres_healthy", labels)] == 6
        assert metrics[("hetpatrol_gres_registration_up", ())] == 1
        # drain is off: Slurm untouched, no event line
        assert slurm_node.state() == "idle"
        assert events(tmp_path / "patrol.jsonl") == []

        # all eight there: no finding, node ok
        patroller = Patroller(config, replay_dir=replays["healthy"])
        try:
            ok = patroller.run()
        finally:
            patroller.close()
        assert ok.health == "ok", ok.node_findings
        assert [e["healthy"] for e in ok.node_checks["gres"]["entries"]] == [8, 8]


def test_drain_on_critical_then_resume_when_healthy(slurm_node, replays, tmp_path):
    with slurm_node.explain():
        daemon = Daemon(slurm_config(slurm_node, tmp_path), replay_dir=replays["sick"])
        try:
            report = daemon.patrol_once()
            assert report.health == "critical"
            line = slurm_node.wait_for(lambda s: "drain" in s.split(" ")[1], what="drained")
            state, reason = line.split(" ", 2)[1:]
            assert state == "drained"
            assert reason.startswith("hetpatrol: ")
            # drained by action: the highest first (the lost GPU: reboot the node), the
            # other (GPU 1's rows pending: reset_card) counted; the GRES shortfall
            # (watch) drains nothing by itself
            assert reason == (
                "hetpatrol: reboot_node nvidia/3 vendor_health vendor health 'gpu_is_lost' "
                "(+1 more)"
            )
            (drain,) = events(tmp_path / "patrol.jsonl")
            assert drain["event"] == "drain" and drain["dry_run"] is False
            assert drain["reason"] == reason
            assert drain["slurm_node"] == slurm_node.node
            assert drain["command"][-3:] == [
                f"NodeName={slurm_node.node}",
                "State=DRAIN",
                f"Reason={reason}",
            ]

            daemon.patrol_once()  # still critical, already drained by us: nothing new
            assert len(events(tmp_path / "patrol.jsonl")) == 1
            assert slurm_node.reason() == reason

            use_replay(daemon, replays["healthy"])
            assert daemon.patrol_once().health == "ok"  # 1 of 2 healthy patrols
            assert slurm_node.state() == "drained"
            assert daemon.patrol_once().health == "ok"  # 2 of 2: resume
            line = slurm_node.wait_for(lambda s: "drain" not in s, what="resumed")
            assert line.split(" ", 2)[2] == "none"
            resume = events(tmp_path / "patrol.jsonl")[-1]
            assert resume["event"] == "resume" and resume["slurm_reason"] == reason
            assert resume["command"][-2:] == [f"NodeName={slurm_node.node}", "State=UNDRAIN"]
            assert daemon.stats.slurm_events["drain"] == 1
            assert daemon.stats.slurm_events["resume"] == 1
        finally:
            daemon.shutdown()


def test_a_gpu_its_tool_does_not_list_drains_only_from_the_third_patrol(slurm_node, tmp_path):
    """fixtures/nodes/gpu-unlisted (an H100 at 0000:e8:00.0 on the bus, driver bound, that
    NVML does not list): patrols 1 and 2 are a pci_unwatched warning (watch) and Slurm's
    node stays idle; the third in a row is critical reset_card and slurmctld drains the
    node with hetpatrol's reason (pci_census.unlisted_patrols 3)."""
    with slurm_node.explain():
        daemon = Daemon(slurm_config(slurm_node, tmp_path), replay_dir=NODES / "gpu-unlisted")
        try:
            for n in (1, 2):
                report = daemon.patrol_once()
                (f,) = [f for f in report.node_findings if f.check == "pci_unwatched"]
                assert (f.severity, f.action) == ("warning", "watch")
                assert f"{n} of 3 patrols" in f.message
                assert slurm_node.state() == "idle"
            assert events(tmp_path / "patrol.jsonl") == []
            report = daemon.patrol_once()
            assert report.action == "reset_card"
            line = slurm_node.wait_for(lambda s: "drain" in s.split(" ")[1], what="drained")
            reason = line.split(" ", 2)[2]
            assert reason.startswith(
                "hetpatrol: reset_card node pci_unwatched nvidia h100 [10de:2330] at 0000:e8:00.0"
            ), reason
            (drain,) = events(tmp_path / "patrol.jsonl")
            assert drain["event"] == "drain" and drain["reason"] == reason
        finally:
            daemon.shutdown()


def adopt_replay(daemon: Daemon, replay: Path) -> None:
    """The node's cards change under the running daemon: its patroller reads another
    replay directory and goes on from the card state of the one before (as a reload),
    with the PCI census of the new directory."""
    old = daemon.patroller
    daemon.patroller = Patroller(daemon.config, replay_dir=replay)
    reader = daemon.patroller.census_reader
    daemon.patroller.adopt(old)
    old.close()
    daemon.patroller.census_reader = reader
    daemon.replay_dir = replay


def test_a_gpu_gone_from_nvml_drains_only_at_the_third_patrol(slurm_node, tmp_path):
    """NVML lists a ninth H100 at 0000:e8:00.0 (tests/test_pci_census.py lists_e8), then
    no longer does (fixtures/nodes/gpu-unlisted): card_missing is a warning (watch) for
    patrols 1 and 2 of its absence and Slurm's node stays idle (before, slurmctld drained
    it on the first: reboot_node from one answer); the third in a row is critical
    reboot_node and slurmctld drains the node with hetpatrol's card_missing reason."""
    from test_pci_census import lists_e8, variant

    back = variant(tmp_path, "back", lists_e8)
    with slurm_node.explain():
        daemon = Daemon(slurm_config(slurm_node, tmp_path), replay_dir=back)
        try:
            assert daemon.patrol_once().action in ("none", "watch")
            adopt_replay(daemon, NODES / "gpu-unlisted")
            for n in (1, 2):
                report = daemon.patrol_once()
                (f,) = [f for f in report.node_findings if f.check == "card_missing"]
                assert (f.severity, f.action) == ("warning", "watch")
                assert f"nvidia/8 (0000:e8:00.0) {n} of 3 patrols" in f.message
                assert slurm_node.state() == "idle"
            assert events(tmp_path / "patrol.jsonl") == []
            report = daemon.patrol_once()
            assert report.action == "reboot_node"
            line = slurm_node.wait_for(lambda s: "drain" in s.split(" ")[1], what="drained")
            reason = line.split(" ", 2)[2]
            assert reason.startswith(
                "hetpatrol: reboot_node node card_missing nvidia: 1 card(s) listed before no "
                "longer listed: nvidia/8 (0000:e8:00.0) not listed in 3 patrols"
            ), reason
            (drain,) = events(tmp_path / "patrol.jsonl")
            assert drain["event"] == "drain" and drain["reason"] == reason
        finally:
            daemon.shutdown()


def test_a_gpu_gone_from_nvml_and_from_the_pci_bus_drains_at_once(slurm_node, tmp_path):
    """The same GPU gone from NVML's list and from the PCI bus (the census no longer holds
    0000:e8:00.0): a second, independent signal about the same card, so card_missing is
    critical at once and slurmctld drains the node on that first patrol."""
    from test_pci_census import e8_off_the_bus, lists_e8, variant

    back = variant(tmp_path, "back", lists_e8)
    gone = variant(tmp_path, "gone", e8_off_the_bus)
    with slurm_node.explain():
        daemon = Daemon(slurm_config(slurm_node, tmp_path), replay_dir=back)
        try:
            daemon.patrol_once()
            assert slurm_node.state() == "idle"
            adopt_replay(daemon, gone)
            report = daemon.patrol_once()
            assert report.action == "reboot_node"
            line = slurm_node.wait_for(lambda s: "drain" in s.split(" ")[1], what="drained")
            reason = line.split(" ", 2)[2]
            assert reason.startswith("hetpatrol: reboot_node node card_missing nvidia: "), reason
            assert "0000:e8:00.0 is gone from the PCI bus" in next(
                f.message for f in report.node_findings if f.check == "card_missing"
            )
        finally:
            daemon.shutdown()


def test_admin_drain_is_never_replaced_or_resumed(slurm_node, replays, tmp_path):
    with slurm_node.explain():
        slurm_node.admin_drain("admin: DIMM swap, ticket 4711")
        daemon = Daemon(slurm_config(slurm_node, tmp_path), replay_dir=replays["sick"])
        try:
            assert daemon.patrol_once().health == "critical"
            daemon.patrol_once()
            (skipped,) = events(tmp_path / "patrol.jsonl")  # once, not once per patrol
            assert skipped["event"] == "drain_skipped"
            assert skipped["slurm_reason"] == "admin: DIMM swap, ticket 4711"
            assert "admin: DIMM swap, ticket 4711" in skipped["detail"]
            assert skipped["reason"].startswith("hetpatrol: ")  # what it would have set
            assert slurm_node.reason() == "admin: DIMM swap, ticket 4711"

            use_replay(daemon, replays["healthy"])
            for _ in range(3):
                assert daemon.patrol_once().health == "ok"
            assert slurm_node.state() == "drained"
            assert slurm_node.reason() == "admin: DIMM swap, ticket 4711"
            assert len(events(tmp_path / "patrol.jsonl")) == 1
        finally:
            daemon.shutdown()


def test_dry_run_logs_and_changes_nothing(slurm_node, replays, tmp_path):
    with slurm_node.explain():
        config = slurm_config(slurm_node, tmp_path, dry_run=True)
        daemon = Daemon(config, replay_dir=replays["sick"])
        try:
            daemon.patrol_once()
            daemon.patrol_once()
            assert slurm_node.sinfo().split(" ", 1)[1] == "idle none"
            use_replay(daemon, replays["healthy"])
            daemon.patrol_once()
            daemon.patrol_once()
            assert slurm_node.sinfo().split(" ", 1)[1] == "idle none"
        finally:
            daemon.shutdown()
        drain, resume = events(tmp_path / "patrol.jsonl")
        assert (drain["event"], drain["dry_run"]) == ("drain", True)
        assert drain["reason"].startswith("hetpatrol: ")
        assert drain["slurm_state"] == "IDLE"
        assert (resume["event"], resume["dry_run"]) == ("resume", True)


def test_planned_node_is_drained_and_resumed(slurm_node, replays, tmp_path):
    """IDLE+PLANNED (the backfill scheduler earmarked the node for a pending job) is a
    state hetpatrol acts on: it used to say "not one hetpatrol acts on" and never drain.
    (ALLOCATED+PLANNED / MIXED+PLANNED: 22.05's backfill clears PLANNED on allocated
    nodes, _handle_planned() in src/plugins/sched/backfill/backfill.c; stand-in only.)"""
    with slurm_node.explain(), slurm_node.planned():
        assert slurm_node.node_state() == "IDLE+PLANNED"
        daemon = Daemon(slurm_config(slurm_node, tmp_path), replay_dir=replays["sick"])
        try:
            assert daemon.patrol_once().health == "critical"
            slurm_node.wait_for(lambda s: "drain" in s.split(" ")[1], what="drained")
            (drain,) = events(tmp_path / "patrol.jsonl")
            assert (drain["event"], drain["slurm_state"]) == ("drain", "IDLE+PLANNED")
            assert slurm_node.reason() == drain["reason"]
            use_replay(daemon, replays["healthy"])
            daemon.patrol_once()
            daemon.patrol_once()
            slurm_node.wait_for(lambda s: "drain" not in s, what="resumed")
            resume = events(tmp_path / "patrol.jsonl")[-1]
            assert resume["event"] == "resume", resume
            assert "DRAIN" in resume["slurm_state"]
        finally:
            daemon.shutdown()


def test_maintenance_state_is_skipped_once(slurm_node, replays, tmp_path):
    """A maintenance reservation on the real node (``IDLE+MAINTENANCE``, no reason): the
    table says no drain; said once, not every patrol."""
    node = slurm_node.node
    with slurm_node.explain():
        slurm_node.scontrol(
            "create",
            "reservation",
            "ReservationName=hetpatrol_test_maint",
            "StartTime=now",
            "Duration=10",
            f"Nodes={node}",
            "Users=root",
            "Flags=MAINT,IGNORE_JOBS",
        )
        try:
            deadline = time.monotonic() + 30  # slurmctld sets the flag on its next pass
            while "MAINTENANCE" not in slurm_node.node_state():
                assert time.monotonic() < deadline, slurm_node.node_state()
                time.sleep(0.2)
            daemon = Daemon(slurm_config(slurm_node, tmp_path), replay_dir=replays["sick"])
            try:
                for _ in range(3):
                    assert daemon.patrol_once().health == "critical"
            finally:
                daemon.shutdown()
            (skipped,) = events(tmp_path / "patrol.jsonl")
            assert skipped["event"] == "drain_skipped"
            assert "no drain in MAINTENANCE" in skipped["detail"]
            assert "drain" not in slurm_node.state()
        finally:
            slurm_node.run("scontrol", "delete", "ReservationName=hetpatrol_test_maint")


def test_drain_without_a_reason_is_left_alone(slurm_node, replays, tmp_path):
    """``Reason=" "`` (scontrol refuses an empty one, not a blank one) drains the real
    node with no reason: someone else's drain, never re-drained, never resumed."""
    node = slurm_node.node
    with slurm_node.explain():
        slurm_node.scontrol("update", f"NodeName={node}", "State=DRAIN", "Reason= ")
        assert slurm_node.node_state() == "IDLE+DRAIN"
        daemon = Daemon(slurm_config(slurm_node, tmp_path), replay_dir=replays["sick"])
        try:
            for _ in range(3):
                assert daemon.patrol_once().health == "critical"
            use_replay(daemon, replays["healthy"])
            for _ in range(3):
                assert daemon.patrol_once().health == "ok"
        finally:
            daemon.shutdown()
        (skipped,) = events(tmp_path / "patrol.jsonl")
        assert skipped["event"] == "drain_skipped"
        assert skipped["slurm_state"] == "IDLE+DRAIN" and skipped["slurm_reason"] is None
        assert "drained without a reason" in skipped["detail"]
        assert slurm_node.node_state() == "IDLE+DRAIN"
        assert not slurm_node.reason().startswith("hetpatrol")


@pytest.mark.slow
def test_the_registration_of_a_node_in_a_partition_of_other_groups_is_read_by_sinfo():
    """Hostile trial (h35c): the node's only partition is ``AllowGroups=root`` (a GPU
    partition for some groups). As the daemon's user (here uid 65534), sinfo without
    ``--all`` printed no line for it (slurmctld 22.05), so every read fell back to
    ``scontrol show node``, the whole node table. With ``--all`` the one node is read:
    one REQUEST_NODE_INFO_SINGLE, no REQUEST_NODE_INFO."""
    import shutil
    import subprocess

    from hetpatrol.slurm.inventory import read_registration, registration_argv
    from hetpatrol.tool import run_tool

    if shutil.which("runuser") is None:
        cluster._fail_or_skip("runuser not installed (Debian: util-linux)")
    partition = f"debug Nodes={cluster.NODE_NAME} Default=YES MaxTime=INFINITE State=UP"
    c = cluster.start_cluster(overrides={"PartitionName": f"{partition} AllowGroups=root"})
    nobody = ("runuser", "-u", "nobody", "--", "env", f"SLURM_CONF={c.conf}")
    scontrol = shutil.which("scontrol") or "scontrol"
    settings = SlurmSettings(enabled=True, node_name=c.node, scontrol=(*nobody, scontrol))
    log = c.root / "log" / "slurmctld.log"
    try:
        with c.explain():
            sinfo = [*nobody, str(Path(scontrol).parent / "sinfo")]
            plain = [a for a in registration_argv(sinfo, c.node) if a != "--all"]
            before = subprocess.run(plain, capture_output=True, text=True, timeout=60)
            assert before.returncode == 0 and before.stdout == "", before
            c.run("scontrol", "setdebug", "debug2")
            try:
                seen = len(log.read_text())
                reg = read_registration(settings, c.node, run_tool)
                rpcs = log.read_text()[seen:]
            finally:
                c.run("scontrol", "setdebug", "info")
            assert (reg.source, reg.error) == ("sinfo", None), reg
            assert {(e.name, e.type, e.count) for e in reg.entries} == {
                ("gpu", "a100", 8),
                ("ascend", "910b", 8),
            }
            assert "Processing RPC: REQUEST_NODE_INFO from" not in rpcs, rpcs[-3000:]
            assert rpcs.count("Processing RPC: REQUEST_NODE_INFO_SINGLE from") == 1, rpcs[-3000:]
    finally:
        c.stop()
