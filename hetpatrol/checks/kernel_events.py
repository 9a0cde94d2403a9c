"""Judging kernel log events: XID classes, card findings and the ``kind: "event"`` lines.

Only judges: takes the :class:`~hetpatrol.kernel_log.KernelLogSnapshot` that the kernel
log source read and the cards the collectors read, and decides severities (DESIGN
section 4):

- drain class (48, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143, 155, 156, 158; the
  NVLink5 XIDs 144-150 that NVIDIA's catalog decodes to ``RESET_GPU``) -> ``critical``:
  drain the node, reset the GPU;
- application class (13, 31, 43, 45) -> ``warning`` attributed to the process (and its
  Slurm job): the job's fault, the card stays in service;
- informational (63, 92) -> ``info``;
- 94 (contained ECC error: the application was stopped) -> ``warning``, ``critical`` once
  it repeats ``repeat_critical[94]`` times in the window;
- 154 (recovery action changed) -> ``critical`` unless the new action is ``None``;
- NVLink5 144-150 decoded to ``IGNORE`` or ``XID_154_EVAL`` -> ``warning``. The decode
  is the catalog's (unit and Error Status from IntrInfo, the NETIR_LINK_EVT sub-code;
  :func:`hetpatrol.collectors.nvidia_kmsg.nvlink5_decode`), not the printed
  ``Fatal``/``Nonfatal`` word; only a line the catalog cannot decode goes by that word:
  ``Nonfatal`` -> ``warning``, ``Fatal`` or no word -> ``critical``;
- failures that print no Xid (``fallen off the bus``, ``NV_ERR_RESET_REQUIRED``,
  ``RmInitAdapter failed``) -> ``critical``;
- any other XID -> ``unknown_xid_severity`` (``warning``).

Every class can be overridden per XID in the config (``kernel_log.xid_severity``).
A card's finding lasts while an episode of the fault is in the window
(``kernel_log.window_seconds``); an event from before the window (an old ring-buffer
record read at start-up) is written as an event line but makes no finding. A record that
was in a text kernel log before its first read (age unknown; never a replay's) is written
and kept with ``jobs_unknown`` but makes no card finding, no off-bus signal and no
escalation: one ``kernel_log_earlier`` info node finding counts them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hetpatrol import processes
from hetpatrol.config_file import SEVERITY_OR_OFF
from hetpatrol.kernel_log import (
    KIND_KERNEL,
    KIND_XID,
    REASON_FALLEN_OFF_BUS,
    REASON_RESET_REQUIRED,
    REASON_RM_INIT_FAILED,
    KernelLog,
    KernelLogSnapshot,
    KernelOccurrence,
)
from hetpatrol.logs import get_logger
from hetpatrol.schema import (
    CLASS_APPLICATION,
    CLASS_DRAIN,
    CLASS_INFO,
    CLASS_OTHER,
    EVENT_SCHEMA,
    HEALTH_CRITICAL,
    HEALTH_WARNING,
    SEVERITY_INFO,
    CardRecord,
    Finding,
    worst,
)

_log = get_logger("hetpatrol.kernel_log")

DRAIN_XIDS = frozenset({48, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143, 155, 156, 158})
NVLINK5_XIDS = frozenset(range(144, 151))
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
INFO_XIDS = frozenset({63, 92})


#: Short names of the XIDs hetpatrol classifies (NVIDIA's XID catalogue).
XID_NAMES: dict[int, str] = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    140: "Unrecovered ECC Error",
    143: "GPU Initialization Failure",
    144: "NVLink: SAW Error",
    145: "NVLink: RLW Error",
    146: "NVLink: TLW Error",
    147: "NVLink: TREX Error",
    148: "NVLink: NVLPW_CTRL Error",
    149: "NVLink: NETIR Error",
    150: "NVLink: MSE Error",
    154: "GPU Recovery Action Changed",
    155: "NVLink: SW Defined Error",
    156: "Resource Retirement Event",
    158: "GPU Fatal Timeout",
}

REASON_TEXT = {
    REASON_FALLEN_OFF_BUS: "GPU has fallen off the bus (no Xid printed)",
    REASON_RESET_REQUIRED: "driver says NV_ERR_RESET_REQUIRED",
    REASON_RM_INIT_FAILED: "RmInitAdapter failed: the driver could not initialise the GPU",
}

_ACTION = {
    HEALTH_CRITICAL: "drain the node and reset the GPU (or reboot); RMA if it returns",
    HEALTH_WARNING: "look at the job that ran on it; the card stays in service",
    SEVERITY_INFO: "no action needed",
}


@dataclass(frozen=True)
class KernelLogRules:
    """The ``kernel_log`` section of the config (reading and judging settings)."""

    enabled: bool = True
    path: str = "/dev/kmsg"
    window_seconds: float = 3600.0
    burst_seconds: float = 5.0
    xid_severity: Mapping[int, str] = field(default_factory=dict)
    repeat_critical: Mapping[int, int] = field(default_factory=lambda: {94: 3})
    unknown_xid_severity: str = HEALTH_WARNING


NAME = "kernel_events"
#: mappings whose keys are XID numbers: "0079" and "79" are one key
TOP_NORMALISED_KEYS = (
    (("kernel_log", "xid_severity"), int),
    (("kernel_log", "repeat_critical"), int),
)
TOP_SCHEMA: dict[str, Any] = {
    "kernel_log": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "enabled": {"type": "boolean"},
            "path": {"type": "string", "minLength": 1},
            "window_seconds": {"type": "number", "exclusiveMinimum": 0},
            "burst_seconds": {"type": "number", "minimum": 0},
            "xid_severity": {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9]{1,4}$"},
                "additionalProperties": SEVERITY_OR_OFF,
            },
            "repeat_critical": {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9]{1,4}$"},
                "additionalProperties": {"type": "integer", "minimum": 1},
            },
            "unknown_xid_severity": SEVERITY_OR_OFF,
        },
    },
}


def build_top(data: Mapping[str, Any]) -> KernelLogRules:
    """The ``kernel_log`` section of the config file's top level ``data``."""
    section = data.get("kernel_log")
    s = section or {}
    base = KernelLogRules()
    return KernelLogRules(
        enabled=bool(s.get("enabled", base.enabled)),
        path=str(s.get("path", base.path)),
        window_seconds=float(s.get("window_seconds", base.window_seconds)),
        burst_seconds=float(s.get("burst_seconds", base.burst_seconds)),
        xid_severity={int(k): v for k, v in (s.get("xid_severity") or {}).items()},
        repeat_critical={
            **base.repeat_critical,
            **{int(k): int(v) for k, v in (s.get("repeat_critical") or {}).items()},
        },
        unknown_xid_severity=s.get("unknown_xid_severity", base.unknown_xid_severity),
    )


