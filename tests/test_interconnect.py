"""Throttling, PCIe link and NVLink checks on the recorded dumps and the bundled nodes.

Values read off the recordings: the healthy-mixed H100s (from
nvidia-smi-q_H100-80GB-HBM3x8_535.161.08.txt) show "HW Slowdown: Active" and "HW Power
Brake Slowdown: Active" (mask 0x88) at 0 % utilisation, PCIe gen 5/5, x16/x16; the XML
dumps show only "gpu_idle Active" (or nothing) as clocks event reason; A10G gen 1 of 4
and x8 of x16 at 0 %, T4 x8 of x16 at 0 %, RTX-2080 x8 of x16 at 2 %, RTX-3080 gen 4/4
x16/x16 at 65 %.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import NODES, samples_dir

from hetpatrol.collectors.nvidia import NvidiaCollector
from hetpatrol.collectors.nvml_replay import load_replay_nvml
from hetpatrol.config import load_config
from hetpatrol.judge import judge
from hetpatrol.patrol import Patroller

HEALTHY = NODES / "healthy-mixed"


def nvidia_report(tmp_path, faults=None, config=None, base=HEALTHY):
    """healthy-mixed's GPUs with extra NVML faults, through the whole patrol."""
    d = tmp_path / "node"
    d.mkdir(exist_ok=True)
    (d / "nvidia-smi-q.xml").write_bytes((base / "nvidia-smi-q.xml").read_bytes())
    (d / "scenario.yaml").write_text(yaml.safe_dump({"node": "t", "nvml": faults or {}}))
    p = Patroller(replace(config or load_config(), node="t"), replay_dir=d)
    try:
        return p.run()
    finally:
        p.close()


def finding(card, check):
    found = [f for f in card.findings if f.check == check]
    return found[0] if found else None


def test_healthy_node_power_brake_while_idle_is_info(tmp_path):
    report = nvidia_report(tmp_path)
    assert report.exit_code == 0
    for card in report.cards:
        f = finding(card, "clock_event_reasons")
        assert (f.severity, f.value) == ("info", "0x88")
        assert "HW slowdown" in f.message and "HW power brake" in f.message
        assert card.health == "ok"
        assert finding(card, "pcie_downtrained") is None


def test_power_brake_while_busy_is_a_warning(tmp_path):
    faults = {"gpus": {0: {"xml_overrides": {"utilization/gpu_util": "95 %"}}}}
    report = nvidia_report(tmp_path, faults)
    gpu0 = report.cards[0]
    f = finding(gpu0, "clock_event_reasons")
    assert (f.severity, f.value, f.threshold) == ("warning", "0x88", 0.5)
    assert gpu0.health == "warning" and report.exit_code == 1
    assert all(c.health == "ok" for c in report.cards[1:])


def test_hw_thermal_counts_even_when_idle(tmp_path):
    path = "clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown"
    report = nvidia_report(tmp_path, {"gpus": {5: {"xml_overrides": {path: "Active"}}}})
    f = finding(report.cards[5], "clock_event_reasons")
    assert (f.severity, f.value) == ("warning", "0xc8")
    assert "HW thermal slowdown (warning)" in f.message


def test_profile_severities(tmp_path):
    text = (
        Path(load_config().source)
        .read_text(encoding="utf-8")
        .replace("hw_power_brake: warning}", "hw_power_brake: critical}")
    )
    (tmp_path / "c.yaml").write_text(text)
    config = load_config(tmp_path / "c.yaml")
    faults = {"gpus": {0: {"xml_overrides": {"utilization/gpu_util": "95 %"}}}}
    report = nvidia_report(tmp_path, faults, config)
    assert finding(report.cards[0], "clock_event_reasons").severity == "critical"


