"""Vendor fault codes: the error codes a card's own health report lists.

Today Ascend's ``npu-smi info -t health`` codes (``record.health_detail``), judged by the
bundled table ``config/ascend_fault_codes.yaml`` (class -> severity and action).

Config section (each profile and ``defaults``): ``ascend_fault_codes: {unknown_code,
overrides: {CODE: severity}}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import yaml

from hetpatrol.checks.facts import CardFacts
from hetpatrol.config_file import SEVERITY_OR_OFF, bundled_data
from hetpatrol.schema import HEALTH_WARNING, SEVERITY_INFO, CardRecord, Finding, worst

NAME = "fault_codes"
#: fault codes are read case-folded: 8c03a000 and 8C03A000 are one key
PROFILE_NORMALISED_KEYS = ((("ascend_fault_codes", "overrides"), str.upper),)
FAULT_CODE_FILE = "ascend_fault_codes.yaml"

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


@dataclass(frozen=True)
class FaultCodeTable:
    """Severity per error code, from the bundled ``ascend_fault_codes.yaml``."""

    classes: Mapping[str, Mapping[str, str]]
    codes: Mapping[str, str]  # code -> class

    def lookup(self, code: str) -> tuple[str | None, str | None, str | None]:
        """(severity, class, action) of a code; (None, None, None) when not listed."""
        cls = self.codes.get(code.upper())
        if cls is None:
            return None, None, None
        spec = self.classes.get(cls, {})
        return spec.get("severity"), cls, spec.get("action")


@lru_cache(maxsize=1)
def fault_code_table() -> FaultCodeTable:
    data = yaml.safe_load(bundled_data(FAULT_CODE_FILE).read_text(encoding="utf-8"))
    codes = {}
    for cls, listed in (data.get("codes") or {}).items():
        for code in listed or ():
            codes[str(code).upper()] = cls
    return FaultCodeTable(classes=data.get("classes") or {}, codes=codes)


def evaluate(record: CardRecord, settings: FaultCodeSettings, facts: CardFacts) -> list[Finding]:
    """``ascend_fault_code``: the codes of ``health_detail`` (``npu-smi info -t health``)
    by the bundled table, an override, or ``unknown_code`` for a code not listed."""
    th = settings
    detail = record.health_detail
    if not detail or not detail.get("codes"):
        return []
    table = fault_code_table()
    parts, severities, value = [], [], {}
    for code in detail["codes"]:
        severity, cls, action = table.lookup(code)
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
            "ascend_fault_code",
            overall,
            f"npu-smi -t health {detail.get('status')}: "
            + ", ".join(parts)
            + (f"; {info}" if info else ""),
            value=value,
        )
    ]
