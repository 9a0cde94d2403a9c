"""Vendor fault codes: the error codes a card's own health report lists.

The codes of ``record.health_detail`` (``{"status", "codes", "info"}``), judged by the
table of the card's plugin: ``VendorInfo.fault_codes`` (a
:class:`hetpatrol.collector.FaultCodes`: the finding's name, the report's name and the
code -> (severity, class, action) lookup; the Ascend plugin's ``npu-smi info -t health``
codes by its ``collectors/ascend_fault_codes.yaml``). A vendor that declares none gets
no finding here.

Config section (each profile and ``defaults``): ``ascend_fault_codes: {unknown_code,
overrides: {CODE: severity}}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetpatrol.checks.facts import CardFacts
from hetpatrol.config_file import SEVERITY_OR_OFF
from hetpatrol.schema import HEALTH_WARNING, SEVERITY_INFO, CardRecord, Finding, worst

NAME = "fault_codes"
#: fault codes are read case-folded: 8c03a000 and 8C03A000 are one key
PROFILE_NORMALISED_KEYS = ((("ascend_fault_codes", "overrides"), str.upper),)

PROFILE_SCHEMA: dict[str, Any] = {
    "ascend_fault_codes": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "unknown_code": SEVERITY_OR_OFF,
            "overrides": {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9A-Fa-f]{8}$"},
                "additionalProperties": SEVERITY_OR_OFF,
            },
        },
    }
}


@dataclass(frozen=True)
class FaultCodeSettings:
    """Severity of a code not in the table, and per-code overrides (upper case)."""

    unknown_code: str | None = HEALTH_WARNING
    overrides: Mapping[str, str | None] = field(default_factory=dict)


def build_profile(
    defaults: Mapping[str, Any], profile: Mapping[str, Any] | None, where: tuple
) -> FaultCodeSettings:
    """Settings of a profile: built-in < ``defaults`` < the profile (overrides merged)."""
    unknown, overrides = FaultCodeSettings.unknown_code, {}
    for section in (defaults or {}, profile or {}):
        codes = section.get("ascend_fault_codes") or {}
        if "unknown_code" in codes:
            unknown = codes["unknown_code"]
        overrides |= {str(k).upper(): v for k, v in (codes.get("overrides") or {}).items()}
    return FaultCodeSettings(unknown, overrides)


def evaluate(record: CardRecord, settings: FaultCodeSettings, facts: CardFacts) -> list[Finding]:
    """The plugin's finding (``facts.vendor.fault_codes.check``, Ascend's
    ``ascend_fault_code``): the codes of ``health_detail`` by the plugin's table, an
    override, or ``unknown_code`` for a code not listed; none when the vendor declares
    no table. Raises what the table's lookup raises (OSError / ValueError: a bundled
    table that cannot be read)."""
    th = settings
    declared = facts.vendor.fault_codes
    detail = record.health_detail
    if declared is None or not detail or not detail.get("codes"):
        return []
    parts, severities, value = [], [], {}
    for code in detail["codes"]:
        severity, cls, action = declared.lookup(code)
        if code.upper() in th.overrides:
            severity = th.overrides[code.upper()]
        elif severity is None:
            severity = th.unknown_code
        if severity is None:
            continue
        severities.append(severity)
        value[code] = severity
        parts.append(
            f"{code} {severity}" + (f" ({cls}: {action})" if cls else " (not in the table)")
        )
    if not severities:
        return []
    overall = worst(*severities) if any(s != SEVERITY_INFO for s in severities) else SEVERITY_INFO
    info = "; ".join(detail.get("info") or [])
    return [
        Finding(
            declared.check,
            overall,
            f"{declared.report} {detail.get('status')}: "
            + ", ".join(parts)
            + (f"; {info}" if info else ""),
            value=value,
        )
    ]