def test_pcie_downtrained_while_busy(tmp_path):
    overrides = {
        "utilization/gpu_util": "80 %",
        "pci/pci_gpu_link_info/pcie_gen/current_link_gen": "4",
        "pci/pci_gpu_link_info/link_widths/current_link_width": "8x",
    }
    report = nvidia_report(tmp_path, {"gpus": {3: {"xml_overrides": overrides}}})
    f = finding(report.cards[3], "pcie_downtrained")
    assert f.severity == "warning"
    assert f.value == {"gen": 4, "width": 8}
    assert f.threshold == {"gen": 5, "width": 16}
    # the same link while idle is power saving, not a fault
    overrides["utilization/gpu_util"] = "10 %"
    report = nvidia_report(tmp_path, {"gpus": {3: {"xml_overrides": overrides}}})
    assert finding(report.cards[3], "pcie_downtrained") is None


# (dump, [(gen, gen max, width, width max, util %)] read off the XML)
DUMPS = [
    ("nvidia-smi-q-x_A10G_v11.xml", [(1, 4, 8, 16, 0)]),
    ("nvidia-smi-q-x_Tesla-T4_v11.xml", [(3, 3, 8, 16, 0)]),
    ("nvidia-smi-q-x_RTX-2080_windows_v11.xml", [(3, 3, 8, 16, 2)]),
    ("nvidia-smi-q-x_RTX-3080_v13.xml", [(4, 4, 16, 16, 65)]),
    ("nvidia-smi-q-x_RTX-3090_v12.xml", [(1, 4, 16, 16, 0)]),
    ("nvidia-smi-q-x_RTX-A5000x2_v13.xml", [(1, 4, 16, 16, 0), (1, 4, 16, 16, 0)]),
]


@pytest.mark.parametrize(("name", "links"), DUMPS)
def test_recorded_dumps_idle_or_full_speed_make_no_finding(name, links):
    nvml = load_replay_nvml(samples_dir("nvidia") / name)
    result = NvidiaCollector({}, nvml=nvml).collect()
    config = load_config()
    got = []
    for rec in result.records:
        got.append(
            (
                rec.pcie_link_gen,
                rec.pcie_link_gen_max,
                rec.pcie_link_width,
                rec.pcie_link_width_max,
                round(rec.utilization_ratio * 100),
            )
        )
        judge(rec, config)
        checks = {f.check for f in rec.findings}
        assert not checks & {"pcie_downtrained", "clock_event_reasons", "nvlink_down"}
        assert rec.links == []  # dumps have no NVLink section: no links, no error
    assert got == links


def test_every_xml_dump_idle_reason_is_no_finding():
    config = load_config()
    for path in sorted(samples_dir("nvidia").glob("*.xml")):
        result = NvidiaCollector({}, nvml=load_replay_nvml(path)).collect()
        for rec in result.records:
            mask = rec.counters.get("clocks_event_reasons")
            assert mask in (None, 0, 1), (path.name, mask)  # only "gpu_idle" is ever Active
            judge(rec, config)
            assert not [f for f in rec.findings if f.check == "clock_event_reasons"]


def test_nvlink_storm_node_links(tmp_path):
    p = Patroller(replace(load_config(), node="t"), replay_dir=NODES / "nvlink-storm")
    try:
        report = p.run()
    finally:
        p.close()
    gpu2 = report.cards[2]
    assert len(gpu2.links) == 18
    assert [lk["link"] for lk in gpu2.links if lk["state"] == "down"] == [7]
    assert gpu2.links[7]["counters"] == {
        "replay": 31,
        "recovery": 12,
        "crc_flit": 240,
        "crc_data": 3,
    }
    down = finding(gpu2, "nvlink_down")
    assert (down.severity, down.value) == ("warning", [7])
    errors = finding(gpu2, "nvlink_errors")
    assert (errors.severity, errors.value, errors.threshold) == ("warning", 286, 100)
    for card in report.cards[3:]:
        assert [lk["state"] for lk in card.links] == ["up"] * 18
        assert finding(card, "nvlink_down") is None

    from prometheus_client.parser import text_string_to_metric_families

    from hetpatrol.exporters.prometheus import Exposition

    text = Exposition(["nvidia"]).update(report, 1).decode()
    ups = [
        s
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "hetpatrol_card_link_up"
    ]
    assert len(ups) == 8 * 18
    assert [(s.labels["index"], s.labels["link"]) for s in ups if s.value == 0] == [("2", "7")]


