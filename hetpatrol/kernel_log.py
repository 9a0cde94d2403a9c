"""The kernel log as a source: the card failures a vendor's driver prints there.

Reading only (the collector side of the data flow): this module takes the prefixes off
kernel log records, reads them from ``/dev/kmsg`` (or a recorded log when replaying),
folds bursts and keeps the window counts. What a line *means* is the vendor's word: each
plugin that has kernel-log lines declares a :class:`KernelLogPatterns`
(``VendorInfo.kernel_log``; NVIDIA's ``NVRM:`` XIDs are in
``hetpatrol.collectors.nvidia_kmsg``). It never judges: the severity of an event is
decided by :mod:`hetpatrol.checks.kernel_events`.

Line shapes understood (each seen in a published recording, see the tests):

- ``/dev/kmsg`` records: ``6,1234,5678901,-;NVRM: Xid (...)`` (priority, sequence,
  microseconds since boot, flags; ``\\x0a`` escapes a newline inside a record; the
  `` KEY=value`` dictionary lines after a record are ignored);
- ``dmesg``: ``[ 1843.308145] NVRM: ...``; ``dmesg -T``/``--ctime``: ``[Sun Feb 23
  16:24:18 2025] NVRM: ...``; ``dmesg --time-format iso``; ``dmesg -r``: ``<4>[...]``;
- syslog / journal: ``Dec  2 11:38:27 host kernel: [  199.234935] NVRM: ...`` (also
  with an RFC 3339 time), or a bare ``kernel:`` prefix; ``journalctl -o
  short-monotonic``: ``[ 4274.052063] host kernel: ...``;
- Talos: ``kern: warning: [2024-05-01T12:34:56.789Z]: NVRM: ...``;
- a bare ``NVRM: Xid (...)`` line (``grep Xid`` output);
- a message printed over several lines (``The NVIDIA GPU 0000:b3:00.0`` / ``(PCI ID:
  ...)`` / ``fallen off the bus``): dmesg indents the continuation lines; they are
  joined to the line they continue.
"""

from __future__ import annotations

import calendar
import errno
import hashlib
import os
import re
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Protocol

from hetpatrol.schema import normalize_bus_id

__all__ = [
    "KMSG_PATH",
    "kmsg_denied_why",
    "REPLAY_FILE",
    "KernelEvent",
    "KernelLog",
    "KernelLogSnapshot",
    "KernelOccurrence",
    "KmsgReader",
    "open_kernel_log",
    "TextLogReader",
    "parse_lines",
    "parse_text",
    "stamp_time",
]

KMSG_PATH = "/dev/kmsg"
#: The kernel log of a replay directory (any of the line shapes above).
REPLAY_FILE = "kmsg.txt"
#: Most bytes one patrol reads from a kernel log text file.
TEXT_READ_MAX = 8 * 1024 * 1024

#: One ``read()`` of ``/dev/kmsg`` returns one record; a smaller buffer than the record
#: fails with EINVAL. Records are at most about 1 KiB of text plus the dictionary.
KMSG_READ_SIZE = 8192
#: At most this many records are taken per poll (a storm must not stall a patrol).
MAX_RECORDS_PER_POLL = 20000
#: (major, minor) of the kernel log character device ``/dev/kmsg`` on Linux: no other
#: device is read as one (``/dev/urandom`` would never run dry).
KMSG_DEVICE = (1, 11)
#: Episodes kept per (bus, XID or reason) for the window.
MAX_OCCURRENCES_PER_KEY = 64
#: Distinct (bus, XID or reason) keys kept (window episodes, totals, bus -> UUID): a node
#: has at most a few dozen GPUs and a dozen XIDs or reasons in one window. A log naming
#: 10,000 bus ids (a flood, a forged log) held 60,000 keys and 280 MB that were never
#: given back; past the bound a new key's records are counted in ``untracked``, not kept.
MAX_KEYS = 1024
#: Characters of one logical record (text and raw) kept: printk records are at most
#: about 1 KiB; continuation lines past this are dropped.
MAX_RECORD_CHARS = 4096
#: Distinct records a text log reader counts the repeats of (:attr:`KernelEvent.record`):
#: past this the oldest counted is forgotten (a repeat of it is then numbered 0 again).
MAX_EQUAL_RECORDS = 4096

