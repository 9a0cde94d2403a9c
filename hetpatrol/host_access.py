"""What hetpatrol opens and runs on the host: the contract a sandbox must keep open.

The daemon reads the kernel log itself; NVML (in the daemon) and ``npu-smi`` /
``hccn_tool`` (child processes) open the vendor device nodes. A hardening change that
hides one of these does not fail loudly: the check it feeds goes blind (no XIDs, no
RoCE link state). ``systemd/hetpatrol.service`` is checked against these tables by
``tests/test_systemd_unit.py``; a new device node or tool is declared here.

Shapes:

- :data:`DEVICE_NODES`: :class:`DeviceNode` rows; ``path`` is a ``/dev`` path (with
  ``{n}`` for a numbered node, ``0 .. count-1``), ``group`` the device group of
  ``/proc/devices`` that systemd's ``DeviceAllow=char-<group>`` names (None: only the
  path), ``access`` the least access needed (``"r"`` or ``"rw"``);
- :data:`TOOL_DIRS`: program name -> the directories the vendor installs it in (one of
  them must be on the unit's ``PATH``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetpatrol.kernel_log import KMSG_PATH

__all__ = ["DEVICE_NODES", "TOOL_DIRS", "DeviceNode", "ASCEND_MAX_CHIPS", "device_paths"]

#: /dev/davinciN per NPU chip: an Atlas A3 node has 16 (vendor sample
#: npu-smi-info_910_93-A3_16chip_*).
ASCEND_MAX_CHIPS = 16
#: /dev/nvidiaN per GPU: an HGX/DGX board carries 8; 16 leaves room (the device group
#: allows them all anyway).
NVIDIA_MAX_GPUS = 16


@dataclass(frozen=True)
class DeviceNode:
    """One device node (or numbered family) and who needs it, for what."""

    path: str
    access: str
    user: str
    group: str | None = None
    count: int = 1


DEVICE_NODES: tuple[DeviceNode, ...] = (
    # The kernel log: XIDs and "fallen off the bus" (hetpatrol.kernel_log.KmsgReader).
    DeviceNode(KMSG_PATH, "r", "hetpatrol (kernel log)"),
    # NVML: /dev/nvidiactl (195:255) and /dev/nvidiaN (195:N) share the major the NVIDIA
    # kernel module registers as "nvidia-frontend"; nvidia-uvm and nvidia-caps
    # (/dev/nvidia-caps/nvidia-capN, MIG) have majors of their own. (nvidia-modprobe(1);
    # NVIDIA driver README "Installing the NVIDIA Driver", device files)
    DeviceNode("/dev/nvidiactl", "rw", "NVML", "nvidia-frontend"),
    DeviceNode("/dev/nvidia{n}", "rw", "NVML", "nvidia-frontend", NVIDIA_MAX_GPUS),
    DeviceNode("/dev/nvidia-uvm", "rw", "NVML", "nvidia-uvm"),
    DeviceNode("/dev/nvidia-caps/nvidia-cap{n}", "r", "NVML (MIG)", "nvidia-caps", 2),
    # npu-smi / hccn_tool: the management nodes and one /dev/davinciN per chip
    # (hiascend.com: "Use in Containers", --device=/dev/davinciN /dev/davinci_manager
    # /dev/hisi_hdc /dev/devmm_svm).
    DeviceNode("/dev/davinci_manager", "rw", "npu-smi"),
    DeviceNode("/dev/devmm_svm", "rw", "npu-smi"),
    DeviceNode("/dev/hisi_hdc", "rw", "npu-smi"),
    DeviceNode("/dev/davinci{n}", "rw", "npu-smi", None, ASCEND_MAX_CHIPS),
)

#: Where the vendors install the tools hetpatrol runs. npu-smi: /usr/local/sbin
#: (/usr/local/bin on some SoC boards), hiascend.com MindCluster "Default Content Mounted
#: by Ascend Docker Runtime"; hccn_tool: /usr/local/Ascend/driver/tools (MindCluster
#: fault-diagnosis guide, "/usr/local/Ascend/driver/tools/hccn_tool -i ${device_id} -link -g").
TOOL_DIRS: dict[str, tuple[str, ...]] = {
    "npu-smi": ("/usr/local/sbin", "/usr/local/bin"),
    "hccn_tool": ("/usr/local/Ascend/driver/tools",),
}


def device_paths(node: DeviceNode) -> list[str]:
    """The concrete paths of ``node``: ``/dev/davinci0`` .. ``/dev/davinci15``."""
    if "{n}" not in node.path:
        return [node.path]
    return [node.path.format(n=i) for i in range(node.count)]
