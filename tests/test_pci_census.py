"""The PCI census: real lspci outputs classified by the plugins' PCI rules, the sysfs
reader, and the census check on the replay scenarios (fixtures/nodes/mixed-three-vendor,
gpu-unlisted). The lspci files are in tests/fixtures/lspci/ with their sources."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import NODES

from hetpatrol import pci_census
from hetpatrol.cli import main
from hetpatrol.config import load_config
from hetpatrol.patrol import Patroller, plugin_pci_rules
from hetpatrol.pci_census import CensusReader, parse_lspci, read_census, read_sysfs

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


def test_card_on_the_bus_no_tool_lists_is_named_by_bus_id():
    report, _ = run_patrol("gpu-unlisted")
    found = [f for f in report.node_findings if f.check == "pci_unwatched"]
    assert [(f.severity, f.value) for f in found] == [("critical", "0000:e8:00.0")]
    assert "nvidia h100 [10de:2330] at 0000:e8:00.0" in found[0].message
    assert "does not list it" in found[0].message
    assert found[0].action == "reset_card"  # actions/findings.py: a GPU the driver lost
    assert main(["once", "--replay", str(NODES / "gpu-unlisted")]) == 2


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
