"""The PCI census: real lspci outputs classified by the plugins' PCI rules, the sysfs
reader, and the census check on the replay scenarios (fixtures/nodes/mixed-three-vendor,
gpu-unlisted). The lspci files are in tests/fixtures/lspci/ with their sources."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from conftest import NODES

from hetpatrol import pci_census
from hetpatrol.cli import main
from hetpatrol.config import ConfigError, load_config
from hetpatrol.patrol import Patroller, plugin_pci_rules
from hetpatrol.pci_census import CensusReader, parse_lspci, read_census, read_sysfs
from hetpatrol.schema import patrol_json_schema

LSPCI = Path(__file__).parent / "fixtures" / "lspci"
RULES = plugin_pci_rules()


def census_cards(name: str):
    functions, problems = parse_lspci((LSPCI / name).read_text())
    assert not problems
    from hetpatrol.pci_census import Census

    return Census(name, tuple(functions)).cards(RULES), functions


def test_hgx_h100_nvswitch_bridges_are_not_cards():
    cards, functions = census_cards("h100-nvswitch-hgx.txt")
    assert len(functions) == 13
    assert [(c.plugin, c.card_type) for c in cards] == [("nvidia", "h100")] * 8
    assert cards[0].function.bus_id == "0000:1b:00.0"
    assert "0000:07:00.0" not in {c.function.bus_id for c in cards}  # NVSwitch 10de:22a3


def test_gpu_audio_usb_and_amd_host_functions_are_not_cards():
    cards, _ = census_cards("nvidia-gpu-audio-amd-host.txt")
    assert [(c.function.bus_id, c.plugin) for c in cards] == [("0000:01:00.0", "nvidia")]
    assert cards[0].card_type is None  # 10de:2d04 is in no table: a card, type unknown
    cards, _ = census_cards("amd-gpu-audio.txt")
    assert [(c.function.bus_id, c.plugin) for c in cards] == [
        ("0000:01:00.0", "nvidia"),
        ("0000:02:00.0", "amd"),
    ]


def test_huawei_nics_are_not_npus_and_the_310_is():
    cards, functions = census_cards("huawei-hi1822-nic.txt")
    assert len(functions) == 4 and cards == ()
    cards, _ = census_cards("ascend-310-iommu.txt")
    assert [(c.function.bus_id, c.plugin, c.card_type) for c in cards] == [
        ("0000:0c:00.0", "ascend", "310")
    ]


def test_hygon_host_functions_are_not_dcus():
    cards, functions = census_cards("hygon-dcu-and-host.txt")
    assert len(functions) == 6
    assert [(c.function.bus_id, c.card_type) for c in cards] == [
        ("0000:07:00.0", "z100l"),
        ("0000:0a:00.0", "z100l"),
    ]
    assert {c.plugin for c in cards} == {"hygon"}


def test_vmm_records_give_driver_and_numa_node():
    functions, _ = parse_lspci((NODES / "gpu-unlisted" / "lspci-Dnn-vmm.txt").read_text())
    by_bus = {f.bus_id: f for f in functions}
    gpu = by_bus["0000:e8:00.0"]
    assert (gpu.pci_id, gpu.class_code, gpu.driver, gpu.numa_node) == (
        "10de:2330",
        0x0302,
        "nvidia",
        1,
    )
    assert by_bus["0000:83:00.0"].driver == "hinic"


def make_device(root: Path, bus: str, vendor: str, device: str, klass: str, **files):
    d = root / "sys/bus/pci/devices" / bus
    d.mkdir(parents=True)
    for name, value in {"vendor": vendor, "device": device, "class": klass, **files}.items():
        (d / name).write_text(value + "\n")
    return d


def test_sysfs_tree_reader(tmp_path):
    gpu = make_device(
        tmp_path,
        "0000:3b:00.0",
        "0x10de",
        "0x2330",
        "0x030200",
        numa_node="1",
        current_link_speed="2.5 GT/s PCIe",
        max_link_speed="32.0 GT/s PCIe",
        current_link_width="16",
        max_link_width="16",
        local_cpulist="0-31,64-95",
    )
    drivers = tmp_path / "sys/bus/pci/drivers/nvidia"
    drivers.mkdir(parents=True)
    os.symlink(drivers, gpu / "driver")
    make_device(tmp_path, "0000:07:00.0", "0x10de", "0x22a3", "0x068000", numa_node="-1")
    make_device(tmp_path, "0000:00:00.0", "0x1d94", "0x1450", "0x060000")
    census = read_sysfs(tmp_path, vendor_ids={0x10DE})
    assert census.known
    fns = {f.bus_id: f for f in census.functions}
    g = fns["0000:3b:00.0"]
    assert (g.driver, g.numa_node, g.current_link_speed, g.max_link_speed) == (
        "nvidia",
        1,
        "2.5 GT/s PCIe",
        "32.0 GT/s PCIe",
    )
    assert (g.current_link_width, g.max_link_width) == (16, 16)
    assert g.local_cpulist == "0-31,64-95"
    assert fns["0000:07:00.0"].numa_node is None  # -1: no NUMA affinity
    assert [c.function.bus_id for c in census.cards(RULES)] == ["0000:3b:00.0"]


def test_unreadable_bus_is_an_error_not_an_empty_census(tmp_path):
    census = read_sysfs(tmp_path / "nothing")
    assert not census.known and "sys/bus/pci/devices" in census.error
    assert not read_census(replay_dir=NODES / "nvlink-storm").known


def test_reader_rereads_only_after_its_interval(tmp_path):
    make_device(tmp_path, "0000:3b:00.0", "0x10de", "0x2330", "0x030200")
    now = [0.0]
    reader = CensusReader(tmp_path, interval_seconds=60, clock=lambda: now[0])
    first = reader.get()
    now[0] = 59.0
    assert reader.get() is first and reader.reads == 1
    now[0] = 61.0
    assert reader.get() is not first and reader.reads == 2


def run_patrol(name: str | Path, config=None, patrols: int = 1):
    config = config or load_config()
    p = Patroller(replace(config, node="n1"), replay_dir=Path(NODES / name))
    try:
        for _ in range(patrols):
            report = p.run()
        return report, p
    finally:
        p.close()


def test_bundled_config_shows_all_24_cards_of_the_three_vendor_node(capsys):
    report, _ = run_patrol("mixed-three-vendor")
    kinds = sorted({(c.vendor, c.card_type) for c in report.cards})
    assert len(report.cards) == 24
    assert kinds == [("ascend", "910b"), ("hygon", "k100_ai"), ("nvidia", "h100")]
    assert not [f for f in report.node_findings if f.check.startswith("pci")]
    data = report.node_checks["pci_census"]
    assert (data["cards"], data["unwatched"]) == (24, [])
    assert {"vendor": "hygon", "card_type": "k100_ai", "cards": 8, "unwatched": 0} in data["types"]
    assert main(["once", "--replay", str(NODES / "mixed-three-vendor")]) == 0
    assert "hygon k100_ai (gres dcu)  8 cards: 8 ok" in capsys.readouterr().out


# ---------------------------------------- a card its tool does not list, over patrols
# fixtures/nodes/gpu-unlisted: NVML (nvidia-smi-q.xml) lists 8 H100 at 19, 3b, 4c, 5d,
# 9b, bb, cb, db; the bus (lspci-Dnn-vmm.txt) holds a ninth at 0000:e8:00.0, driver nvidia
LOST = NODES / "gpu-unlisted"
E8 = "0000:e8:00.0"
DB = "0000:db:00.0"
XML = "nvidia-smi-q.xml"


def unlisted(report) -> list[tuple[str, str, str]]:
    """(bus id, severity, action) of each pci_unwatched finding of ``report``."""
    return [
        (f.value, f.severity, f.action) for f in report.node_findings if f.check == "pci_unwatched"
    ]


def variant(tmp_path: Path, name: str, edit) -> Path:
    """A copy of gpu-unlisted with ``edit(directory)`` applied."""
    d = tmp_path / name
    shutil.copytree(LOST, d)
    edit(d)
    return d


def lists_e8(d: Path) -> None:
    """NVML lists a ninth GPU at E8 (a copy of the DB GPU's element, with its own bus id,
    UUID, serial and minor number): the card is read again."""
    text = (d / XML).read_text()
    start = text.index('    <gpu id="00000000:DB:00.0">')
    block = text[start : text.index("</gpu>", start) + len("</gpu>\n")]
    ninth = (
        block.replace("DB:00.0", "E8:00.0")
        .replace(
            "GPU-004dc5e2-7c1d-cc17-c721-e63ad8f75bae", "GPU-004dc5e2-7c1d-cc17-c721-e63ad8f75bb0"
        )
        .replace("<serial>9458441022271<", "<serial>9458441022288<")
        .replace("<minor_number>7<", "<minor_number>8<")
    )
    text = text.replace("<attached_gpus>8<", "<attached_gpus>9<")
    (d / XML).write_text(text.replace("</nvidia_smi_log>", ninth + "</nvidia_smi_log>"))


def drops_db(d: Path) -> None:
    """NVML no longer lists the DB GPU either: two bus ids unlisted."""
    text = (d / XML).read_text()
    start = text.index('    <gpu id="00000000:DB:00.0">')
    end = text.index("</gpu>", start) + len("</gpu>\n")
    text = text.replace("<attached_gpus>8<", "<attached_gpus>7<")
    (d / XML).write_text(text[:start] + text[end:])


def e8_off_the_bus(d: Path) -> None:
    """The bus no longer holds E8 (hot-unplugged, or fell off the bus)."""
    path = d / "lspci-Dnn-vmm.txt"
    records = path.read_text().split("\n\n")
    path.write_text("\n\n".join(r for r in records if f"Slot:\t{E8}" not in r))


def e8_without_driver(d: Path) -> None:
    """E8 with no driver bound (what a driver reload passes through)."""
    path = d / "lspci-Dnn-vmm.txt"
    head, block, tail = path.read_text().partition(f"Slot:\t{E8}")
    path.write_text(head + block + tail.replace("Driver:\tnvidia\n", "", 1))


def nvml_fails(d: Path) -> None:
    """nvidia-smi-q.xml garbled: the nvidia collector fails (no answer about any card)."""
    (d / XML).write_text("<nvidia_smi_log><gpu")


def patrol_each(dirs, config=None):
    """One patrol of each replay directory, in order, each by a new Patroller that
    adopts the state of the one before (as a reload does: boot, held findings, last
    cards), with the census of its own directory: a card's state across patrols."""
    config = replace(config or load_config(), node="n1")
    reports, before = [], None
    for d in dirs:
        p = Patroller(config, replay_dir=Path(d))
        if before is not None:
            reader = p.census_reader  # adopt() keeps the old reader: not this bus's
            p.adopt(before)
            before.close()
            p.census_reader = reader
        reports.append(p.run())
        before = p
    before.close()
    return reports