def classify(occ: KernelOccurrence, window_count: int, rules: KernelLogRules) -> tuple[str, str]:
    """(severity, class) of one episode, given how many records of it the window holds."""
    ev = occ.event
    if ev.kind == KIND_KERNEL:
        return HEALTH_CRITICAL, CLASS_DRAIN
    xid = ev.xid if ev.xid is not None else -1
    if xid in DRAIN_XIDS:
        severity, cls = HEALTH_CRITICAL, CLASS_DRAIN
    elif xid in NVLINK5_XIDS:
        if ev.nvlink_action is not None:  # the catalog's decode of IntrInfo/Error Status
            fatal = ev.nvlink_action == "RESET_GPU"
        else:  # not decodable: the printed word; none printed counts as fatal
            fatal = ev.fatal is not False
        severity = HEALTH_CRITICAL if fatal else HEALTH_WARNING
        cls = CLASS_DRAIN if fatal else CLASS_OTHER
    elif xid in APPLICATION_XIDS or xid == 94:
        severity, cls = HEALTH_WARNING, CLASS_APPLICATION
    elif xid in INFO_XIDS:
        severity, cls = SEVERITY_INFO, CLASS_INFO
    elif xid == 154:
        action = (ev.recovery_action or "").strip().lower()
        if action in ("none", ""):
            severity, cls = SEVERITY_INFO, CLASS_INFO
        else:
            severity, cls = HEALTH_CRITICAL, CLASS_DRAIN
    else:
        severity, cls = rules.unknown_xid_severity, CLASS_OTHER
    if xid in rules.xid_severity:
        severity = rules.xid_severity[xid]
    limit = rules.repeat_critical.get(xid)
    if limit is not None and window_count >= limit and severity != HEALTH_CRITICAL:
        severity, cls = HEALTH_CRITICAL, CLASS_DRAIN
    return severity, cls


