"""The new vendors through the whole patrol: the three-vendor scenario
(``fixtures/nodes/mixed-three-vendor``: 8 x H100 + 8 x 910B4 + 8 x Hygon K100_AI) judged,
counted against its Slurm GRES and exported; and the AMD and Cambricon plugins, fed the
recorded samples, exported in an exposition that ``promtool check metrics`` accepts.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import jsonschema
import psutil
from conftest import NODES, require_program, samples_dir

from hetpatrol.config import load_config
from hetpatrol.exporters.prometheus import Exposition
from hetpatrol.patrol import Patroller
from hetpatrol.replay import load_scenario
from hetpatrol.schema import jsonl_json_schema
from hetpatrol.slurm.gres import parse_gres
from hetpatrol.slurm.inventory import compare
from hetpatrol.tool import ToolOutput

SCENARIO = NODES / "mixed-three-vendor"
OTHER = samples_dir("other-vendors")
MIB = 1048576


def three_vendor_report():
    config = load_config(SCENARIO / "hetpatrol.yaml")
    patroller = Patroller(config, replay_dir=SCENARIO)
    try:
        return config, patroller.run()
    finally:
        patroller.close()


def test_three_vendor_node_is_judged_and_matches_its_gres():
    config, report = three_vendor_report()
    assert report.health == "ok"
    by_vendor = {}
    for card in report.cards:
        by_vendor.setdefault(card.vendor, []).append(card)
    assert {v: len(c) for v, c in by_vendor.items()} == {"nvidia": 8, "ascend": 8, "hygon": 8}
    dcus = by_vendor["hygon"]
    # the composed DTK JSON: card0 80.0 W, junction 39.0 C, 65520 MiB total, 2 MiB used
    assert (dcus[0].power_watts, dcus[0].temperature_celsius) == (80.0, 39.0)
    assert (dcus[0].memory_total_bytes, dcus[0].memory_used_bytes) == (65520 * MIB, 2 * MIB)
    assert {(c.card_type, c.gres, c.health) for c in dcus} == {("k100_ai", "dcu", "ok")}
    assert [c.uuid for c in dcus] == [f"7100fa886690406{i}" for i in range(8)]

    gres = load_scenario(SCENARIO)["gres"]
    counts, findings = compare(report.cards, parse_gres(gres), config)
    assert sorted((c.name, c.type, c.configured, c.found, c.healthy) for c in counts) == [
        ("ascend", "910b", 8, 8, 8),
        ("dcu", "k100_ai", 8, 8, 8),
        ("gpu", "h100", 8, 8, 8),
    ]
    assert findings == []
    # one DCU fewer registered than found is said
    _, findings = compare(report.cards, parse_gres(gres.replace("k100_ai:8", "k100_ai:7")), config)
    assert [f.check for f in findings] == ["gres_mismatch"]

    schema = jsonl_json_schema()
    for line in report.jsonl_lines():
        jsonschema.validate(json.loads(line), schema)


def _feed(patroller, name, outputs):
    def run(argv, timeout):
        answer = outputs.get(tuple(argv))
        if answer is None:
            raise FileNotFoundError(argv[0])
        return ToolOutput(tuple(argv), answer, "", 0, False, 0.01)

    patroller._collectors[name].collector.runner = run


def test_exposition_of_all_new_vendors_passes_promtool(tmp_path):
    promtool = require_program("promtool", package="prometheus")
    config = load_config(text="node: n1\nlisten: null\ncollectors: {amd: {}, cambricon: {}}\n")
    patroller = Patroller(config)
    static = (OTHER / "amd-smi-static-MI300A-cpu-and-gpu0.txt").read_text()
    metric = (OTHER / "amd-smi-metric-power-json.txt").read_text()
    _feed(
        patroller,
        "amd",
        {("amd-smi", "static", "--json"): static, ("amd-smi", "metric", "--json"): metric},
    )
    cnmon = (OTHER / "cambricon-cnmon-v5.10.13-MLU370-X8-2cards.txt").read_text()
    _feed(patroller, "cambricon", {("cnmon",): cnmon})
    try:
        report = patroller.run()
    finally:
        patroller.close()
    assert [(c.vendor, c.index, c.card_type) for c in report.cards] == [
        ("amd", 0, "mi300a"),
        ("cambricon", 0, "mlu370"),
        ("cambricon", 1, "mlu370"),
    ]
    _, three = three_vendor_report()
    body = Exposition(["amd", "cambricon"]).update(report, 1).decode()
    body3 = Exposition(["nvidia", "ascend", "hygon"]).update(three, 1).decode()
    # amd-smi socket_power {"value": 10, "unit": "W"}; cnmon card 1: 39C, 106 W/ 250 W
    assert 'hetpatrol_card_power_watts{card_type="mi300a",index="0",vendor="amd"} 10.0' in body
    assert (
        'hetpatrol_card_temperature_celsius{card_type="mlu370",index="1",vendor="cambricon"} 39.0'
        in body
    )
    assert 'hetpatrol_collector_up{collector="hygon"} 1.0' in body3
    for name, text in (("new.prom", body), ("three.prom", body3)):
        path = tmp_path / name
        path.write_text(text)
        with path.open() as fh:
            done = subprocess.run(
                [promtool, "check", "metrics"], stdin=fh, capture_output=True, text=True
            )
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_unit_runs_every_new_vendors_tool_and_opens_its_devices():
    """The shipped unit's PATH holds a directory each new plugin declares for its tool
    (the sandbox test in test_systemd_unit.py covers the device nodes of every plugin)."""
    from hetpatrol.collector import load_collector

    unit = (Path(__file__).resolve().parents[1] / "systemd" / "hetpatrol.service").read_text()
    (path,) = [
        ln.split("=", 2)[2] for ln in unit.splitlines() if ln.startswith("Environment=PATH=")
    ]
    on_path = set(path.split(":"))
    tools = {
        "amd": ["amd-smi", "rocm-smi"],
        "hygon": ["rocm-smi"],
        "cambricon": ["cnmon"],
        "gaudi": ["hl-smi"],
        "iluvatar": ["ixsmi"],
        "kunlunxin": ["xpu_smi"],
        "enflame": ["efsmi"],
    }
    for name, programs in tools.items():
        info = load_collector(name).vendor_info
        assert info.device_nodes, name
        for program in programs:
            assert set(info.tool_dirs[program]) & on_path, (name, program)


def test_a_real_hung_tool_is_killed_once_per_patrol_and_reported_hung(tmp_path):
    """A real ``cnmon`` that prints half a table, ignores SIGTERM and hangs: the real
    run_tool kills its process group at the timeout; the patrol reports the collector
    ``hung`` with what it printed, and the next patrol runs it once more (no pile-up)."""
    # a sleep length nothing else uses (this run's pid in it: not a second suite's)
    marker = f"2917.{os.getpid()}"
    tool = tmp_path / "cnmon"
    tool.write_text(
        "#!/bin/sh\ntrap '' TERM HUP INT\n"
        f"echo run >> '{tmp_path / 'runs'}'\n"
        "printf '+-------+\\n| CNMON v5.10.13 '\n"
        f"sleep {marker}\n"
    )
    tool.chmod(0o755)
    config = load_config(
        text=f"node: n1\nlisten: null\ncollectors:\n  cambricon: {{command: ['{tool}'], "
        "timeout_seconds: 1}\n"
    )
    patroller = Patroller(config)
    try:
        for _ in range(2):
            started = time.monotonic()
            report = patroller.run()
            assert time.monotonic() - started < 8  # killed at 1 s, not left to run
            (status,) = [s for s in report.collectors if s.name == "cambricon"]
            assert (status.state, status.up) == ("hung", False)
            assert status.error == "cnmon hung: killed after 1s"
            assert status.raw == "+-------+\n| CNMON v5.10.13 "
            assert not report.cards and report.health != "ok", report.health
    finally:
        patroller.close()
    assert (tmp_path / "runs").read_text() == "run\nrun\n"

    def left() -> list[psutil.Process]:
        return [
            p
            for p in psutil.process_iter(["cmdline", "status"])
            if marker in (p.info["cmdline"] or []) and p.info["status"] != "zombie"
        ]

    deadline = time.monotonic() + 5  # a killed process dies when next scheduled
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == [], left()


def test_each_card_type_is_judged_by_its_profile():
    """The plugins' own profiles apply (no config section names them): a reading between
    a profile's levels is a warning, above critical is critical, with the profile's
    threshold in the finding."""
    from hetpatrol.judge import judge
    from hetpatrol.schema import CardRecord

    config = load_config(text="node: n1\nlisten: null\n")
    cases = [
        # vendor, card type, profile, warning reading, critical reading, critical level
        ("hygon", "k100_ai", "hygon-k100", 90.0, 96.0, 95),
        ("hygon", "z100", "hygon-z100", 90.0, 96.0, 95),
        ("amd", "mi300x", "amd-mi300", 100.0, 106.0, 105),
        ("amd", "mi250x", "amd-mi200", 100.0, 106.0, 105),
    ]
    for vendor, card_type, profile, warm, hot, level in cases:
        assert config.profile_for(vendor, card_type, None).name == profile
        for temp, health in ((warm, "warning"), (hot, "critical")):
            rec = CardRecord(vendor=vendor, index=0, card_type=card_type, temperature_celsius=temp)
            judge(rec, config)
            assert rec.health == health, (vendor, card_type, temp, rec.findings)
        (finding,) = rec.findings
        assert (finding.check, finding.threshold) == ("temperature", level)