def test_one_patrol_of_a_card_its_tool_does_not_list_is_a_warning_never_a_drain(capsys):
    from hetpatrol.slurm.drain import drain_needs

    report, _ = run_patrol("gpu-unlisted")
    (found,) = [f for f in report.node_findings if f.check == "pci_unwatched"]
    assert (found.severity, found.value, found.action) == ("warning", E8, "watch")
    assert "nvidia h100 [10de:2330] at 0000:e8:00.0" in found.message
    assert "the nvidia tool does not list it (1 of 3 patrols" in found.message
    assert "as hetpatrol once or the Epilog's, never drains for it" in found.message
    assert (report.health, report.action) == ("warning", "watch")
    assert drain_needs(report, load_config().actions.drain_on) == []
    assert report.node_checks["pci_census"]["unwatched"][0]["patrols"] == 1
    assert main(["once", "--replay", str(LOST)]) == 1  # one patrol: WARNING, never 2
    out = capsys.readouterr().out
    assert "WARNING" in out.splitlines()[0] and "1 of 3 patrols" in out


def test_three_patrols_in_a_row_are_critical_reset_card(tmp_path):
    from hetpatrol.slurm.drain import drain_needs

    reports = run_patrols("gpu-unlisted", 4)
    assert [unlisted(r) for r in reports] == [
        [(E8, "warning", "watch")],
        [(E8, "warning", "watch")],
        [(E8, "critical", "reset_card")],
        [(E8, "critical", "reset_card")],
    ]
    assert "2 of 3 patrols" in reports[1].node_findings[0].message
    third = next(f for f in reports[2].node_findings if f.check == "pci_unwatched")
    assert "does not list it in 3 patrols in a row (pci_census.unlisted_patrols 3)" in (
        third.message
    )
    (need,) = drain_needs(reports[2], load_config().actions.drain_on)
    assert (need[0], need[1].action, need[1].code) == ("node", "reset_card", "check:pci_unwatched")
    assert reports[3].node_checks["boot"]["unlisted_patrols"] == {E8: 4}
    line = json.loads(reports[3].patrol_line)
    jsonschema.validate(line, patrol_json_schema())
    assert line["boot"]["unlisted_patrols"] == {E8: 4}
    assert line["pci_census"]["unwatched"][0]["patrols"] == 4
    # the number of patrols is the config's
    cfg = tmp_path / "c.yaml"
    cfg.write_text("pci_census:\n  unlisted_patrols: 5\n")
    reports = run_patrols("gpu-unlisted", 5, load_config(cfg))
    assert [unlisted(r)[0][1] for r in reports] == ["warning"] * 4 + ["critical"]
    assert "4 of 5 patrols" in unlisted_message(reports[3])
    # one patrol's answer is never enough: 1 is refused, naming the key
    cfg.write_text("pci_census:\n  unlisted_patrols: 1\n")
    with pytest.raises(ConfigError, match="unlisted_patrols"):
        load_config(cfg)


