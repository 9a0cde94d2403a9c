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
    "unknown_error": "NVML answers Unknown error for a core call of this GPU (handle, "
    "memory, or its whole identity)",
    "insufficient_power": "GPU has insufficient power (external power cable?): NVML "
    "answers InsufficientPower",
}


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


def evaluate_card(record: CardRecord, profile: Profile) -> list[Finding]:
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
    candidates.append(_recovery_action(record))
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
