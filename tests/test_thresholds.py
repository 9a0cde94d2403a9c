"""Per-card-type thresholds turn records into findings and a verdict."""

from __future__ import annotations

import pytest

from hetpatrol.judge import judge
from hetpatrol.schema import CardRecord

GIB = 2**30


def rec(vendor="nvidia", model="NVIDIA A100-SXM4-80GB", card_type="a100", **kw) -> CardRecord:
    return CardRecord(vendor=vendor, index=0, model=model, card_type=card_type, **kw)


def checks(r: CardRecord) -> dict[str, str]:
    return {f.check: f.severity for f in r.findings}


def test_healthy_card_is_ok(base_config):
    r = judge(
        rec(
            temperature_celsius=40.0,
            power_watts=90.0,
            power_limit_watts=400.0,
            memory_used_bytes=1 * GIB,
            memory_total_bytes=80 * GIB,
            ecc_uncorrected_total=0,
            remapped_rows_pending=False,
        ),
        base_config,
    )
    assert r.health == "ok"
    assert r.findings == []
    assert r.gres == "gpu"


@pytest.mark.parametrize(
    ("vendor", "model", "card_type", "temp", "health"),
    [
        # A100 profile: warning 83, critical 90
        ("nvidia", "NVIDIA A100-SXM4-80GB", "a100", 82.0, "ok"),
        ("nvidia", "NVIDIA A100-SXM4-80GB", "a100", 83.0, "warning"),
        ("nvidia", "NVIDIA A100-SXM4-80GB", "a100", 90.0, "critical"),
        # L40S profile runs hotter: 87 / 94
        ("nvidia", "NVIDIA L40S", "l40s", 88.0, "warning"),
        ("nvidia", "NVIDIA L40S", "l40s", 93.0, "warning"),
        # 310P profile is cooler: 75 / 85
        ("ascend", "310P3", "310p", 76.0, "warning"),
        ("ascend", "310P3", "310p", 86.0, "critical"),
        # 910B: 80 / 90 -- the same 86 C that is critical on a 310P is a warning here
        ("ascend", "910B3", "910b", 86.0, "warning"),
    ],
)
def test_temperature_thresholds_differ_per_card_type(
    base_config, vendor, model, card_type, temp, health
):
    r = judge(
        rec(vendor=vendor, model=model, card_type=card_type, temperature_celsius=temp), base_config
    )
    assert r.health == health
    if health != "ok":
        (f,) = r.findings
        assert f.check == "temperature"
        assert f.value == temp
        assert f.threshold in (83, 90, 87, 94, 75, 85, 80)
        assert f"{temp:.3g} C" in f.message


@pytest.mark.parametrize(
    ("raw", "health"),
    [
        ("OK", "ok"),
        ("Warning", "warning"),
        ("Alarm", "critical"),
        ("Critical", "critical"),
        ("UNKNOWN", "unknown"),
        ("Something-New", "unknown"),
    ],
)
def test_npu_smi_health_column(base_config, raw, health):
    r = judge(rec(vendor="ascend", model="910B3", card_type="910b", vendor_health=raw), base_config)
    assert r.health == health
    if health != "ok":
        assert checks(r) == {"vendor_health": health}
        assert r.findings[0].value == raw


@pytest.mark.parametrize("raw", ["", "   "], ids=["empty", "spaces"])
def test_empty_vendor_health_is_unknown_never_ok(base_config, raw):
    """An empty Health cell (read but blank) is unknown, whatever the other values say."""
    r = judge(
        rec(
            vendor="ascend",
            model="910B4",
            card_type="910b",
            vendor_health=raw,
            temperature_celsius=33.0,
            power_watts=87.2,
        ),
        base_config,
    )
    assert r.health == "unknown"
    assert [(f.check, f.severity, f.value, f.message) for f in r.findings] == [
        ("vendor_health", "unknown", "", "vendor health could not be read: empty value")
    ]


@pytest.mark.parametrize("marker", ["gpu_is_lost", "reset_required", "unknown_error"])
def test_nvml_failure_markers_are_critical(base_config, marker):
    r = judge(rec(vendor_health=marker), base_config)
    assert r.health == "critical"
    assert checks(r) == {"vendor_health": "critical"}


def test_memory_state_checks(base_config):
    r = judge(rec(remapped_rows_pending=True, remapped_rows_failure=False), base_config)
    assert checks(r) == {"remapped_rows_pending": "critical"}
    r = judge(rec(retired_pages_pending=True), base_config)
    assert checks(r) == {"retired_pages_pending": "critical"}
    r = judge(rec(remapped_rows_pending=None, retired_pages_pending=None), base_config)
    assert r.health == "ok"


def test_ecc_power_and_memory(base_config):
    r = judge(rec(ecc_uncorrected_total=3), base_config)
    assert checks(r) == {"ecc_uncorrected": "warning"}
    r = judge(rec(ecc_uncorrected_total=10), base_config)
    assert checks(r) == {"ecc_uncorrected": "critical"}
    r = judge(rec(power_watts=430.0, power_limit_watts=400.0), base_config)
    assert checks(r) == {"power": "warning"}
    assert r.findings[0].value == pytest.approx(1.075)
    # memory_used_ratio is off by default: a full card is not a fault
    r = judge(rec(memory_used_bytes=80 * GIB, memory_total_bytes=80 * GIB), base_config)
    assert r.health == "ok"


def test_missing_values_are_not_judged(base_config):
    r = judge(
        rec(temperature_celsius=None, power_watts=None, ecc_uncorrected_total=None), base_config
    )
    assert r.health == "ok"


def test_unreadable_card_is_unknown_never_ok(base_config):
    r = rec(read_ok=False)
    r.add_error("npu-smi info", "row cut mid-line")
    judge(r, base_config)
    assert r.health == "unknown"
    assert checks(r) == {"card_unreadable": "unknown"}
    assert "row cut mid-line" in r.findings[0].message


def test_worst_finding_wins(base_config):
    r = judge(
        rec(
            vendor="ascend",
            model="910B3",
            card_type="910b",
            vendor_health="Warning",
            temperature_celsius=95.0,
        ),
        base_config,
    )
    assert r.health == "critical"
    assert checks(r) == {"vendor_health": "warning", "temperature": "critical"}


def test_implausible_values_are_dropped_not_judged_ok(base_config):
    r = rec(
        temperature_celsius=-300.0,
        power_watts=-50.0,
        utilization_ratio=2.5,
        memory_used_bytes=2**40,
        memory_total_bytes=80 * GIB,
    )
    r.drop_implausible()
    assert (r.temperature_celsius, r.power_watts, r.utilization_ratio) == (None, None, None)
    assert r.memory_used_bytes is None and r.memory_total_bytes == 80 * GIB
    assert {e["source"] for e in r.errors} == {
        "temperature_celsius",
        "power_watts",
        "utilization_ratio",
        "memory_used_bytes",
    }
