"""NVML's GPU recovery action -> action.

``nvmlDeviceGetGpuRecoveryAction`` (field ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``) and
the text of XID 154 ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot
Required)") report one value of ``nvmlDeviceGpuRecoveryAction_t``. Values as published
in NVIDIA's cuda-python NVML bindings, ``cuda.bindings.nvml.DeviceGpuRecoveryAction``
(https://nvidia.github.io/cuda-python/ ... /cuda.bindings.nvml.DeviceGpuRecoveryAction.html):

====  ======================  ===========================  ============
value name                    NVIDIA's text                action
====  ======================  ===========================  ============
0     NONE                    No action needed.            none
1     GPU_RESET               Reset Gpu.                   reset_card
2     NODE_REBOOT             Reboot Node.                 reboot_node
3     DRAIN_P2P               Drain P2P.                   restart_job
4     DRAIN_AND_RESET         Drain P2P and Reset Gpu.     reset_card
5     RECOVER_IMEX_DOMAIN     Recover IMEX Domain.         restart_job
6     BUS_RESET               Reset the GPU's PCIe bus.    reset_card
7     SYSTEM_REBOOT           Reboot the system.           reboot_node
====  ======================  ===========================  ============

NVIDIA's A100 GPU memory error management guide ("Error Recovery and Response Flags",
https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html):
None: "The GPU can be immediately used again by starting a new GPU process"; Reset:
"Terminate all GPU processes, reset the GPU using nvidia-smi -r"; Reboot: "Reboot the
operating system"; Drain P2P: "requires all peer-to-peer traffic to be quiesced.
Terminate all GPU processes that conduct peer-to-peer traffic and disable UVM
persistence mode. Once all peer-to-peer traffic are drained, query
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION again, which will return one of the other actions"
-- the jobs go, the card is not yet reset: ``restart_job`` (the next value says more).
RECOVER_IMEX_DOMAIN is recovered by the fabric's IMEX service, not by a card reset or a
reboot of this node; its jobs restart: ``restart_job``. (hetpatrol's
``gpu_recovery_action`` finding rates both a warning.) An unknown value is ``watch``
with the raw value.

The XID 154 texts (catalog row 154): "None", "Drain P2P", "Drain and Reset", "GPU Reset
Required", "Node Reboot Required".

Standard library only.
"""

from __future__ import annotations

import re

from hetpatrol.actions.vocabulary import (
    NONE,
    REBOOT_NODE,
    RESET_CARD,
    RESTART_JOB,
    WATCH,
    ActionVerdict,
)

#: value -> (enum name, action)
RECOVERY_ACTIONS: dict[int, tuple[str, str]] = {
    0: ("NONE", NONE),
    1: ("GPU_RESET", RESET_CARD),
    2: ("NODE_REBOOT", REBOOT_NODE),
    3: ("DRAIN_P2P", RESTART_JOB),
    4: ("DRAIN_AND_RESET", RESET_CARD),
    5: ("RECOVER_IMEX_DOMAIN", RESTART_JOB),
    6: ("BUS_RESET", RESET_CARD),
    7: ("SYSTEM_REBOOT", REBOOT_NODE),
}

#: XID 154 texts (folded: lower case, single spaces) -> value
XID154_TEXTS: dict[str, int] = {
    "none": 0,
    "gpu reset required": 1,
    "node reboot required": 2,
    "drain p2p": 3,
    "drain and reset": 4,
}

_NAME_TO_VALUE = {name: value for value, (name, _a) in RECOVERY_ACTIONS.items()}
_HEX_RE = re.compile(r"0x([0-9a-fA-F]+)")


def recovery_action(value: int | str | None) -> ActionVerdict:
    """The action for an NVML recovery action value.

    Takes the integer, its decimal or ``0x`` text, or the enum name with or without
    the ``NVML_GPU_RECOVERY_ACTION_`` / ``GPU_RECOVERY_ACTION_`` prefix. ``None`` (not
    read) and anything not in the enum give ``watch`` with the raw value. Never raises.
    """
    if value is None:
        return ActionVerdict(WATCH, "unknown", "nvml_recovery:None", "recovery action not read")
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    else:
        text = str(value).strip()
        name = text.upper()
        for prefix in ("NVML_GPU_RECOVERY_ACTION_", "GPU_RECOVERY_ACTION_"):
            name = name.removeprefix(prefix)
        if name in _NAME_TO_VALUE:
            number = _NAME_TO_VALUE[name]
        else:
            try:
                number = int(text, 0)
            except ValueError:
                number = None
    if number is None or number not in RECOVERY_ACTIONS:
        return ActionVerdict(
            WATCH, "unknown", f"nvml_recovery:{value}", f"recovery action {value!r} not known"
        )
    name, action = RECOVERY_ACTIONS[number]
    return ActionVerdict(action, "nvml_recovery", f"nvml_recovery:{number}", name)


def recovery_action_from_text(text: str | None) -> ActionVerdict:
    """The action of XID 154's new recovery action: ``0x2 (Node Reboot Required)``,
    ``Node Reboot Required`` or ``0x2``. The hex value wins when both are there and
    disagree with nothing known; an unknown text is ``watch`` with the raw text."""
    if text is None or not text.strip():
        return ActionVerdict(WATCH, "unknown", "nvml_recovery:None", "no recovery action text")
    m = _HEX_RE.search(text)
    if m:
        return recovery_action(int(m.group(1), 16))
    words = " ".join(re.sub(r"[()]", " ", text).split()).lower()
    if words in XID154_TEXTS:
        return recovery_action(XID154_TEXTS[words])
    return recovery_action(text)