# Who may open /dev/kmsg for reading. The node is root:root 0644, but devkmsg_open()
# also calls check_syslog_permissions(SYSLOG_ACTION_READ_ALL): while the sysctl
# kernel.dmesg_restrict is 1 (CONFIG_SECURITY_DMESG_RESTRICT, e.g. Debian's and Ubuntu's
# kernels) the opener needs CAP_SYSLOG, else EPERM; group membership (adm,
# systemd-journal) does not count. torvalds/linux kernel/printk/printk.c
# (devkmsg_open, check_syslog_permissions; "kmsg: honor dmesg_restrict sysctl on
# /dev/kmsg", Linux 3.11) and Documentation/admin-guide/sysctl/kernel.rst (dmesg_restrict).
#: The sysctl that makes reading the kernel log need CAP_SYSLOG (``1``) or not (``0``).
DMESG_RESTRICT_PATH = "/proc/sys/kernel/dmesg_restrict"
#: Bit of CAP_SYSLOG in the ``CapEff`` mask of ``/proc/<pid>/status``
#: (include/uapi/linux/capability.h).
CAP_SYSLOG_BIT = 34
#: systemd hides a path (ProtectKernelLogs=yes does so to /dev/kmsg and /proc/kmsg,
#: InaccessiblePaths= to any) by mounting its "inaccessible" node of the same type over
#: it: for a character device that is one with device number 0:0 and mode 0000
#: (systemd src/core/namespace.c protect_kernel_logs_dev_table, MOUNT_INACCESSIBLE;
#: src/shared/dev-setup.c make_inaccessible_nodes).
INACCESSIBLE_DEVICE = (0, 0)

KIND_XID = "xid"
KIND_KERNEL = "kernel"

REASON_FALLEN_OFF_BUS = "fallen_off_bus"
REASON_RESET_REQUIRED = "reset_required"
REASON_RM_INIT_FAILED = "rm_init_adapter_failed"

# ------------------------------------------------------------------------------ parsing
# "(?a)": \d is an ASCII digit only (not "٧٩", which int() would read as 79).

BUS_PATTERN = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
ANY_BUS_RE = re.compile(r"(?:PCI:)?(?<![0-9a-fA-F:])(?P<bus>" + BUS_PATTERN + r")(?![0-9a-fA-F])")


# Prefixes, tried in this order; each may appear once.
_KMSG_RE = re.compile(r"(?a)^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;")
_PRIO_RE = re.compile(r"(?a)^<\d{1,3}>")
_TALOS_RE = re.compile(
    r"(?a)^(?P<fac>[a-z]+):\s*(?P<lvl>[a-z]+):\s*\[(?P<ts>\d{4}-\d\d-\d\dT[^\]]+)\]:\s?"
)
_SYSLOG_BSD_RE = re.compile(
    r"(?a)^(?P<ts>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)\s+\S+\s+kernel(?:\[\d+\])?:\s?"
)
_SYSLOG_ISO_RE = re.compile(r"(?a)^(?P<ts>\d{4}-\d\d-\d\dT\S+)\s+\S+\s+kernel(?:\[\d+\])?:\s?")
_KERNEL_TAG_RE = re.compile(r"^kernel:\s?")
#: after the kernel's own stamp: ``journalctl -o short-monotonic``'s host and tag (the
#: kernel's records carry no ``[pid]``: a user's ``logger -t kernel`` line does)
_HOST_KERNEL_RE = re.compile(r"(?a)^\S+\s+kernel:\s?")
_DMESG_SECS_RE = re.compile(r"(?a)^\[\s*(?P<secs>\d+\.\d+)\]\s?")
_DMESG_CTIME_RE = re.compile(
    r"(?a)^\[(?P<ts>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]\s?"
)
_DMESG_ISO_RE = re.compile(r"(?a)^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[,.]\d+[+-]\d\d:?\d\d)\s")
_DICT_LINE_RE = re.compile(r"^\s+[A-Z_]+=")


@dataclass(frozen=True)
class KernelEvent:
    """One kernel log record about a GPU, as read (not judged).

    - ``kind``: ``"xid"`` (an ``NVRM: Xid`` line, ``xid`` set) or ``"kernel"`` (a failure
      that prints no Xid, ``reason`` set: ``fallen_off_bus``, ``reset_required``,
      ``rm_init_adapter_failed``);
    - ``bus_id``: normalised ``0000:9b:00.0`` (the Xid line omits the function: ``.0``);
    - ``message``: the text after the XID number and the ``pid=``/``name=`` fields;
    - ``pid``/``process``: from ``pid=``/``name=`` (``None`` when ``<unknown>`` or absent);
    - ``nvlink_unit``/``fatal``/``link``: NVLink5 XIDs 144-150 (``NETIR``, True, 13;
      ``fatal`` is the printed word, None when the line prints none); ``intr_info`` /
      ``error_status``: its first two hex words; ``nvlink_action``: what NVIDIA's XID
      catalog decodes from them (``RESET_GPU``, ``XID_154_EVAL``, ``IGNORE``; None when
      it cannot be decoded), the vendor plugin's decode;
    - ``recovery_action``: XID 154's new action (``None``, ``GPU Reset Required``...);
    - ``log_time``: the time stamp as the line wrote it; ``clock``: that stamp as
      (``"boot"`` seconds since boot | ``"wall"`` seconds, value), for burst folding;
    - ``seq``: the ``/dev/kmsg`` sequence number; ``raw``: the line(s) as read;
    - ``record``: a text log's own name for the record, where it has no ``seq``
      (:meth:`TextLogReader.read`): ``<device>.<inode>:<sha256 of raw, 16 hex>:<n>``,
      ``n`` its place among the equal records (same raw line(s), same fault) of the file
      before it, 0 the first; the same for a record read again, by this reader or a
      restarted daemon's, as long as the file is the same;
    - ``vendor``: whose driver printed it (the plugin whose patterns matched).
    """

    kind: str
    bus_id: str | None
    raw: str
    message: str = ""
    xid: int | None = None
    reason: str | None = None
    pid: int | None = None
    process: str | None = None
    uuid: str | None = None
    nvlink_unit: str | None = None
    fatal: bool | None = None
    link: int | None = None
    intr_info: int | None = None
    error_status: int | None = None
    nvlink_action: str | None = None
    recovery_action: str | None = None
    log_time: str | None = None
    clock: tuple[str, float] | None = None
    seq: int | None = None
    vendor: str | None = None
    record: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """What repeats of the same fault share: (bus id, kind, XID number or reason)."""
        what = str(self.xid) if self.kind == KIND_XID else (self.reason or "")
        return (self.bus_id or "", self.kind, what)