def _what(occ: KernelOccurrence) -> str:
    ev = occ.event
    if ev.kind == KIND_XID:
        name = XID_NAMES.get(ev.xid or -1)
        head = f"XID {ev.xid}" + (f" ({name})" if name else "")
        if ev.nvlink_unit:
            word = {True: " Fatal", False: " Nonfatal", None: ""}[ev.fatal]
            head += f" {ev.nvlink_unit}{word} link {ev.link}"
            if ev.nvlink_action:
                head += f" (catalog: {ev.nvlink_action})"
        if ev.xid == 154 and ev.recovery_action:
            head += f" -> {ev.recovery_action}"
        return head
    return REASON_TEXT.get(ev.reason or "", ev.reason or "kernel fault")


def _match(
    bus_id: str | None, uuid: str | None, cards: Sequence[CardRecord], vendors: Collection[str]
) -> CardRecord | None:
    """The card a kernel event is about: by bus id, else by UUID, else by elimination.

    Elimination: a GPU that fell off the bus before its first read has no bus id in
    NVML (``nvmlDeviceGetHandleByIndex`` fails); when exactly one card of the event's
    vendor has no bus id (and no other UUID than the event's) and no card has the
    event's bus id, the event is that card's. Two cards without a bus id (one with a
    UUID, one without, or neither) leave the event unmatched: it is a node finding by
    its bus id, never another card's.
    """
    for card in cards:
        if bus_id and card.bus_id == bus_id:
            return card
    for card in cards:
        if uuid and card.uuid == uuid:
            return card
    if not bus_id:
        return None
    blind = [c for c in cards if c.vendor in vendors and c.bus_id is None]
    if len(blind) != 1 or (uuid and blind[0].uuid and blind[0].uuid != uuid):
        return None
    return blind[0]


def event_code(event: Any) -> tuple[str, str]:
    """``(check, code)`` of a kernel-log event (a :class:`~hetpatrol.kernel_log.KernelEvent`)
    as its finding names it: ``("xid", "79")`` for an Xid line, ``("kernel_fault",
    "fallen_off_bus")`` for a failure printed without one (the keys of the plugins'
    ``VendorActions`` tables)."""
    check = "xid" if event.kind == KIND_XID else "kernel_fault"
    return check, event.key[2]


def off_bus_events(
    snapshot: KernelLogSnapshot | None, codes: Mapping[str, Collection[str]]
) -> list[tuple[str, str]]:
    """``(bus id, "xid 79")`` of each event of ``snapshot`` (read this patrol or in its
    window; those of an earlier boot are already left out by :func:`patrol_kernel_log`)
    whose ``(check, code)`` is one of ``codes`` (check -> codes: the plugins'
    ``VendorActions.off_bus_codes``, the events that say a card left the bus). Events
    without a bus id are left out."""
    if snapshot is None:
        return []
    out = []
    for occ in (*snapshot.new, *snapshot.window):
        if occ.earlier:  # in a text log before it was first read: of unknown age
            continue
        ev = occ.event
        check, code = event_code(ev)
        if ev.bus_id and code in codes.get(check, ()):
            out.append((ev.bus_id, f"{check} {code}"))
    return out


