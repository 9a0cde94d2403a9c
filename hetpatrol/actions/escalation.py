"""Escalation over time: repeats and long-lasting conditions raise a card's action.

A pure state machine keyed by card identity (UUID, else serial, else bus id; see
:func:`card_identity`). Its state is a JSON-ready dict (:meth:`Escalation.to_dict`) meant
for the daemon's state file, so counts survive a restart; on load every event older
than its rule's window is dropped (nothing stale is replayed) and an event already
counted (same key, same time) is not counted twice when the kernel ring buffer is read
again at start.

Two kinds of rules:

- :class:`FrequencyRule`: ``times`` occurrences of one of ``keys`` within
  ``window_seconds`` raise the action to ``action``. The escalation then holds: when
  ``release_seconds`` is set (MindCluster's ``ReleaseTimeWindow``), until the fault
  has been recovered (none of the rule's keys present) for ``release_seconds``, timed
  from that recovery after the last occurrence (a fault read once from the kernel log
  recovers as it happens); else until an operator clears it
  (:meth:`Escalation.clear`), as MindCluster's ``ManuallySeparateNPU`` does. Source:
  Ascend/mind-cluster ``component/ascend-device-plugin/pkg/common/fault_code.go``
  (commit 22bb3d98), ``handleFrequencyFault``: the upgrade is removed when
  ``lastRecoverTime >= lastFaultTime`` and ``now - lastRecoverTime >
  ReleaseTimeWindow``. Occurrences decay: one older than the
  window no longer counts.
- :class:`DurationRule`: a condition (one of ``keys``) present without a gap for more
  than ``fault_seconds`` raises the action; it is over once the condition has been
  absent for ``recover_seconds`` (MindCluster ``FaultTimeout`` / ``RecoverTimeout``),
  timed from the patrol that first saw it gone, never from the fault's start (the same
  file, ``GetFaultTypeFromFaultDuration``: the upgrade is removed once
  ``FaultRecoverDurationTime > RecoverTimeout``, the time the fault has been
  recovered).

Keys name a code or a class, ``<kind>:<name>``: the core's ``check:collector_hung``
(a finding's check), ``card:missing`` (held by a card's own identity while it is gone
from its vendor's list), and the codes a vendor plugin's findings hold (its
``VendorActions.code_keys``).

Default rules: the vendors' are declared with their sources by their plugins, in their
fault tables (``VendorInfo.actions``: :class:`hetpatrol.collector.VendorActions`
``frequency_rules`` / ``duration_rules``, loaded by entry point on first use, see
:func:`vendor_rules`); the core's own (:data:`CORE_FREQUENCY_RULES`,
:data:`CORE_DURATION_RULES`) follow them, sources given rule by rule. Standard library
only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hetpatrol.actions.vocabulary import (
    ISOLATE_CARD,
    REBOOT_NODE,
    ActionVerdict,
    parse_action,
)

STATE_SCHEMA = "hetpatrol.escalation/1"
DAY = 86400.0

#: the key a card holds while it is gone from its vendor's list (``card_missing``)
CARD_MISSING_KEY = "card:missing"

#: most occurrences kept per card and key (a storm must not grow the state file)
MAX_EVENTS_PER_KEY = 256
#: an occurrence stamped at most this far after ``now`` is still "now" (the wall time of
#: a kernel record is derived anew at each read); one further ahead is never recent
FUTURE_SLACK_SECONDS = 5.0
#: the wall clock and the monotonic clock disagreeing by more than this between two
#: patrols is a step of the wall clock (NTP, ``date -s``), not drift
CLOCK_STEP_SECONDS = 30.0


@dataclass(frozen=True)
class FrequencyRule:
    """``times`` occurrences of any of ``keys`` within ``window_seconds`` -> ``action``."""

    name: str
    keys: frozenset[str]
    times: int
    window_seconds: float
    action: str
    release_seconds: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        parse_action(self.action)
        if self.times < 1 or not (self.window_seconds > 0):
            raise ValueError(f"rule {self.name}: times >= 1 and window_seconds > 0 needed")


@dataclass(frozen=True)
class DurationRule:
    """A condition in ``keys`` lasting over ``fault_seconds`` -> ``action``; over after
    ``recover_seconds`` without it."""

    name: str
    keys: frozenset[str]
    fault_seconds: float
    action: str
    recover_seconds: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        parse_action(self.action)
        if not (self.fault_seconds >= 0) or not (self.recover_seconds >= 0):
            raise ValueError(f"rule {self.name}: durations must be >= 0")


#: The core's own frequency rules (generic keys: ``card:``, ``check:``); the vendors'
#: (``xid:``, ``ascend:`` ...) are declared by their plugins (:func:`vendor_rules`).
CORE_FREQUENCY_RULES: tuple[FrequencyRule, ...] = (
    FrequencyRule(
        "card_missing_repeat",
        frozenset({CARD_MISSING_KEY}),
        2,
        DAY,
        ISOLATE_CARD,
        # "xid_reset_repeat" is the NVIDIA plugin's rule (collectors/nvidia_actions.py)
        source="a card gone from its vendor's list is a GPU off the bus (XID 79, in "
        "xid_reset_repeat above): gone twice in 24 h, by its identity, it is isolated "
        "until an operator clears it, not drained and resumed at each drop",
    ),
)

#: The core's own duration rules.
CORE_DURATION_RULES: tuple[DurationRule, ...] = (
    DurationRule(
        "collector_hung_lasting",
        frozenset({"check:collector_hung"}),
        600.0,
        REBOOT_NODE,
        recover_seconds=0.0,
        source="hetpatrol's own (no vendor rule): a vendor tool stuck for 10 minutes "
        "(NVML/npu-smi in uninterruptible sleep) is cleared by a reboot",
    ),
)

_vendor_cache: tuple[tuple, tuple[FrequencyRule, ...], tuple[DurationRule, ...]] | None = None


def vendor_rules() -> tuple[tuple[FrequencyRule, ...], tuple[DurationRule, ...]]:
    """``(frequency, duration)``: the escalation rules every installed plugin declares in
    its fault tables (``VendorInfo.actions.frequency_rules`` / ``duration_rules``, a
    :class:`hetpatrol.collector.VendorActions`), plugins in name order, each in its own
    order. Plugins are loaded (by entry point, as :func:`hetpatrol.collector.load_collector`
    does) on the first call and again only when ``sys.path`` changes; one that cannot be
    imported, or declares something other than rules, is left out. Never raises."""
    global _vendor_cache
    import sys
    from importlib.metadata import entry_points

    key = tuple(sys.path)  # plugins come and go with the import path
    if _vendor_cache is not None and _vendor_cache[0] == key:
        return _vendor_cache[1], _vendor_cache[2]
    freq: list[FrequencyRule] = []
    dur: list[DurationRule] = []
    for ep in sorted(entry_points(group="hetpatrol.collectors"), key=lambda e: e.name):
        try:
            declared = ep.load().vendor_info.actions
            if declared is None:
                continue
            f = [r for r in declared.frequency_rules if isinstance(r, FrequencyRule)]
            d = [r for r in declared.duration_rules if isinstance(r, DurationRule)]
        except Exception:  # a broken plugin is reported where it is configured
            continue
        freq.extend(f)
        dur.extend(d)
    _vendor_cache = (key, tuple(freq), tuple(dur))
    return _vendor_cache[1], _vendor_cache[2]


def default_frequency_rules() -> tuple[FrequencyRule, ...]:
    """The default frequency rules: the plugins' (:func:`vendor_rules`), then the core's
    (:data:`CORE_FREQUENCY_RULES`)."""
    return vendor_rules()[0] + CORE_FREQUENCY_RULES


def default_duration_rules() -> tuple[DurationRule, ...]:
    """The default duration rules: the plugins' (:func:`vendor_rules`), then the core's
    (:data:`CORE_DURATION_RULES`)."""
    return vendor_rules()[1] + CORE_DURATION_RULES


class EscalationRules:
    """The rule set: frequency and duration rules. A list not given is the default
    (:func:`default_frequency_rules` / :func:`default_duration_rules`: the plugins' and the
    core's), looked up on first use, not when the rules are made: a config is read, and
    checked by a reload's child, without importing a plugin for them. Compared by value."""

    __slots__ = ("_frequency", "_duration")

    def __init__(
        self,
        frequency: tuple[FrequencyRule, ...] | None = None,
        duration: tuple[DurationRule, ...] | None = None,
    ) -> None:
        self._frequency = None if frequency is None else tuple(frequency)
        self._duration = None if duration is None else tuple(duration)

    @property
    def frequency(self) -> tuple[FrequencyRule, ...]:
        if self._frequency is None:
            self._frequency = default_frequency_rules()
        return self._frequency

    @property
    def duration(self) -> tuple[DurationRule, ...]:
        if self._duration is None:
            self._duration = default_duration_rules()
        return self._duration

    @property
    def longest_window(self) -> float:
        return max((r.window_seconds for r in self.frequency), default=DAY)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EscalationRules):
            return NotImplemented
        return (self.frequency, self.duration) == (other.frequency, other.duration)

    def __hash__(self) -> int:
        return hash((self.frequency, self.duration))

    def __repr__(self) -> str:
        return f"EscalationRules(frequency={self.frequency!r}, duration={self.duration!r})"