def unlisted_message(report) -> str:
    return next(f.message for f in report.node_findings if f.check == "pci_unwatched")


def run_patrols(name, n, config=None):
    config = config or load_config()
    p = Patroller(replace(config, node="n1"), replay_dir=Path(NODES / name))
    try:
        return [p.run() for _ in range(n)]
    finally:
        p.close()


def test_the_card_listed_again_starts_its_count_again(tmp_path):
    back = variant(tmp_path, "back", lists_e8)
    reports = patrol_each([LOST, LOST, back, LOST, LOST, LOST])
    assert [unlisted(r) for r in reports] == [
        [(E8, "warning", "watch")],
        [(E8, "warning", "watch")],
        [],  # NVML lists E8 again: the count is gone
        [(E8, "warning", "watch")],  # 1 of 3 again, not 3
        [(E8, "warning", "watch")],
        [(E8, "critical", "reset_card")],
    ]
    assert "1 of 3 patrols" in unlisted_message(reports[3])
    assert reports[2].node_checks["boot"]["unlisted_patrols"] == {}


def test_a_card_gone_from_the_bus_or_unbound_starts_again_a_failed_tool_keeps_it(tmp_path):
    gone = variant(tmp_path, "gone", e8_off_the_bus)
    unbound = variant(tmp_path, "unbound", e8_without_driver)
    failed = variant(tmp_path, "failed", nvml_fails)
    reports = patrol_each([LOST, LOST, gone, LOST, LOST, unbound, LOST])
    assert [unlisted(r) for r in reports] == [
        [(E8, "warning", "watch")],
        [(E8, "warning", "watch")],
        [],  # off the bus
        [(E8, "warning", "watch")],
        [(E8, "warning", "watch")],
        [(E8, "warning", "watch")],  # no driver bound: its own warning, not counted
        [(E8, "warning", "watch")],
    ]
    assert "1 of 3 patrols" in unlisted_message(reports[3])
    assert "no driver bound" in unlisted_message(reports[5])
    assert "1 of 3 patrols" in unlisted_message(reports[6])
    # a patrol in which NVML gave no answer at all tells nothing: kept, not counted
    reports = patrol_each([LOST, LOST, failed, LOST])
    assert [unlisted(r) for r in reports] == [
        [(E8, "warning", "watch")],
        [(E8, "warning", "watch")],
        [],  # collector_failed says it
        [(E8, "critical", "reset_card")],
    ]
    assert reports[2].node_checks["boot"]["unlisted_patrols"] == {E8: 2}


