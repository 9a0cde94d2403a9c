"""Per-card thresholds: readability, vendor health, temperature, uncorrected ECC,
memory use, power against the limit, the NVML recovery action, and the memory
retirement states (remapped rows pending / failed, retired pages pending).

One family because they are the levels of one ``thresholds`` table per card type and
their findings keep this order on the record. Only judges: reads
:class:`~hetpatrol.schema.CardRecord` values and the profile's settings
(:class:`CardThresholds`). Vendor health words and their severities come from the
vendor's plugin (``facts.vendor.health_words``).

Config section (each profile and ``defaults``): ``temperature_celsius``,
``memory_used_ratio``, ``power_ratio``, ``ecc_uncorrected_total`` (``{warning,
critical}``), and ``remapped_rows_pending``, ``remapped_rows_failure``,
``retired_pages_pending`` (a severity).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetpatrol.checks.facts import CardFacts
from hetpatrol.config_file import SettingError
from hetpatrol.schema import (
    HEALTH_CRITICAL,
    HEALTH_OK,
    HEALTH_UNKNOWN,
    HEALTH_WARNING,
    SEVERITY_INFO,
    CardRecord,
    Finding,
)

NAME = "card_thresholds"

THRESHOLD_KEYS = (
    "temperature_celsius",
    "memory_used_ratio",
    "power_ratio",
    "ecc_uncorrected_total",
)
STATE_CHECK_KEYS = ("remapped_rows_pending", "remapped_rows_failure", "retired_pages_pending")
#: Thresholds that are a share of a whole (``power_ratio`` may pass 1: power over limit).
_AT_MOST_ONE = ("memory_used_ratio",)

_LEVEL = {"type": ["number", "null"]}
_THRESHOLD = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"warning": _LEVEL, "critical": _LEVEL},
}
_SEVERITY = {"enum": [SEVERITY_INFO, HEALTH_WARNING, HEALTH_CRITICAL]}
PROFILE_SCHEMA: dict[str, Any] = {k: _THRESHOLD for k in THRESHOLD_KEYS} | {
    k: _SEVERITY for k in STATE_CHECK_KEYS
}


@dataclass(frozen=True)
class Threshold:
    """A warning and a critical level (``None`` = that level off)."""

    warning: float | None = None
    critical: float | None = None


@dataclass(frozen=True)
class CardThresholds:
    """The levels (by ``THRESHOLD_KEYS`` name) and memory-state severities of a profile."""

    thresholds: Mapping[str, Threshold] = field(default_factory=dict)
    state_checks: Mapping[str, str] = field(default_factory=dict)


def _check_threshold(value: Mapping[str, Any], path: tuple) -> Threshold:
    t = Threshold(warning=value.get("warning"), critical=value.get("critical"))
    if t.warning is not None and t.critical is not None and t.warning > t.critical:
        raise SettingError(
            f"warning {t.warning} is above critical {t.critical}", (*path, "warning")
        )
    for level in ("warning", "critical"):
        v = getattr(t, level)
        if v is not None and v < 0:
            raise SettingError(f"{v} is negative", (*path, level))
        if v is not None and v > 1 and path[-1] in _AT_MOST_ONE:
            raise SettingError(f"{v} is above 1: a ratio (0.95 is 95 %)", (*path, level))
    return t


def build_profile(
    defaults: Mapping[str, Any], profile: Mapping[str, Any] | None, where: tuple
) -> CardThresholds:
    """Levels of a profile: ``defaults`` < the profile (a level the profile leaves unset
    comes from ``defaults``); memory states critical unless set. ``SettingError`` for a
    warning above critical, a negative level, a ratio above 1."""
    base = {
        k: _check_threshold(defaults[k], ("defaults", k)) for k in THRESHOLD_KEYS if k in defaults
    }
    states = {k: HEALTH_CRITICAL for k in STATE_CHECK_KEYS}
    states |= {k: defaults[k] for k in STATE_CHECK_KEYS if k in defaults}
    thresholds = dict(base)
    for k in THRESHOLD_KEYS:
        if profile is not None and k in profile:
            b = base.get(k, Threshold())
            levels = {"warning": b.warning, "critical": b.critical} | (profile[k] or {})
            thresholds[k] = _check_threshold(levels, (*where, k))
    if profile is not None:
        states |= {k: profile[k] for k in STATE_CHECK_KEYS if k in profile}
    return CardThresholds(thresholds, states)


#: ``counters.gpu_recovery_action`` (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, values of
#: ``nvmlDeviceGpuRecoveryAction_t``: nvml.h / nvidia-ml-py pynvml.py
#: ``NVML_GPU_RECOVERY_ACTION_NONE = 0`` ... ``_SYSTEM_REBOOT = 7``) -> (severity, text).
#: What each asks for is NVIDIA's "Error Recovery and Response Flags"
#: (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html):
#: reset/reboot/drain-and-reset take the GPU out of service (critical: drain); drain P2P
#: is a step after which NVML is asked again and answers one of the others, and IMEX
#: domain recovery is a fabric action beyond this GPU: warning. 0 (none) is no finding.
RECOVERY_ACTIONS = {
    1: (HEALTH_CRITICAL, "GPU reset", "terminate the GPU's processes and reset it (nvidia-smi -r)"),
    2: (HEALTH_CRITICAL, "node reboot", "the fault may have left the OS inconsistent: reboot"),
    3: (
        HEALTH_WARNING,
        "drain P2P",
        "stop the processes that use peer-to-peer traffic and UVM persistence mode; NVML "
        "then names the next action",
    ),
    4: (HEALTH_CRITICAL, "drain and reset", "drain the GPU's work, then reset it"),
    5: (HEALTH_WARNING, "recover IMEX domain", "recover the NVLink IMEX domain"),
    6: (HEALTH_CRITICAL, "bus reset", "reset the GPU's PCIe bus"),
    7: (HEALTH_CRITICAL, "system reboot", "reboot the system"),
}


def _recovery_action(record: CardRecord) -> Finding | None:
    action = record.counters.get("gpu_recovery_action")
    if action is None or action == 0:
        return None
    severity, name, todo = RECOVERY_ACTIONS.get(
        action, (HEALTH_WARNING, "unknown", "an action this hetpatrol does not know")
    )
    return Finding(
        "gpu_recovery_action",
        severity,
        f"NVML recovery action: {name} ({action}): {todo}",
        value=action,
    )


def _level(
    check: str, value: float | None, t: Threshold | None, unit: str, label: str
) -> Finding | None:
    if value is None or t is None:
        return None
    for severity, level in ((HEALTH_CRITICAL, t.critical), (HEALTH_WARNING, t.warning)):
        if level is not None and value >= level:
            shown = f"{value:.3g}" if isinstance(value, float) else str(value)
            return Finding(
                check=check,
                severity=severity,
                value=value,
                threshold=level,
                message=f"{label} {shown}{unit} >= {severity} level {level}{unit}",
            )
    return None


def evaluate(record: CardRecord, settings: CardThresholds, facts: CardFacts) -> list[Finding]:
    """Findings for one card under its profile's thresholds (empty when all is well).

    Checks, in order: readability, vendor health, temperature, uncorrected ECC, memory
    use, power against the limit, the NVML recovery action, remapped rows
    pending/failure, retired pages pending.
    """
    findings: list[Finding] = []
    if not record.read_ok and not record.findings:  # collector findings already say why
        reason = "; ".join(f"{e['source']}: {e['error']}" for e in record.errors) or "no data"
        findings.append(
            Finding("card_unreadable", HEALTH_UNKNOWN, f"card could not be read: {reason}")
        )
    if record.vendor_health is not None:
        raw = record.vendor_health.strip()
        severity, text = facts.vendor.health_words.get(raw.lower(), (HEALTH_UNKNOWN, None))
        if severity != HEALTH_OK:
            text = text or f"vendor health is {raw}"
            if not raw:  # an empty/unreadable cell (the collector's error says where)
                text = "vendor health could not be read: empty value"
            findings.append(Finding("vendor_health", severity, text, value=raw))
    th = settings.thresholds
    candidates = [
        _level(
            "temperature",
            record.temperature_celsius,
            th.get("temperature_celsius"),
            " C",
            "temperature",
        ),
        _level(
            "ecc_uncorrected",
            record.ecc_uncorrected_total,
            th.get("ecc_uncorrected_total"),
            "",
            "uncorrected ECC errors",
        ),
    ]
    if record.memory_used_bytes is not None and record.memory_total_bytes:
        ratio = record.memory_used_bytes / record.memory_total_bytes
        candidates.append(
            _level(
                "memory_used", round(ratio, 4), th.get("memory_used_ratio"), "", "memory used ratio"
            )
        )
    if record.power_watts is not None and record.power_limit_watts:
        ratio = record.power_watts / record.power_limit_watts
        candidates.append(
            _level("power", round(ratio, 4), th.get("power_ratio"), "", "power / limit")
        )
    candidates.append(_recovery_action(record))
    findings.extend(f for f in candidates if f is not None)
    for check, text in (
        ("remapped_rows_pending", "remapped rows pending: the GPU needs a reset"),
        ("remapped_rows_failure", "row remapping failed: the GPU needs an RMA"),
        ("retired_pages_pending", "retired pages pending: the GPU needs a reset"),
    ):
        if getattr(record, check) is True:
            findings.append(
                Finding(check, settings.state_checks.get(check, HEALTH_CRITICAL), text, value=True)
            )
    return findings
