"""Ascend detail: npu-smi info -m / -t health, hccn_tool link / net_health / link_stat /
optical, on every recorded sample, the judges, the cadence, and a whole node.

Expected values were read off the sample files by eye.
"""

from __future__ import annotations

import calendar
import json
import time
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from conftest import NODES, samples_dir

from hetpatrol.checks.facts import CardFacts
from hetpatrol.checks.fault_codes import FaultCodeSettings
from hetpatrol.checks.interconnect import InterconnectSettings
from hetpatrol.collectors.ascend import AscendCollector
from hetpatrol.collectors.ascend_detail import (
    DetailReader,
    LinkStat,
    parse_chip_map,
    parse_health,
    parse_link,
    parse_link_stat,
    parse_net_health,
    parse_optical,
)
from hetpatrol.collectors.ascend_levels import fault_code_table
from hetpatrol.config import load_config
from hetpatrol.judge import judge
from hetpatrol.patrol import Patroller
from hetpatrol.schema import CardRecord, Levels, jsonl_json_schema
from hetpatrol.tool import ReplayTool, ToolOutput

ROCE = NODES / "ascend-roce-alarm"


def text(name: str) -> str:
    return (samples_dir("ascend") / name).read_text()


def t(s: str) -> float:
    return float(calendar.timegm(time.strptime(s, "%a %b %d %H:%M:%S %Y")))


# ------------------------------------------------------------------ parsers, per sample


@pytest.mark.parametrize(
    ("name", "rows"),
    [
        (
            "npu-smi-info-m_310P3_1card_cardid32896_Mcu_v25.5.2.txt",
            [(32896, 0, 0, "Ascend 310P3"), (32896, 1, None, "Mcu")],
        ),
        (
            "npu-smi-info-m_310_1card-4chip_MiniD_Mcu_v21.0.4.txt",
            [(6, c, c, "MiniD") for c in range(4)] + [(6, 4, None, "Mcu")],
        ),
        (
            "npu-smi-info-m_310_1card-4chip_cardid215_MiniD_v20.2.0.txt",
            [(215, c, c, "MiniD") for c in range(4)],
        ),
        (
            "npu-smi-info-m_910A_8card_tab-indented_v23.0.5.txt",
            [(n, 0, n, "Ascend 910A") for n in range(8)],
        ),
        ("npu-smi-info-m_910A_8card_v24.1.RC2.txt", [(n, 0, n, "Ascend 910A") for n in range(8)]),
        (
            "npu-smi-info-m_910B4_8card_Mcu_8space-indent_v25.0.rc1.1.txt",
            [row for n in range(8) for row in ((n, 0, n, "Ascend 910B4"), (n, 1, None, "Mcu"))],
        ),
    ],
)
def test_chip_map_samples(name, rows):
    assert parse_chip_map(text(name)) == rows


def test_health_alarm_codes_and_multiline_information():
    h = parse_health(text("npu-smi-info-t-health-i0-c0_910A_Alarm_errcodes-multiline_v23.0.7.txt"))
    assert h.status == "Alarm"
    assert h.codes == ("A4025021", "8C03A000", "8C084E00")
    assert h.info == (
        "ascend_monitor adda heart beat lost error",
        "node type=process-manager, sensor type=General Software, event state=The process "
        "start failed or exit abnormally",
        "node type=adda, sensor type=Heartbeat Sensor, event state=Heartbeat Lost.",
    )


def test_health_ok():
    h = parse_health(text("npu-smi-info-t-health-i0-c0_910A_OK_v23.0.5.txt"))
    assert (h.status, h.codes, h.info) == ("OK", (), ())


@pytest.mark.parametrize(
    "value, codes, bad",
    [
        ("8C03A000,8C084E00", ("8C03A000", "8C084E00"), ()),
        ("0x8C03A000", ("8C03A000",), ()),
        ("A4025021, 0X8c084e00;8C03A000", ("A4025021", "8C084E00", "8C03A000"), ()),
        ("8C03A000 8C03A0 zz", ("8C03A000",), ("8C03A0", "zz")),
        ("N/A", (), ()),
    ],
)
def test_health_error_code_separators_prefix_and_bad_tokens(value, codes, bad):
    h = parse_health(f"Health Status : Alarm\nError Code : {value}\nError Information : NA\n")
    assert (h.codes, h.bad_codes) == (codes, bad)