def card_identity(card: Any) -> str:
    """The identity escalation state is keyed by: ``uuid:...``, else ``serial:...``,
    else ``bus:...`` (lower case), else ``pos:vendor/index[/chip]`` (only when the card
    reports no identity at all; position is not stable across a reseat)."""

    def get(name: str) -> Any:
        return card.get(name) if isinstance(card, Mapping) else getattr(card, name, None)

    for field_name, prefix in (("uuid", "uuid"), ("serial", "serial"), ("bus_id", "bus")):
        value = get(field_name)
        if isinstance(value, str) and value.strip() and value.strip().upper() not in ("N/A", "NA"):
            text = value.strip()
            return f"{prefix}:{text.lower() if prefix == 'bus' else text}"
    chip = get("chip")
    return f"pos:{get('vendor')}/{get('index')}" + (f"/{chip}" if chip is not None else "")


@dataclass
class _Card:
    events: dict[str, list[float]] = field(default_factory=dict)
    #: frequency rule name -> {"since", "last", "action"}
    escalated: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: condition key -> {"since": t, "absent_since": t | None}
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: keys of frequency rules present at the last :meth:`Escalation.observe_present`
    present: list[str] = field(default_factory=list)


def _released(card: _Card, rule: FrequencyRule, held: Mapping[str, Any], now: float) -> bool:
    """Whether ``rule``'s escalation ``held`` on ``card`` is over at ``now``: the rule
    has a ``release_seconds`` and the fault was recovered that long ago, after its last
    occurrence (see the module docstring)."""
    if rule.release_seconds is None:
        return False
    recovered = held.get("recovered")
    if recovered is None:
        if rule.keys & set(card.present):
            return False  # still present: not recovered
        recovered = held["last"]  # an event without duration recovers as it happens
    if recovered < held["last"]:
        return False
    return now - recovered >= rule.release_seconds


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