#: GPU bus ids no card has that get findings of their own; past them one finding says
#: how many more there are.
MAX_UNREAD_BUSES = 16
#: ``jobs_unknown`` of an event line whose record was in a text kernel log before its
#: first read (:attr:`hetpatrol.kernel_log.KernelOccurrence.earlier`): its time, and so
#: its jobs, are not known (the event gets ``jobs: null``, never today's jobs)
JOBS_UNKNOWN_EARLIER = "in the kernel log before this daemon first read it, its time not told"
#: the info node finding for the window's records of a text kernel log that were in it
#: before its first read: they make no card finding and feed no escalation
CHECK_EARLIER = "kernel_log_earlier"


def _earlier_finding(episodes: Sequence[KernelOccurrence], source: str) -> Finding:
    """The ``kernel_log_earlier`` info finding for ``episodes`` (each ``earlier``): how
    many fault records, on how many GPU bus ids, were in the log ``source`` before
    hetpatrol first read it (``value``: ``{"records": n, "episodes": m}``)."""
    records = sum(occ.count for occ in episodes)
    buses = sorted({occ.event.bus_id or "unknown bus" for occ in episodes})
    shown = ", ".join(buses[:5]) + (", ..." if len(buses) > 5 else "")
    return Finding(
        CHECK_EARLIER,
        SEVERITY_INFO,
        f"kernel log {source}: {records} fault record(s) on {len(buses)} GPU bus id(s) "
        f"({shown}) were in the log before hetpatrol first read it, their age unknown "
        "(perhaps an earlier boot): kept as events, no card finding, no escalation",
        value={"records": records, "episodes": len(episodes)},
        threshold=None,
    )


def _findings(
    episodes: Iterable[tuple[KernelOccurrence, str]],
    counts: Mapping[tuple[str, str, str], int],
    window_seconds: float,
    where: str,
) -> list[Finding]:
    """One ``xid`` and/or one ``kernel_fault`` finding for the episodes of one GPU."""
    out = []
    by_check: dict[str, list[tuple[KernelOccurrence, str]]] = {}
    for occ, severity in episodes:
        check = "xid" if occ.event.kind == KIND_XID else "kernel_fault"
        by_check.setdefault(check, []).append((occ, severity))
    for check, items in by_check.items():
        rank = [s for _o, s in items]
        severity = worst(*rank) if any(s != SEVERITY_INFO for s in rank) else SEVERITY_INFO
        value: dict[str, int] = {}
        parts: list[str] = []
        seen: set[tuple[str, str, str]] = set()
        for occ, sev in items:
            key = occ.event.key
            label = key[2]
            value[label] = counts.get(key, occ.count)
            if key in seen:
                continue
            seen.add(key)
            text = f"{_what(occ)} x{value[label]} ({sev})"
            if occ.event.pid is not None or occ.event.process:
                text += f" pid {occ.event.pid} {occ.event.process or ''}".rstrip()
            parts.append(text)
        out.append(
            Finding(
                check,
                severity,
                f"{where}: "
                + "; ".join(parts)
                + f" in the last {window_seconds:g} s: "
                + _ACTION[severity],
                value=value,
                threshold=None,
            )
        )
    return out