def test_reader_keeps_an_unreadable_error_code_as_a_card_error():
    answer = "\tHealth Status : Alarm\n\tError Code : 0x8C03A000,8C03A0G0\n"

    def runner(argv, timeout):
        if "health" not in argv:
            raise FileNotFoundError(argv[0])
        return ToolOutput(tuple(argv), answer, "", 0, False, 0.01)

    reader = DetailReader({"detail": True}, ["npu-smi", "info"], runner, clock=Clock())
    recs = records(1)
    reader.attach(recs)
    assert recs[0].health_detail["codes"] == ["8C03A000"]
    assert recs[0].errors == [
        {
            "source": "npu-smi info -t health -i 0 -c 0: Error Code",
            "error": "not an 8-hex-digit error code: '8C03A0G0'",
        }
    ]


def test_health_without_status_is_refused():
    with pytest.raises(ValueError):
        parse_health(text("npu-smi-info-t-board-i0_error_InvalidCardId_card-missing_v23.0.7.txt"))


def test_link_and_net_health_samples():
    assert parse_link(text("hccn_tool-link-g_UP_DOC-EXAMPLE.txt")) == "up"
    assert parse_link("link status: DOWN\n") == "down"
    assert parse_net_health(text("hccn_tool-net_health-g_910A_dev0_SocketFailed_v23.0.5.txt")) == (
        "Socket failed"
    )
    assert parse_net_health(text("hccn_tool-net_health-g_Success_DOC-EXAMPLE.txt")) == "Success"
    with pytest.raises(ValueError):
        parse_link(text("hccn_tool-fec-g_910A_dev0_noFEC_v23.0.5.txt"))


def test_link_stat_samples():
    flaps = parse_link_stat(text("hccn_tool-link_stat-g_910A_dev0_flaps_v23.0.5.txt"))
    assert flaps == LinkStat(
        t("Wed Aug 2 03:09:26 2022"),
        2,
        (
            (t("Tue Aug 1 14:43:40 2022"), "UP"),
            (t("Tue Aug 1 14:43:40 2022"), "DOWN"),
            (t("Tue Aug 1 14:43:26 2022"), "UP"),
        ),
    )
    assert len(flaps.downs_within(86400)) == 1
    assert flaps.downs_within(3600) == []
    last = parse_link_stat(text("hccn_tool-link_stat-g_910A_dev0_lastLinkDown_v23.0.7.txt"))
    assert last.current_time == t("Wed Aug 2 03:36:43 2022")
    assert last.records[0] == (t("Tue Aug 1 14:44:40 2022"), "DOWN")  # down now
    assert len(last.downs_within(86400)) == 2
    variant = parse_link_stat(text("hccn_tool-link_stat-g_device-prefix-variant_DOC-EXAMPLE.txt"))
    assert variant.current_time == t("Wed Jun 7 10:08:28 2023")
    assert [s for _t, s in variant.records] == ["UP", "DOWN", "UP"]
    assert variant.records[1][0] == t("Tue Jun 6 16:32:10 2023")


def test_optical_rx_loss_sample():
    o = parse_optical(text("hccn_tool-optical-g_910A_dev0_RxLos_v23.0.5.txt"))
    assert o == {
        "present": "not present",
        "rx_los_flag": 0xFF,
        "tx_los_flag": 0x0,
        "rx_power_mw": [1.0189, 0.0054, 0.9907, 1.0213],
        "rx_power_low_mw": 0.1445,
        "rx_power_high_mw": 3.5481,
        "temperature_celsius": 47.0,
    }


# ------------------------------------------------------------------ judges


def _judged(rec: CardRecord) -> dict:
    judge(rec, load_config())
    return {f.check: f for f in rec.findings}