def test_a_tool_that_lists_no_card_at_all_counts_every_card_to_critical(monkeypatch):
    """The count needed the tool to list some card by bus id, so a node whose every GPU
    is lost kept its nine GPUs at warning for ever: never reset_card. NVML answers and
    counts no device ("No devices were found": each GPU's RmInitAdapter failed, its
    driver still bound; NVIDIA/open-gpu-kernel-modules #789, #862): the collector is ok
    with no record (NvidiaCollector.collect with nvmlDeviceGetCount 0; the replay
    refuses a dump without <gpu>, so it is stood in for here). No card listed is no card
    without a bus id either: each is counted."""
    from hetpatrol.collector import STATE_OK, CollectResult
    from hetpatrol.collectors.nvidia import NvidiaCollector

    monkeypatch.setattr(
        NvidiaCollector, "collect", lambda self: CollectResult("nvidia", state=STATE_OK)
    )
    reports = patrol_each([LOST, LOST, LOST])
    assert [r.collectors[0].state for r in reports] == ["ok"] * 3
    assert [[c.vendor for c in r.cards if c.vendor == "nvidia"] for r in reports] == [[]] * 3
    counts = [[f[1] for f in unlisted(r)] for r in reports]
    assert counts == [["warning"] * 9, ["warning"] * 9, ["critical"] * 9]
    assert E8 in {f.value for f in reports[2].node_findings if f.check == "pci_unwatched"}
    assert reports[2].node_checks["boot"]["unlisted_patrols"][E8] == 3