def apply_kernel_log(
    snapshot: KernelLogSnapshot,
    cards: Sequence[CardRecord],
    rules: KernelLogRules,
    *,
    node: str,
    seq: int,
    ts_format,
    lookup_process=None,
    started_at=None,
) -> tuple[list[dict[str, Any]], list[Finding]]:
    """Judge one snapshot: add findings to the matching cards (their ``health`` goes up
    to the worst), return the event lines (dicts) and the node findings for events on a
    GPU no collector reported (a GPU that failed to initialise is not in NVML).

    ``ts_format`` turns a wall time into the RFC 3339 text of the lines;
    ``lookup_process(pid) -> (user, job_id)`` attributes an application-class XID to a
    user and Slurm job (live nodes only); ``started_at(pid)`` (seconds after boot the
    pid started, None: unknown) keeps it from a process that started after the record
    (see :func:`_pid_reused`).
    """
    counts = snapshot.window_counts
    per_card: dict[int, list[tuple[KernelOccurrence, str]]] = {}
    per_bus: dict[str, list[tuple[KernelOccurrence, str]]] = {}
    card_of: dict[int, CardRecord] = {}
    earlier: list[KernelOccurrence] = []
    for occ in snapshot.window:
        if occ.earlier:  # of unknown age: one info finding below, never a card's
            earlier.append(occ)
            continue
        ev = occ.event
        severity, _cls = classify(occ, counts.get(ev.key, occ.count), rules)
        uuid = ev.uuid or snapshot.uuids.get(ev.bus_id or "")
        card = _match(ev.bus_id, uuid, cards, (ev.vendor,) if ev.vendor else snapshot.vendors)
        if card is not None:
            card_of[id(card)] = card
            per_card.setdefault(id(card), []).append((occ, severity))
        else:
            per_bus.setdefault(ev.bus_id or "unknown bus", []).append((occ, severity))
    for key, items in per_card.items():
        card = card_of[key]
        bus = card.bus_id or items[0][0].event.bus_id
        found = _findings(items, counts, snapshot.window_seconds, f"kernel log, GPU {bus}")
        card.findings.extend(found)
        card.health = worst(card.health, *(f.severity for f in found))
    node_findings: list[Finding] = []
    buses = sorted(per_bus)
    for bus in buses[:MAX_UNREAD_BUSES]:
        node_findings.extend(
            _findings(
                per_bus[bus], counts, snapshot.window_seconds, f"GPU {bus} (no card read there)"
            )
        )
    if len(buses) > MAX_UNREAD_BUSES:
        # a flood of bus ids no card has (a node has a few dozen GPUs at most; a forged or
        # garbled log named 10,000, which made 60,000 findings, 15.6 MB per line): the
        # rest are one finding, worst severity, with the count and the first few ids
        rest = buses[MAX_UNREAD_BUSES:]
        rest_items = [item for bus in rest for item in per_bus[bus]]
        severity = worst(*(sev for _occ, sev in rest_items))
        records = sum(counts.get(occ.event.key, occ.count) for occ, _sev in rest_items)
        node_findings.append(
            Finding(
                "kernel_fault_buses",
                severity,
                f"kernel log: faults on {len(rest)} more GPU bus ids no card has "
                f"({', '.join(rest[:5])}, ...), {records} records in the last "
                f"{snapshot.window_seconds:g} s: {_ACTION[severity]}",
                value={"buses": len(rest), "records": records},
                threshold=None,
            )
        )

    if earlier:
        node_findings.append(_earlier_finding(earlier, snapshot.source))

    in_window = {occ.id for occ in snapshot.window}
    lines: list[dict[str, Any]] = []
    for occ in snapshot.new:
        ev = occ.event
        severity, cls = classify(occ, counts.get(ev.key, occ.count), rules)
        uuid = ev.uuid or snapshot.uuids.get(ev.bus_id or "")
        card = _match(ev.bus_id, uuid, cards, (ev.vendor,) if ev.vendor else snapshot.vendors)
        user = job = None
        attributable = lookup_process is not None and ev.pid is not None
        if attributable and cls == CLASS_APPLICATION and not _pid_reused(ev, started_at):
            user, job = lookup_process(ev.pid)
        lines.append(
            {
                "kind": "event",
                "schema": EVENT_SCHEMA,
                "ts": ts_format(occ.first_ts),
                "node": node,
                "seq": seq,
                "event": ev.kind,
                "severity": severity,
                "class": cls,
                "xid": ev.xid,
                "reason": ev.reason,
                "name": XID_NAMES.get(ev.xid)
                if ev.xid is not None
                else REASON_TEXT.get(ev.reason or ""),
                "bus_id": ev.bus_id,
                "vendor": card.vendor if card is not None else None,
                "index": card.index if card is not None else None,
                "chip": card.chip if card is not None else None,
                "uuid": (card.uuid if card is not None else None) or uuid,
                "pid": ev.pid,
                "process": ev.process,
                "user": user,
                "job_id": job,
                "nvlink_unit": ev.nvlink_unit,
                "fatal": ev.fatal,
                "link": ev.link,
                "nvlink_action": ev.nvlink_action,
                "recovery_action": ev.recovery_action,
                "count": occ.count,
                "window_count": counts.get(ev.key, 0),
                "in_window": occ.id in in_window,
                "message": ev.message,
                "log_time": ev.log_time,
                "kmsg_seq": ev.seq,
                # a text log's name for the record (no kmsg_seq): a re-read is known
                **({"log_record": ev.record} if ev.record is not None else {}),
                "raw": ev.raw,
                # whose job it was cannot be known (Patroller._jobs_on_events)
                **({"jobs_unknown": JOBS_UNKNOWN_EARLIER} if occ.earlier else {}),
            }
        )
    return lines, node_findings