@dataclass
class LogLine:
    """One logical record after its prefixes were taken off."""

    text: str
    raw: str
    log_time: str | None = None
    clock: tuple[str, float] | None = None
    seq: int | None = None
    kmsg: bool = False
    usec: int | None = None


def pci_bus_id(text: str) -> str | None:
    """Normalised bus id; the Xid line omits the PCI function, which is 0 for a GPU."""
    return normalize_bus_id(text if "." in text else text + ".0")


def _wall(text: str, fmt: str) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(text, fmt)))
    except ValueError:
        return None


def _iso(text: str) -> float | None:
    value = text.strip().replace(",", ".")
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    # Python < 3.11 accepts at most 6 fractional digits; Talos prints 9.
    value = re.sub(r"(?a)(\.\d{6})\d+", r"\1", value)
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


#: an ISO 8601 / RFC 3339 stamp that names its offset from UTC (``Z``, ``+01:00``,
#: ``+0100``): journalctl ``-o short-iso`` / ``short-iso-precise``, rsyslog's
#: ``RSYSLOG_FileFormat`` (RFC 3339, high precision), Talos. A stamp without one is local
#: time of an unknown zone, and BSD syslog's ``Dec  2 11:38:27`` has no year: neither
#: tells when a record was written.
_ZONED_ISO_RE = re.compile(r"(?a)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)$")


def stamp_time(log_time: str | None) -> float | None:
    """Seconds since the epoch that a record's own stamp (:attr:`KernelEvent.log_time`)
    tells reliably: an ISO 8601 stamp with its UTC offset; None for any other stamp
    (``dmesg`` seconds since boot, a syslog line without a year, ``dmesg -T``'s local
    ctime, a stamp without a zone) or none."""
    if not log_time or not _ZONED_ISO_RE.match(log_time.strip()):
        return None
    return _iso(log_time)


def _strip_prefixes(line: str) -> LogLine | None:
    """Take the known prefixes off ``line``; None when it is a continuation line."""
    raw = line.rstrip("\r\n")
    text = raw
    out = LogLine(text="", raw=raw)
    m = _KMSG_RE.match(text)
    if m:
        out.kmsg = True
        out.seq = int(m.group("seq"))
        out.usec = int(m.group("usec"))
        out.clock = ("boot", out.usec / 1e6)
        out.log_time = f"{out.usec / 1e6:.6f}"
        text = text[m.end() :].replace("\\x0a", "\n")
    else:
        m = _PRIO_RE.match(text)
        if m:
            text = text[m.end() :]
        for regex, kind in (
            (_TALOS_RE, "iso"),
            (_SYSLOG_BSD_RE, "bsd"),
            (_SYSLOG_ISO_RE, "iso"),
            (_KERNEL_TAG_RE, None),
        ):
            m = regex.match(text)
            if not m:
                continue
            if kind is not None:
                stamp = m.group("ts")
                out.log_time = stamp
                seconds = (
                    _iso(stamp) if kind == "iso" else _wall(f"1970 {stamp}", "%Y %b %d %H:%M:%S")
                )
                if seconds is not None:
                    out.clock = ("wall", seconds)
            text = text[m.end() :]
            break
        m = _DMESG_SECS_RE.match(text)
        if m:
            out.log_time = m.group("secs")
            out.clock = ("boot", float(m.group("secs")))
            text = text[m.end() :]
            tag = _HOST_KERNEL_RE.match(text)  # short-monotonic: "[secs] host kernel: "
            if tag:
                text = text[tag.end() :]
        else:
            for regex, kind in ((_DMESG_CTIME_RE, "ctime"), (_DMESG_ISO_RE, "iso")):
                m = regex.match(text)
                if m:
                    stamp = m.group("ts")
                    out.log_time = stamp
                    seconds = (
                        _wall(stamp, "%a %b %d %H:%M:%S %Y") if kind == "ctime" else _iso(stamp)
                    )
                    if seconds is not None:
                        out.clock = ("wall", seconds)
                    text = text[m.end() :]
                    break
        if len(text) == len(raw) and raw[:1] in (" ", "\t"):
            return None  # dmesg's indented continuation of the previous message
    out.text = " ".join(part.strip() for part in text.split("\n") if part.strip())
    return out


