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
- escalation rules over the ``xid:<n>`` keys (:data:`FREQUENCY_RULES`), each citing its
  catalog row.
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

from hetpatrol.actions.escalation import DAY, FrequencyRule
from hetpatrol.actions.vocabulary import (
    ISOLATE_CARD,
    REBOOT_NODE,
    REPLACE_CARD,
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


#: Repeats of XIDs (keys ``xid:<n>``, one per kernel-log record) that raise a card's
#: action (:mod:`hetpatrol.actions.escalation`), each with its source.
FREQUENCY_RULES: tuple[FrequencyRule, ...] = (
    FrequencyRule(
        "xid48_repeat",
        frozenset({"xid:48"}),
        2,
        DAY,
        REPLACE_CARD,
        source="issue 13 (a second double-bit ECC error in 24 h); NVIDIA XID catalog row 48: "
        "check SRAM DBE thresholds and follow the RMA flow",
    ),
    FrequencyRule(
        "xid_reset_repeat",
        frozenset({"xid:79", "xid:95", "xid:119", "xid:120", "xid:140", "xid:158"}),
        2,
        DAY,
        ISOLATE_CARD,
        source="NVIDIA XID catalog, step 3: 'If the issue reoccurs ... the Investigatory "
        "Action column provides guidance' (CONTACT_SUPPORT / INVESTIGATE_SW for these)",
    ),
    FrequencyRule(
        "xid94_repeat",
        frozenset({"xid:94"}),
        3,
        3600.0,
        RESET_CARD,
        source="NVIDIA XID catalog row 94: 'It is recommended to reset the GPU when "
        "convenient'; hetpatrol's kernel_log.repeat_critical[94] = 3 in the window",
    ),
    FrequencyRule(
        "xid74_repeat",
        frozenset({"xid:74"}),
        3,
        DAY,
        ISOLATE_CARD,
        source="NVIDIA XID catalog row 74: 'If this error is seen repeatedly and GPU reset "
        "or node reboot fails to clear the condition, contact your hardware vendor'",
    ),
    FrequencyRule(
        "xid149_repeat",
        frozenset({"xid:149"}),
        2,
        DAY,
        ISOLATE_CARD,
        source="NVIDIA XID catalog, XID 144-150 Decode: NETIR_LINK_DOWN 'REPORT_ISSUE (if "
        "seen >1 per day)'",
    ),
)


ACTIONS = VendorActions(
    code_actions={"xid": xid_code_action, "kernel_fault": kernel_code_action},
    value_actions={"gpu_recovery_action": recovery_value_action},
    check_actions={
        "nvml_driver": {"critical": REBOOT_NODE, "*": WATCH},
        "nvml_field_error": {"critical": RESET_CARD, "*": WATCH},
        # MIG enabled without MIG devices, or a MIG mode change pending: a layout to fix
        "mig_layout": {"*": WATCH},
        # hetpatrol.checks.fabric: critical only after the post-boot grace and N patrols
        # in a row. The fabric manager registers the GPUs with the NVLink fabric when it
        # starts at boot (nvidia-fabricmanager.service); a GPU that did not register
        # "will lose its NVLink peer-to-peer capability" and CUDA fails with
        # cudaErrorSystemNotReady until it is ("The CUDA initialization process can only
        # begin after the GPUs complete their registration process with the NVLink
        # fabric": NVIDIA Fabric Manager User Guide, docs.nvidia.com/datacenter/tesla/
        # fabric-manager-user-guide/, "NVSwitch and NVLink Initialization"). Starting or
        # restarting the fabric manager on a running node is not enough: outside its
        # resiliency ("restart") mode it initialises the fabric from a reset state, i.e.
        # after the GPUs and NVSwitches were reset (same guide, "Fabric Manager Restart
        # Mode", "CUDA Jobs Behavior When the Fabric Manager Service is Stopped or
        # Terminated"); on an 8-GPU baseboard that is every GPU of the node, so the
        # operator's step is reboot_node (the service starts at boot and trains the fabric
        # afresh). A GPU still failing after reboots is taken out by the reboot-survival
        # rule (isolate_card).
        "fabric_not_ready": {"critical": REBOOT_NODE, "*": WATCH},
        "fabric_error": {"critical": REBOOT_NODE, "*": WATCH},
        # a degraded fabric (health summary Unhealthy / Limited Capacity) still works
        "fabric_health": {"*": WATCH},
    },
    # the words of NvidiaCollector.vendor_info.health_words (VH_* in nvidia.py)
    health_actions={
        "gpu_is_lost": REBOOT_NODE,
        "reset_required": RESET_CARD,
        "insufficient_power": ISOLATE_CARD,
        "unknown_error": RESET_CARD,
    },
    frequency_rules=FREQUENCY_RULES,
    off_bus_codes={
        "xid": frozenset(str(x) for x in nvidia_xid.OFF_BUS_XIDS),
        "kernel_fault": nvidia_xid.OFF_BUS_REASONS,
    },
)
