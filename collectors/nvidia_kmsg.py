"""What the NVIDIA kernel module prints in the kernel log: XIDs and the GPU failures
that print no Xid (``NVRM:`` lines). Part of the NVIDIA plugin
(``NvidiaCollector.vendor_info.kernel_log``); the kernel log itself (``/dev/kmsg``, the
line prefixes, bursts, the window) is read by :mod:`hetpatrol.kernel_log`, and judged by
:mod:`hetpatrol.checks.kernel_events`.

XID lines: ``NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, <text>``;
``pid='<unknown>'``/``name=<unknown>`` mean unknown; old drivers print neither; the
PCI domain may be non-zero (``PCI:0019:01:00``) or left out (``PCI:5f:00``: domain
0000); NVLink5 XIDs 144-150 carry a unit (``NETIR_LINK_EVT``; a name may hold ``/``),
``Fatal``/``Nonfatal``, ``XC0 i0 Link 13`` and up to six hex words, IntrInfo and Error
Status first: they are decoded as NVIDIA's catalog decodes them (:func:`nvlink5_decode`),
the printed word is not the verdict; XID 154 names the new recovery action. Failures
without an Xid: ``fallen off the bus``, ``NV_ERR_RESET_REQUIRED``, ``RmInitAdapter
failed`` / ``rm_init_adapter failed``.
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
#: a bus id without its PCI domain (``5f:00``): domain 0000
_SHORT_BUS = r"[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_XID_RE = re.compile(
    r"(?a)NVRM: Xid \((?:PCI:)?(?P<bus>"
    + BUS_PATTERN
    + "|"
    + _SHORT_BUS
    + r")[^)]*\):\s*(?P<xid>\d+)(?:,\s*(?P<rest>.*))?$"
)
_PID_RE = re.compile(r"(?a)^pid=(?:'?<unknown>'?|(?P<pid>\d+)),\s*")
_NAME_RE = re.compile(r"^name=(?P<name>[^,]*),\s*")
# ``<unit> [Fatal|Nonfatal] XC<n> i<n> Link <n> (<IntrInfo> <ErrorStatus> <debug>...)``;
# pre-R575 drivers print ``XC 1 i 2`` and may bracket the words (``[0x0000000a]``)
_NVLINK5_RE = re.compile(
    r"(?a)^(?P<unit>[A-Z][A-Za-z0-9_/]*)\s+(?:(?P<sev>Fatal|Non-?[Ff]atal)\s+)?"
    r"XC\s*(?P<xc>\d+)\s+i\s*(?P<inst>\d+)\s+Link\s+(?P<link>-?\d+)"
    r"(?:\s*[(\[](?P<words>(?:\s*0x[0-9a-fA-F]+)+)\s*[)\]])?"
)
_RECOVERY_RE = re.compile(r"to\s+0x(?P<code>[0-9a-fA-F]+)\s*\((?P<action>[^)]*)\)")
_IDENTITY_RE = re.compile(
    r"NVRM: GPU at PCI:(?P<bus>" + BUS_PATTERN + r"):\s*(?P<uuid>GPU-[0-9a-fA-F-]+)"
)
_GPU_HEAD_RE = re.compile(r"NVRM: The NVIDIA GPU (?P<bus>" + BUS_PATTERN + r")")
#: the start of a driver record that may say a kernel reason (``_KERNEL_REASONS``):
#: ``NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x62:NV_ERR_RESET_REQUIRED:1696)``,
#: ``NVRM: The NVIDIA GPU 0000:cb:00.0 ... fallen off the bus``, syslog's split
#: ``NVRM: fallen off the bus and is not responding to commands.``, and a bus-less
#: ``NVRM: RmInitAdapter failed! (...)`` (the bus then from the record before)
_REASON_HEAD_RE = re.compile(
    r"NVRM: (?:GPU (?:at PCI:)?"
    + BUS_PATTERN
    + r"|The NVIDIA GPU "
    + BUS_PATTERN
    + r"|fallen off the bus|(?i:rm_?init_?adapter failed))"
)

_KERNEL_REASONS = (
    (re.compile(r"fallen off the bus", re.I), REASON_FALLEN_OFF_BUS),
    (re.compile(r"NV_ERR_RESET_REQUIRED"), REASON_RESET_REQUIRED),
    (re.compile(r"rm_?init_?adapter failed", re.I), REASON_RM_INIT_FAILED),
)


# ------------------------------------------------------------- XID 144-150 decode
# NVIDIA, "Analyzing Xid Errors with the Xid Catalog"
# (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), sheet "XID
# 144-150 Decode" (read 2026-12-01). The unit is encoded in IntrInfo (the first hex word):
# V1 (drivers < R575) IntrInfo[9:5] with IntrInfo[4:0] = XID - 143, V2 (>= R575)
# IntrInfo[6:0]; the row is then picked by Error Status (the second word), for XID 149
# NETIR_LINK_EVT/NETIR_LINK_DOWN by the sub-code in IntrInfo[25:20]. The catalog's
# "Resolution Bucket (Immediate Action)" is the decode: RESET_GPU, XID_154_EVAL or
# IGNORE; rows marked "*" (RLW_RXPIPE 0x1/0x2/0x4) are RESET_GPU ("Action 2") when
# IntrInfo bit 10 (V1) / bit 7 (V2) is set. The printed Fatal/Nonfatal word does not
# decide: NETIR_LINK_EVT "Fatal" with sub-code 38 or 40 is IGNORE in the catalog.
NVLINK5_FIRST, NVLINK5_LAST = 144, 150
RESET_GPU, XID_154_EVAL, IGNORE = "RESET_GPU", "XID_154_EVAL", "IGNORE"
_R, _E, _I = RESET_GPU, XID_154_EVAL, IGNORE
_RANK = {IGNORE: 0, XID_154_EVAL: 1, RESET_GPU: 2}
_ANY = -1  # a row for every Error Status
#: (xid, unit names V1/V2, V1 unit code, V2 unit code, {error status: bucket}, the
#: statuses whose bucket is RESET_GPU when the promote bit is set)
_NVLINK5_ROWS: tuple[tuple[int, str, int, int, dict[int, str], frozenset[int]], ...] = (
    (144, "SAW_MVB", 1, 1, {0x1: _I, 0x2: _R, 0x4: _I, 0x8: _I, 0x10: _R, 0x20: _I}, frozenset()),
    (145, "RLW_CTRL", 3, 3, {0x80000000: _I}, frozenset()),
    (
        145,
        "RLW_REMAP",
        4,
        4,
        {0x1: _E, 0x2: _E, 0x4: _E, 0x8: _E, 0x10: _E, 0x20: _E, 0x40: _R, 0x80: _R}
        | {0x100: _I, 0x200: _I, 0x80000000: _I},
        frozenset(),
    ),
    (145, "RLW_RSPCOL", 5, 5, {0x1: _I, 0x2: _R, 0x80000000: _I}, frozenset()),
    (
        145,
        "RLW_RXPIPE",
        6,
        6,
        {0x1: _I, 0x2: _I, 0x4: _I, 0x8: _I, 0x80000000: _I},
        frozenset({0x1, 0x2, 0x4}),
    ),
    (
        145,
        "RLW_SRC_TRACK",
        7,
        7,
        {0x1: _R, 0x2: _I, 0x4: _E, 0x8: _E, 0x10: _R, 0x20: _R, 0x80000000: _I},
        frozenset(),
    ),
    (
        145,
        "RLW_TAGSTATE",
        8,
        8,
        {0x1: _I, 0x2: _R, 0x10000: _I, 0x20000: _R, 0x100000: _R, 0x80000000: _I},
        frozenset(),
    ),
    (146, "TLW_CTRL", 9, 9, {0x1: _I, 0x2: _I, 0x4: _R, 0x80000000: _I}, frozenset()),
    (146, "TLW_RX/TLW_RX_PIPE0", 10, 10, {0x1: _I, 0x2: _I, 0x4: _R, 0x80000000: _I}, frozenset()),
    (146, "TLW_RX/TLW_RX_PIPE1", 10, 11, {0x1: _I, 0x2: _I, 0x4: _R, 0x80000000: _I}, frozenset()),
    (146, "TLW_TX/TLW_TX_PIPE0", 11, 12, {0x1: _I, 0x2: _I, 0x4: _R, 0x80000000: _I}, frozenset()),
    (146, "TLW_TX/TLW_TX_PIPE1", 11, 13, {0x1: _I, 0x2: _I, 0x4: _R, 0x80000000: _I}, frozenset()),
    (147, "TREX", 12, 14, {0x1: _I, 0x80000000: _I}, frozenset()),
    (148, "NVLPW_CTRL/NVLPW", 0, 15, {0x80000000: _I}, frozenset()),
    (149, "NETIR/NETIR_INT", 0, 24, {_ANY: _R}, frozenset()),
    (149, "NETIR_BER_EVENT", 17, 19, {0x0: _I, 0x1: _I, 0x2: _I, 0x3: _I}, frozenset()),
    (149, "NETIR_MFDE_EVENT", 18, 20, {0x1: _R, 0x3: _I, 0x4: _R, 0x5: _R, 0x7: _R}, frozenset()),
)
#: NETIR_LINK_EVT/NETIR_LINK_DOWN (V1 unit 14, V2 17): sub-code IntrInfo[25:20] -> bucket
_LINK_EVT = ("NETIR_LINK_EVT/NETIR_LINK_DOWN", 14, 17)
_LINK_EVT_SUBCODES: dict[int, str] = {
    **dict.fromkeys((0, 1, 2, 4, 10, 15, 16, 17, 18, 21, 22), _R),
    **dict.fromkeys((32, 33, 34, 35, 36, 37, 42, 43), _R),
    38: _I,  # peer side down to ..., INVESTIGATE_SW/USER
    40: _I,  # INVESTIGATE_HOST
}
#: bitmask Error Status (XIDs 144-148: one row per bit) as opposed to a value (149)
_BITMASK_XIDS = frozenset(range(144, 149))


def nvlink5_decode(xid: int, intr: int | None, status: int | None) -> str | None:
    """The catalog's immediate action for one NVLink5 XID line: ``"RESET_GPU"``,
    ``"XID_154_EVAL"`` or ``"IGNORE"``; None when the line cannot be decoded (no IntrInfo,
    a unit, status or sub-code the catalog does not list): the judge then goes by the
    printed word. ``intr``/``status``: the first two hex words. The printed unit name is
    not used: IntrInfo names the unit (no code of the sheet fits both layouts)."""
    if xid == 150:
        return RESET_GPU  # MSE Degraded / MSE_WATCHDOG: every row RESET_GPU, Fatal
    if intr is None:
        return None
    rows = [r for r in _NVLINK5_ROWS if r[0] == xid]
    if xid == 149:
        rows.append((149, _LINK_EVT[0], _LINK_EVT[1], _LINK_EVT[2], {}, frozenset()))
    v1 = [r for r in rows if intr & 0x1F == xid - 143 and (intr >> 5) & 0x1F == r[2]]
    v2 = [r for r in rows if intr & 0x7F == r[3]]
    if v1 and v2:  # fits both layouts: never with the sheet's codes
        return None
    version, found = ("V1", v1) if v1 else ("V2", v2)
    if not found:
        return None
    promote = bool(intr >> (10 if version == "V1" else 7) & 1)
    buckets = set()
    for _xid, names, _c1, _c2, by_status, promoted in found:
        if names == _LINK_EVT[0]:
            bucket = _LINK_EVT_SUBCODES.get((intr >> 20) & 0x3F)
        elif _ANY in by_status:
            bucket = by_status[_ANY]
        elif status is None:
            bucket = None
        elif status in by_status:
            bucket = RESET_GPU if promote and status in promoted else by_status[status]
        elif xid in _BITMASK_XIDS and status:
            bits = [1 << i for i in range(32) if status >> i & 1]
            if not all(b in by_status for b in bits):
                return None
            bucket = max(
                (RESET_GPU if promote and b in promoted else by_status[b] for b in bits),
                key=_RANK.__getitem__,
            )
        else:
            bucket = None
        if bucket is None:
            return None
        buckets.add(bucket)
    return max(buckets, key=_RANK.__getitem__)


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
    intr = status = None
    bucket = None
    lm = _NVLINK5_RE.match(rest)
    if lm:
        unit = lm.group("unit")
        fatal = None if lm.group("sev") is None else lm.group("sev").lower() == "fatal"
        link = int(lm.group("link"))
        words = [int(w, 16) for w in (lm.group("words") or "").split()]
        intr = words[0] if words else None
        status = words[1] if len(words) > 1 else None
    if NVLINK5_FIRST <= xid <= NVLINK5_LAST:
        bucket = nvlink5_decode(xid, intr, status)
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
        intr_info=intr,
        error_status=status,
        nvlink_action=bucket,
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
            # Only the driver's own records, matched from their first character (every
            # recorded one starts so, prefixes taken off): the kernel prints text a user
            # chose inside others, unescaped: fs/exec.c "process '%pD4' started with
            # executable stack" (the program's last four path components), and
            # arch/x86/mm/fault.c "%s[%d]: segfault at ..." + mm/memory.c
            # print_vma_addr() " in <file name>[...]" (the process's comm, 15
            # characters a user sets, first; the name of the file it faulted in last).
            # A directory or library named "NVRM: Xid (PCI:...): 79, ..." there is no
            # XID, and a comm "NVRM" is no driver record: each pattern must match where
            # the record starts, its head longer than a comm can forge.
            if not text.startswith("NVRM: "):
                continue
            m = _XID_RE.match(text)
            if m:
                head_bus = None
                yield _parse_xid(m, line)
                continue
            im = _IDENTITY_RE.match(text)
            if im:
                yield (pci_bus_id(im.group("bus")) or "", im.group("uuid"))
                continue
            hm = _GPU_HEAD_RE.match(text)
            if not _REASON_HEAD_RE.match(text):
                # a kernel reason is said only in the driver's GPU record ("NVRM: GPU
                # <bus>: ...", "NVRM: The NVIDIA GPU <bus> ...") or its syslog-split
                # continuation ("NVRM: fallen off the bus and is not responding ...")
                continue
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