def _logical_lines(lines: Iterable[str]) -> Iterator[LogLine]:
    """Prefix-stripped records, continuation lines joined to the record they continue."""
    current: LogLine | None = None
    for line in lines:
        if not line.strip():
            continue
        parsed = _strip_prefixes(line)
        if parsed is None:
            if current is None:
                parsed = LogLine(text=line.strip(), raw=line.rstrip("\r\n"))
            else:
                if current.kmsg and _DICT_LINE_RE.match(line):
                    continue  # /dev/kmsg dictionary: SUBSYSTEM=pci, DEVICE=+pci:...
                if len(current.raw) < MAX_RECORD_CHARS:  # a flood of continuations: dropped
                    current.text = f"{current.text} {line.strip()}"[:MAX_RECORD_CHARS]
                    current.raw = f"{current.raw}\n{line.rstrip(chr(13) + chr(10))}"[
                        :MAX_RECORD_CHARS
                    ]
                continue
        if current is not None:
            yield current
        current = parsed
    if current is not None:
        yield current


class KernelLogPatterns(Protocol):
    """What a vendor's plugin declares to have its kernel-log lines read
    (``VendorInfo.kernel_log``): the vendor name its events carry, and ``events()``:
    from the logical lines of a read, in order, each :class:`KernelEvent` it recognises
    and a ``(bus_id, uuid)`` pair for each line that names a card's UUID."""

    #: the ``vendor`` of the events (and of the cards they are matched to)
    vendor: str
    #: what its cards are called in a message: ``"NVIDIA GPU"``
    cards_name: str

    def events(self, lines: Sequence[LogLine]) -> Iterator[KernelEvent | tuple[str, str]]: ...


def registered_patterns() -> tuple[KernelLogPatterns, ...]:
    """The kernel-log patterns every registered collector plugin declares (loaded through
    the ``hetpatrol.collectors`` entry points; a plugin that fails to load adds none)."""
    from importlib.metadata import entry_points

    found = []
    for ep in sorted(entry_points(group="hetpatrol.collectors"), key=lambda e: e.name):
        try:
            info = getattr(ep.load(), "vendor_info", None)
        except Exception:  # noqa: BLE001 - a broken plugin is reported where configured
            continue
        patterns = getattr(info, "kernel_log", None)
        if patterns is not None:
            found.append(patterns)
    return tuple(found)


def _events(
    lines: Iterable[LogLine], patterns: Sequence[KernelLogPatterns] | None
) -> Iterator[KernelEvent | tuple[str, str]]:
    """Every vendor's events in ``lines`` (one vendor after the other)."""
    if patterns is None:
        patterns = registered_patterns()
    logical = list(lines)
    for vendor in patterns:
        for item in vendor.events(logical):
            if isinstance(item, KernelEvent) and item.vendor is None:
                item = replace(item, vendor=vendor.vendor)
            yield item


def parse_lines(
    lines: Iterable[str], patterns: Sequence[KernelLogPatterns] | None = None
) -> list[KernelEvent]:
    """Every GPU event in ``lines`` (any of the shapes in the module doc), in order.

    Events after a line naming a GPU's UUID carry that UUID.
    """
    uuids: dict[str, str] = {}
    out: list[KernelEvent] = []
    for item in _events(_logical_lines(lines), patterns):
        if isinstance(item, tuple):
            uuids[item[0]] = item[1]
            continue
        if item.bus_id in uuids and item.uuid is None:
            item = replace(item, uuid=uuids[item.bus_id])
        out.append(item)
    return out


def parse_text(text: str, patterns: Sequence[KernelLogPatterns] | None = None) -> list[KernelEvent]:
    """:func:`parse_lines` over a whole log text."""
    return parse_lines(text.splitlines(), patterns)


# ------------------------------------------------------------------------------ readers


def _named_events(
    lines: Iterable[str],
    uuids: dict[str, str],
    result: ReadResult,
    patterns: Sequence[KernelLogPatterns],
) -> Iterator[KernelEvent]:
    """The events of ``lines``, each with its GPU's UUID when a ``GPU UUID`` line (of this
    read or an earlier one: ``uuids``, updated) named the bus id; new names go into
    ``result.uuids`` too."""
    for item in _events(_logical_lines(lines), patterns):
        if isinstance(item, tuple):
            uuids[item[0]] = item[1]
            result.uuids[item[0]] = item[1]
            continue
        if item.bus_id in uuids and item.uuid is None:
            item = replace(item, uuid=uuids[item.bus_id])
        yield item


