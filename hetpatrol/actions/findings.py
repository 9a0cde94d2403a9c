"""The default action of every finding hetpatrol makes, by check name and severity.

A finding is ``{check, severity, value, threshold, message}`` (hetpatrol.schema.Finding,
or its dict in the JSONL / state file). Its action:

- ``xid``: the highest :func:`hetpatrol.actions.nvidia_xid.xid_action` of the XIDs in
  ``value`` (``{"79": 2}``); ``kernel_fault``: by the reason (``fallen_off_bus`` ...);
- ``ascend_fault_code``: the highest MindCluster level action of the codes in ``value``;
- every other check: the :data:`CHECK_ACTIONS` row for its severity;
- ``info`` / ``ok`` severities of table checks: ``none``;
- a check not in the table: ``watch`` with the check name, never ``none``.

Per-code overrides (``overrides``) are keyed ``xid:<n>``, ``ascend:<CODE>``,
``kernel:<reason>`` or ``check:<name>`` and hold an action word.

Why each row (NVIDIA references: the XID catalog, see nvidia_xid.py; NVIDIA A100 GPU
memory error management, "Row Remapping" and "Error Recovery and Response Flags"):

- ``remapped_rows_pending`` / ``retired_pages_pending`` -> reset_card: the remap or
  retirement takes effect at the next GPU reset ("row-remapping will happen at the next
  GPU reset");
- ``remapped_rows_failure`` -> replace_card: a remapping failure is an RMA condition
  (NVIDIA, "RMA Policy Thresholds for Row-Remapping"; catalog XID 64);
- ``ecc_uncorrected`` critical -> reset_card: uncorrectable errors need a reset to
  retire/remap (catalog XID 48 trigger text: "A GPU reset or node reboot is needed");
  a repeat escalates (escalation.py);
- ``card_missing`` critical -> reboot_node: a GPU that left the bus (catalog XID 79,
  RESTART_BM); unknown (its collector failed) -> watch;
- ``nvml_driver`` -> reboot_node: "Driver/library version mismatch" / "couldn't
  communicate with the NVIDIA driver" are cleared by loading one driver, i.e. a reboot;
- ``temperature`` / ``pcie_downtrained`` / ``roce_*`` critical -> isolate_card: cooling,
  seating, cables and optics need a person (catalog CHECK_MECHANICALS);
- ``nvlink_down`` / ``nvlink_errors`` critical -> reset_card (catalog XID 74: "A GPU reset
  or node reboot is needed to clear this error");
- ``vendor_health`` by its value: NVML ``gpu_is_lost`` -> reboot_node, ``reset_required`` ->
  reset_card, ``insufficient_power`` -> isolate_card, ``unknown_error`` (Unknown on a core
  call) -> reset_card; npu-smi Alarm -> watch (the error codes carry the action), Critical
  (the urgent alarm) -> reset_card, also when its codes could not be read;
- ``collector_hung`` / ``collector_failed`` / ``card_unreadable`` -> watch: one stuck
  read is no proof of a broken card; a hang that lasts escalates (escalation.py);
- usage and configuration checks (``memory_used``, ``power``, ``gres_*``, library
  paths, ``baseline_drift``, ``clock_event_reasons``) -> watch at most: no card action
  fixes them.

Standard library only (the Ascend table is read lazily, with ``yaml``, on first use).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from hetpatrol.actions import ascend_levels, nvidia_xid, nvml_recovery
from hetpatrol.actions.vocabulary import (
    ISOLATE_CARD,
    NONE,
    REBOOT_NODE,
    REPLACE_CARD,
    RESET_CARD,
    RESTART_JOB,
    WATCH,
    ActionVerdict,
    worst_verdict,
)

_QUIET = {"ok", "info"}

#: check -> {severity: action}; "*" is any other non-quiet severity
CHECK_ACTIONS: dict[str, dict[str, str]] = {
    # thresholds.py
    "card_unreadable": {"*": WATCH},
    "vendor_health": {"*": WATCH},  # by value: VENDOR_HEALTH_ACTIONS
    "temperature": {"warning": WATCH, "critical": ISOLATE_CARD, "*": WATCH},
    "ecc_uncorrected": {"warning": WATCH, "critical": RESET_CARD, "*": WATCH},
    "memory_used": {"*": WATCH},
    "power": {"*": WATCH},
    "remapped_rows_pending": {"*": RESET_CARD},
    "remapped_rows_failure": {"*": REPLACE_CARD},
    "retired_pages_pending": {"*": RESET_CARD},
    # patrol.py
    "card_missing": {"critical": REBOOT_NODE, "*": WATCH},
    "no_cards": {"*": WATCH},
    "collector_hung": {"*": WATCH},
    "collector_failed": {"*": WATCH},
    "recovering": {"*": WATCH},
    # collectors/nvidia.py (gpu_recovery_action is looked up by its value, below)
    "nvml_driver": {"critical": REBOOT_NODE, "*": WATCH},
    # NVML answered Unknown for one field: no card fault yet
    "nvml_field_error": {"critical": RESET_CARD, "*": WATCH},
    # by its value: nvml_recovery.recovery_action (this row is the fallback)
    "gpu_recovery_action": {"*": WATCH},
    # deep_health.py
    "baseline_drift": {"*": WATCH},
    "clock_event_reasons": {"*": WATCH},
    # checks/card_hung.py: busy but stuck, the job hangs; the card itself may be fine
    "card_hung": {"*": RESTART_JOB},
    # checks/stray_process.py: a user's process outside the card's job; patrol.py: the
    # jobs of the cards could not be read (squeue --json)
    "stray_process": {"*": WATCH},
    "card_jobs_unread": {"*": WATCH},
    "pcie_downtrained": {"warning": WATCH, "critical": ISOLATE_CARD, "*": WATCH},
    "nvlink_down": {"warning": WATCH, "critical": RESET_CARD, "*": WATCH},
    "nvlink_errors": {"warning": WATCH, "critical": RESET_CARD, "*": WATCH},
    # ascend_detail.py (ascend_fault_code is looked up per code, below)
    "roce_link_down": {"warning": WATCH, "critical": ISOLATE_CARD, "*": WATCH},
    "roce_net_health": {"warning": WATCH, "critical": ISOLATE_CARD, "*": WATCH},
    "roce_link_flaps": {"*": WATCH},
    "roce_optical": {"warning": WATCH, "critical": ISOLATE_CARD, "*": WATCH},
    # slurm/inventory.py, environment.py
    "gres_mismatch": {"*": WATCH},
    "gres_registration": {"*": WATCH},
    "library_path_mix": {"*": WATCH},
    "global_ld_library_path": {"*": WATCH},
    # checks/pci_census.py: critical is a card on the bus with its driver bound that
    # its tool no longer lists (NVIDIA: a GPU the driver lost, recovered by a GPU reset);
    # a plugin off, no driver, or an unreadable bus: watched
    "pci_unwatched": {"critical": RESET_CARD, "*": WATCH},
    "pci_census": {"*": WATCH},
}

#: ``vendor_health`` by its value (thresholds.VENDOR_HEALTH_SEVERITY's words)
VENDOR_HEALTH_ACTIONS: dict[str, str] = {
    # NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus (catalog XID 79: RESTART_BM)
    "gpu_is_lost": REBOOT_NODE,
    # NVML_ERROR_RESET_REQUIRED: "The GPU requires a reset before it can be used again"
    "reset_required": RESET_CARD,
    # NVML_ERROR_INSUFFICIENT_POWER: power cable (catalog XID 54: CHECK_MECHANICALS)
    "insufficient_power": ISOLATE_CARD,
    # npu-smi Health Alarm / Warning: the Error Codes carry the action (MindCluster
    # handles a chip by its fault codes, not by the health word). Critical is the urgent
    # alarm: without its codes read (detail sweep off, -t health failed) it must still
    # take the chip out of service, as a verdict of critical did before actions existed
    "alarm": WATCH,
    "critical": RESET_CARD,
    "warning": WATCH,
    # NVML Unknown on a core call (handle, memory, identity): the card cannot be used
    "unknown_error": RESET_CARD,
}

#: checks whose action is looked up per code in ``value``
CODE_CHECKS = frozenset({"xid", "kernel_fault", "ascend_fault_code"})

_XID154_RE = re.compile(r"XID 154\b[^;]*?->\s*(?P<action>.+?)\s+x\d+\s+\(")

_levels_cache: dict[str, str] | None = None


def bundled_levels() -> dict[str, str]:
    """The bundled Ascend code -> level table, read once (imports yaml on first call)."""
    global _levels_cache
    if _levels_cache is None:
        _levels_cache = ascend_levels.load_code_levels()
    return _levels_cache


def _get(finding: Any, name: str) -> Any:
    if isinstance(finding, Mapping):
        return finding.get(name)
    return getattr(finding, name, None)


def finding_action(
    finding: Any,
    *,
    levels: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> ActionVerdict:
    """The action of one finding (a :class:`hetpatrol.schema.Finding` or its dict).

    ``levels``: the Ascend code table (default: the bundled one); ``overrides``: see the
    module docstring. An already-set ``action`` key of a dict finding is not consulted:
    this computes the default. Never raises on odd values (they give ``watch``).
    """
    check = str(_get(finding, "check") or "")
    severity = str(_get(finding, "severity") or "")
    value = _get(finding, "value")
    key = f"check:{check}"
    if overrides and key in overrides:
        return ActionVerdict(overrides[key], "override", key, "per-check override in the config")
    if check in CODE_CHECKS:
        verdicts = _code_verdicts(
            check, severity, value, _get(finding, "message"), levels, overrides
        )
        if verdicts:
            return worst_verdict(verdicts)  # type: ignore[return-value]
        if severity in _QUIET:
            return ActionVerdict(NONE, "finding", key, f"{check} {severity}")
        return ActionVerdict(WATCH, "unknown", key, f"{check}: no code in the finding")
    if check == "vendor_health" and severity not in _QUIET:
        word = str(value or "").strip().lower()
        action = VENDOR_HEALTH_ACTIONS.get(word, WATCH)
        return ActionVerdict(action, "finding", key, f"vendor health {value!r}")
    if check == "gpu_recovery_action" and severity not in _QUIET:
        verdict = nvml_recovery.recovery_action(value)
        return ActionVerdict(verdict.action, "nvml_recovery", verdict.code, verdict.reason)
    if check.endswith("_check_failed"):
        return ActionVerdict(WATCH, "finding", key, "a node check failed")
    row = CHECK_ACTIONS.get(check)
    if row is None:
        return ActionVerdict(WATCH, "unknown", key, f"check {check!r} has no action table row")
    if severity in _QUIET:
        return ActionVerdict(NONE, "finding", key, f"{check} {severity}")
    return ActionVerdict(row.get(severity, row["*"]), "finding", key, f"{check} {severity}")


def _code_verdicts(check, severity, value, message, levels, overrides) -> list[ActionVerdict]:
    if not isinstance(value, Mapping):
        return []
    out = []
    for code in value:
        if check == "xid":
            fatal = None
            recovery = None
            if str(code).strip() in {str(x) for x in nvidia_xid.NVLINK5_XIDS}:
                fatal = None if severity == "critical" else False
            if str(code).strip() == "154":
                m = _XID154_RE.search(str(message or ""))
                recovery = m.group("action") if m else None
            out.append(
                nvidia_xid.xid_action(
                    code, fatal=fatal, recovery_action=recovery, overrides=overrides
                )
            )
        elif check == "kernel_fault":
            key = f"kernel:{code}"
            if overrides and key in overrides:
                out.append(ActionVerdict(overrides[key], "override", key, "per-code override"))
            else:
                out.append(nvidia_xid.kernel_reason_action(str(code)))
        else:
            table = bundled_levels() if levels is None else levels
            out.append(ascend_levels.code_action(str(code), table, overrides))
    return out


def card_action(
    findings: Iterable[Any],
    *,
    levels: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> ActionVerdict:
    """The highest action of a card's (or the node's) findings; ``none`` for none."""
    verdicts = [finding_action(f, levels=levels, overrides=overrides) for f in findings]
    return worst_verdict(verdicts, ActionVerdict(NONE, "finding", None, "no finding"))  # type: ignore[return-value]
