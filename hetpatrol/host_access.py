"""What hetpatrol opens and runs on the host: the contract a sandbox must keep open.

The daemon reads the kernel log itself; NVML (in the daemon) and ``npu-smi`` /
``hccn_tool`` (child processes) open the vendor device nodes. A hardening change that
hides one of these does not fail loudly: the check it feeds goes blind (no XIDs, no
RoCE link state). ``systemd/hetpatrol.service`` is checked against these tables by
``tests/test_systemd_unit.py``. Each vendor declares its own device nodes and tool
directories in its plugin (``VendorInfo.device_nodes``, ``VendorInfo.tool_dirs``); a
vendor the unit does not list is granted by a drop-in
(``/etc/systemd/system/hetpatrol.service.d/<vendor>.conf`` with its ``DeviceAllow=``
lines).

Shapes:

- :func:`device_nodes`: :class:`~hetpatrol.collector.DeviceNode` rows; ``path`` is a
  ``/dev`` path (with ``{n}`` for a numbered node, ``0 .. count-1``), ``group`` the
  device group of ``/proc/devices`` that systemd's ``DeviceAllow=char-<group>`` names
  (None: only the path), ``access`` the least access needed (``"r"`` or ``"rw"``);
- :func:`tool_dirs`: program name -> the directories the vendor installs it in (one of
  them must be on the unit's ``PATH``).
"""

from __future__ import annotations

from importlib.metadata import entry_points

from hetpatrol.collector import DeviceNode, VendorInfo
from hetpatrol.kernel_log import KMSG_PATH

__all__ = ["DeviceNode", "device_nodes", "device_paths", "tool_dirs"]

#: The kernel log: XIDs and "fallen off the bus" (hetpatrol.kernel_log.KmsgReader).
KMSG_NODE = DeviceNode(KMSG_PATH, "r", "hetpatrol (kernel log)")


def _vendors() -> list[VendorInfo]:
    """The ``vendor_info`` of every registered plugin, by name (one that fails to load
    declares nothing)."""
    out = []
    for ep in sorted(entry_points(group="hetpatrol.collectors"), key=lambda e: e.name):
        try:
            out.append(ep.load().vendor_info)
        except Exception:  # noqa: BLE001 - a broken plugin is reported where configured
            continue
    return out


def device_nodes() -> tuple[DeviceNode, ...]:
    """The kernel log, then every registered vendor's device nodes."""
    return (KMSG_NODE, *(node for info in _vendors() for node in info.device_nodes))


def tool_dirs() -> dict[str, tuple[str, ...]]:
    """Program name -> install directories, of every registered vendor's tools."""
    return {tool: dirs for info in _vendors() for tool, dirs in info.tool_dirs.items()}


def device_paths(node: DeviceNode) -> list[str]:
    """The concrete paths of ``node``: ``/dev/davinci0`` .. ``/dev/davinci15``."""
    if "{n}" not in node.path:
        return [node.path]
    return [node.path.format(n=i) for i in range(node.count)]