def _pid_reused(ev: Any, started_at: Any) -> bool:
    """Whether the pid a record names now belongs to a process that started after the
    record was written (its boot-clock stamp): a pid used again since (a restarted
    daemon reads the whole ring buffer again, records of hours ago), whose user and job
    are not the record's. The record's stamp is the kernel's ``local_clock()``, which
    stops in a suspend while a process's start time does not: after a suspend a
    record's own process may read as started after it, and is then not attributed (no
    job named rather than another user's). False when either time is unknown."""
    if started_at is None or ev.clock is None or ev.clock[0] != "boot":
        return False
    started = started_at(ev.pid)
    return started is not None and started > ev.clock[1] + 1.0


def card_xid_totals(
    snapshot: KernelLogSnapshot | None, cards: Sequence[CardRecord]
) -> list[tuple[CardRecord, str, int]]:
    """(card, XID number as text, records since start) for the Prometheus counter."""
    if snapshot is None:
        return []
    out = []
    for (bus, kind, what), total in sorted(snapshot.totals.items()):
        if kind != KIND_XID:
            continue
        card = _match(bus or None, snapshot.uuids.get(bus), cards, snapshot.vendors)
        if card is not None:
            out.append((card, what, total))
    return out


CHECK_UNREADABLE = "kernel_log_unreadable"


def unreadable_finding(
    snapshot: KernelLogSnapshot, cards: Sequence[CardRecord], *, replay: bool = False
) -> Finding | None:
    """The ``kernel_log_unreadable`` warning node finding, or None.

    A kernel log that cannot be read (``state`` ``absent`` or ``failed``) on a node with
    NVIDIA cards blinds the XID checks (79, 48, 95, 119...) and "fallen off the bus":
    warning, ``value`` the state, the message naming the source and the reader's error
    (why: no CAP_SYSLOG, the device cgroup, systemd's placeholder...). None on a node
    without NVIDIA cards (Ascend faults are not read from the kernel log) and for a
    replay directory without a ``kmsg.txt`` (a recording without a kernel log).
    """
    if snapshot.state == "ok":
        return None
    if replay and snapshot.state == "absent":
        return None
    counts = {v: sum(1 for c in cards if c.vendor == v) for v in snapshot.vendors}
    blind = [f"{n} {snapshot.vendors[v]}(s)" for v, n in counts.items() if n]
    if not blind:
        return None
    why = snapshot.error or f"kernel log {snapshot.source} {snapshot.state}"
    return Finding(
        CHECK_UNREADABLE,
        HEALTH_WARNING,
        f"{why}; XIDs and GPUs fallen off the bus are not seen on this node's "
        + " and ".join(blind),
        value=snapshot.state,
    )


@dataclass(frozen=True)
class KernelLogResult:
    """What the kernel log added to one patrol: event lines, node findings, the
    snapshot (for the metrics) and the summary written in the patrol line."""

    events: tuple[dict[str, Any], ...] = ()
    findings: tuple[Finding, ...] = ()
    snapshot: KernelLogSnapshot | None = None
    summary: dict[str, Any] | None = None


#: a wall stamp before this (2001-09-09) came from a line without a year (BSD syslog's
#: ``Dec  8 10:15:01``, read as 1970): it cannot say which boot it is from
_YEARLESS_BEFORE = 1e9
#: seconds a record may seem to precede ``btime`` (an integer, rounded down) and still be
#: this boot's
_BOOT_SLACK_SECONDS = 1.0


