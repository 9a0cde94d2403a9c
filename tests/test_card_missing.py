"""card_missing: a card its collector listed before and no longer lists, over patrols.

Replays fixtures/nodes/gpu-unlisted (NVML, nvidia-smi-q.xml, lists 8 H100 at 19, 3b, 4c,
5d, 9b, bb, cb, db; the bus, lspci-Dnn-vmm.txt, holds a ninth at 0000:e8:00.0) and its
variants from tests/test_pci_census.py: ``lists_e8`` (NVML lists the ninth GPU at E8 as
index 8, UUID GPU-...bb0), ``drops_db`` (NVML no longer lists the DB GPU, index 7),
``e8_off_the_bus`` (the bus no longer holds E8). A card listed in one directory and not
in the next is the case; one patrol's short list is never critical on its own.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import NODES
from test_pci_census import LOST, drops_db, e8_off_the_bus, lists_e8, variant, with_boot

from hetpatrol.boot import BootWatch
from hetpatrol.config import ConfigError, load_config
from hetpatrol.kernel_log import open_kernel_log
from hetpatrol.patrol import Patroller, missing_evidence
from hetpatrol.pci_census import Census, PciFunction
from hetpatrol.schema import CardRecord

E8 = "0000:e8:00.0"
DB = "0000:db:00.0"
E8_UUID = "GPU-004dc5e2-7c1d-cc17-c721-e63ad8f75bb0"  # lists_e8's ninth GPU
DB_UUID = "GPU-004dc5e2-7c1d-cc17-c721-e63ad8f75bae"  # GPU 7 of nvidia-smi-q.xml


def missing(report) -> list[tuple[str, str]]:
    """(severity, action) of the card_missing finding of ``report``, or []."""
    return [(f.severity, f.action) for f in report.node_findings if f.check == "card_missing"]


def message(report) -> str:
    return next(f.message for f in report.node_findings if f.check == "card_missing")


def patrol_each(dirs, config=None):
    """One patrol of each replay directory in order, each by a new Patroller that adopts
    the one before (as a reload does: seen cards, boot, holds), with the PCI census and
    the kernel log (kmsg.txt) of its own directory."""
    config = replace(config or load_config(), node="n1")
    kl = config.top["kernel_events"]
    reports, before = [], None
    for d in dirs:
        p = Patroller(config, replay_dir=Path(d))
        if before is not None:
            reader = p.census_reader  # adopt() keeps the old reader: not this bus's
            p.adopt(before)
            before.close()
            p.census_reader = reader
            if p.kernel_log is not None:
                p.kernel_log.close()
            p.kernel_log = open_kernel_log(
                kl.enabled,
                kl.path,
                window_seconds=kl.window_seconds,
                burst_seconds=kl.burst_seconds,
                replay_dir=Path(d),
            )
        reports.append(p.run())
        before = p
    before.close()
    return reports


@pytest.fixture
def back(tmp_path):
    return variant(tmp_path, "back", lists_e8)


def xid79_on(bus: str, uuid: str, serial: str):
    """An edit: the kernel log of fixtures/nodes/xid-79 (XID 79 and the no-Xid "fallen off
    the bus" message on 0000:cb:00.0, with that GPU's UUID and serial) moved to ``bus``
    and the GPU there."""

    def edit(d: Path) -> None:
        text = (NODES / "xid-79" / "kmsg.txt").read_text()
        text = text.replace("0000:cb:00", bus[:10]).replace(
            "GPU-d7051dd7-616a-cb6a-4aaf-7901dc199334", uuid
        )
        (d / "kmsg.txt").write_text(text.replace("0315890135362", serial))

    return edit


def test_one_patrol_without_a_card_is_a_warning_never_a_drain(back):
    """NVML listed E8, then does not: "1 of 3 patrols", action watch; nothing drains
    (before: critical, reboot_node, a drain from one answer)."""
    from hetpatrol.slurm.drain import drain_needs

    first, second = patrol_each([back, LOST])
    assert missing(first) == []
    assert missing(second) == [("warning", "watch")]
    assert message(second).startswith(
        "nvidia: 1 card(s) listed before no longer listed: nvidia/8 (0000:e8:00.0) 1 of 3 "
        "patrols; critical (action reboot_node) only after 3 patrols in a row, or at once"
    )
    assert (second.health, second.action) == ("warning", "watch")
    assert drain_needs(second, load_config().actions.drain_on) == []
    entry = second.node_checks["boot"]["missing_cards"][f"uuid:{E8_UUID}"]
    assert (entry["patrols"], entry["bus_id"], entry["index"]) == (1, E8, 8)


def test_three_patrols_in_a_row_are_critical_reboot_node(back, tmp_path):
    from hetpatrol.slurm.drain import drain_needs

    reports = patrol_each([back, LOST, LOST, LOST, LOST])
    assert [missing(r) for r in reports] == [
        [],
        [("warning", "watch")],
        [("warning", "watch")],
        [("critical", "reboot_node")],
        [("critical", "reboot_node")],
    ]
    assert "nvidia/8 (0000:e8:00.0) 2 of 3 patrols" in message(reports[2])
    assert "nvidia/8 (0000:e8:00.0) not listed in 3 patrols in a row (missing_patrols 3)" in (
        message(reports[3])
    )
    needs = drain_needs(reports[3], load_config().actions.drain_on)
    assert ("node", "reboot_node", "check:card_missing") in [
        (n[0], n[1].action, n[1].code) for n in needs
    ]
    # the repeat rule holds card:missing from the patrol that confirmed it, not before
    cards = reports[2].escalation["cards"]
    assert f"uuid:{E8_UUID}" not in cards
    assert reports[3].escalation["cards"][f"uuid:{E8_UUID}"]["present"] == ["card:missing"]
    # the count is the config's; 1 (one answer enough) is refused, naming the key
    cfg = tmp_path / "c.yaml"
    cfg.write_text("missing_patrols: 4\n")
    reports = patrol_each([back, LOST, LOST, LOST, LOST], load_config(cfg))
    assert [missing(r)[0][0] for r in reports[1:]] == ["warning"] * 3 + ["critical"]
    cfg.write_text("missing_patrols: 1\n")
    with pytest.raises(ConfigError, match="missing_patrols"):
        load_config(cfg)


def test_xid_79_on_that_bus_id_is_critical_at_once(back, tmp_path):
    """The kernel log has XID 79 (and "fallen off the bus") for E8 in the patrol NVML no
    longer lists it: corroborated, critical at once. The same XID on another card (DB,
    still listed) says nothing of E8: it stays 1 of 3."""
    lost_xid = variant(tmp_path, "lost-xid", xid79_on(E8, E8_UUID, "9458441022288"))
    _, second = patrol_each([back, lost_xid])
    assert missing(second) == [("critical", "reboot_node")]
    assert message(second) == (
        "nvidia: 1 card(s) listed before no longer listed: nvidia/8 (0000:e8:00.0) 1 of 3 "
        "patrols, and the kernel log has xid 79 for 0000:e8:00.0 in this boot"
    )
    assert second.node_checks["boot"]["off_bus"] == {E8: "xid 79"}
    other = variant(tmp_path, "db-xid", xid79_on(DB, DB_UUID, "9458441022271"))
    _, second = patrol_each([back, other])
    assert missing(second) == [("warning", "watch")]
    assert second.node_checks["boot"]["off_bus"] == {DB: "xid 79"}
    # an XID 79 read in an earlier patrol of the boot (the card still listed then) counts
    back_xid = variant(tmp_path, "back-xid", lists_e8)
    xid79_on(E8, E8_UUID, "9458441022288")(back_xid)
    reports = patrol_each([back_xid, LOST])
    assert missing(reports[1]) == [("critical", "reboot_node")]


def test_the_bus_id_gone_from_the_pci_bus_is_critical_at_once(back, tmp_path):
    gone = variant(tmp_path, "gone", e8_off_the_bus)
    _, second = patrol_each([back, gone])
    assert missing(second) == [("critical", "reboot_node")]
    assert message(second).endswith("1 of 3 patrols, and 0000:e8:00.0 is gone from the PCI bus")


def test_a_census_read_before_the_card_was_last_listed_says_nothing():
    card = CardRecord(vendor="nvidia", index=8, bus_id=E8)
    other = PciFunction(DB, 0x10DE, 0x2330, 0x0302)
    census = Census("lspci", (other,), read_at=100.0)
    assert missing_evidence(card, census, {}, listed_at=99.0) == f"{E8} is gone from the PCI bus"
    assert missing_evidence(card, census, {}, listed_at=101.0) is None  # stale census
    assert missing_evidence(card, Census("x", error="unreadable"), {}) is None
    masked = CardRecord(vendor="ascend", index=0, bus_id="0000:xx:00.0")  # as npu-smi masks
    assert missing_evidence(masked, census, {"0000:xx:00.0": "xid 79"}) is None
    assert missing_evidence(card, None, {E8: "xid 79"}) == (
        f"the kernel log has xid 79 for {E8} in this boot"
    )


def test_a_card_read_under_new_identities_leaves_no_old_key_behind(tmp_path):
    """The GPU on DB swapped for another one patrol after patrol (a new UUID and serial
    on the same bus id, as an RMA swap reads): the per-card bookkeeping holds the cards
    of the last patrol, never every identity read since the daemon started."""

    def swapped(n: int):
        def edit(d: Path) -> None:
            xml = d / "nvidia-smi-q.xml"
            text = xml.read_text().replace(DB_UUID, f"GPU-004dc5e2-7c1d-cc17-c721-{n:012x}")
            xml.write_text(text.replace("<serial>9458441022271<", f"<serial>{9000 + n}<"))

        return edit

    config = replace(load_config(), node="n1")
    before, sizes = None, []
    for n in range(6):
        p = Patroller(config, replay_dir=variant(tmp_path, f"swap{n}", swapped(n)))
        if before is not None:
            p.adopt(before)
            before.close()
        report = p.run()
        assert missing(report) == []  # the same bus id: the card is there, not gone
        sizes.append(len(p._listed_at))
        before = p
    before.close()
    assert len(report.cards) == sizes[0]
    assert sizes == [sizes[0]] * 6, sizes


def test_listed_again_resets_the_count_and_a_critical_one_is_held(back):
    reports = patrol_each([back, LOST, LOST, back, LOST])
    assert [missing(r) for r in reports] == [
        [],
        [("warning", "watch")],
        [("warning", "watch")],
        [],  # listed again: a warning ends, no hold
        [("warning", "watch")],  # 1 of 3 again, not 3
    ]
    assert "1 of 3 patrols" in message(reports[4])
    assert reports[3].node_checks["boot"]["missing_cards"] == {}
    # critical, then listed again: held recovery_patrols (3) patrols by its UUID; gone
    # again within the hold it is critical at once
    reports = patrol_each([back, LOST, LOST, LOST, back, back, back, LOST])
    assert [missing(r) for r in reports][3:] == [
        [("critical", "reboot_node")],
        [("critical", "reboot_node")],  # held 1 of 3
        [("critical", "reboot_node")],  # held 2 of 3
        [],
        [("warning", "watch")],
    ]
    assert "listed again, held until listed 3 patrols in a row: nvidia/8 (0000:e8:00.0) 1 of 3" in (
        message(reports[4])
    )
    reports = patrol_each([back, LOST, LOST, LOST, back, LOST])
    assert missing(reports[5]) == [("critical", "reboot_node")]
    assert "gone again before it was listed long enough to end its hold" in message(reports[5])


def test_two_cards_are_counted_apart(back, tmp_path):
    two = variant(tmp_path, "two", drops_db)
    reports = patrol_each([back, LOST, two, two, two])
    assert [missing(r) for r in reports] == [
        [],
        [("warning", "watch")],
        [("warning", "watch")],
        [("critical", "reboot_node")],  # E8's third; DB's second
        [("critical", "reboot_node")],
    ]
    text = message(reports[3])
    assert "nvidia/8 (0000:e8:00.0) not listed in 3 patrols in a row" in text
    assert "nvidia/7 (0000:db:00.0) 2 of 3 patrols" in text  # DB inherits nothing
    counts = {k: v["patrols"] for k, v in reports[3].node_checks["boot"]["missing_cards"].items()}
    assert counts == {f"uuid:{DB_UUID}": 2, f"uuid:{E8_UUID}": 3}
    held = reports[3].escalation["cards"]
    assert held[f"uuid:{E8_UUID}"]["present"] == ["card:missing"]
    assert f"uuid:{DB_UUID}" not in held  # a warning holds no card:missing


def test_the_count_goes_on_after_a_restart_within_the_boot_never_a_new_boot(tmp_path):
    from hetpatrol.daemon import Daemon
    from hetpatrol.exporters.state import read_state
    from hetpatrol.replay import scenario_boots

    boot1, boot2 = scenario_boots(NODES / "reboot-links-late")  # two boot ids
    back1 = with_boot(tmp_path, "back1", boot1)
    lists_e8(back1)
    lost1, lost2 = with_boot(tmp_path, "b1", boot1), with_boot(tmp_path, "b2", boot2)
    state = tmp_path / "state" / "state.json"
    config = replace(load_config(), node="n1", jsonl_path=None, state_path=state)

    def daemon_patrols(replay: Path, n: int, then: Path | None = None):
        """``n`` patrols of a daemon started on ``replay`` (then, one patrol each, on
        ``then``: the node's cards change under the running daemon, as a reload)."""
        d = Daemon(config, replay_dir=replay)
        try:
            d.restore_escalation()
            reports = [d.patrol_once() for _ in range(n)]
            if then is not None:
                old = d.patroller
                d.patroller = Patroller(d.config, replay_dir=then)
                reader = d.patroller.census_reader
                d.patroller.adopt(old)
                old.close()
                d.patroller.census_reader = reader
                reports += [d.patrol_once() for _ in range(2)]
            return reports
        finally:
            d.shutdown()

    reports = daemon_patrols(back1, 1, then=lost1)
    assert [missing(r) for r in reports] == [[], [("warning", "watch")], [("warning", "watch")]]
    entry = read_state(state)["boot"]["missing_cards"][f"uuid:{E8_UUID}"]
    assert (entry["patrols"], entry["collector"], entry["bus_id"]) == (2, "nvidia", E8)
    # hostile trial (h34g): the same state file, stale (written an hour ago on both
    # clocks: no daemon patrolled since): its count is no patrols in a row with this
    # run's first, which is "1 of 3" (before: critical and a drain at once)
    kept = state.read_text()
    doc = json.loads(kept)
    doc["finished"] -= 3600
    doc["finished_boot"] -= 3600
    state.write_text(json.dumps(doc))
    (report,) = daemon_patrols(lost1, 1)
    assert missing(report) == [("warning", "watch")]
    assert "1 of 3 patrols" in message(report)
    state.write_text(kept)
    # a daemon restarted within the boot knows the card from the state file: the third
    (report,) = daemon_patrols(lost1, 1)
    assert missing(report) == [("critical", "reboot_node")]
    assert "not listed in 3 patrols in a row" in message(report)
    # after a reboot (another boot id) nothing is carried over: a new enumeration
    (report,) = daemon_patrols(lost2, 1)
    assert missing(report) == []
    assert read_state(state)["boot"]["missing_cards"] == {}
    # in one process whose boot id changes, the count starts again at 1
    reports = patrol_each([back1, lost1, lost1, lost2, lost2])
    assert [missing(r) for r in reports][1:] == [[("warning", "watch")]] * 4
    assert "1 of 3 patrols" in message(reports[3])


def test_a_damaged_state_entry_counts_from_zero_again():
    from hetpatrol.boot import BootInfo

    watch = BootWatch()
    info_id = "d1b2c3d4-0000-4000-8000-000000000001"

    good = {
        "collector": "nvidia",
        "vendor": "nvidia",
        "index": 8,
        "chip": None,
        "uuid": E8_UUID,
        "serial": None,
        "bus_id": E8,
        "gres": "gpu",
        "patrols": 2,
    }
    doc = {
        "boot_id": info_id,
        "patrols": 5,
        "missing_cards": {"a": good, "b": {**good, "patrols": "2"}, "c": {**good, "index": None}},
        "off_bus": {E8: "xid 79", DB: 79},
    }
    watch.restore(doc, BootInfo(info_id, 1.0))
    assert list(watch.missing_cards) == ["a"]
    assert watch.off_bus == {E8: "xid 79"}


def test_the_plugins_say_which_kernel_events_mean_off_the_bus():
    from hetpatrol.actions.findings import vendor_tables

    # NVIDIA's XID catalog: 79 is ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, the only row
    # that says the GPU left the bus; and the no-Xid "fallen off the bus" message
    assert vendor_tables().off_bus_codes == {
        "xid": frozenset({"79"}),
        "kernel_fault": frozenset({"fallen_off_bus"}),
    }


def test_a_card_gone_while_no_daemon_ran_is_counted_after_the_restart(tmp_path):
    """The daemon of boot 1 last listed E8 (state file card lines); a daemon started
    again in the same boot no longer finds it: card_missing 1 of 3 (before: nothing, the
    new daemon had never seen it). In another boot the old card lines say nothing."""
    from hetpatrol.daemon import Daemon
    from hetpatrol.replay import scenario_boots

    boot1, boot2 = scenario_boots(NODES / "reboot-links-late")
    back1 = with_boot(tmp_path, "back1", boot1)
    lists_e8(back1)
    lost1, lost2 = with_boot(tmp_path, "b1", boot1), with_boot(tmp_path, "b2", boot2)
    state = tmp_path / "state" / "state.json"
    config = replace(load_config(), node="n1", jsonl_path=None, state_path=state)

    def one_patrol(replay: Path):
        d = Daemon(config, replay_dir=replay)
        try:
            d.restore_escalation()
            return d.patrol_once()
        finally:
            d.shutdown()

    one_patrol(back1)
    report = one_patrol(lost1)
    assert missing(report) == [("warning", "watch")]
    assert "nvidia/8 (0000:e8:00.0) 1 of 3 patrols" in message(report)
    one_patrol(back1)
    assert missing(one_patrol(lost2)) == []  # a reboot: a new enumeration