def test_fault_code_severities_from_the_bundled_table():
    table = fault_code_table()
    assert table.lookup("A4025021")[:2] == ("info", "NotHandleFaultCodes")
    assert table.lookup("8C03A000")[:2] == ("critical", "RestartNPUCodes")
    assert table.lookup("8c084e00")[:2] == ("critical", "FreeRestartNPUCodes")
    h = parse_health(text("npu-smi-info-t-health-i0-c0_910A_Alarm_errcodes-multiline_v23.0.7.txt"))
    rec = CardRecord(vendor="ascend", index=0, chip=0, card_type="910")
    rec.health_detail = {"status": h.status, "codes": list(h.codes), "info": list(h.info)}
    f = _judged(rec)["ascend_fault_code"]
    assert f.severity == "critical"
    assert f.value == {"A4025021": "info", "8C03A000": "critical", "8C084E00": "critical"}
    assert "Heartbeat Lost" in f.message


def test_fault_code_unknown_and_overrides():
    from hetpatrol.checks.fault_codes import evaluate

    rec = CardRecord(vendor="ascend", index=0, chip=0, card_type="910b")
    rec.health_detail = {"status": "Warning", "codes": ["DEADBEEF", "8C03A000"], "info": []}
    th = FaultCodeSettings(overrides={"8C03A000": "warning"})
    facts = CardFacts(vendor=AscendCollector.vendor_info)
    (f,) = evaluate(rec, th, facts)
    assert f.value == {"DEADBEEF": "warning", "8C03A000": "warning"}
    th = FaultCodeSettings(unknown_code=None, overrides={"8C03A000": "info"})
    (f,) = evaluate(rec, th, facts)
    assert (f.severity, f.value) == ("info", {"8C03A000": "info"})
    # the table is the plugin's: a vendor that declares none gets no finding here
    assert evaluate(rec, FaultCodeSettings(), CardFacts()) == []


def test_the_fault_code_table_ships_with_the_plugin_and_the_check_names_no_vendor():
    """The bundled table is the Ascend plugin's file (package data of
    hetpatrol.collectors), reached by the check through VendorInfo.fault_codes."""
    from importlib.resources import files

    import hetpatrol.checks.fault_codes as check

    declared = AscendCollector.vendor_info.fault_codes
    assert (declared.check, declared.report) == ("ascend_fault_code", "npu-smi -t health")
    assert files("hetpatrol.collectors").joinpath("ascend_fault_codes.yaml").is_file()
    assert not files("hetpatrol.bundled").joinpath("ascend_fault_codes.yaml").is_file()
    source = Path(check.__file__).read_text()
    assert "npu-smi" not in source.split('"""', 2)[2] and "yaml" not in source.split('"""', 2)[2]
    # MindCluster faultCode.json: 80E3A201 is a SeparateNPU code
    assert declared.lookup("80e3a201")[:2] == ("critical", "SeparateNPUCodes")


def _roce(**kw) -> CardRecord:
    rec = CardRecord(vendor="ascend", index=0, chip=0, card_type="910")
    rec.links.append({"kind": "roce", "link": 0, "state": "up", **kw})
    return rec


def test_roce_judges_on_sample_values():
    stat = parse_link_stat(text("hccn_tool-link_stat-g_910A_dev0_flaps_v23.0.5.txt"))
    downs = [t for t, s in stat.records if s == "DOWN"]
    found = _judged(_roce(link_down_times=downs, link_stat_time=stat.current_time, link_up_count=2))
    f = found["roce_link_flaps"]
    assert (f.severity, f.value, f.threshold) == ("warning", 1, 1)
    assert "roce_link_down" not in found
    from hetpatrol.checks.interconnect import evaluate

    quiet = InterconnectSettings(roce_flap_window_seconds=3600)  # the down was 12 h before
    rec = _roce(link_down_times=downs, link_stat_time=stat.current_time)
    assert evaluate(rec, quiet, CardFacts()) == []
    strict = InterconnectSettings(roce_link_flaps=Levels(warning=1, critical=1))
    (f,) = evaluate(rec, strict, CardFacts())
    assert f.severity == "critical"

    found = _judged(_roce(state="down", net_health="Socket failed"))
    assert found["roce_link_down"].severity == "critical"
    assert found["roce_net_health"].value == "Socket failed"
    for ok in ("Success", "Init"):
        assert "roce_net_health" not in _judged(_roce(net_health=ok))

    optical = parse_optical(text("hccn_tool-optical-g_910A_dev0_RxLos_v23.0.5.txt"))
    f = _judged(_roce(optical=optical))["roce_optical"]
    assert f.severity == "warning"
    assert f.value == {"rx_los_flag": 0xFF, "weak_lanes": [1]}
    assert f.threshold == 0.1445
    assert "0.0054 mW" in f.message


