"""Busy but stuck: a card at (or near) 100 % utilisation that draws idle power and moves
no memory, for a configured time, is ``card_hung`` (action ``restart_job``).

Why this shape: a kernel spinning on a lost peer or a dead collective keeps the
engine's "busy" counter at 100 % (NVML's utilisation is the share of the sample period
in which *a* kernel was resident, not how much work it did), while the power draw and
the memory traffic fall to what an idle card shows. Prior art: sichek's hang checker
(scitix/sichek, ``config/hang``: "high sm utilization", "low memory throughput", "low
power" held for ``hang_threshold`` seconds, 600 s by default); DeepSpeed and the
Stas Bekman ML engineering notes name a power drop to ~10 % of the limit as the sign of
a hung collective. Real readings this module's defaults are set against
(../shared/vendor-samples/nvidia): an H100 80GB idle draws 68 W of a 700 W limit
(0.10) with memory 0 %; the same card under gpu-burn draws 629 W (0.90) with memory
11 % and utilisation 100 %.

Config, per card class (each profile and ``defaults``), ``card_hung:``

- ``seconds``: how long the three signs must hold together (null: off; default 600);
- ``busy_utilization_ratio``: utilisation at or above it is "busy" (default 0.95);
- ``idle_power_ratio``: ``power_watts / power_limit_watts`` at or below it is idle
  power (default 0.2);
- ``idle_memory_activity_percent``: ``counters["memory_activity_percent"]`` (NVIDIA:
  ``nvmlDeviceGetUtilizationRates().memory``) at or below it is no memory traffic
  (default 5).

A card whose plugin does not read memory traffic is judged on utilisation and power,
and the finding says memory traffic was not read. A card without a readable
utilisation, power or power limit is never hung (nothing to judge), and a patrol that
cannot read one of them restarts the clock: the time is of an unbroken run of patrols
that all showed the three signs.

The patrol keeps the clock per card *identity* (:func:`hetpatrol.actions.escalation.
card_identity`: UUID, serial, bus id), never position, in :class:`HungWatch`;
:func:`evaluate` (the per-patrol part run by the judge) adds nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetpatrol.actions.escalation import card_identity
from hetpatrol.checks.facts import CardFacts
from hetpatrol.schema import HEALTH_WARNING, CardRecord, Finding, worst

NAME = "card_hung"
FINDING = "card_hung"
MEMORY_COUNTER = "memory_activity_percent"

_RATIO = {"type": "number", "minimum": 0, "maximum": 1}
PROFILE_SCHEMA: dict[str, Any] = {
    NAME: {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "seconds": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "busy_utilization_ratio": _RATIO,
            "idle_power_ratio": _RATIO,
            "idle_memory_activity_percent": {"type": "number", "minimum": 0, "maximum": 100},
        },
    }
}


@dataclass(frozen=True)
class HungSettings:
    """One card class's settings (see the module docstring for each key)."""

    seconds: float | None = 600.0
    busy_utilization_ratio: float = 0.95
    idle_power_ratio: float = 0.2
    idle_memory_activity_percent: float = 5.0


def build_profile(
    defaults: Mapping[str, Any], profile: Mapping[str, Any] | None, where: tuple
) -> HungSettings:
    """Settings of a profile: built-in < ``defaults`` < the profile."""
    values: dict[str, Any] = {}
    for section in (defaults or {}, profile or {}):
        values |= section.get(NAME) or {}
    base = HungSettings()
    seconds = values.get("seconds", base.seconds)
    return HungSettings(
        seconds=None if seconds is None else float(seconds),
        busy_utilization_ratio=float(
            values.get("busy_utilization_ratio", base.busy_utilization_ratio)
        ),
        idle_power_ratio=float(values.get("idle_power_ratio", base.idle_power_ratio)),
        idle_memory_activity_percent=float(
            values.get("idle_memory_activity_percent", base.idle_memory_activity_percent)
        ),
    )


def evaluate(record: CardRecord, settings: HungSettings, facts: CardFacts) -> list[Finding]:
    """Nothing per patrol: the condition needs time, kept by :class:`HungWatch`."""
    return []


def looks_hung(record: CardRecord, settings: HungSettings) -> tuple[bool, str]:
    """(True, what was seen) when this one reading shows all the signs: utilisation at
    or above ``busy_utilization_ratio``, power at or below ``idle_power_ratio`` of the
    limit and, where read, memory traffic at or below the idle percent."""
    util, power, limit = record.utilization_ratio, record.power_watts, record.power_limit_watts
    if not record.read_ok or util is None or power is None or not limit:
        return False, ""
    if util < settings.busy_utilization_ratio or power / limit > settings.idle_power_ratio:
        return False, ""
    memory = record.counters.get(MEMORY_COUNTER)
    if memory is not None and memory > settings.idle_memory_activity_percent:
        return False, ""
    mem_text = "memory traffic not read" if memory is None else f"memory traffic {memory}%"
    return True, (
        f"utilization {util * 100:.0f}%, power {power:.0f} W of {limit:.0f} W "
        f"({power / limit * 100:.0f}%), {mem_text}"
    )


class HungWatch:
    """The clock of each card's busy-but-idle run, by card identity.

    :meth:`observe` is called once per patrol with the judged records and the
    monotonic time (seconds); it adds a ``card_hung`` warning finding to each card whose
    run has lasted ``seconds`` of its class, and forgets cards that left the state."""

    def __init__(self) -> None:
        #: identity -> monotonic time of the first patrol of the current run
        self.since: dict[str, float] = {}

    def observe(self, cards: Sequence[CardRecord], config: Any, now: float) -> None:
        seen: set[str] = set()
        for rec in cards:
            profile = config.profile_for(rec.vendor, rec.card_type, rec.model)
            settings = profile.checks.get(NAME)
            if settings is None or settings.seconds is None:
                continue
            hung, what = looks_hung(rec, settings)
            if not hung:
                continue
            ident = card_identity(rec)
            seen.add(ident)
            start = self.since.setdefault(ident, now)
            held = now - start
            if held < settings.seconds:
                continue
            rec.findings.append(
                Finding(
                    FINDING,
                    HEALTH_WARNING,
                    f"busy but stuck for {held:.0f} s: {what}; the job on this card is "
                    "probably hung (restart it)",
                    value=round(held, 1),
                    threshold=settings.seconds,
                )
            )
            rec.health = worst(rec.health, HEALTH_WARNING)
        for ident in list(self.since):
            if ident not in seen:
                del self.since[ident]