def test_two_bus_ids_are_counted_apart(tmp_path):
    two = variant(tmp_path, "two", drops_db)
    reports = patrol_each([LOST, LOST, two, two, two])
    assert [sorted(unlisted(r)) for r in reports] == [
        [(E8, "warning", "watch")],
        [(E8, "warning", "watch")],
        [(DB, "warning", "watch"), (E8, "critical", "reset_card")],  # DB inherits nothing
        [(DB, "warning", "watch"), (E8, "critical", "reset_card")],
        [(DB, "critical", "reset_card"), (E8, "critical", "reset_card")],
    ]
    assert reports[3].node_checks["boot"]["unlisted_patrols"] == {DB: 2, E8: 4}
    # NVML lists the DB GPU again and not E8: DB's count goes, E8's goes on
    reports = patrol_each([two, two, LOST])
    assert [sorted(unlisted(r)) for r in reports][2] == [(E8, "critical", "reset_card")]
    assert reports[2].node_checks["boot"]["unlisted_patrols"] == {E8: 3}


def moves_db_to_e8(d: Path) -> None:
    """NVML lists the DB GPU's element at E8: E8 is read again, DB is not listed."""
    (d / XML).write_text((d / XML).read_text().replace("00000000:DB:00.0", "00000000:E8:00.0"))


def test_a_critical_card_listed_again_is_held_by_its_bus_id(tmp_path):
    """The hold of a critical node finding (recovery_patrols, 3) after E8 is listed
    again is E8's: DB's warning of the same check neither ends it nor takes its place."""
    back = variant(tmp_path, "back", lists_e8)
    moved = variant(tmp_path, "moved", moves_db_to_e8)
    reports = patrol_each([LOST, LOST, LOST, back, back, back])
    assert [unlisted(r) for r in reports][3:] == [
        [(E8, "critical", "reset_card")],  # held 1 of 3
        [(E8, "critical", "reset_card")],
        [],
    ]
    assert "(not raised for 1 of 3 patrols: held)" in unlisted_message(reports[3])
    reports = patrol_each([LOST, LOST, LOST, moved])
    assert sorted(unlisted(reports[3])) == [
        (DB, "warning", "watch"),  # 1 of 3: nothing inherited from E8
        (E8, "critical", "reset_card"),  # held
    ]
    assert reports[3].action == "reset_card"


def with_boot(tmp_path: Path, name: str, boot: Path) -> Path:
    """gpu-unlisted with the proc/ (boot id, btime) of ``boot``."""
    return variant(tmp_path, name, lambda d: shutil.copytree(boot / "proc", d / "proc"))