def _before_boot(occurrence: Any, boot_time: float) -> bool:
    """Whether a kernel-log episode happened before ``boot_time``: by the wall stamp its
    line wrote (``dmesg -T``, ISO 8601, a syslog line with a year), else by the wall
    time the reader gave it (``/dev/kmsg``: this boot's, always after)."""
    clock = getattr(occurrence.event, "clock", None)
    when = occurrence.last_ts
    if clock is not None and clock[0] == "wall" and clock[1] >= _YEARLESS_BEFORE:
        when = clock[1]
    return when < boot_time - _BOOT_SLACK_SECONDS


def patrol_kernel_log(
    source: KernelLog | None,
    cards: Sequence[CardRecord],
    rules: KernelLogRules,
    *,
    node: str,
    seq: int,
    ts_format,
    enrich_processes: bool,
    boot_time: float | None = None,
) -> KernelLogResult:
    """One patrol's kernel log step: read what is new, judge it onto ``cards``.

    ``boot_time`` (seconds since the epoch, ``btime`` of ``/proc/stat``): an episode
    whose last record is from before it belongs to an earlier boot (a kernel log file
    or journal export keeps them) and never counts: no event line, no finding; the
    patrol line's ``kernel_log.earlier_boot_events`` counts them.

    A source that cannot read (no ``/dev/kmsg``, no permission, no ``kmsg.txt`` in a
    replay) is said once in the daemon log and in every patrol line's ``kernel_log``
    summary (``state: absent`` or ``failed``, ``error`` says why); on a node with NVIDIA
    cards it is also a node finding (:func:`unreadable_finding`).
    """
    if source is None:
        return KernelLogResult(summary={"state": "disabled"})
    source.window_seconds = rules.window_seconds
    source.burst_seconds = rules.burst_seconds
    source.boot_time = boot_time
    try:
        snapshot = source.poll()
    except Exception as exc:  # noqa: BLE001 - a reader bug must not stop the patrol
        snapshot = KernelLogSnapshot(
            state="failed",
            error=f"{type(exc).__name__}: {exc}",
            source=source.source,
            window_seconds=rules.window_seconds,
            vendors=source.vendors,
        )
    previous = getattr(source, "_last_state", None)
    if previous != (snapshot.state, snapshot.error):
        level = _log.warning if snapshot.state == "failed" else _log.info
        # an absent log (no such file, no permission) is a reason, not an error of ours
        why = {}
        if snapshot.error:
            why["error" if snapshot.state == "failed" else "reason"] = snapshot.error
        level("kernel_log", state=snapshot.state, source=snapshot.source, **why)
        source._last_state = (snapshot.state, snapshot.error)  # type: ignore[attr-defined]
    earlier = 0
    if boot_time is not None and (snapshot.new or snapshot.window):
        new = tuple(o for o in snapshot.new if not _before_boot(o, boot_time))
        window = tuple(o for o in snapshot.window if not _before_boot(o, boot_time))
        earlier = len(snapshot.new) - len(new)
        snapshot = replace(snapshot, new=new, window=window)
    lookup = processes.lookup if enrich_processes else None
    started = processes.started_boot_seconds if enrich_processes else None
    events, findings = apply_kernel_log(
        snapshot,
        cards,
        rules,
        node=node,
        seq=seq,
        ts_format=ts_format,
        lookup_process=lookup,
        started_at=started,
    )
    blind = unreadable_finding(snapshot, cards, replay=bool(getattr(source, "replay", False)))
    if blind is not None:
        findings.append(blind)
    summary = {
        "state": snapshot.state,
        "error": snapshot.error,
        "source": snapshot.source,
        "new_events": len(events),
        "window_events": sum(snapshot.window_counts.values()),
        "untracked_events": snapshot.untracked,
        **({"earlier_boot_events": earlier} if earlier else {}),
    }
    return KernelLogResult(tuple(events), tuple(findings), snapshot, summary)