# ------------------------------------------------------------------ the reader


class CountingReplay:
    def __init__(self, directory, hang=(), missing=()):
        self.replay = ReplayTool(directory)
        self.calls: list[tuple[str, ...]] = []
        self.hang = hang
        self.missing = missing

    def __call__(self, argv, timeout):
        self.calls.append(tuple(argv))
        if any(h in " ".join(argv) for h in self.hang):
            return ToolOutput(tuple(argv), "", "", None, True, timeout)
        if any(m in " ".join(argv) for m in self.missing):
            raise FileNotFoundError(argv[0])
        return self.replay.run(argv, timeout)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def records(n=8, sick=()):
    return [
        CardRecord(vendor="ascend", index=i, chip=0, vendor_health="Alarm" if i in sick else "OK")
        for i in range(n)
    ]


def test_reader_sweeps_at_its_cadence_and_asks_a_sick_chip_at_once():
    runner, clock = CountingReplay(ROCE), Clock()
    options = {"detail": True, "detail_interval_seconds": 300}
    reader = DetailReader(options, ["npu-smi", "info"], runner, clock=clock)
    recs = records(sick=(3,))
    reader.attach(recs)
    # -m once, then per chip: -t health, -link, -net_health, -link_stat, -optical (not
    # recorded: one try, then that command is known absent)
    assert runner.calls.count(("npu-smi", "info", "-m")) == 1
    assert ("hccn_tool", "-i", "5", "-link", "-g") in runner.calls
    assert sum(1 for c in runner.calls if "-optical" in c) == 1
    assert recs[3].health_detail["codes"] == ["A4025021", "8C03A000", "8C084E00"]
    assert recs[5].links[0]["state"] == "down"
    assert recs[0].links[0] | {"ts": None} == {
        "kind": "roce",
        "link": 0,
        "state": "up",
        "net_health": "Success",
        "link_up_count": 1,
        "link_down_times": [],
        "link_stat_time": t("Fri Nov 28 09:12:05 2025"),
        "ts": None,
    }
    n = len(runner.calls)
    clock.t += 10
    recs = records(sick=(3,))
    reader.attach(recs)
    # not due: only the sick chip's -t health runs; the other answers are attached again
    assert runner.calls[n:] == [("npu-smi", "info", "-t", "health", "-i", "3", "-c", "0")]
    assert recs[5].links[0]["net_health"] == "Socket failed"
    clock.t += 300
    reader.attach(records())
    assert len(runner.calls) > n + 1 + 8  # a new sweep


def test_reader_stops_before_the_deadline_and_goes_on_later():
    runner, clock = CountingReplay(ROCE), Clock()
    options = {"detail": True, "detail_interval_seconds": 300, "detail_timeout_seconds": 5}
    reader = DetailReader(options, ["npu-smi", "info"], runner, clock=clock)
    reader.attach(records(), deadline=clock.t + 4)  # not even one 5 s command fits
    assert runner.calls == []
    reader.attach(records(), deadline=clock.t + 100)
    assert any("-t" in c for c in runner.calls)


