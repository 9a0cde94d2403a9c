"""NVIDIA's fault tables, declared to the core through ``VendorInfo.actions``
(:class:`hetpatrol.collector.VendorActions`; :mod:`hetpatrol.actions.findings` reads
them without naming the vendor):

- ``xid`` findings (``value``: ``{"<XID>": count}``): each XID by NVIDIA's XID catalog,
  :func:`hetpatrol.collectors.nvidia_xid.xid_action`. An NVLink5 XID (144-150) the
  kernel-log judge rated below critical is not a fatal one (its decode said so); XID
  154's recovery action is read from the finding's message (``XID 154 ... -> <text>
  xN (``), as the kernel-log judge writes it;
- ``kernel_fault`` findings (``value``: ``{"<reason>": count}``): NVRM's non-XID lines
  (``fallen_off_bus`` ...), :func:`~hetpatrol.collectors.nvidia_xid.kernel_reason_action`;
  an override ``kernel:<reason>`` wins;
- ``gpu_recovery_action`` findings: NVML's recovery action value,
  :func:`hetpatrol.collectors.nvml_recovery.recovery_action`;
- ``nvml_driver`` critical -> reboot_node: "Driver/library version mismatch" /
  "couldn't communicate with the NVIDIA driver" are cleared by loading one driver, i.e.
  a reboot; ``nvml_field_error`` critical -> reset_card, else watch (NVML answered
  Unknown for one field: no card fault yet);
- ``vendor_health`` words (the markers :class:`~hetpatrol.collectors.nvidia.NvidiaCollector`
  sets when an NVML call raised): ``gpu_is_lost`` -> reboot_node
  (NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus, catalog XID 79: RESTART_BM),
  ``reset_required`` -> reset_card (NVML_ERROR_RESET_REQUIRED: "The GPU requires a reset
  before it can be used again"), ``insufficient_power`` -> isolate_card
  (NVML_ERROR_INSUFFICIENT_POWER: power cable, catalog XID 54: CHECK_MECHANICALS),
  ``unknown_error`` -> reset_card (NVML Unknown on a core call: handle, memory, identity;
  the card cannot be used);
- ``off_bus_codes``: the kernel-log events that say a GPU left the bus
  (:data:`~hetpatrol.collectors.nvidia_xid.OFF_BUS_XIDS`: XID 79, and the no-Xid
  ``fallen_off_bus`` line): on a GPU's bus id in this boot they corroborate NVML no
  longer listing it, so ``card_missing`` is critical at once (one patrol's short list is
  otherwise only a warning until ``missing_patrols`` patrols in a row).

Standard library only (the Slurm prolog may read these).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hetpatrol.actions.vocabulary import (
    ISOLATE_CARD,
    REBOOT_NODE,
    RESET_CARD,
    WATCH,
    ActionVerdict,
)
from hetpatrol.collector import VendorActions
from hetpatrol.collectors import nvidia_xid, nvml_recovery

_XID154_RE = re.compile(r"XID 154\b[^;]*?->\s*(?P<action>.+?)\s+x\d+\s+\(")
_NVLINK5 = frozenset(str(x) for x in nvidia_xid.NVLINK5_XIDS)


def xid_code_action(
    code: str,
    severity: str,
    message: str | None,
    levels: Mapping[str, str] | None,
    overrides: Mapping[str, str] | None,
) -> ActionVerdict:
    """The action of one XID of an ``xid`` finding (``levels`` is not read)."""
    fatal = None
    recovery = None
    if str(code).strip() in _NVLINK5:
        fatal = None if severity == "critical" else False
    if str(code).strip() == "154":
        m = _XID154_RE.search(str(message or ""))
        recovery = m.group("action") if m else None
    return nvidia_xid.xid_action(code, fatal=fatal, recovery_action=recovery, overrides=overrides)


def kernel_code_action(
    code: str,
    severity: str,
    message: str | None,
    levels: Mapping[str, str] | None,
    overrides: Mapping[str, str] | None,
) -> ActionVerdict:
    """The action of one reason of a ``kernel_fault`` finding; ``kernel:<reason>`` in
    ``overrides`` wins."""
    key = f"kernel:{code}"
    if overrides and key in overrides:
        return ActionVerdict(overrides[key], "override", key, "per-code override")
    return nvidia_xid.kernel_reason_action(str(code))


def recovery_value_action(value: Any) -> ActionVerdict:
    """The action of a ``gpu_recovery_action`` finding's value (NVML's number)."""
    verdict = nvml_recovery.recovery_action(value)
    return ActionVerdict(verdict.action, "nvml_recovery", verdict.code, verdict.reason)


ACTIONS = VendorActions(
    code_actions={"xid": xid_code_action, "kernel_fault": kernel_code_action},
    value_actions={"gpu_recovery_action": recovery_value_action},
    check_actions={
        "nvml_driver": {"critical": REBOOT_NODE, "*": WATCH},
        "nvml_field_error": {"critical": RESET_CARD, "*": WATCH},
        # MIG enabled without MIG devices, or a MIG mode change pending: a layout to fix
        "mig_layout": {"*": WATCH},
    },
    # the words of NvidiaCollector.vendor_info.health_words (VH_* in nvidia.py)
    health_actions={
        "gpu_is_lost": REBOOT_NODE,
        "reset_required": RESET_CARD,
        "insufficient_power": ISOLATE_CARD,
        "unknown_error": RESET_CARD,
    },
    off_bus_codes={
        "xid": frozenset(str(x) for x in nvidia_xid.OFF_BUS_XIDS),
        "kernel_fault": nvidia_xid.OFF_BUS_REASONS,
    },
)