class Escalation:
    """Counts and timers per card identity; see the module docstring.

    Times are wall-clock seconds since the epoch (they must survive a restart). Within
    one run the daemon gives :meth:`note_clock` the wall and monotonic clocks each
    patrol: a step of the wall clock moves every stored time by the step, so a span
    (a condition lasting, an escalation's release, an occurrence's age) is measured on
    the monotonic clock. Across a restart (:meth:`from_dict`) no such link exists: a
    stored time after ``now`` is never taken as recent (an occurrence is dropped, a
    timer restarts at ``now``).
    """

    def __init__(self, rules: EscalationRules | None = None) -> None:
        self.rules = rules or EscalationRules()
        self._cards: dict[str, _Card] = {}
        #: (wall, monotonic) at the last :meth:`note_clock`
        self._clock: tuple[float, float] | None = None

    # ------------------------------------------------------------------ clock
    def note_clock(self, now: float, monotonic: float) -> float:
        """The wall clock ``now`` and the monotonic clock ``monotonic`` of this patrol
        (seconds). When the wall clock moved more than :data:`CLOCK_STEP_SECONDS` more
        (or less) than the monotonic one since the last call, every stored time is
        moved by that step. Returns the step (0.0: none)."""
        last, self._clock = self._clock, (now, monotonic)
        if last is None or _finite(now) is None or _finite(monotonic) is None:
            return 0.0
        step = (now - last[0]) - (monotonic - last[1])
        if abs(step) <= CLOCK_STEP_SECONDS:
            return 0.0
        for card in self._cards.values():
            for key, times in card.events.items():
                card.events[key] = [t + step for t in times]
            for held in card.escalated.values():
                for name in ("since", "last", "recovered"):
                    if held.get(name) is not None:
                        held[name] += step
            for cond in card.conditions.values():
                cond["since"] += step
                if cond["absent_since"] is not None:
                    cond["absent_since"] += step
        return step

    # ------------------------------------------------------------------ input
    def observe_event(
        self, identity: str, key: str, ts: float, now: float, *, reread: bool = True
    ) -> bool:
        """Count one occurrence of ``key`` that happened at ``ts`` on card ``identity``.

        Returns False (not counted) when no frequency rule names the key, when ``ts`` is
        older than every window of the key's rules (a stale record read at start), in
        the future beyond :data:`FUTURE_SLACK_SECONDS`, or already counted (``reread``:
        an occurrence within a second of a counted one is the same kernel record read
        again; False for a state seen coming back, which is a new occurrence however
        soon)."""
        rules = [r for r in self.rules.frequency if key in r.keys]
        if not rules or _finite(ts) is None:
            return False
        window = max(r.window_seconds for r in rules)
        if ts < now - window or ts > now + FUTURE_SLACK_SECONDS:
            return False
        card = self._cards.setdefault(identity, _Card())
        times = card.events.setdefault(key, [])
        # the same record read again (a restarted daemon reads the kernel's ring buffer
        # from its start; its wall time is derived anew, within a second of the first)
        if reread and any(abs(ts - t) < 1.0 for t in times):
            return False
        times.append(ts)
        times.sort()
        del times[:-MAX_EVENTS_PER_KEY]
        for rule in rules:
            count = sum(
                1
                for k in rule.keys
                for t in card.events.get(k, ())
                if t >= ts - rule.window_seconds and t <= ts
            )
            if count >= rule.times:
                held = card.escalated.get(rule.name)
                card.escalated[rule.name] = {
                    "since": held["since"] if held else ts,
                    "last": max(ts, held["last"]) if held else ts,
                    "action": rule.action,
                    "recovered": None,
                }
            elif rule.name in card.escalated:
                held = card.escalated[rule.name]
                held["last"] = max(held["last"], ts)
                held["recovered"] = None
        return True

    def observe_conditions(self, identity: str, present: Iterable[str], now: float) -> None:
        """The condition keys present on card ``identity`` at ``now`` (one patrol); the
        keys of duration rules not in ``present`` are absent."""
        watched = {k for r in self.rules.duration for k in r.keys}
        here = set(present) & watched
        card = self._cards.get(identity)
        if card is None:
            if not here:
                return
            card = self._cards.setdefault(identity, _Card())
        for key in here:
            cond = card.conditions.get(key)
            if cond is None:
                card.conditions[key] = {"since": now, "absent_since": None}
            else:
                cond["absent_since"] = None
        for key in list(card.conditions):
            if key in here:
                continue
            cond = card.conditions[key]
            if cond["absent_since"] is None:
                cond["absent_since"] = now
            recover = max(
                (r.recover_seconds for r in self.rules.duration if key in r.keys), default=0.0
            )
            if now - cond["absent_since"] >= recover:
                del card.conditions[key]

    def observe_present(self, identity: str, keys: Iterable[str], now: float) -> list[str]:
        """One patrol's state keys on card ``identity`` (``check:<name>`` of its findings,
        the codes of its plugins' code findings, :func:`hetpatrol.actions.apply.state_keys`).

        Feeds the duration rules (:meth:`observe_conditions`), and counts a key of a
        frequency rule as one occurrence at ``now`` when it was not present at the
        previous call: a code that stays up for many patrols is one fault, one that
        clears and comes back is two (MindCluster counts fault occurrences, not polls).
        Returns the keys counted."""
        keys = set(keys)
        self.observe_conditions(identity, keys, now)
        freq = {k for r in self.rules.frequency for k in r.keys}
        card = self._cards.get(identity)
        before = set(card.present) if card is not None else set()
        counted = []
        for key in sorted((keys & freq) - before):
            if self.observe_event(identity, key, now, now, reread=False):
                counted.append(key)
        now_present = sorted(keys & freq)
        card = self._cards.get(identity)
        if card is None and now_present:
            card = self._cards.setdefault(identity, _Card())
        if card is not None:
            card.present = now_present
            # the fault recovered: none of a rule's keys is present any more
            for rule in self.rules.frequency:
                held = card.escalated.get(rule.name)
                if held is None or held.get("recovered") is not None:
                    continue
                if rule.keys & before and not rule.keys & keys:
                    held["recovered"] = now
        return counted

    def clear(self, identity: str, rule_name: str | None = None) -> None:
        """An operator released the card: forget one rule's escalation (or all, with its
        counts) for ``identity``."""
        card = self._cards.get(identity)
        if card is None:
            return
        if rule_name is None:
            del self._cards[identity]
        else:
            card.escalated.pop(rule_name, None)

    # ----------------------------------------------------------------- output
    def decay(self, now: float) -> None:
        """Drop occurrences older than their longest window, released escalations and
        cards with nothing left."""
        for identity in list(self._cards):
            card = self._cards[identity]
            for key in list(card.events):
                windows = [r.window_seconds for r in self.rules.frequency if key in r.keys]
                if not windows:
                    del card.events[key]
                    continue
                card.events[key] = [t for t in card.events[key] if t >= now - max(windows)]
                if not card.events[key]:
                    del card.events[key]
            for name in list(card.escalated):
                rule = next((r for r in self.rules.frequency if r.name == name), None)
                if rule is None or _released(card, rule, card.escalated[name], now):
                    del card.escalated[name]
            if not (card.events or card.escalated or card.conditions or card.present):
                del self._cards[identity]

    def actions(self, identity: str, now: float) -> list[ActionVerdict]:
        """The escalated actions in force on card ``identity`` at ``now`` (after
        :meth:`decay`), one per rule; empty when none."""
        card = self._cards.get(identity)
        if card is None:
            return []
        out = []
        for rule in self.rules.frequency:
            held = card.escalated.get(rule.name)
            if held is None or _released(card, rule, held, now):
                continue
            what = "/".join(sorted(rule.keys)) if len(rule.keys) <= 3 else "listed codes"
            out.append(
                ActionVerdict(
                    rule.action,
                    "escalation",
                    rule.name,
                    f"{rule.times} x {what} within {rule.window_seconds:g} s ({rule.source})",
                )
            )
        for rule in self.rules.duration:
            for key in sorted(rule.keys):
                cond = card.conditions.get(key)
                if cond is None or cond["absent_since"] is not None:
                    continue
                lasted = now - cond["since"]
                if lasted > rule.fault_seconds:
                    out.append(
                        ActionVerdict(
                            rule.action,
                            "escalation",
                            rule.name,
                            f"{key} for {lasted:.0f} s > {rule.fault_seconds:g} s ({rule.source})",
                        )
                    )
                    break
        return out

    def identities(self) -> list[str]:
        return sorted(self._cards)

    # ------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state: ``{"schema", "cards": {identity: {"events": {key: [t]},
        "escalated": {rule: {since, last, action, recovered}}, "conditions": {key: {since,
        absent_since}}, "present": [key]}}}``."""
        return {
            "schema": STATE_SCHEMA,
            "cards": {
                ident: {
                    "events": {k: list(v) for k, v in sorted(c.events.items())},
                    "escalated": {k: dict(v) for k, v in sorted(c.escalated.items())},
                    "conditions": {k: dict(v) for k, v in sorted(c.conditions.items())},
                    "present": list(c.present),
                }
                for ident, c in sorted(self._cards.items())
            },
        }

    @classmethod
    def from_dict(cls, doc: Any, now: float, rules: EscalationRules | None = None) -> Escalation:
        """Rebuild from :meth:`to_dict` output as of ``now``: events outside their
        windows, rules that no longer exist and malformed entries are dropped (a damaged
        or foreign document gives an empty state, never an exception). A condition's
        timer is kept: the time the daemon was down counts as the condition going on
        only if the next patrol still sees it.

        The wall clock may have been stepped while the daemon was down: an occurrence
        stamped after ``now`` (beyond :data:`FUTURE_SLACK_SECONDS`) is dropped, and an
        escalation's or a condition's time after ``now`` becomes ``now`` (the hold goes
        on, timed afresh: a clock step neither releases a card nor makes a condition
        look as if it had lasted)."""
        esc = cls(rules)
        if not isinstance(doc, Mapping) or doc.get("schema") != STATE_SCHEMA:
            return esc
        cards = doc.get("cards")
        if not isinstance(cards, Mapping):
            return esc
        names = {r.name: r for r in esc.rules.frequency}
        for ident, raw in cards.items():
            if not isinstance(ident, str) or not isinstance(raw, Mapping):
                continue
            card = _Card()
            for key, times in _mapping(raw.get("events")).items():
                if isinstance(key, str) and isinstance(times, list):
                    kept = sorted(
                        {
                            t
                            for t in (_finite(x) for x in times)
                            if t is not None and t <= now + FUTURE_SLACK_SECONDS
                        }
                    )
                    if kept:
                        card.events[key] = kept[-MAX_EVENTS_PER_KEY:]
            for name, held in _mapping(raw.get("escalated")).items():
                if name in names and isinstance(held, Mapping):
                    since, last = _finite(held.get("since")), _finite(held.get("last"))
                    recovered = _finite(held.get("recovered"))
                    if since is not None and last is not None:
                        card.escalated[name] = {
                            "since": min(since, now),
                            "last": min(last, now),
                            "action": names[name].action,
                            "recovered": None if recovered is None else min(recovered, now),
                        }
            for key, cond in _mapping(raw.get("conditions")).items():
                if isinstance(key, str) and isinstance(cond, Mapping):
                    since = _finite(cond.get("since"))
                    absent = cond.get("absent_since")
                    absent = _finite(absent) if absent is not None else None
                    if since is not None:
                        card.conditions[key] = {
                            "since": min(since, now),
                            "absent_since": None if absent is None else min(absent, now),
                        }
            present = raw.get("present")
            if isinstance(present, list):
                card.present = sorted({k for k in present if isinstance(k, str)})
            esc._cards[ident] = card
        esc.decay(now)
        return esc


def rules_from_config(section: Mapping[str, Any] | None) -> EscalationRules:
    """Rules from a config section ``{frequency: [...], duration: [...]}``; each list
    replaces the default list when given. Items: ``{name, keys, times, window_seconds,
    action, release_seconds}`` / ``{name, keys, fault_seconds, recover_seconds,
    action}``. Raises ValueError naming the bad item."""
    if not section:
        return EscalationRules()
    freq = dur = None  # a list not given: the defaults, looked up on first use
    try:
        if "frequency" in section:
            freq = tuple(
                FrequencyRule(
                    str(i["name"]),
                    frozenset(str(k) for k in i["keys"]),
                    int(i["times"]),
                    float(i["window_seconds"]),
                    parse_action(i["action"]),
                    None if i.get("release_seconds") is None else float(i["release_seconds"]),
                    source="config",
                )
                for i in section["frequency"] or ()
            )
        if "duration" in section:
            dur = tuple(
                DurationRule(
                    str(i["name"]),
                    frozenset(str(k) for k in i["keys"]),
                    float(i["fault_seconds"]),
                    parse_action(i["action"]),
                    float(i.get("recover_seconds") or 0.0),
                    source="config",
                )
                for i in section["duration"] or ()
            )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"escalation rule is missing or has a bad field: {exc}") from None
    return EscalationRules(freq, dur)


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else ``{}`` (a damaged state file's part)."""
    return value if isinstance(value, Mapping) else {}
