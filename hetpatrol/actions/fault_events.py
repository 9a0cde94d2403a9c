"""The recent card fault events with their jobs, kept in the state file (fault to job).

Every card fault event line of the JSONL (``kind: "event"``, ``event`` ``xid`` or
``kernel``) carries ``jobs``: the Slurm jobs on its card when it was read
(:meth:`hetpatrol.patrol.Patroller._jobs_on_events`). The daemon also keeps the last of
them in its state file (``fault_events``), so that an operator who gathers the state
files of the nodes (``hetpatrol ledger faults DIR``) or looks at one node
(``hetpatrol status``) sees which jobs ran on a card that faulted without the JSONL
log, and so that a restarted daemon goes on from them.

A kept event (:func:`kept_event`) is the JSONL event's identity and verdict, nothing
else: ``ts`` (RFC 3339, the JSONL event's), ``boot_id`` (the boot it was read in, null
when unknown), ``run_id`` and ``seq`` (the run and patrol that wrote the JSONL line: the
same event in both is one), ``event``, ``xid`` or ``reason``, ``severity``, the card's
``uuid``, ``bus_id``, ``vendor``, ``index`` (and ``chip``), ``kmsg_seq`` (the
``/dev/kmsg`` record's sequence number) or ``log_record`` (a text kernel log's name for
a record: :attr:`hetpatrol.kernel_log.KernelEvent.record`) and ``jobs`` (a list of job
ids, null when the card was not one of the patrol's; at most :data:`MAX_JOBS`,
``jobs_more`` counts the rest), ``jobs_unknown`` (why ``jobs`` is null for a record
older than what the daemon could know: read at its start from before its first read of
the cards' jobs). Fields that are null are left out but ``ts``, ``boot_id``, ``event``,
``severity`` and ``jobs``.

Bounds (``actions.fault_events``, :class:`FaultEventRule`): ``max_events`` (100)
events, none older than ``max_age_seconds`` (7 days) by its ``ts``; past ``max_events``
the oldest of the lowest severity go first (:meth:`FaultLog._bound`). The JSONL
log is the archive; the state file is written every patrol and read by ``check`` in the
Prolog, so it holds the recent past only (100 events are about 25 KB).

A restarted daemon reads the kernel ring buffer (or its text kernel log) again: a record
already kept (:func:`record_key`: same boot id and ``kmsg_seq``, or same ``log_record``;
same card and fault) is not kept twice, and :meth:`FaultLog.observe` returns it, so the
daemon writes no second JSONL line of it (its line of the first read stands, with the
jobs when it happened, not those on the card at the restart). A record it no longer
keeps (past ``max_events``), or one from before its first read of the cards' jobs, gets
no jobs (``jobs_unknown`` says why: :meth:`hetpatrol.patrol.Patroller._jobs_on_events`).
Standard library only.

Ages are not moved by a step of the wall clock (NTP after a bad RTC, ``date -s``, a
bad time source): the daemon gives :meth:`FaultLog.note_clock` the wall and monotonic
clocks each patrol, and a step moves the kept events' times with it (their ``ts`` text
stays as the JSONL has it), as the escalation counts are (:data:`hetpatrol.actions.
escalation.CLOCK_STEP_SECONDS`); a restart in the same boot takes the step since the
state file was written from its ``finished`` / ``finished_boot`` (``CLOCK_BOOTTIME``).
Without those a clock 8 days ahead for one patrol dropped every kept event for good.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hetpatrol.actions.escalation import CLOCK_STEP_SECONDS

#: the ``event`` of a card fault line
FAULT_EVENTS = ("xid", "kernel")
#: most job ids kept per event (a shared card may hold many jobs; the JSONL has all)
MAX_JOBS = 64
#: longest text kept in a field (a UUID is 40, a boot id 36, a job id far less)
MAX_TEXT = 128
DEFAULT_MAX_EVENTS = 100
DEFAULT_MAX_AGE_SECONDS = 7 * 86400.0

_TEXT_FIELDS = ("run_id", "reason", "uuid", "bus_id", "vendor", "jobs_unknown", "log_record")
_INT_FIELDS = ("seq", "xid", "index", "chip", "kmsg_seq")
_SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class FaultEventRule:
    """``max_events``: most kept events (the oldest go first); ``max_age_seconds``: an
    event whose ``ts`` is older is dropped. ``max_events`` 0 keeps none."""

    max_events: int = DEFAULT_MAX_EVENTS
    max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS


def rule_from_config(section: Mapping[str, Any] | None) -> FaultEventRule:
    """The ``actions.fault_events`` section ``{max_events, max_age_seconds}``. Raises
    ValueError naming the bad key."""
    if not section:
        return FaultEventRule()
    try:
        rule = FaultEventRule(
            int(section.get("max_events", DEFAULT_MAX_EVENTS)),
            float(section.get("max_age_seconds", DEFAULT_MAX_AGE_SECONDS)),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"actions.fault_events: {exc}") from None
    if not 0 <= rule.max_events <= 10000 or not rule.max_age_seconds > 0:
        raise ValueError(
            "actions.fault_events: max_events in [0, 10000] and max_age_seconds > 0 needed"
        )
    return rule


def _text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT


def event_time(ts: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 ``ts`` (``2026-12-01T22:35:12.912Z``), or
    None when it is not one."""
    if not _text(ts):
        return None
    try:
        when = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    value = when.timestamp()
    return value if math.isfinite(value) else None