def test_nvlink_read_at_its_own_cadence(tmp_path):
    nvml = load_replay_nvml(HEALTHY / "nvidia-smi-q.xml", {"nvlink": {"links": 12}})
    collector = NvidiaCollector({"nvlink_interval_seconds": 3600}, nvml=nvml)
    first = collector.collect()
    calls = nvml.calls["nvmlDeviceGetNvLinkState"]
    assert calls == 8 * 13  # 12 links + the 13th answering NotSupported, per GPU
    second = collector.collect()
    assert nvml.calls["nvmlDeviceGetNvLinkState"] == calls  # cached
    assert second.records[0].links == first.records[0].links
    off = NvidiaCollector({"nvlink": False}, nvml=load_replay_nvml(HEALTHY / "nvidia-smi-q.xml"))
    assert off.collect().records[0].links == []


def test_bad_nvlink_fault_is_refused():
    from hetpatrol.collectors.nvml_replay import ReplayFormatError

    with pytest.raises(ReplayFormatError, match="nvlink"):
        load_replay_nvml(HEALTHY / "nvidia-smi-q.xml", {"nvlink": {"links": 40}})


def test_exported_pcie_width_is_the_current_one_not_the_max(tmp_path):
    """Every scenario had width = max, so exporting the max as the current width went
    unseen. GPU 3 replayed at x8 of x16 (as the recorded A10G dump,
    nvidia-smi-q-x_A10G_v11.xml: current_link_width 8x, max_link_width 16x)."""
    from prometheus_client.parser import text_string_to_metric_families

    from hetpatrol.exporters.prometheus import Exposition

    overrides = {"pci/pci_gpu_link_info/link_widths/current_link_width": "8x"}
    report = nvidia_report(tmp_path, {"gpus": {3: {"xml_overrides": overrides}}})
    body = Exposition(["nvidia", "ascend"]).update(report, 1).decode()
    got: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            if (
                s.name.startswith("hetpatrol_card_pcie_link_width")
                and s.labels["vendor"] == "nvidia"
            ):
                got.setdefault(s.name, {})[s.labels["index"]] = s.value
    assert got["hetpatrol_card_pcie_link_width"]["3"] == 8
    assert got["hetpatrol_card_pcie_link_width_max"]["3"] == 16
    assert got["hetpatrol_card_pcie_link_width"]["2"] == 16


def test_recorded_downtrained_dump_reads_current_and_max_apart():
    """The recorded A10G (x8 of x16) and T4 (x8 of x16) dumps, read by the collector."""
    for name in ("nvidia-smi-q-x_A10G_v11.xml", "nvidia-smi-q-x_Tesla-T4_v11.xml"):
        nvml = load_replay_nvml(samples_dir("nvidia") / name)
        (rec,) = NvidiaCollector({}, nvml=nvml).collect().records
        assert (rec.pcie_link_width, rec.pcie_link_width_max) == (8, 16)


# ------------------------------------------------------------------ RoCE expected ports

ROCE = NODES / "ascend-roce-alarm"


class _FailingHccn:
    """The ascend-roce-alarm recordings, with every hccn_tool command of the chips in
    ``failing`` answering exit 255 (a port the tool no longer lists)."""

    def __init__(self):
        from hetpatrol.tool import ReplayTool

        self.replay = ReplayTool(ROCE)
        self.failing: set[str] = set()

    def __call__(self, argv, timeout):
        from hetpatrol.tool import ToolOutput

        if argv[0] == "hccn_tool" and argv[2] in self.failing:
            return ToolOutput(tuple(argv), "", "Failed to get dev info\n", 255, False, 0.01)
        return self.replay.run(argv, timeout)


