"""The default action of every finding hetpatrol makes, by check name and severity.

A finding is ``{check, severity, value, threshold, message}`` (hetpatrol.schema.Finding,
or its dict in the JSONL / state file). Its action:

- a check a vendor plugin declares in its fault tables (``VendorInfo.actions``, a
  :class:`hetpatrol.collector.VendorActions`): per code, the highest action of the codes
  in ``value`` (``{"79": 2}``; NVIDIA's ``xid`` by its XID catalog and ``kernel_fault``
  by the reason, Ascend's ``ascend_fault_code`` by the MindCluster level), or by its one
  value (NVIDIA's ``gpu_recovery_action``); see :func:`vendor_tables`;
- every other check: the :data:`CHECK_ACTIONS` row for its severity;
- ``info`` / ``ok`` severities of table checks: ``none``;
- a check not in the table: ``watch`` with the check name, never ``none``.

Per-code overrides (``overrides``) are keyed ``xid:<n>``, ``ascend:<CODE>``,
``kernel:<reason>`` or ``check:<name>`` and hold an action word.

Why each row (NVIDIA references: the XID catalog, see collectors/nvidia_xid.py; NVIDIA A100 GPU
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
  RESTART_BM); critical only after ``missing_patrols`` patrols in a row or with an
  off-the-bus signal for the same card (hetpatrol.patrol), so a warning (one short list)
  and unknown (its output damaged) -> watch;
- ``temperature`` / ``pcie_downtrained`` critical -> isolate_card: cooling and seating
  need a person (catalog CHECK_MECHANICALS);
- ``nvlink_down`` / ``nvlink_errors`` critical -> reset_card (catalog XID 74: "A GPU reset
  or node reboot is needed to clear this error");
- ``vendor_health`` by its value: the word's action in the plugins' ``health_actions``
  (NVIDIA's NVML markers, npu-smi's Health words: see collectors/nvidia_actions.py and
  ascend_actions.py), ``watch`` for a word none lists; the vendors' own checks
  (``nvml_driver``, ``roce_*``) by their plugins' ``check_actions`` rows, with their
  reasons there;
- ``collector_hung`` / ``collector_failed`` / ``card_unreadable`` -> watch: one stuck
  read is no proof of a broken card; a hang that lasts escalates (escalation.py);
- usage and configuration checks (``memory_used``, ``power``, ``gres_*``, library
  paths, ``baseline_drift``, ``clock_event_reasons``) -> watch at most: no card action
  fixes them.

Standard library only at import time; the plugins' tables are imported on the first
finding that needs them (the Ascend code table is read then, with ``yaml``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from hetpatrol.collector import VendorActions

_QUIET = {"ok", "info"}

#: check -> {severity: action}; "*" is any other non-quiet severity
CHECK_ACTIONS: dict[str, dict[str, str]] = {
    # thresholds.py
    "card_unreadable": {"*": WATCH},
    "vendor_health": {"*": WATCH},  # by value: the plugins' VendorActions.health_actions
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
    # the vendors' own checks (nvml_driver, roce_link_down ...): their plugins'
    # VendorActions.check_actions
    # deep_health.py
    "baseline_drift": {"*": WATCH},
    "clock_event_reasons": {"*": WATCH},
    # checks/card_hung.py: busy but stuck, the job hangs; the card itself may be fine
    "card_hung": {"*": RESTART_JOB},
    # checks/stray_process.py: a user's process outside the card's job; patrol.py: the
    # jobs of the cards could not be read (squeue --json), or their processes cannot be
    # told from others (ProctrackType not proctrack/cgroup)
    "stray_process": {"*": WATCH},
    "stray_process_unjudged": {"*": WATCH},  # info: none
    "card_jobs_unread": {"*": WATCH},
    "pcie_downtrained": {"warning": WATCH, "critical": ISOLATE_CARD, "*": WATCH},
    "nvlink_down": {"warning": WATCH, "critical": RESET_CARD, "*": WATCH},
    "nvlink_errors": {"warning": WATCH, "critical": RESET_CARD, "*": WATCH},
    # slurm/inventory.py, environment.py
    "gres_mismatch": {"*": WATCH},
    "gres_registration": {"*": WATCH},
    "library_path_mix": {"*": WATCH},
    "global_ld_library_path": {"*": WATCH},
    # checks/pci_census.py: critical is a card on the bus with its driver bound that
    # its tool no longer lists, pci_census.unlisted_patrols patrols in a row (NVIDIA: a
    # GPU the driver lost, recovered by a GPU reset; one patrol's answer is a warning);
    # a plugin off, no driver, or an unreadable bus: watched
    "pci_unwatched": {"critical": RESET_CARD, "*": WATCH},
    "pci_census": {"*": WATCH},
    # checks/kernel_events.py: past MAX_UNREAD_BUSES bus ids no card has, the rest are one
    # finding; a flood of ids no card has names no card to act on
    "kernel_fault_buses": {"*": WATCH},
    # records in a text kernel log before its first read, of unknown age: said, not acted on
    "kernel_log_earlier": {"*": WATCH},  # info: none
}

_tables: tuple[tuple, VendorActions] | None = None


def vendor_tables() -> VendorActions:
    """Every installed plugin's fault tables (``VendorInfo.actions``) in one
    :class:`hetpatrol.collector.VendorActions`: ``code_actions``, ``value_actions``,
    ``check_actions`` and ``code_keys`` by check name, ``health_actions`` by word (a
    check or word two plugins declare: the first plugin by name), ``off_bus_codes`` by
    check name (every plugin's codes together), and a ``code_table`` that merges theirs.
    Plugins are loaded (imported) on the first call and again only when ``sys.path``
    changes; one that cannot be imported is left out (its checks then take the generic
    rows or ``watch``). Never raises."""
    global _tables
    key = tuple(sys.path)  # plugins come and go with the import path
    if _tables is not None and _tables[0] == key:
        return _tables[1]
    from hetpatrol.collector import VendorActions, load_collector

    eps = sorted(entry_points(group="hetpatrol.collectors"), key=lambda e: e.name)
    code: dict[str, Any] = {}
    value: dict[str, Any] = {}
    rows: dict[str, Any] = {}
    health: dict[str, str] = {}
    keys: dict[str, Any] = {}
    off_bus: dict[str, frozenset[str]] = {}
    tables: list[Any] = []
    for ep in eps:
        try:
            declared = load_collector(ep.name).vendor_info.actions
        except Exception:  # a broken plugin is reported where it is configured
            continue
        if declared is None:
            continue
        for name, fn in declared.code_actions.items():
            code.setdefault(name, fn)
        for name, fn in declared.value_actions.items():
            value.setdefault(name, fn)
        for name, row in declared.check_actions.items():
            rows.setdefault(name, row)
        for word, action in declared.health_actions.items():
            health.setdefault(word.lower(), action)
        for name, fn in declared.code_keys.items():
            keys.setdefault(name, fn)
        for name, codes in declared.off_bus_codes.items():
            off_bus[name] = off_bus.get(name, frozenset()) | frozenset(str(c) for c in codes)
        if declared.code_table is not None:
            tables.append(declared.code_table)

    def merged_table() -> dict[str, str]:
        out: dict[str, str] = {}
        for table in tables:
            for k, v in table().items():
                out.setdefault(k, v)
        return out

    merged = VendorActions(
        code_actions=code,
        value_actions=value,
        code_table=merged_table,
        check_actions=rows,
        health_actions=health,
        code_keys=keys,
        off_bus_codes=off_bus,
    )
    _tables = (key, merged)
    return merged


def bundled_levels() -> dict[str, str]:
    """The plugins' bundled code tables (``code_table``: the Ascend code -> MindCluster
    level table), merged; read on first call (imports yaml). Raises OSError /
    ValueError when a bundled table cannot be read."""
    table = vendor_tables().code_table
    return dict(table()) if table is not None else {}


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

    ``levels``: the code table of the code checks (the Ascend code -> level table; default:
    each plugin's bundled one); ``overrides``: see the
    module docstring. An already-set ``action`` key of a dict finding is not consulted:
    this computes the default. Never raises on odd values (they give ``watch``).
    """
    check = str(_get(finding, "check") or "")
    severity = str(_get(finding, "severity") or "")
    value = _get(finding, "value")
    key = f"check:{check}"
    if overrides and key in overrides:
        return ActionVerdict(overrides[key], "override", key, "per-check override in the config")
    generic = check in CHECK_ACTIONS and check != "vendor_health"
    tables = None if generic else vendor_tables()
    if tables is not None and check in tables.code_actions:
        verdicts = _code_verdicts(
            tables.code_actions[check], severity, value, _get(finding, "message"), levels, overrides
        )
        if verdicts:
            return worst_verdict(verdicts)  # type: ignore[return-value]
        if severity in _QUIET:
            return ActionVerdict(NONE, "finding", key, f"{check} {severity}")
        return ActionVerdict(WATCH, "unknown", key, f"{check}: no code in the finding")
    if check == "vendor_health" and severity not in _QUIET:
        word = str(value or "").strip().lower()
        action = tables.health_actions.get(word, WATCH) if tables is not None else WATCH
        return ActionVerdict(action, "finding", key, f"vendor health {value!r}")
    if tables is not None and check in tables.value_actions:
        if severity in _QUIET:
            return ActionVerdict(NONE, "finding", key, f"{check} {severity}")
        return tables.value_actions[check](value)
    if check.endswith("_check_failed"):
        return ActionVerdict(WATCH, "finding", key, "a node check failed")
    row = CHECK_ACTIONS.get(check)
    if row is None and tables is not None:
        row = tables.check_actions.get(check)
    if row is None:
        return ActionVerdict(WATCH, "unknown", key, f"check {check!r} has no action table row")
    if severity in _QUIET:
        return ActionVerdict(NONE, "finding", key, f"{check} {severity}")
    # the why is the finding's own message ("remapped rows pending: the GPU needs a
    # reset"), not the check name again: the code already names the check
    why = why_text(_get(finding, "message")) or f"{check} {severity}"
    return ActionVerdict(row.get(severity, row["*"]), "finding", key, why)


#: the longest why a verdict keeps from a finding's message (drain reasons: 200 in all)
WHY_MAX = 100


def why_text(message: Any, limit: int = WHY_MAX) -> str:
    """A finding's message as a verdict's why: one line of printable text (control,
    format and bidi characters and whitespace runs become one space), at most ``limit``
    characters (cut with ``...``); "" for no message."""
    if not isinstance(message, str):
        return ""
    text = " ".join("".join(c if c.isprintable() else " " for c in message).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _code_verdicts(fn, severity, value, message, levels, overrides) -> list[ActionVerdict]:
    if not isinstance(value, Mapping):
        return []
    return [fn(str(code), severity, message, levels, overrides) for code in value]


def card_action(
    findings: Iterable[Any],
    *,
    levels: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> ActionVerdict:
    """The highest action of a card's (or the node's) findings; ``none`` for none."""
    verdicts = [finding_action(f, levels=levels, overrides=overrides) for f in findings]
    return worst_verdict(verdicts, ActionVerdict(NONE, "finding", None, "no finding"))  # type: ignore[return-value]
