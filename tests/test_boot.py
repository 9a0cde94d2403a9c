"""Boot awareness (hetpatrol.boot): boot id and time on every patrol line and in the state
file, kernel-log events of an earlier boot never counted, the post-boot grace of link
findings and the expected links of a card class, on the multi-boot replays
fixtures/nodes/reboot-links-late and fault-survives-reboots."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from conftest import NODES

from hetpatrol.boot import BootInfo, BootWatch, read_boot
from hetpatrol.checks.facts import BootFacts, CardFacts
from hetpatrol.checks.interconnect import InterconnectSettings, evaluate
from hetpatrol.config import load_config
from hetpatrol.daemon import Daemon
from hetpatrol.exporters.state import read_state
from hetpatrol.patrol import Patroller
from hetpatrol.replay import scenario_boots
from hetpatrol.schema import CardRecord, patrol_json_schema

LATE = NODES / "reboot-links-late"
# boot ids as written in the fixtures' proc/sys/kernel/random/boot_id
BOOT1 = "3f1b0c2e-8d4a-4c47-9a51-6e2f7d0b9c13"
BOOT2 = "a7c94e51-2b6f-4e0d-8c3a-91d5f08e2b46"


def late_config(**profile):
    config = load_config(LATE / "hetpatrol.yaml")
    return replace(config, jsonl_path=None, state_path=None)


def patrols(config, boot_dir: Path, n: int, patroller: Patroller | None = None):
    p = Patroller(config, replay_dir=boot_dir)
    p.post_boot_grace = True  # as the daemon's
    if patroller is not None:
        p.boot = patroller.boot
    try:
        return [p.run() for _ in range(n)], p
    finally:
        p.close()


def nvidia(report):
    return sorted((c for c in report.cards if c.vendor == "nvidia"), key=lambda c: c.index)


def test_read_boot_reads_the_replayed_proc_files():
    boots = scenario_boots(LATE)
    assert [b.name for b in boots] == ["1", "2"]
    info = read_boot(boots[1])
    # btime of boots/2/proc/stat: 2025-12-01T00:00:00Z
    assert info == BootInfo(BOOT2, 1764547200.0, None)
    missing = read_boot(NODES / "healthy-mixed")
    assert missing.boot_id is None and missing.boot_time is None
    assert "boot_id" in missing.error and "proc/stat" in missing.error


def test_a_garbled_boot_id_is_no_boot(tmp_path):
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("not-a-uuid\n")
    (tmp_path / "proc/stat").write_text("cpu 1 2 3\nbtime x\n")
    info = read_boot(tmp_path)
    assert info.boot_id is None and info.boot_time is None
    assert "not a boot id" in info.error


def test_boot_watch_counts_patrols_per_boot_and_restores_within_one():
    w = BootWatch()
    assert w.note(BootInfo(BOOT1, 1.0)) == 1
    assert w.note(BootInfo(BOOT1, 1.0)) == 2
    w.learned_links["uuid:x"] = {"nvlink": 18}
    assert w.note(BootInfo(BOOT2, 2.0)) == 1  # a new boot: count and links start again
    assert w.learned_links == {}
    restored = BootWatch()
    restored.restore({"boot_id": BOOT2, "patrols": 7}, BootInfo(BOOT2, 2.0))
    assert restored.note(BootInfo(BOOT2, 2.0)) == 8
    other = BootWatch()
    other.restore({"boot_id": BOOT1, "patrols": 7}, BootInfo(BOOT2, 2.0))
    assert other.note(BootInfo(BOOT2, 2.0)) == 1


def test_patrol_line_and_state_file_carry_the_boot(tmp_path):
    config = replace(late_config(), state_path=tmp_path / "state.json")
    d = Daemon(config, replay_dir=scenario_boots(LATE)[0])
    try:
        d.restore_escalation()
        report = d.patrol_once()
    finally:
        d.shutdown()
    line = json.loads(report.patrol_line)
    jsonschema.validate(line, patrol_json_schema())
    assert line["boot"]["boot_id"] == BOOT1
    assert line["boot"]["boot_time"] == 1764460800.0
    assert line["boot"]["patrols"] == 1
    doc = read_state(tmp_path / "state.json")
    assert doc["boot"]["boot_id"] == BOOT1 and doc["boot"]["patrols"] == 1
    # every GPU's 18 links were up: learned as this boot's expected links
    assert doc["boot"]["learned_links"]["uuid:GPU-6d33bd6a-6eac-013c-9c16-a880cab1362b"] == {
        "nvlink": 18
    }
    # a daemon restarted in the same boot goes on counting
    d = Daemon(config, replay_dir=scenario_boots(LATE)[0])
    try:
        d.restore_escalation()
        report = d.patrol_once()
    finally:
        d.shutdown()
    assert json.loads(report.patrol_line)["boot"]["patrols"] == 2


def test_a_planned_reboot_whose_links_train_late_drains_nothing():
    config = late_config()
    boot1, boot2 = scenario_boots(LATE)
    first, p = patrols(config, boot1, 2)
    assert all(r.health == "ok" for r in first)
    reports, _ = patrols(config, boot2, 6, p)
    for n, report in enumerate(reports[:3], 1):
        assert json.loads(report.patrol_line)["boot"] == {
            **json.loads(report.patrol_line)["boot"],
            "boot_id": BOOT2,
            "patrols": n,
        }
        for card in nvidia(report):
            down = [f for f in card.findings if f.check == "nvlink_down"]
            assert len(down) == 1, card.findings
            assert down[0].severity == "warning"
            assert f"post-boot grace {n} of 4" in down[0].message
            assert "0 of 18 links up" in down[0].message
            assert card.action == "watch"
        assert report.action not in config.actions.drain_on
    # patrol 4: the links trained; held at warning ("recovering", recovery_patrols 3)
    # until patrol 6, never drained
    for report in reports[3:5]:
        assert not any(f.check == "nvlink_down" for c in nvidia(report) for f in c.findings)
        assert {c.action for c in nvidia(report)} == {"watch"}
    assert reports[5].health == "ok"
    assert all(c.health == "ok" and c.action == "none" for c in nvidia(reports[5]))


def test_without_the_grace_the_same_reboot_would_drain():
    """The grace is what keeps the reboot above from a drain (0 patrols: none)."""
    config = late_config()
    h100 = next(p for p in config.profiles if p.name == "h100-h200")
    settings = replace(h100.checks["interconnect"], post_boot_grace_patrols=0)
    profiles = tuple(
        replace(p, checks={**p.checks, "interconnect": settings}) if p is h100 else p
        for p in config.profiles
    )
    config = replace(config, profiles=profiles)
    reports, _ = patrols(config, scenario_boots(LATE)[1], 1)
    cards = nvidia(reports[0])
    assert {c.health for c in cards} == {"critical"}
    assert {c.action for c in cards} == {"reset_card"}
    assert reports[0].action in config.actions.drain_on


def test_links_still_down_after_the_grace_are_critical():
    config = late_config()
    h100 = next(p for p in config.profiles if p.name == "h100-h200")
    settings = replace(h100.checks["interconnect"], post_boot_grace_patrols=2)
    profiles = tuple(
        replace(p, checks={**p.checks, "interconnect": settings}) if p is h100 else p
        for p in config.profiles
    )
    reports, _ = patrols(replace(config, profiles=profiles), scenario_boots(LATE)[1], 3)
    assert {c.health for c in nvidia(reports[1])} == {"warning"}
    assert {c.health for c in nvidia(reports[2])} == {"critical"}  # patrol 3 > grace 2


def _card(links):
    return CardRecord(vendor="nvidia", index=0, uuid="GPU-x", links=links)


def _links(n, down=()):
    return [
        {"kind": "nvlink", "link": i, "state": "down" if i in down else "up", "counters": {}}
        for i in range(n)
    ]


def test_a_pcie_board_never_gets_link_down_findings():
    pcie = InterconnectSettings(nvlink_link_down="critical", nvlink_expected_links=0)
    # even a garbled answer listing links down, with error counts: the class has none
    garbled = _links(4, down={0, 1})
    garbled[0]["counters"] = {"crc_flit": 500}
    assert evaluate(_card(garbled), pcie, CardFacts()) == []
    # NVML answering NotSupported (no links) and no expectation: no finding
    assert evaluate(_card([]), InterconnectSettings(), CardFacts()) == []


def test_a_drop_below_the_expected_links_is_the_finding():
    th = InterconnectSettings(nvlink_link_down="critical", post_boot_grace_patrols=0)
    # learned in the first healthy patrol of the boot: 18; now NVML lists 12, all up
    facts = CardFacts(boot=BootFacts(patrols=9, learned_links={"nvlink": 18}))
    (f,) = evaluate(_card(_links(12)), th, facts)
    assert f.check == "nvlink_down" and f.severity == "critical"
    assert "12 of 18 links up" in f.message and "6 link(s) not listed" in f.message
    assert f.threshold == 18
    # from the profile: 18 expected, the card lists none at all
    profile = replace(th, nvlink_expected_links=18)
    (f,) = evaluate(_card([]), profile, CardFacts())
    assert "0 of 18 links up (expected from its profile)" in f.message
    # all listed up and as many as expected: nothing
    assert evaluate(_card(_links(18)), profile, facts) == []


def test_learned_links_come_from_the_first_healthy_patrol_of_the_boot():
    config = late_config()
    h100 = next(p for p in config.profiles if p.name == "h100-h200")
    settings = replace(h100.checks["interconnect"], nvlink_expected_links=None)
    profiles = tuple(
        replace(p, checks={**p.checks, "interconnect": settings}) if p is h100 else p
        for p in config.profiles
    )
    config = replace(config, profiles=profiles)
    reports, p = patrols(config, scenario_boots(LATE)[1], 4)
    # links down in patrols 1-3: nothing learned yet; patrol 4 all up: 18 learned
    gpu2 = "uuid:GPU-6d33bd6a-6eac-013c-9c16-a880cab1362b"
    assert p.boot.learned_links[gpu2] == {"nvlink": 18}
    assert json.loads(reports[2].patrol_line)["boot"]["learned_links"] == {}


def test_kernel_events_of_an_earlier_boot_never_count(tmp_path):
    """nvlink-storm's kernel log (XID 145/149/45) replayed with a boot time after its
    lines: the events belong to an earlier boot: no event line, no XID finding."""
    replay = tmp_path / "storm"
    shutil.copytree(NODES / "nvlink-storm", replay, symlinks=False)
    config = replace(load_config(), node="t", jsonl_path=None, state_path=None)
    before, _ = patrols(config, replay, 1)
    assert any(f.check == "xid" for c in before[0].cards for f in c.findings)
    shutil.copytree(LATE / "boots/2/proc", replay / "proc")
    stat = replay / "proc/stat"
    # booted 2025-12-09T00:00:00Z: after every line of kmsg.txt (Mon Dec 8 10:15 2025)
    stat.write_text(re.sub(r"(?m)^btime \d+$", "btime 1765238400", stat.read_text()))
    after, _ = patrols(config, replay, 1)
    assert not any(f.check == "xid" for c in after[0].cards for f in c.findings)
    assert after[0].event_lines == ()
    summary = json.loads(after[0].patrol_line)["kernel_log"]
    assert summary["earlier_boot_events"] == len(before[0].event_lines)


def test_a_one_off_patrol_has_no_grace():
    """`hetpatrol once` or the Epilog's patrol is the first of its process whatever the
    uptime: a link down is judged as it is, never held as "links training"."""
    p = Patroller(late_config(), replay_dir=scenario_boots(LATE)[1])
    try:
        report = p.run()
    finally:
        p.close()
    assert json.loads(report.patrol_line)["boot"]["patrols"] == 1
    assert {c.health for c in nvidia(report)} == {"critical"}
    assert {c.action for c in nvidia(report)} == {"reset_card"}


@pytest.mark.parametrize("boots", [["../x"], "boots/1", [1]])
def test_bad_boots_list_is_a_clear_error(tmp_path, boots):
    (tmp_path / "scenario.yaml").write_text(f"boots: {json.dumps(boots)}\n")
    with pytest.raises(ValueError, match="scenario.yaml"):
        scenario_boots(tmp_path)


def test_once_on_a_multi_boot_scenario_names_a_boot_to_replay():
    """The scenario's own directory holds no recording (each boot has its own): replayed
    whole it read as a node without cards (exit 3, `no_cards`); it is refused instead,
    naming the first boot's directory."""
    import subprocess

    from conftest import HETPATROL, NODES

    res = subprocess.run(
        [*HETPATROL, "once", "--replay", str(NODES / "reboot-links-late")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 78, res.stdout + res.stderr
    assert "is a scenario of 2 boots" in res.stderr
    assert f"--replay {NODES / 'reboot-links-late' / 'boots' / '1'}" in res.stderr
    one = subprocess.run(
        [*HETPATROL, "once", "--replay", str(NODES / "reboot-links-late" / "boots" / "2")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # boot 2's first patrol: the links train late, within the post-boot grace a warning
    assert one.returncode == 1, one.stdout + one.stderr


def test_a_damaged_state_files_learned_links_are_not_taken():
    """``learned_links`` read back from the state file becomes the links a card must have
    up (fewer up: ``nvlink_down``, reset_card where a profile makes it critical). A
    damaged or hand-edited file (``true``, a negative or a huge count, a list) gave any
    int: 10**6 links expected made a healthy card's 18 links "down". Only counts a card
    can have (1 to 64, the ``expected_links`` schema's bound) are taken."""
    watch = BootWatch()
    doc = {
        "boot_id": BOOT2,
        "patrols": 3,
        "learned_links": {
            "uuid:A": {"nvlink": 18, "roce": 1},
            "uuid:B": {"nvlink": 10**6},
            "uuid:C": {"nvlink": True, "roce": -1},
            "uuid:D": ["nvlink"],
            "uuid:E": {"nvlink": 18.0},
        },
    }
    watch.restore(doc, BootInfo(BOOT2, 2.0))
    assert watch.patrols == 3
    assert watch.learned_links == {"uuid:A": {"nvlink": 18, "roce": 1}}


def test_a_stale_state_restores_the_boot_but_no_patrols_in_a_row_count():
    """Hostile trial (h34g): ``streaks=False`` (the daemon's state file is stale: no
    daemon patrolled for longer than ``check`` allows) keeps the boot's patrols, links
    and off-bus events, and the cards known gone, but every patrols-in-a-row count
    starts again: a count frozen hours ago plus one patrol drained at once."""
    gone = {
        "patrols": 2,
        "collector": "nvidia",
        "vendor": "nvidia",
        "index": 3,
        "chip": None,
        "uuid": "GPU-x",
        "bus_id": "0000:e8:00.0",
        "severity": "warning",
    }
    doc = {
        "boot_id": BOOT2,
        "patrols": 9,
        "learned_links": {"uuid:A": {"nvlink": 18}},
        "unlisted_patrols": {"0000:e8:00.0": 2},
        "missing_cards": {"uuid:GPU-x": gone},
        "off_bus": {"0000:e8:00.0": "xid 79"},
    }
    fresh, stale = BootWatch(), BootWatch()
    fresh.restore(doc, BootInfo(BOOT2, 2.0))
    stale.restore(doc, BootInfo(BOOT2, 2.0), streaks=False)
    assert fresh.unlisted_patrols == {"0000:e8:00.0": 2}
    assert fresh.missing_cards["uuid:GPU-x"]["patrols"] == 2
    assert (stale.patrols, stale.learned_links, stale.off_bus) == (
        9,
        {"uuid:A": {"nvlink": 18}},
        {"0000:e8:00.0": "xid 79"},
    )
    assert stale.unlisted_patrols == {}
    assert list(stale.missing_cards) == ["uuid:GPU-x"]
    entry = stale.missing_cards["uuid:GPU-x"]
    assert entry["patrols"] == 0 and "severity" not in entry and entry["uuid"] == "GPU-x"
