"""card_hung: busy but stuck (utilisation ~100 %, idle power, no memory traffic) for a
card class's configured time -> a warning with action restart_job; by card identity.

Readings: fixtures/nodes/healthy-mixed/nvidia-smi-q.xml (H100 80GB HBM3, idle: 67.74 W of
700 W, memory 0 %) with its GPU 0 utilisation overridden to 100 % (a kernel resident,
nothing moving); GPU 1 given the values of ../shared/vendor-samples/nvidia/
nvidia-smi-q_H100-80GB-HBM3_590.48.01_load.txt (gpu-burn: utilisation 100 %, memory
11 %, 629.45 W average): busy and working, never hung.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from hetpatrol.checks.card_hung import HungSettings, HungWatch, looks_hung
from hetpatrol.config import load_config
from hetpatrol.patrol import Patroller
from hetpatrol.schema import CardRecord

REPO = Path(__file__).resolve().parent.parent
HEALTHY = REPO / "fixtures" / "nodes" / "healthy-mixed"
H100_UUID0 = "GPU-e94fa8ce-6e04-a49e-f637-ba3a7dc7019a"

SCENARIO = """node: hung-01
nvml:
  gpus:
    0: {xml_overrides: {"utilization/gpu_util": "100 %"}}
    1: {xml_overrides: {"utilization/gpu_util": "100 %", "utilization/memory_util": "11 %",
        "gpu_power_readings/power_draw": "629.45 W"}}
"""


@pytest.fixture
def replay(tmp_path):
    shutil.copy(HEALTHY / "nvidia-smi-q.xml", tmp_path / "nvidia-smi-q.xml")
    (tmp_path / "scenario.yaml").write_text(SCENARIO)
    return tmp_path


def _patroller(directory: Path, config_text: str = "") -> Patroller:
    cfg = load_config()
    if config_text:
        path = directory / "hetpatrol.yaml"
        path.write_text(config_text)
        cfg = load_config(str(path))
    cfg = replace(cfg, collectors=[c for c in cfg.collectors if c.name == "nvidia"])
    return Patroller(replace(cfg, node="hung-01"), replay_dir=directory)


def _hung(report):
    return {
        (c.index, f.check, f.action)
        for c in report.cards
        for f in c.findings
        if f.check == "card_hung"
    }


def test_busy_with_idle_power_for_the_configured_time_is_card_hung(replay):
    p = _patroller(replay)
    clock = [1000.0]
    p.monotonic = lambda: clock[0]
    try:
        first = p.run()
        assert _hung(first) == set()  # the run has just started
        card0 = next(c for c in first.cards if c.index == 0)
        assert card0.utilization_ratio == 1.0 and card0.power_watts == 67.74
        assert card0.counters["memory_activity_percent"] == 0
        clock[0] += 599
        assert _hung(p.run()) == set()  # 599 s < the default 600 s
        clock[0] += 2
        report = p.run()
        assert _hung(report) == {(0, "card_hung", "restart_job")}
        card0 = next(c for c in report.cards if c.index == 0)
        (finding,) = [f for f in card0.findings if f.check == "card_hung"]
        assert finding.severity == "warning" and finding.value == 601.0
        assert "power 68 W of 700 W (10%), memory traffic 0%" in finding.message
        assert card0.action == "restart_job" and card0.health == "warning"
        # GPU 1 (gpu-burn's readings) is busy and working: never hung
        card1 = next(c for c in report.cards if c.index == 1)
        assert card1.power_watts == 629.45 and card1.counters["memory_activity_percent"] == 11
    finally:
        p.close()


def test_per_class_time_and_clearing(replay):
    config = (
        "defaults:\n  card_hung: {seconds: 3600}\n"
        "profiles:\n  - name: h100-h200\n    card_hung: {seconds: 60}\n"
    )
    p = _patroller(replay, config)
    clock = [0.0]
    p.monotonic = lambda: clock[0]
    try:
        p.run()
        clock[0] = 61.0
        assert _hung(p.run()) == {(0, "card_hung", "restart_job")}
        # the card works again (memory moves): the clock stops, the finding goes
        (replay / "scenario.yaml").write_text(
            SCENARIO.replace(
                '0: {xml_overrides: {"utilization/gpu_util": "100 %"}}',
                '0: {xml_overrides: {"utilization/gpu_util": "100 %", '
                '"utilization/memory_util": "40 %"}}',
            )
        )
        p.close()
        q = _patroller(replay, config)
        q.adopt(p)
        q.monotonic = lambda: clock[0]
        clock[0] = 62.0
        assert _hung(q.run()) == set()
        assert q.hung_watch.since == {}
        q.close()
    finally:
        p.close()


def test_one_reading_by_itself():
    s = HungSettings()
    rec = CardRecord("ascend", 0, utilization_ratio=1.0, power_watts=60.0, power_limit_watts=310)
    hung, what = looks_hung(rec, s)
    assert hung and "memory traffic not read" in what  # a plugin without memory traffic
    rec.power_watts = 200.0
    assert looks_hung(rec, s) == (False, "")
    rec.power_limit_watts = None  # no limit: nothing to compare against
    assert looks_hung(rec, s) == (False, "")


def test_the_clock_follows_identity_not_position():
    class Cfg:
        class _P:
            checks = {"card_hung": HungSettings(seconds=10)}

        def profile_for(self, *a):
            return self._P()

    def card(index, uuid):
        return CardRecord(
            "nvidia",
            index,
            uuid=uuid,
            utilization_ratio=1.0,
            power_watts=50.0,
            power_limit_watts=700.0,
            counters={"memory_activity_percent": 0},
        )

    w = HungWatch()
    w.observe([card(0, H100_UUID0)], Cfg(), 0.0)
    moved = card(3, H100_UUID0)  # same card, renumbered
    other = card(0, "GPU-other")
    w.observe([moved, other], Cfg(), 11.0)
    assert [f.check for f in moved.findings] == ["card_hung"]
    assert other.findings == []