def test_reader_hung_command_is_an_error_absent_tool_is_not():
    runner = CountingReplay(ROCE, hang=("-t health -i 2",), missing=("hccn_tool",))
    reader = DetailReader({"detail": True}, ["npu-smi", "info"], runner, clock=Clock())
    recs = records()
    reader.attach(recs)
    assert recs[2].errors == [
        {"source": "npu-smi info -t health -i 2 -c 0", "error": "hung: killed after 5 s"}
    ]
    assert all(r.links == [] for r in recs)  # no hccn_tool (a 310P node): no RoCE
    assert recs[0].errors == []
    # each hccn_tool command is tried once (-link, -net_health, -link_stat, -optical),
    # then known absent: no retry per chip or per patrol
    assert sum(1 for c in runner.calls if c[0] == "hccn_tool") == 4
    reader._last_sweep = -1e9
    reader.attach(records())
    assert sum(1 for c in runner.calls if c[0] == "hccn_tool") == 4


def test_the_detail_sweep_is_on_unless_switched_off():
    """A config of one's own that leaves `detail` unset still gets the RoCE and
    fault-code checks (it was off, and a RoCE link down read ok); `detail: false` runs
    npu-smi info alone."""
    calls = []
    collector = AscendCollector({})
    assert collector.detail.enabled
    collector = AscendCollector({"detail": False})

    def runner(argv, timeout):
        calls.append(tuple(argv))
        return ReplayTool(ROCE).run(argv, timeout)

    collector.runner = runner
    result = collector.collect()
    assert calls == [("npu-smi", "info")]
    assert all(r.health_detail is None for r in result.records)


# ------------------------------------------------------------------ the whole node


def test_ascend_node_with_roce_link_down_and_health_alarm():
    p = Patroller(replace(load_config(), node="n1"), replay_dir=ROCE)
    try:
        report = p.run()
    finally:
        p.close()
    assert report.exit_code == 2
    by = {c.index: c for c in report.cards}
    checks = {i: {f.check: f.severity for f in c.findings} for i, c in by.items()}
    assert checks[3] == {"vendor_health": "critical", "ascend_fault_code": "critical"}
    assert checks[5] == {
        "roce_link_down": "critical",
        "roce_net_health": "warning",
        "roce_link_flaps": "warning",
    }
    assert all(checks[i] == {} for i in (0, 1, 2, 4, 6, 7))
    assert by[3].health_detail["status"] == "Alarm"
    assert [(c.index, c.links[0]["state"]) for c in report.cards] == [
        (i, "down" if i == 5 else "up") for i in range(8)
    ]
    schema = jsonl_json_schema()
    for line in report.jsonl_lines():
        jsonschema.validate(json.loads(line), schema)


def test_failed_chip_map_is_reported_and_retried_next_sweep(tmp_path):
    """A garbage ``npu-smi info -m`` answer is an error on the cards (the RoCE checks did
    not run) and is not cached: once -m answers again, the RoCE findings come back."""
    import shutil

    from hetpatrol.config import bundled_config_path

    node = tmp_path / "node"
    shutil.copytree(ROCE, node)
    good = (node / "npu-smi_info_-m.txt").read_text()
    (node / "npu-smi_info_-m.txt").write_text("garbage\n")
    text = bundled_config_path().read_text()
    assert "detail_interval_seconds: 300" in text
    cfg = load_config(
        text=text.replace("detail_interval_seconds: 300", "detail_interval_seconds: 0")
    )
    p = Patroller(replace(cfg, node="n1"), replay_dir=node)
    try:
        report = p.run()
        by = {c.index: c for c in report.cards}
        for card in report.cards:
            assert card.links == []
            errs = [e for e in card.errors if e["source"] == "npu-smi info -m"]
            assert len(errs) == 1 and "RoCE checks not run" in errs[0]["error"]
        assert "roce_link_down" not in {f.check for f in by[5].findings}
        (node / "npu-smi_info_-m.txt").write_text(good)
        report = p.run()
    finally:
        p.close()
    by = {c.index: c for c in report.cards}
    checks = {i: {f.check: f.severity for f in c.findings} for i, c in by.items()}
    assert by[5].health == "critical"
    assert checks[5] == {
        "roce_link_down": "critical",
        "roce_net_health": "warning",
        "roce_link_flaps": "warning",
    }
    assert all(not [e for e in c.errors if "-m" in e["source"]] for c in report.cards)