def test_the_count_survives_a_restart_within_the_boot_never_a_new_boot(tmp_path):
    from hetpatrol.daemon import Daemon
    from hetpatrol.exporters.state import read_state
    from hetpatrol.healthcheck import check
    from hetpatrol.replay import scenario_boots

    # boots/1 and boots/2 of reboot-links-late: two boot ids (see its scenario.yaml)
    boot1, boot2 = scenario_boots(NODES / "reboot-links-late")
    first, second = with_boot(tmp_path, "b1", boot1), with_boot(tmp_path, "b2", boot2)
    state = tmp_path / "state" / "state.json"
    config = replace(load_config(), node="n1", jsonl_path=None, state_path=state)

    def daemon_patrols(replay: Path, n: int):
        d = Daemon(config, replay_dir=replay)
        try:
            d.restore_escalation()
            return [d.patrol_once() for _ in range(n)]
        finally:
            d.shutdown()

    assert [unlisted(r) for r in daemon_patrols(first, 2)] == [[(E8, "warning", "watch")]] * 2
    doc = read_state(state)
    assert doc["boot"]["unlisted_patrols"] == {E8: 2}
    code, line = check(state)
    assert code == 1 and "node pci_unwatched" in line and "2 of 3 patrols" in line, line
    # the daemon restarted within the same boot goes on: its first patrol is the third
    (report,) = daemon_patrols(first, 1)
    assert unlisted(report) == [(E8, "critical", "reset_card")]
    code, line = check(state)
    assert code == 2 and "in 3 patrols in a row" in line, line
    # after a reboot (another boot id) the count starts again
    (report,) = daemon_patrols(second, 1)
    assert unlisted(report) == [(E8, "warning", "watch")]
    assert "1 of 3 patrols" in unlisted_message(report)
    assert read_state(state)["boot"]["unlisted_patrols"] == {E8: 1}
    # the same in one process whose boot id changes (a replay of boot 1 then boot 2)
    reports = patrol_each([first, first, second, second])
    assert [unlisted(r)[0][1] for r in reports] == ["warning"] * 4
    assert "1 of 3 patrols" in unlisted_message(reports[2])


def test_no_driver_bound_is_a_warning(tmp_path):
    scenario = tmp_path / "s"
    shutil.copytree(NODES / "gpu-unlisted", scenario)
    path = scenario / "lspci-Dnn-vmm.txt"
    text = path.read_text()
    block = "Slot:\t0000:e8:00.0"
    head, _, tail = text.partition(block)
    path.write_text(head + block + tail.replace("Driver:\tnvidia\n", "", 1))
    report, _ = run_patrol(scenario)
    found = [f for f in report.node_findings if f.check == "pci_unwatched"]
    assert [(f.severity, f.value) for f in found] == [("warning", "0000:e8:00.0")]
    assert "no driver bound" in found[0].message
    assert report.node_checks["pci_census"]["unwatched"][0]["patrols"] is None