def _dmesg_restrict(path: str) -> int | None:
    """``kernel.dmesg_restrict`` (0 or 1); None when it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _has_cap_syslog(status_path: str) -> bool | None:
    """Whether CAP_SYSLOG is in this process's effective set; None when unknown."""
    try:
        with open(status_path, encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYSLOG_BIT & 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


#: Where this process's capability masks are read (``CapEff``).
PROC_STATUS_PATH = "/proc/self/status"


def kmsg_denied_why(
    err: int,
    *,
    dmesg_restrict_path: str | None = None,
    status_path: str | None = None,
) -> str:
    """Why opening ``/dev/kmsg`` failed with ``err`` (EPERM or EACCES), in words an
    operator can act on: the missing CAP_SYSLOG while ``kernel.dmesg_restrict=1`` (read
    from ``dmesg_restrict_path`` and the ``CapEff`` mask of ``status_path``), else the
    device cgroup (systemd's ``DevicePolicy=`` without ``DeviceAllow=/dev/kmsg r``) or a
    security module (EPERM), else the file mode (EACCES)."""
    restrict = _dmesg_restrict(dmesg_restrict_path or DMESG_RESTRICT_PATH)
    if restrict == 1 and _has_cap_syslog(status_path or PROC_STATUS_PATH) is False:
        return (
            "kernel.dmesg_restrict=1 and this process lacks CAP_SYSLOG; "
            "the shipped unit grants it with AmbientCapabilities=CAP_SYSLOG"
        )
    if err == errno.EPERM:
        return (
            "the device cgroup or a security module refuses it; "
            "the shipped unit allows it with DeviceAllow=/dev/kmsg r"
        )
    return "its file mode refuses this user"


@dataclass
class ReadResult:
    """What one read of a kernel log gave.

    ``events`` pairs each event with the wall time it happened when the reader can
    tell (``/dev/kmsg``: boot time + the record's microseconds), else ``None`` (the time
    of this read is used). ``state`` is ``ok``, ``absent`` (no log here, or no right to
    read it: said once, never an error per patrol) or ``failed``.

    ``boot_clock``: the events' ``("boot", seconds)`` stamps are this boot's monotonic
    clock (``/dev/kmsg`` records: the kernel's ``local_clock()`` microseconds), so the
    window can be timed on them whatever the wall clock does; False for a recorded log
    (its ``[secs]`` stamps are another boot's).

    ``earlier``: every record of this read was in the log before the reader first
    looked (a text log's content at its first read): how long before, and so whose job
    it was, is not known, unless a record's own zoned stamp tells (:func:`stamp_time`,
    :meth:`KernelLog.poll`).
    """

    events: list[tuple[KernelEvent, float | None]] = field(default_factory=list)
    uuids: dict[str, str] = field(default_factory=dict)
    state: str = "ok"
    error: str | None = None
    lost: int = 0
    boot_clock: bool = False
    earlier: bool = False


class KmsgReader:
    """Reads ``/dev/kmsg`` without blocking: the ring buffer at the first read, then only
    the records written since. One ``read()`` per record, with an 8 KiB buffer."""

    def __init__(
        self,
        path: str | os.PathLike[str] = KMSG_PATH,
        patterns: Sequence[KernelLogPatterns] | None = None,
    ):
        self.path = str(path)
        #: the vendors' line patterns (None: every registered plugin's)
        self.patterns = registered_patterns() if patterns is None else tuple(patterns)
        self._fd: int | None = None
        self._last_seq = -1
        self._error: str | None = None
        self._uuids: dict[str, str] = {}
        self._head_bus: str | None = None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _not_kmsg(self, st: os.stat_result) -> str | None:
        """Why ``st`` is not the kernel log device; None when it is."""
        rdev = (os.major(st.st_rdev), os.minor(st.st_rdev))
        if stat.S_ISCHR(st.st_mode) and rdev == KMSG_DEVICE:
            return None
        if stat.S_ISCHR(st.st_mode) and rdev == INACCESSIBLE_DEVICE:
            return (
                f"{self.path} is systemd's inaccessible placeholder (character device "
                f"{rdev[0]}:{rdev[1]}), not the kernel log: the unit hides it "
                "(ProtectKernelLogs=yes or InaccessiblePaths=)"
            )
        return (
            f"{self.path} is not the kernel log device (character device "
            f"{KMSG_DEVICE[0]}:{KMSG_DEVICE[1]}, /dev/kmsg): not read"
        )

    def read(self) -> ReadResult:
        if self._fd is None:
            try:  # never open another device: opening one may act (a tape rewinds)
                why = self._not_kmsg(os.stat(self.path))
            except OSError:
                why = None  # the open below says why
            if why is not None:
                return ReadResult(state="failed", error=why)
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                self._error = f"cannot read {self.path}: {exc.strerror or exc}"
                if exc.errno in (errno.EACCES, errno.EPERM):
                    self._error += f" ({kmsg_denied_why(exc.errno)})"
                return ReadResult(state="absent", error=self._error)
            why = self._not_kmsg(os.fstat(self._fd))  # replaced since the stat above
            if why is not None:
                self.close()
                return ReadResult(state="failed", error=why)
        result = ReadResult(boot_clock=True)
        raw_records: list[str] = []
        for _ in range(MAX_RECORDS_PER_POLL):
            try:
                data = os.read(self._fd, KMSG_READ_SIZE)
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them
                    result.lost += 1
                    continue
                result.state, result.error = "failed", f"read {self.path}: {exc.strerror}"
                self.close()
                break
            if not data:
                break
            raw_records.append(data.decode("utf-8", errors="replace"))
        now_wall = time.time()
        now_boot = time.clock_gettime(time.CLOCK_MONOTONIC)
        lines = []
        for record in raw_records:
            first = record.split("\n", 1)[0]  # the rest is the KEY=value dictionary
            m = _KMSG_RE.match(first)
            if m and int(m.group("seq")) <= self._last_seq:
                continue
            if m:
                self._last_seq = int(m.group("seq"))
            lines.append(first)
        for item in _named_events(lines, self._uuids, result, self.patterns):
            when = None
            if item.clock is not None and item.clock[0] == "boot":
                when = now_wall - (now_boot - item.clock[1])
            result.events.append((item, when))
        return result


class TextLogReader:
    """A recorded kernel log (``kmsg.txt`` of a replay directory), any line shape.

    The file is followed like ``tail -F``: the first read takes it whole, later reads
    only what was appended (a test appends lines to make new events). A missing file is
    a node without a recorded kernel log (``absent``).

    One read takes at most :data:`TEXT_READ_MAX` bytes, so a huge file never sits in
    memory whole: a first read of a larger file starts at its last ``TEXT_READ_MAX``
    bytes (as ``tail`` does; the skipped bytes are said in ``error``), and a burst
    appended between two patrols is read over the next patrols.

    A text log has no sequence number: each record without one gets
    :attr:`KernelEvent.record`, its identity in the file (the file's device and inode,
    the record's raw line(s), which hold its own time stamp where the format writes
    one, and its place among the equal records before it). A daemon restarted on the
    same file reads each record again under the same name, so a record already kept
    is known (:func:`hetpatrol.actions.fault_events.record_key`), while two real faults
    with the same text are two names (0 and 1). The count starts again when the file
    does (replaced by another inode, as logrotate's ``create`` does, or truncated, as
    ``copytruncate`` does: then read from its start) and at a first read that skips the start
    of a file larger than :data:`TEXT_READ_MAX` (a restart on such a file may name a
    repeated record otherwise than the reader before it did).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        patterns: Sequence[KernelLogPatterns] | None = None,
    ):
        self.path = Path(path)
        #: the vendors' line patterns (None: every registered plugin's)
        self.patterns = registered_patterns() if patterns is None else tuple(patterns)
        self._offset = 0
        self._partial = ""
        self._uuids: dict[str, str] = {}
        #: no read tried yet: what the first finds was written before the reader looked
        self._first = True
        #: (sha256 of raw, fault key) -> records of it read in this file so far
        self._equal: dict[tuple[bytes, tuple[str, str, str]], int] = {}
        #: ``<device>.<inode>`` of the file read last
        self._file_id: str | None = None

    def _name(self, item: KernelEvent, file_id: str) -> KernelEvent:
        """``item`` with :attr:`KernelEvent.record` (a record without ``seq``)."""
        if item.seq is not None:
            return item
        digest = hashlib.sha256(item.raw.encode("utf-8", "surrogateescape")).digest()[:8]
        key = (digest, item.key)
        n = self._equal.pop(key, 0)
        if len(self._equal) >= MAX_EQUAL_RECORDS:  # the oldest counted is forgotten
            del self._equal[next(iter(self._equal))]
        self._equal[key] = n + 1
        return replace(item, record=f"{file_id}:{digest.hex()}:{n}")

    def close(self) -> None:
        pass

    def read(self) -> ReadResult:
        first, self._first = self._first, False
        skipped = 0
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return ReadResult(state="failed", error=f"{self.path} is not a regular file")
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                size = st.st_size
                file_id = f"{st.st_dev:x}.{st.st_ino:x}"
                # replaced (another inode: logrotate's create, a rename) or truncated
                # (copytruncate): a new file, read from its start
                if size < self._offset or file_id != (self._file_id or file_id):
                    self._offset, self._partial = 0, ""
                    self._equal.clear()
                self._file_id = file_id
                if self._offset == 0 and size > TEXT_READ_MAX:
                    skipped = size - TEXT_READ_MAX
                    self._offset = skipped
                f.seek(self._offset)
                data = f.read(TEXT_READ_MAX)
        except FileNotFoundError:
            return ReadResult(state="absent", error=f"no recorded kernel log {self.path}")
        except OSError as exc:
            return ReadResult(state="failed", error=f"cannot read {self.path}: {exc.strerror}")
        self._offset += len(data)
        text = self._partial + data.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for its newline
        if len(self._partial) > TEXT_READ_MAX:  # no newline in sight: not a log line
            self._partial = ""
        result = ReadResult(earlier=first)
        if skipped:
            del lines[:1]  # the line the skip cut in two
            result.error = (
                f"{self.path} is {size} bytes: read from its last {TEXT_READ_MAX} "
                f"({skipped} bytes at its start skipped)"
            )
        for item in _named_events(lines, self._uuids, result, self.patterns):
            result.events.append((self._name(item, file_id), None))
        return result


# ------------------------------------------------------------------------ the source


@dataclass(frozen=True)
class KernelOccurrence:
    """One episode of a fault: the first event and the repeats folded into it.

    ``first_ts``/``last_ts`` are wall times (for the event lines, as the wall clock
    said when the record was read); ``count`` counts the records folded in (1 for a
    single line). ``id`` numbers episodes in the order they were first read.
    ``earlier``: its first record was in a text log before the reader's first read, its
    time not told (:attr:`ReadResult.earlier`; never for a replay's recording, which
    stands for the present, nor for a record whose zoned stamp is after this boot's
    start, :attr:`KernelLog.boot_time`). It makes no card finding above info
    (:func:`hetpatrol.checks.kernel_events.apply_kernel_log`).
    """

    id: int
    event: KernelEvent
    first_ts: float
    last_ts: float
    count: int
    earlier: bool = False


@dataclass(frozen=True)
class KernelLogSnapshot:
    """The kernel log as one patrol sees it.

    - ``new``: episodes first read in this patrol (one event line each);
    - ``window``: episodes whose last record is within ``window_seconds`` of now
      (these make card findings);
    - ``window_counts``: records per (bus, kind, XID or reason) in the window;
    - ``totals``: records per (bus, kind, XID or reason) since the source started;
    - ``uuids``: bus id -> UUID as the log named them.
    """

    state: str
    error: str | None
    source: str
    window_seconds: float
    new: tuple[KernelOccurrence, ...] = ()
    window: tuple[KernelOccurrence, ...] = ()
    window_counts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    totals: dict[tuple[str, str, str], int] = field(default_factory=dict)
    uuids: dict[str, str] = field(default_factory=dict)
    lost: int = 0
    #: vendor -> what its cards are called, for every vendor whose lines are read
    vendors: dict[str, str] = field(default_factory=dict)
    #: records of keys past :data:`MAX_KEYS`, counted and not kept
    untracked: int = 0


@dataclass
class _Episode:
    id: int
    event: KernelEvent
    first_ts: float
    last_ts: float
    count: int
    last_clock: tuple[str, float] | None
    #: the monotonic time of the last record: what the window is timed on
    last_mono: float = 0.0
    earlier: bool = False

    def frozen(self) -> KernelOccurrence:
        return KernelOccurrence(
            self.id, self.event, self.first_ts, self.last_ts, self.count, self.earlier
        )


class KernelLog:
    """Reads a kernel log each patrol, folds bursts, keeps window counts.

    Repeats of one fault (same bus, same XID or reason) whose time stamps lie within
    ``burst_seconds`` of the episode's last record are folded into that episode: they
    count, but make no new event. Records read together without a time stamp of their
    own fold the same way.

    ``replay``: the source is the ``kmsg.txt`` of a replay directory (a recording, not
    this host's kernel log: a recording without one is no fault of the node).

    Time: ``clock`` is the wall clock (seconds since the epoch, for the event lines'
    ``ts``); ``monotonic`` times the window and the folding (default
    ``time.monotonic`` when ``clock`` is the wall clock, else ``clock`` itself). A step
    of the wall clock (NTP, an operator's ``date -s``) neither ages a fault out of the
    window (+2 h) nor brings one back into it (-3 h). A ``/dev/kmsg`` record is timed
    by its own stamp (the kernel's monotonic microseconds since boot).
    """

    def __init__(
        self,
        reader: KmsgReader | TextLogReader,
        *,
        window_seconds: float = 3600.0,
        burst_seconds: float = 5.0,
        clock=time.time,
        monotonic=None,
        replay: bool = False,
    ):
        self.reader = reader
        self.replay = replay
        self.window_seconds = float(window_seconds)
        self.burst_seconds = float(burst_seconds)
        self._clock = clock
        if monotonic is None:
            monotonic = time.monotonic if clock is time.time else clock
        self._monotonic = monotonic
        self._episodes: dict[tuple[str, str, str], list[_Episode]] = {}
        self._totals: dict[tuple[str, str, str], int] = {}
        self._uuids: dict[str, str] = {}
        self._next_id = 1
        self._lost = 0
        self._untracked = 0
        #: this boot's start (``btime``, seconds since the epoch; set by the patrol, None:
        #: unknown): a text log's record of the first read whose own zoned stamp
        #: (:func:`stamp_time`) is after it is this boot's, and counts as read now
        self.boot_time: float | None = None

    @property
    def vendors(self) -> dict[str, str]:
        """vendor -> what its cards are called, for each vendor whose lines are read."""
        return {p.vendor: p.cards_name for p in getattr(self.reader, "patterns", ())}

    @property
    def source(self) -> str:
        return str(getattr(self.reader, "path", ""))

    def close(self) -> None:
        self.reader.close()

    def _earlier(self, result: ReadResult, ev: KernelEvent) -> bool:
        """Whether ``ev`` of ``result`` was in a text log before the reader first looked,
        its age not told: a record of the first read of a log that is not a replay's,
        unless its own zoned stamp says it was written after this boot started (never a
        guess from a stamp without a year or zone)."""
        if not result.earlier or self.replay:
            return False
        when = stamp_time(ev.log_time)
        # btime is an integer, rounded down: a second of slack
        return self.boot_time is None or when is None or when < self.boot_time - 1.0

    def _folds(self, ep: _Episode, ev: KernelEvent, mono: float) -> bool:
        a, b = ep.last_clock, ev.clock
        if a is not None and b is not None and a[0] == b[0]:
            return abs(b[1] - a[1]) <= self.burst_seconds
        return abs(mono - ep.last_mono) <= self.burst_seconds

    def poll(self) -> KernelLogSnapshot:
        """Read what is new and return this patrol's view."""
        now = self._clock()
        mono_now = self._monotonic()
        result = self.reader.read()
        for bus, uuid in result.uuids.items():
            self._uuids.pop(bus, None)
            if len(self._uuids) >= MAX_KEYS:  # the oldest named goes
                del self._uuids[next(iter(self._uuids))]
            self._uuids[bus] = uuid
        self._lost += result.lost
        new: list[_Episode] = []
        for ev, when in result.events:
            ts = now if when is None else when
            if result.boot_clock and ev.clock is not None and ev.clock[0] == "boot":
                mono = min(ev.clock[1], mono_now)  # the record's own monotonic stamp
            else:  # a recorded log: as old as the reader says, on this read's clock
                mono = mono_now - max(0.0, now - ts)
            key = ev.key
            if key not in self._episodes and len(self._episodes) >= MAX_KEYS:
                self._untracked += 1  # the window's table is full: counted, not kept
                continue
            if key not in self._totals and len(self._totals) >= MAX_KEYS:
                # the totals are full: the total of a key out of the window is forgotten
                stale = next((k for k in self._totals if k not in self._episodes), None)
                if stale is None:
                    self._untracked += 1
                    continue
                del self._totals[stale]
            self._totals[key] = self._totals.get(key, 0) + 1
            episodes = self._episodes.setdefault(key, [])
            last = episodes[-1] if episodes else None
            earlier = self._earlier(result, ev)
            # a record of now never folds into one of unknown age (its episode counts)
            if last is not None and last.earlier == earlier and self._folds(last, ev, mono):
                last.count += 1
                last.last_ts = max(last.last_ts, ts)
                last.last_mono = max(last.last_mono, mono)
                last.last_clock = ev.clock or last.last_clock
                continue
            ep = _Episode(self._next_id, ev, ts, ts, 1, ev.clock, mono, earlier)
            self._next_id += 1
            episodes.append(ep)
            del episodes[:-MAX_OCCURRENCES_PER_KEY]
            new.append(ep)
        since = mono_now - self.window_seconds
        window: list[_Episode] = []
        counts: dict[tuple[str, str, str], int] = {}
        for key, episodes in list(self._episodes.items()):
            # episodes past the window count nowhere (nor fold: the window is longer
            # than a burst): dropped, so the table holds the window only
            episodes[:] = [ep for ep in episodes if ep.last_mono >= since]
            if not episodes:
                del self._episodes[key]
                continue
            for ep in episodes:
                window.append(ep)
                counts[key] = counts.get(key, 0) + ep.count
        window.sort(key=lambda e: e.id)
        return KernelLogSnapshot(
            state=result.state,
            error=result.error,
            source=self.source,
            window_seconds=self.window_seconds,
            new=tuple(e.frozen() for e in new),
            window=tuple(e.frozen() for e in window),
            window_counts=counts,
            totals=dict(self._totals),
            uuids=dict(self._uuids),
            lost=self._lost,
            vendors=self.vendors,
            untracked=self._untracked,
        )


def open_kernel_log(
    enabled: bool,
    path: str,
    *,
    window_seconds: float,
    burst_seconds: float,
    replay_dir: Path | None = None,
) -> KernelLog | None:
    """The kernel log source of a patrol: ``/dev/kmsg`` (``path``) on a live node, the
    replay directory's ``kmsg.txt`` when replaying; None when switched off."""
    if not enabled:
        return None
    reader: KmsgReader | TextLogReader
    if replay_dir is not None:
        reader = TextLogReader(Path(replay_dir) / REPLAY_FILE)
    elif path == KMSG_PATH or Path(path).is_char_device():
        reader = KmsgReader(path)
    else:
        reader = TextLogReader(path)  # a log file (tests, or a forwarded kernel log)
    return KernelLog(
        reader,
        window_seconds=window_seconds,
        burst_seconds=burst_seconds,
        replay=replay_dir is not None,
    )
