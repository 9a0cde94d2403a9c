"""Reboot survival: the same fault on the same card in boot after boot -> ``replace_card``.

A reboot is the last repair a node can give itself (``reboot_node``); a fault that is
back on the same card after it was rebooted ``reboots`` times (default 2) is in the card,
not in its state, and the card is for replacement. gpud (leptonai/gpud) takes the same
rule: a GPU fault that persists across two reboots needs hardware inspection.

History is kept per card identity (:func:`hetpatrol.actions.escalation.card_identity`:
UUID, serial, bus id; never the position) and fault family (the finding's ``check``:
``nvlink_down``, ``remapped_rows_failure``, ``xid`` ...) as the boot ids in which the
family was seen critical, with the first and last time seen (seconds since the epoch).
The daemon keeps it in ``reboot-history.json`` beside the state file (it survives the
reboots it counts); ``hetpatrol history clear --card ...`` clears a card (an audit line
goes to the JSONL log). Boots older than ``window_seconds`` (default 30 days) are
forgotten, so a fault twice in a year is not "surviving reboots". Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hetpatrol.actions.vocabulary import REPLACE_CARD, ActionVerdict

HISTORY_SCHEMA = "hetpatrol.reboot_history/1"
HISTORY_FILE = "reboot-history.json"
#: most boots kept per card and family, and most cards kept (a damaged file or a storm of
#: new identities must not grow the file without bound)
MAX_BOOTS = 32
MAX_CARDS = 4096


@dataclass(frozen=True)
class SurvivalRule:
    """``reboots``: reboots a fault must survive (seen in ``reboots + 1`` boots) before
    ``replace_card``; ``window_seconds``: boots last seen longer ago are forgotten;
    ``enabled`` false: no history kept."""

    enabled: bool = True
    reboots: int = 2
    window_seconds: float = 30 * 86400.0


@dataclass
class RebootHistory:
    """Boots each (card identity, fault family) was seen critical in."""

    rule: SurvivalRule = field(default_factory=SurvivalRule)
    #: identity -> family -> {"boots": [boot id, in order first seen], "first", "last"}
    cards: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    #: the (identity, families, boot id, time) of the last patrol (see :meth:`replay`)
    last: list[tuple[str, frozenset[str], str, float]] = field(default_factory=list)
    #: identity -> the card's other names (bus id, serial), for :meth:`clear`
    names: dict[str, list[str]] = field(default_factory=dict)

    def observe(
        self,
        observations: Iterable[tuple[str, Iterable[str]]],
        boot_id: str,
        now: float,
        names: Mapping[str, Iterable[str]] | None = None,
    ) -> bool:
        """Note the families each card holds critical in this patrol of boot
        ``boot_id``; ``names``: identity -> the card's other names (bus id, serial) that
        ``hetpatrol history clear`` may be given. Returns whether anything was added (a
        new boot of a family, or a new family): the file needs writing then."""
        self.last = [(i, frozenset(f), boot_id, now) for i, f in observations if f]
        for identity, _f, _b, _n in self.last:
            known = [n for n in (names or {}).get(identity, ()) if isinstance(n, str) and n]
            if known:
                self.names[identity] = sorted({*self.names.get(identity, []), *known})[:8]
        return self.replay(self.last)

    def replay(self, observations: Iterable[tuple[str, frozenset[str], str, float]]) -> bool:
        """Apply observations again (onto a history re-read from disk). See
        :meth:`observe`."""
        if not self.rule.enabled:
            return False
        changed = False
        for identity, families, boot_id, now in observations:
            card = self.cards.setdefault(identity, {})
            for family in sorted(families):
                entry = card.setdefault(family, {"boots": [], "first": now, "last": now})
                # never moved back: a clock behind (an RTC that lost its time, before
                # NTP) must not stamp a family as last seen years ago (see decay)
                entry["last"] = max(entry["last"], now)
                if boot_id not in entry["boots"]:
                    entry["boots"] = [*entry["boots"], boot_id][-MAX_BOOTS:]
                    changed = True
        return changed

    def verdict(self, identity: str) -> ActionVerdict | None:
        """``replace_card`` when a family of the card was seen in more boots than
        ``reboots`` (it survived that many reboots), else None."""
        if not self.rule.enabled:
            return None
        need = self.rule.reboots + 1
        for family, entry in sorted(self.cards.get(identity, {}).items()):
            boots = entry["boots"]
            if len(boots) >= need:
                return ActionVerdict(
                    REPLACE_CARD,
                    "reboot_history",
                    family,
                    f"{family} seen in {len(boots)} boots: it survived "
                    f"{len(boots) - 1} reboot(s) (>= {self.rule.reboots}): the fault is in "
                    "the card (gpud: a fault across 2 reboots needs hardware inspection)",
                )
        return None

    def clear(self, match: str) -> list[str]:
        """Forget every card whose identity is ``match`` (``uuid:GPU-...``) or ends in it
        after the kind (a UUID, serial or bus id as written: bus ids compared lower
        case). Returns the identities cleared."""
        text = match.strip()
        gone = [
            i
            for i in self.cards
            if i == text
            or i.split(":", 1)[-1] == text
            or (i.startswith("bus:") and i[4:] == text.lower())
            or text in self.names.get(i, ())
            or text.lower() in self.names.get(i, ())
        ]
        for identity in gone:
            del self.cards[identity]
            self.names.pop(identity, None)
        return gone

    def decay(self, now: float) -> None:
        """Forget families last seen more than ``window_seconds`` before ``now``. A
        ``last`` after ``now`` (the clock is behind the one that wrote it, or that one
        ran ahead) is kept: a wrong clock never ages the history, it can only keep a
        family until ``last`` + ``window_seconds``."""
        for identity in list(self.cards):
            card = self.cards[identity]
            for family in list(card):
                if now - card[family]["last"] > self.rule.window_seconds:
                    del card[family]
            if not card:
                del self.cards[identity]
                self.names.pop(identity, None)

    def to_dict(self) -> dict[str, Any]:
        """``{"schema", "cards": {identity: {family: {"boots": [id], "first", "last"}}},
        "names": {identity: [bus id, serial]}}``."""
        return {
            "schema": HISTORY_SCHEMA,
            "cards": {
                i: {f: dict(e) for f, e in sorted(c.items())} for i, c in sorted(self.cards.items())
            },
            "names": {i: list(n) for i, n in sorted(self.names.items()) if i in self.cards},
        }

    @classmethod
    def from_dict(cls, doc: Any, now: float, rule: SurvivalRule | None = None) -> RebootHistory:
        """Rebuild from :meth:`to_dict` output; malformed entries are dropped (a damaged
        or foreign document gives an empty history, never an exception)."""
        out = cls(rule or SurvivalRule())
        if not isinstance(doc, Mapping) or doc.get("schema") != HISTORY_SCHEMA:
            return out
        cards = doc.get("cards")
        if not isinstance(cards, Mapping):
            return out
        for identity, raw in list(cards.items())[:MAX_CARDS]:
            if not isinstance(identity, str) or not isinstance(raw, Mapping):
                continue
            for family, entry in raw.items():
                if not isinstance(family, str) or not isinstance(entry, Mapping):
                    continue
                boots = entry.get("boots")
                first, last = _finite(entry.get("first")), _finite(entry.get("last"))
                if not isinstance(boots, list) or first is None or last is None:
                    continue
                kept = [b for b in boots if isinstance(b, str)][-MAX_BOOTS:]
                if kept:
                    out.cards.setdefault(identity, {})[family] = {
                        "boots": list(dict.fromkeys(kept)),
                        "first": first,
                        "last": last,
                    }
        names = doc.get("names")
        if isinstance(names, Mapping):
            for identity, known in names.items():
                if identity in out.cards and isinstance(known, list):
                    out.names[identity] = [n for n in known if isinstance(n, str)][:8]
        out.decay(now)
        return out


#: the latest time a history entry may hold: 9999-12-31T23:59:59Z, the last second
#: ``datetime`` (and so ``history show``'s RFC 3339 text) can say
LATEST_TIME = 253402300799.0


def _finite(x: Any) -> float | None:
    """A time of an entry (seconds since the epoch), or None: not a number, not finite,
    before the epoch or after :data:`LATEST_TIME` (no clock of the daemon wrote it: a
    damaged file; ``last`` 1e300 made ``history show`` fail with a traceback and kept
    the family for ever)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) and 0 <= x <= LATEST_TIME else None


def rule_from_config(section: Mapping[str, Any] | None) -> SurvivalRule:
    """The ``actions.reboot_survival`` section ``{enabled, reboots, window_seconds}``.
    Raises ValueError naming the bad key."""
    if not section:
        return SurvivalRule()
    try:
        rule = SurvivalRule(
            bool(section.get("enabled", True)),
            int(section.get("reboots", 2)),
            float(section.get("window_seconds", 30 * 86400.0)),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"actions.reboot_survival: {exc}") from None
    if rule.reboots < 1 or not rule.window_seconds > 0:
        raise ValueError("actions.reboot_survival: reboots >= 1 and window_seconds > 0 needed")
    return rule
