"""Judging card records against the thresholds of their card type.

Only judges: reads :class:`~hetpatrol.schema.CardRecord` values filled by collectors and
the :class:`~hetpatrol.config.Profile` that applies, and returns findings and a verdict.
It never reads hardware.
"""

from __future__ import annotations

from hetpatrol import deep_health
from hetpatrol.config import Config, Profile, Threshold
from hetpatrol.schema import (
    HEALTH_CRITICAL,
    HEALTH_OK,
    HEALTH_UNKNOWN,
    HEALTH_WARNING,
    CardRecord,
    Finding,
    worst,
)

#: npu-smi ``Health`` column and NVML failure markers -> hetpatrol severity.
#: npu-smi: OK, Warning (minor alarm), Alarm (major), Critical (urgent), UNKNOWN (device
#: absent or not started). NVML markers are set by the NVIDIA collector when a call
#: raised GpuIsLost / ResetRequired / Unknown.
VENDOR_HEALTH_SEVERITY = {
    "ok": HEALTH_OK,
    "warning": HEALTH_WARNING,
    "alarm": HEALTH_CRITICAL,
    "critical": HEALTH_CRITICAL,
    "unknown": HEALTH_UNKNOWN,
    "gpu_is_lost": HEALTH_CRITICAL,
    "reset_required": HEALTH_CRITICAL,
    "unknown_error": HEALTH_CRITICAL,
    "insufficient_power": HEALTH_CRITICAL,
}

_VENDOR_HEALTH_TEXT = {
    "gpu_is_lost": "GPU is lost (fell off the bus): NVML answers GpuIsLost",
    "reset_required": "GPU requires a reset: NVML answers ResetRequired",
    "unknown_error": "NVML answers Unknown error for this GPU",
    "insufficient_power": "GPU has insufficient power (external power cable?): NVML "
    "answers InsufficientPower",
}


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


def evaluate_card(record: CardRecord, profile: Profile) -> list[Finding]:
    """Findings for one card under its profile's thresholds (empty when all is well).

    Checks, in order: readability, vendor health, temperature, memory use, power against
    the limit, uncorrected ECC, remapped rows pending/failure, retired pages pending.
    """
    findings: list[Finding] = []
    if not record.read_ok and not record.findings:  # collector findings already say why
        reason = "; ".join(f"{e['source']}: {e['error']}" for e in record.errors) or "no data"
        findings.append(
            Finding("card_unreadable", HEALTH_UNKNOWN, f"card could not be read: {reason}")
        )
    if record.vendor_health is not None:
        raw = record.vendor_health.strip()
        severity = VENDOR_HEALTH_SEVERITY.get(raw.lower(), HEALTH_UNKNOWN)
        if severity != HEALTH_OK:
            text = _VENDOR_HEALTH_TEXT.get(raw.lower(), f"vendor health is {raw}")
            if not raw:  # an empty/unreadable cell (the collector's error says where)
                text = "vendor health could not be read: empty value"
            findings.append(Finding("vendor_health", severity, text, value=raw))
    th = profile.thresholds
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
    findings.extend(f for f in candidates if f is not None)
    for check, text in (
        ("remapped_rows_pending", "remapped rows pending: the GPU needs a reset"),
        ("remapped_rows_failure", "row remapping failed: the GPU needs an RMA"),
        ("retired_pages_pending", "retired pages pending: the GPU needs a reset"),
    ):
        if getattr(record, check) is True:
            findings.append(
                Finding(check, profile.state_checks.get(check, HEALTH_CRITICAL), text, value=True)
            )
    return findings


def judge(record: CardRecord, config: Config) -> CardRecord:
    """Apply the matching profile to ``record`` in place: GRES name, findings, health.

    Returns the same record. ``health`` is the worst finding severity, ``ok`` when there
    is none; a record that could not be read is never ``ok``.
    """
    profile = config.profile_for(record.vendor, record.card_type, record.model)
    if record.gres is None:
        record.gres = profile.gres
    record.findings.extend(evaluate_card(record, profile))
    # baseline drift, clock events, PCIe, NVLink, Ascend fault codes and RoCE
    record.findings.extend(deep_health.evaluate(record, profile, config))
    record.health = worst(*(f.severity for f in record.findings))
    if not record.read_ok and record.health == HEALTH_OK:
        record.health = HEALTH_UNKNOWN
    return record
