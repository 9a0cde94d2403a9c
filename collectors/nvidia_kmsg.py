"""What the NVIDIA kernel module prints in the kernel log: XIDs and the GPU failures
that print no Xid (``NVRM:`` lines). Part of the NVIDIA plugin
(``NvidiaCollector.vendor_info.kernel_log``); the kernel log itself (``/dev/kmsg``, the
line prefixes, bursts, the window) is read by :mod:`hetpatrol.kernel_log`, and judged by
:mod:`hetpatrol.checks.kernel_events`.

XID lines: ``NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, <text>``;
``pid='<unknown>'``/``name=<unknown>`` mean unknown; old drivers print neither; the
PCI domain may be non-zero (``PCI:0019:01:00``); NVLink5 XIDs 144-150 carry a unit,
``Fatal``/``Nonfatal``, ``XC0 i0 Link 13`` and six hex words; XID 154 names the new
recovery action. Failures without an Xid: ``fallen off the bus``,
``NV_ERR_RESET_REQUIRED``, ``RmInitAdapter failed`` / ``rm_init_adapter failed``.
``NVRM: GPU at PCI:0000:9b:00: GPU-<uuid>`` lines name the GPU's UUID.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from hetpatrol.kernel_log import (
    ANY_BUS_RE,
    BUS_PATTERN,
    KIND_KERNEL,
    KIND_XID,
    REASON_FALLEN_OFF_BUS,
    REASON_RESET_REQUIRED,
    REASON_RM_INIT_FAILED,
    KernelEvent,
    LogLine,
    pci_bus_id,
)

# "(?a)": \d is an ASCII digit only (not "٧٩", which int() would read as 79).
_XID_RE = re.compile(
    r"(?a)NVRM: Xid \((?:PCI:)?(?P<bus>"
    + BUS_PATTERN
    + r")[^)]*\):\s*(?P<xid>\d+)(?:,\s*(?P<rest>.*))?$"
)
_PID_RE = re.compile(r"(?a)^pid=(?:'?<unknown>'?|(?P<pid>\d+)),\s*")
_NAME_RE = re.compile(r"^name=(?P<name>[^,]*),\s*")
_NVLINK5_RE = re.compile(
    r"(?a)^(?P<unit>[A-Z][A-Z0-9_]*)\s+(?P<sev>Fatal|Non-?[Ff]atal)\s+XC(?P<xc>\d+)\s+"
    r"i(?P<inst>\d+)\s+Link\s+(?P<link>-?\d+)"
)
_RECOVERY_RE = re.compile(r"to\s+0x(?P<code>[0-9a-fA-F]+)\s*\((?P<action>[^)]*)\)")
_IDENTITY_RE = re.compile(
    r"NVRM: GPU at PCI:(?P<bus>" + BUS_PATTERN + r"):\s*(?P<uuid>GPU-[0-9a-fA-F-]+)"
)
_GPU_HEAD_RE = re.compile(r"NVRM: The NVIDIA GPU (?P<bus>" + BUS_PATTERN + r")")

_KERNEL_REASONS = (
    (re.compile(r"fallen off the bus", re.I), REASON_FALLEN_OFF_BUS),
    (re.compile(r"NV_ERR_RESET_REQUIRED"), REASON_RESET_REQUIRED),
    (re.compile(r"rm_?init_?adapter failed", re.I), REASON_RM_INIT_FAILED),
)


def _parse_xid(m: re.Match[str], line: LogLine) -> KernelEvent:
    rest = (m.group("rest") or "").strip()
    pid: int | None = None
    process: str | None = None
    pm = _PID_RE.match(rest)
    if pm:
        pid = int(pm.group("pid")) if pm.group("pid") else None
        rest = rest[pm.end() :]
    nm = _NAME_RE.match(rest)
    if nm:
        name = nm.group("name").strip().strip("'")
        process = None if name in ("", "<unknown>") else name
        rest = rest[nm.end() :]
    xid = int(m.group("xid"))
    unit = fatal = link = action = None
    lm = _NVLINK5_RE.match(rest)
    if lm:
        unit = lm.group("unit")
        fatal = lm.group("sev").lower() == "fatal"
        link = int(lm.group("link"))
    if xid == 154:
        am = _RECOVERY_RE.search(rest)
        if am:
            action = am.group("action").strip()
    return KernelEvent(
        kind=KIND_XID,
        bus_id=pci_bus_id(m.group("bus")),
        raw=line.raw,
        message=rest,
        xid=xid,
        pid=pid,
        process=process,
        nvlink_unit=unit,
        fatal=fatal,
        link=link,
        recovery_action=action,
        log_time=line.log_time,
        clock=line.clock,
        seq=line.seq,
    )


class NvrmPatterns:
    """The NVIDIA kernel module's lines (see the module doc)."""

    vendor = "nvidia"
    cards_name = "NVIDIA GPU"

    def events(self, lines: Sequence[LogLine]) -> Iterator[KernelEvent | tuple[str, str]]:
        """Events, and ``(bus_id, uuid)`` pairs for the lines that name a GPU's UUID."""
        head_bus: str | None = None  # "The NVIDIA GPU <bus>" whose text goes on in later lines
        for line in lines:
            text = line.text
            if "NVRM" not in text:
                continue
            m = _XID_RE.search(text)
            if m:
                head_bus = None
                yield _parse_xid(m, line)
                continue
            im = _IDENTITY_RE.search(text)
            if im:
                yield (pci_bus_id(im.group("bus")) or "", im.group("uuid"))
                continue
            hm = _GPU_HEAD_RE.search(text)
            for regex, reason in _KERNEL_REASONS:
                if not regex.search(text):
                    continue
                bm = ANY_BUS_RE.search(text)
                bus = pci_bus_id(bm.group("bus")) if bm else head_bus
                yield KernelEvent(
                    kind=KIND_KERNEL,
                    bus_id=bus,
                    raw=line.raw,
                    message=text[text.find("NVRM") :],
                    reason=reason,
                    log_time=line.log_time,
                    clock=line.clock,
                    seq=line.seq,
                )
                hm = None
                break
            # syslog splits a multi-line message into lines of their own: remember the GPU
            # the message starts with, for a "fallen off the bus" line without a bus id.
            head_bus = pci_bus_id(hm.group("bus")) if hm else head_bus


#: the patterns the NVIDIA plugin declares
NVRM = NvrmPatterns()