def kept_event(event: Mapping[str, Any], boot_id: Any = None) -> dict[str, Any] | None:
    """The kept form of a card fault event (a JSONL event dict, or a kept event read
    back: its own ``boot_id`` wins over ``boot_id``), or None when it is not one or a
    field has the wrong type or size (a damaged or foreign document)."""
    if not isinstance(event, Mapping) or event.get("event") not in FAULT_EVENTS:
        return None
    ts, severity = event.get("ts"), event.get("severity")
    if event_time(ts) is None or severity not in _SEVERITIES:
        return None
    boot = event.get("boot_id", boot_id)
    if boot is not None and not _text(boot):
        return None
    kept: dict[str, Any] = {"ts": ts, "boot_id": boot, "event": event["event"]}
    for key in _TEXT_FIELDS:
        value = event.get(key)
        if value is not None:
            if not _text(value):
                return None
            kept[key] = value
    for key in _INT_FIELDS:
        value = event.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                return None
            kept[key] = value
    if kept.get("xid") is None and kept.get("reason") is None:
        return None  # neither what nor why: nothing to credit
    kept["severity"] = severity
    jobs = event.get("jobs")
    if jobs is not None:
        if not isinstance(jobs, list) or not all(_text(j) for j in jobs):
            return None
        more = event.get("jobs_more", 0)
        if not isinstance(more, int) or isinstance(more, bool) or more < 0:
            return None
        more += max(0, len(jobs) - MAX_JOBS)
        jobs = list(jobs[:MAX_JOBS])
        if more:
            kept["jobs_more"] = more
    kept["jobs"] = jobs
    return kept


def record_key(kept: Mapping[str, Any]) -> tuple | None:
    """The kernel record an event was read from, None where it cannot be told:

    - a ``/dev/kmsg`` record: (boot id, ``kmsg_seq``, bus id, fault), None where the
      boot is unknown (the sequence numbers start again each boot);
    - a text kernel log's record (``log_record``: the file, the record's raw line(s) with
      their own time stamp where the format has one, its place among equal records):
      (``log_record``, bus id, fault). The boot it was read in is not part of it: a text
      log keeps the records of earlier boots, and a daemon of a later boot reads them
      again under the same name.

    The card is the record's own bus id (the UUID where it names none): the card a
    record was matched to may be unlisted at a restart (as after an XID 79), and its
    UUID then unknown.

    ``hetpatrol ledger faults`` counts an event once by the same key (with the node)."""
    what = (kept.get("xid"), kept.get("reason"))
    if kept.get("kmsg_seq") is not None:
        if kept.get("boot_id") is None:
            return None
        return (kept["boot_id"], kept["kmsg_seq"], kept.get("bus_id") or kept.get("uuid"), *what)
    if kept.get("log_record") is not None:
        return ("text", kept["log_record"], kept.get("bus_id") or kept.get("uuid"), *what)
    return None