def test_plugin_not_enabled_names_each_card(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("collectors:\n  hygon: {enabled: false}\n")
    report, _ = run_patrol("mixed-three-vendor", load_config(cfg))
    found = [f for f in report.node_findings if f.check == "pci_unwatched"]
    assert len(found) == 8 and {f.severity for f in found} == {"warning"}
    assert found[0].value == "0000:04:00.0"
    assert "plugin 'hygon' not enabled" in found[0].message
    assert len(report.cards) == 16


def test_scenario_without_census_says_so_at_info():
    report, _ = run_patrol("nvlink-storm")
    found = [f for f in report.node_findings if f.check == "pci_census"]
    assert [f.severity for f in found] == ["info"]
    assert "could not be read" in found[0].message


def test_absent_plugin_without_cards_on_the_bus_is_not_asked_again(monkeypatch):
    calls: list[list[str]] = []
    from hetpatrol import tool

    real = tool.ReplayTool.run

    def counting(self, argv, timeout):
        calls.append(list(argv))
        return real(self, argv, timeout)

    monkeypatch.setattr(tool.ReplayTool, "run", counting)
    report, _ = run_patrol("mixed-three-vendor", patrols=3)
    cnmon = [a for a in calls if a[0] == "cnmon"]
    assert len(cnmon) == 1  # first patrol only
    status = {c.name: c for c in report.collectors}["cambricon"]
    assert status.state == "absent" and "no cambricon card on the PCI bus" in status.error
    # without a census every collector is asked every patrol
    calls.clear()
    run_patrol("nvlink-storm", patrols=3)
    assert len([a for a in calls if a[0] == "cnmon"]) == 3


@pytest.mark.parametrize("name", ["mixed-three-vendor", "gpu-unlisted"])
def test_census_metrics(name):
    from hetpatrol.exporters.prometheus import ExporterStats, report_metrics
    from hetpatrol.exporters.text_format import TextRenderer

    report, _ = run_patrol(name)
    families = report_metrics(report, ExporterStats(), [], 1)
    text = TextRenderer().render(families).decode()
    if name == "mixed-three-vendor":
        assert 'hetpatrol_pci_cards{card_type="k100_ai",vendor="hygon"} 8.0' in text
        assert 'hetpatrol_pci_cards_unwatched{vendor="hygon"} 0.0' in text
    else:
        assert 'hetpatrol_pci_cards_unwatched{vendor="nvidia"} 1.0' in text


def test_replay_census_from_a_sysfs_tree_or_the_argv_named_lspci_file(tmp_path):
    make_device(tmp_path / "root", "0000:c1:00.0", "0x19e5", "0xd802", "0x120000")
    make_device(tmp_path / "root", "0000:83:00.0", "0x19e5", "0x1822", "0x020000")
    census = read_census(replay_dir=tmp_path)
    assert census.source.endswith("root/sys/bus/pci/devices")
    assert [(c.function.bus_id, c.card_type) for c in census.cards(RULES)] == [
        ("0000:c1:00.0", "910b")
    ]
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(NODES / "gpu-unlisted" / "lspci-Dnn-vmm.txt", other / "lspci_-Dnn_-vmm.txt")
    assert len(read_census(replay_dir=other).cards(RULES)) == 17
    (other / "lspci_-Dnn_-vmm.txt").write_text("Slot:\t0000:01:00.0\nClass:\tnonsense\n")
    broken = read_census(replay_dir=other)
    assert not broken.known and "no Class/Vendor/Device id" in broken.error


def test_thousands_of_sriov_functions_and_a_long_cpulist(tmp_path, monkeypatch):
    # 5000 VFs of a NIC sort before the GPU: the first 4096 names were read and the
    # census, still "known", had no GPU; a GPU's interleaved local_cpulist (one socket's
    # even CPUs, as some BIOSes number them) is 420 bytes: 256 were read
    base = tmp_path / "sys/bus/pci/devices"
    for i in range(5000):
        d = base / f"0000:{i >> 8:02x}:{(i >> 3) & 0x1F:02x}.{i & 7}"
        d.mkdir(parents=True)
        for name, value in (("vendor", "0x15b3"), ("device", "0x101e"), ("class", "0x020000")):
            (d / name).write_text(value + "\n")
    cpus = ",".join(str(n) for n in range(0, 224, 2))
    make_device(tmp_path, "0000:ff:00.0", "0x10de", "0x2330", "0x030200", local_cpulist=cpus)
    census = read_sysfs(tmp_path, vendor_ids={0x10DE})
    assert census.known and len(census.functions) == 5001
    (gpu,) = (f for f in census.functions if f.vendor_id == 0x10DE)
    assert (gpu.bus_id, gpu.local_cpulist) == ("0000:ff:00.0", cpus)
    assert [c.function.bus_id for c in census.cards(RULES)] == ["0000:ff:00.0"]
    # past PCI's bound the census is unknown with the reason, never a part of the bus
    monkeypatch.setattr(pci_census, "MAX_FUNCTIONS", 5000)
    census = read_sysfs(tmp_path, vendor_ids={0x10DE})
    assert not census.known and "5001 entries, more than PCI's 5000: not read" in census.error