def _roce_patrols(n_failing_after_first=("2",), config=None, grace_patrols=0):
    """Two reads of the recorded 910B4 node (detail every patrol): the first learns each
    chip's ports as the patrol does (BootWatch.learned_links: ports up in the first
    healthy patrol of the boot), the second fails ``hccn_tool`` on some chips."""
    from hetpatrol.actions.escalation import card_identity
    from hetpatrol.boot import BootInfo, BootWatch, learn_links
    from hetpatrol.checks.facts import BootFacts
    from hetpatrol.collectors.ascend import AscendCollector

    config = config or load_config()
    collector = AscendCollector(
        {"detail_interval_seconds": 0, "detail_budget_seconds": 60}, replay_dir=ROCE
    )
    runner = _FailingHccn()
    collector.runner = runner
    watch = BootWatch()
    out = []
    for patrol in (1, 2):
        watch.note(BootInfo("3f1b0c2e-8d4a-4c47-9a51-6e2f7d0b9c13", 1.0))
        if patrol == 2:
            runner.failing = set(n_failing_after_first)
        records = collector.collect().records
        for rec in records:
            ident = card_identity(rec)
            boot = BootFacts(grace_patrols and watch.patrols, watch.learned_links.get(ident, {}))
            judge(rec, config, boot)
            learn_links(watch, ident, rec.links)
        out.append({r.index: r for r in records})
    return out


def test_roce_port_no_longer_listed_is_roce_link_down():
    """NPU 2's port was UP in the first patrol (hccn_tool_-i_2_-link_-g.txt: "link
    status: UP"); when hccn_tool stops answering for it, the port is no longer listed:
    roce_link_down critical, naming the count and the tool's error. NPU 5's port was
    DOWN from the start (never learned): its finding is the recorded DOWN, as before."""
    first, second = _roce_patrols()
    assert [f.check for f in first[2].findings] == []
    assert first[2].links[0]["state"] == "up"
    assert second[2].links == []
    (f,) = [f for f in second[2].findings if f.check == "roce_link_down"]
    assert f.severity == "critical" and f.threshold == 1
    assert f.value == {"listed": 0, "up": 0}
    assert "0 of 1 port(s) up (expected from its first healthy patrol of this boot)" in (f.message)
    assert "exit 255: Failed to get dev info" in f.message
    assert [g.message for g in second[5].findings if g.check == "roce_link_down"] == [
        "RoCE port 5 link is DOWN (hccn_tool -link): check the cable, optical module and "
        "switch port"
    ]
    assert all(
        not [g for g in second[i].findings if g.check == "roce_link_down"]
        for i in (0, 1, 3, 4, 6, 7)
    )


def test_roce_missing_port_has_the_post_boot_grace():
    _, second = _roce_patrols(grace_patrols=6)
    (f,) = [f for f in second[2].findings if f.check == "roce_link_down"]
    assert f.severity == "warning" and "post-boot grace 2 of 6" in f.message


def test_roce_expected_ports_from_the_profile(tmp_path):
    """A profile count counts even without a learned one: 2 ports expected on the
    910B class, 1 listed up on every chip: each chip is one port short; 0 (the 310P
    class's bundled value) means no RoCE port at all: no RoCE finding, even for a port
    listed DOWN."""
    site = tmp_path / "hetpatrol.yaml"
    site.write_text("profiles:\n  - name: ascend-910b\n    roce: {expected_links: 2}\n")
    first, _ = _roce_patrols(config=load_config(site))
    (f,) = [f for f in first[0].findings if f.check == "roce_link_down"]
    assert "1 of 2 port(s) up (expected from its profile): 1 port(s) no longer" in f.message
    site.write_text("profiles:\n  - name: ascend-910b\n    roce: {expected_links: 0}\n")
    first, second = _roce_patrols(config=load_config(site))
    assert not [f for f in first[5].findings if f.check.startswith("roce")]
    assert not [f for f in second[2].findings if f.check.startswith("roce")]
    bundled = load_config().profile_for("ascend", "310p", "310P3").checks["interconnect"]
    assert bundled.roce_expected_links == 0