class FaultLog:
    """The kept events, oldest first, and their JSON text for the state file (encoded
    again only when the list changes: the state file is written every patrol)."""

    def __init__(self, rule: FaultEventRule | None = None) -> None:
        self.rule = rule or FaultEventRule()
        self._events: list[dict[str, Any]] = []
        self._times: list[float] = []
        self._records: dict[tuple, dict[str, Any]] = {}
        #: the last :meth:`from_state`'s entries that were not kept events (damaged)
        self.dropped = 0
        self._json = "[]"
        #: (wall, monotonic) at the last :meth:`note_clock`
        self._clock: tuple[float, float] | None = None

    @property
    def events(self) -> list[dict[str, Any]]:
        """The kept events, oldest first (do not change them)."""
        return self._events

    def json_text(self) -> str:
        """The kept events as compact JSON text (a list)."""
        return self._json

    def note_clock(self, now: float, monotonic: float) -> float:
        """The wall clock ``now`` and the monotonic clock ``monotonic`` of this patrol
        (seconds). When the wall clock moved more than :data:`CLOCK_STEP_SECONDS` more
        (or less) than the monotonic one since the last call, the kept events' times are
        moved by that step (their ``ts`` text is not), so the age bound is not. Returns
        the step (0.0: none)."""
        last, self._clock = self._clock, (now, monotonic)
        if last is None or not (math.isfinite(now) and math.isfinite(monotonic)):
            return 0.0
        step = (now - last[0]) - (monotonic - last[1])
        if not math.isfinite(step) or abs(step) <= CLOCK_STEP_SECONDS:
            return 0.0
        self._times = [t + step for t in self._times]
        return step

    def observe(
        self,
        events: Iterable[dict[str, Any]],
        boot_id: str | None,
        now: float,
        run_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Keep this patrol's card fault events (JSONL event dicts with ``jobs``, read in
        boot ``boot_id`` by run ``run_id``), then apply the bounds as of ``now`` (seconds
        since the epoch). A record already kept (:func:`record_key`) is not kept again,
        and its event's ``jobs`` (in place) become the kept ones: the jobs when the record
        was first read. Returns those events (records read again: a restarted daemon's
        read of a kernel log it had read), in order; the daemon writes no line of them."""
        changed = False
        again: list[dict[str, Any]] = []
        for event in events:
            kept = kept_event(event if run_id is None else {**event, "run_id": run_id}, boot_id)
            if kept is None:
                continue
            key = record_key(kept)
            first = self._records.get(key) if key is not None else None
            if first is not None:  # as first read: its jobs, or why they are not known
                event["jobs"] = list(first["jobs"]) if first["jobs"] is not None else None
                event.pop("jobs_unknown", None)
                if first.get("jobs_unknown") is not None:
                    event["jobs_unknown"] = first["jobs_unknown"]
                again.append(event)
                continue
            self._append(kept)
            changed = True
        if self._bound(now) or changed:
            self._encode()
        return again

    def _append(self, kept: dict[str, Any]) -> None:
        when = event_time(kept["ts"])
        assert when is not None  # kept_event checked it
        # events arrive in time order; one out of order (a restored file) is put in place
        i = len(self._times)
        while i and self._times[i - 1] > when:
            i -= 1
        self._events.insert(i, kept)
        self._times.insert(i, when)
        key = record_key(kept)
        if key is not None:
            self._records.setdefault(key, kept)

    def _bound(self, now: float) -> bool:
        """Drop the events past the age bound, then, past ``max_events``, the oldest of
        the lowest severity first: an application's own errors (XID 13, 31, 43:
        ``warning``), which a user's crashing program repeats at will, never push a
        critical card fault (XID 79, 48) out of the kept ones. Returns whether any went."""
        cut = 0
        oldest = now - self.rule.max_age_seconds
        while cut < len(self._times) and self._times[cut] < oldest:
            cut += 1
        over = len(self._events) - cut - self.rule.max_events
        gone = set(range(cut))
        if over > 0:
            rank = {s: i for i, s in enumerate(_SEVERITIES)}
            left = range(cut, len(self._events))
            gone.update(sorted(left, key=lambda i: (rank[self._events[i]["severity"]], i))[:over])
        if not gone:
            return False
        for i in gone:
            key = record_key(self._events[i])
            if key is not None and self._records.get(key) is self._events[i]:
                del self._records[key]
        self._events = [e for i, e in enumerate(self._events) if i not in gone]
        self._times = [t for i, t in enumerate(self._times) if i not in gone]
        return True

    def _encode(self) -> None:
        self._json = json.dumps(self._events, separators=(",", ":"))

    @classmethod
    def from_state(
        cls,
        doc: Any,
        now: float,
        rule: FaultEventRule | None = None,
        boot: tuple[str, float] | None = None,
    ) -> FaultLog:
        """Rebuild from a state document's ``fault_events`` as of ``now``: entries that
        are not kept events (wrong types, too long) are dropped and counted in
        :attr:`dropped`, the bounds applied; a missing or foreign value gives an empty
        log, never an exception. ``boot``: (this boot's id, ``CLOCK_BOOTTIME`` seconds,
        :func:`hetpatrol.exporters.state.boot_clock`): a document written in this boot
        says the wall clock's step since (:func:`restart_step`), and the events' times
        are moved by it before the age bound."""
        log = cls(rule)
        raw = doc.get("fault_events") if isinstance(doc, Mapping) else None
        if raw is None:
            return log
        if not isinstance(raw, list):
            log.dropped = 1
            return log
        for entry in raw[-(log.rule.max_events or 1) * 4 :]:  # a huge list: its tail
            kept = kept_event(entry) if isinstance(entry, Mapping) else None
            if kept is None or "boot_id" not in entry:
                log.dropped += 1
                continue
            key = record_key(kept)
            if key is not None and key in log._records:
                continue
            log._append(kept)
        log.dropped += max(0, len(raw) - (log.rule.max_events or 1) * 4)
        step = restart_step(doc, now, boot)
        if step:
            log._times = [t + step for t in log._times]
        log._bound(now)
        log._encode()
        return log


def restart_step(doc: Mapping[str, Any], now: float, boot: tuple[str, float] | None) -> float:
    """The wall clock's step since the state document was written, when it was written
    in this boot: (``now`` - its ``finished``) - (``boot``'s seconds - its
    ``finished_boot``), 0.0 when within :data:`CLOCK_STEP_SECONDS` or not known (another
    boot, a field missing or not a finite number)."""
    if boot is None or not isinstance(doc, Mapping) or doc.get("boot_id") != boot[0]:
        return 0.0
    wall, on_boot = doc.get("finished"), doc.get("finished_boot")
    values = (wall, on_boot, now, boot[1])
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return 0.0
    step = (now - wall) - (boot[1] - on_boot)
    return step if math.isfinite(step) and abs(step) > CLOCK_STEP_SECONDS else 0.0
