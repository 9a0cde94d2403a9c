"""Clock slowdowns: the clocks event reasons a card reports (thermal, power brake).

Config section (each profile and ``defaults``): ``clock_event_reasons: {sw_thermal,
hw_thermal, hw_slowdown, hw_power_brake}`` (a severity each, null: off) and
``busy_utilization_ratio`` (below it a load-driven slowdown is only ``info``; shared
with the PCIe check in :mod:`hetpatrol.checks.interconnect`). Which bit of
``counters["clocks_event_reasons"]`` means which reason is the vendor's word
(``VendorInfo.clock_event_reason_bits``; NVIDIA: NVML ``nvmlClocksEventReasons``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetpatrol.checks.facts import CardFacts
from hetpatrol.config_file import SEVERITY_OR_OFF
from hetpatrol.schema import HEALTH_WARNING, SEVERITY_INFO, CardRecord, Finding, worst

NAME = "clocks"
REASONS = ("sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake")
BUSY_SCHEMA: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 1}
PROFILE_SCHEMA: dict[str, Any] = {
    "clock_event_reasons": {
        "type": "object",
        "additionalProperties": False,
        "properties": {k: SEVERITY_OR_OFF for k in REASONS},
    },
    "busy_utilization_ratio": BUSY_SCHEMA,
}

CLOCK_REASON_TEXT = {
    "hw_slowdown": "HW slowdown",
    "sw_thermal": "SW thermal slowdown",
    "hw_thermal": "HW thermal slowdown",
    "hw_power_brake": "HW power brake slowdown",
}
#: Reasons that count only while the card is busy (an idle card loses no work).
_LOAD_REASONS = ("hw_slowdown", "hw_power_brake")


@dataclass(frozen=True)
class ClockSettings:
    reasons: Mapping[str, str | None] = field(
        default_factory=lambda: {r: HEALTH_WARNING for r in REASONS}
    )
    busy_utilization_ratio: float = 0.5


def build_profile(
    defaults: Mapping[str, Any], profile: Mapping[str, Any] | None, where: tuple
) -> ClockSettings:
    """Settings of a profile: built-in < ``defaults`` < the profile."""
    out = ClockSettings()
    reasons, busy = dict(out.reasons), out.busy_utilization_ratio
    for section in (defaults or {}, profile or {}):
        reasons |= section.get("clock_event_reasons") or {}
        if "busy_utilization_ratio" in section:
            busy = float(section["busy_utilization_ratio"])
    return ClockSettings(reasons, busy)


def evaluate(record: CardRecord, settings: ClockSettings, facts: CardFacts) -> list[Finding]:
    """``clock_event_reasons``: the slowdown reasons set in the clocks event mask, by the
    bit meanings the vendor's plugin declares (none declared: nothing judged)."""
    if not record.read_ok:
        return []
    th = settings
    mask = record.counters.get("clocks_event_reasons")
    if mask is None:
        return []
    busy = th.busy_utilization_ratio
    idle = record.utilization_ratio is not None and record.utilization_ratio < busy
    active: list[tuple[str, str]] = []
    for reason, bit in facts.vendor.clock_event_reason_bits.items():
        severity = th.reasons.get(reason)
        if severity is None or not mask & bit:
            continue
        if reason in _LOAD_REASONS and idle:
            severity = SEVERITY_INFO
        active.append((reason, severity))
    if not active:
        return []
    severities = [s for _r, s in active]
    severity = worst(*severities) if any(s != SEVERITY_INFO for s in severities) else SEVERITY_INFO
    names = ", ".join(f"{CLOCK_REASON_TEXT.get(r, r)} ({s})" for r, s in active)
    util = (
        "unknown" if record.utilization_ratio is None else f"{record.utilization_ratio * 100:.0f}%"
    )
    advice = (
        f"idle (below {busy * 100:.0f}%): no work is slowed"
        if severity == SEVERITY_INFO
        else "check cooling, power supply and the chassis power brake"
    )
    return [
        Finding(
            "clock_event_reasons",
            severity,
            f"clocks slowed by {names}, mask {mask:#x}, utilization {util}: {advice}",
            value=f"{mask:#x}",
            threshold=busy,
        )
    ]
