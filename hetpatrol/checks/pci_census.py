"""Cards nobody watches: the PCI census (:mod:`hetpatrol.pci_census`) against the cards
the collectors listed.

Every census card (a PCI function a plugin's ``VendorInfo.pci`` calls its card) is
matched to a collector's card by bus id (``dddd:bb:dd.f``; a card listed by its
function 0 watches the other functions of its slot too). One not matched is a node
finding ``pci_unwatched`` naming its bus id, PCI id and why nobody reads it:

- ``plugin not enabled`` (``collectors.<name>.enabled: false``, or not in the config)
  or ``no plugin installed``: warning;
- ``no driver bound`` (sysfs has no ``driver`` link: the module never loaded or failed to
  probe): warning;
- ``tool does not list it``: the plugin answered (``ok``), the card has its driver, and
  the tool gave bus ids for its other cards, or listed none (NVML's "No devices were
  found": every GPU's RmInitAdapter failed): the NVIDIA case is a GPU the driver lost,
  it needs a reset. One patrol's answer is no proof: a GPU is briefly missing from NVML
  while an admin's ``nvidia-smi -r`` resets it or a tool gives a partial answer. So it
  is a warning (action ``watch``, "k of N patrols") until ``unlisted_patrols`` (3)
  patrols in a row have found the same bus id so, then critical (action
  ``reset_card``). When the tool gives no bus id for some cards, as many census cards
  as those are taken as watched (they cannot be told apart); only the rest are
  findings, at warning, never counted;
- the plugin is ``absent`` (its tool is not installed): warning.

The count is kept per bus id (the card's identity on the bus, never its position in a
tool's list) in :attr:`hetpatrol.boot.BootWatch.unlisted_patrols`: it starts again when
the bus id is listed again, leaves the bus, or is unwatched for another reason (no
driver bound: a driver reload unbinds it first); a patrol whose collector failed or hung
(no answer about any card) or whose bus could not be read keeps it without counting.
The state file keeps it with the boot, so a daemon restarted within the boot goes on
from it, and a new boot starts every count at 0. A one-off patrol (``hetpatrol once``,
the Epilog's) counts its own first patrol only: it never makes this critical.

A collector that failed or hung gives no ``pci_unwatched`` (its own finding says it).
When the bus could not be read, one ``pci_census`` info finding says so: the check is
then skipped, never silent. The section ``pci_census`` (``enabled``, ``root``,
``interval_seconds``, ``absent_recheck_seconds``, ``unlisted_patrols``) is declared
here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetpatrol.checks.facts import NodeCheckResult
from hetpatrol.collector import STATE_ABSENT, STATE_OK, CollectorStatus
from hetpatrol.pci_census import Census, CensusCard
from hetpatrol.schema import (
    HEALTH_CRITICAL,
    HEALTH_WARNING,
    SEVERITY_INFO,
    CardRecord,
    Finding,
    normalize_bus_id,
)

NAME = "pci_census"
TOP_SCHEMA: dict[str, Any] = {
    "pci_census": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "enabled": {"type": "boolean"},
            "root": {"type": "string", "minLength": 1},
            "interval_seconds": {"type": "number", "minimum": 0},
            "absent_recheck_seconds": {"type": "number", "minimum": 0},
            # 1 would make one patrol's answer critical (a drain): the project's rule is
            # never a drain from one ambiguous signal
            "unlisted_patrols": {"type": "integer", "minimum": 2, "maximum": 1000},
        },
    },
}


@dataclass(frozen=True)
class CensusSettings:
    """The ``pci_census`` section: read the bus (under ``root``) every
    ``interval_seconds``; a plugin ``absent`` whose vendor is not on the bus is asked
    again only every ``absent_recheck_seconds`` (or when its vendor appears). A card
    whose tool does not list it is critical after ``unlisted_patrols`` patrols in a row
    (3, as ``collectors.nvidia.field_error_patrols``, ``hung_tool_patrols`` and
    ``stray_process.patrols``: at the bundled 10 s interval 20 to 30 s, longer than an
    ``nvidia-smi -r`` of one idle GPU takes, NVIDIA/NVSentinel#1690 "the same reset
    succeed[s] seconds later")."""

    enabled: bool = True
    root: str = "/"
    interval_seconds: float = 60.0
    absent_recheck_seconds: float = 600.0
    unlisted_patrols: int = 3


def build_top(data: Mapping[str, Any]) -> CensusSettings:
    """The ``pci_census`` section of the config file's top level ``data``."""
    s = data.get("pci_census") or {}
    base = CensusSettings()
    return CensusSettings(
        enabled=bool(s.get("enabled", base.enabled)),
        root=str(s.get("root", base.root)),
        interval_seconds=float(s.get("interval_seconds", base.interval_seconds)),
        absent_recheck_seconds=float(s.get("absent_recheck_seconds", base.absent_recheck_seconds)),
        unlisted_patrols=int(s.get("unlisted_patrols", base.unlisted_patrols)),
    )


@dataclass(frozen=True)
class PatrolCensus:
    """What the patrol hands the check: this patrol's census, its cards, and the plugins
    enabled in the config and installed (``installed``: loadable entry points)."""

    census: Census
    cards: tuple[CensusCard, ...]
    enabled: frozenset[str]
    installed: frozenset[str]


def _slot(bus_id: str) -> str:
    return bus_id.rsplit(".", 1)[0]


def judge(
    pc: PatrolCensus,
    cards: Sequence[CardRecord],
    collectors: Sequence[CollectorStatus],
    unlisted: Mapping[str, int] | None = None,
    patrols: int = CensusSettings.unlisted_patrols,
) -> tuple[list[Finding], list[dict[str, Any]], dict[str, int]]:
    """``(findings, entries, counts)``: a ``pci_unwatched`` finding per census card no
    collector listed; every census card as a dict with ``plugin``, ``card_type``,
    ``watched`` and ``reason`` (an unwatched one: all of :meth:`CensusCard.to_dict` and
    ``patrols``, its count or None, as well); and this patrol's counts, bus id ->
    patrols in a row its tool did not list it (``unlisted``: the last patrol's; a card
    reaching ``patrols`` is critical, see the module docstring)."""
    before = unlisted or {}
    counts: dict[str, int] = {}
    states = {c.name: c for c in collectors}
    listed: dict[str, set[str]] = {}
    slots: dict[str, set[str]] = {}
    anonymous: dict[str, int] = {}
    for rec in cards:
        bus = normalize_bus_id(rec.bus_id)
        if bus is None:
            anonymous[rec.vendor] = anonymous.get(rec.vendor, 0) + 1
            continue
        listed.setdefault(rec.vendor, set()).add(bus)
        slots.setdefault(rec.vendor, set()).add(_slot(bus))
    findings: list[Finding] = []
    entries: list[dict[str, Any]] = []
    for cc in pc.cards:
        fn = cc.function
        plugin = cc.plugin
        watched = fn.bus_id in listed.get(plugin, ()) or _slot(fn.bus_id) in slots.get(plugin, ())
        reason = None
        severity = HEALTH_WARNING
        count = None
        status = states.get(plugin)
        if not watched and anonymous.get(plugin, 0) > 0:
            anonymous[plugin] -= 1  # a card listed without bus id: this may be it
            watched = True
            reason = "matched by count: the tool gives no bus id"
        if not watched:
            if plugin not in pc.installed:
                reason = f"no plugin {plugin!r} installed"
            elif plugin not in pc.enabled:
                reason = f"plugin {plugin!r} not enabled (collectors.{plugin})"
            elif status is not None and status.state not in (STATE_OK, STATE_ABSENT):
                reason = f"{plugin} collector {status.state}"
                severity = None  # its own collector_failed / collector_hung finding says it
                if fn.bus_id in before:  # no answer about any card: kept, not counted
                    counts[fn.bus_id] = before[fn.bus_id]
            elif fn.driver is None:
                reason = "no driver bound (kernel module not loaded or failed to probe)"
            elif status is not None and status.state == STATE_ABSENT:
                reason = f"{plugin} collector absent: {status.error or 'tool not found'}"
            else:
                reason = f"the {plugin} tool does not list it"
                if not anonymous.get(plugin):
                    # the lost-card case: the same bus id, patrols in a row (a tool that
                    # lists no card at all, NVML's "No devices were found" with every
                    # GPU's driver bound, is every card lost: counted too)
                    count = counts[fn.bus_id] = before.get(fn.bus_id, 0) + 1
                    if count >= patrols:
                        severity = HEALTH_CRITICAL
                        reason += (
                            f" in {count} patrols in a row (pci_census.unlisted_patrols {patrols})"
                        )
                    else:
                        reason += (
                            f" ({count} of {patrols} patrols: critical, action reset_card, "
                            f"only after {patrols} in a row; a single patrol, as hetpatrol "
                            "once or the Epilog's, never drains for it)"
                        )
            if severity is not None:
                what = f"{plugin} {cc.card_type or 'card'} [{fn.pci_id}]"
                driver = f", driver {fn.driver}" if fn.driver else ""
                findings.append(
                    Finding(
                        "pci_unwatched",
                        severity,
                        f"{what} at {fn.bus_id} is on the PCI bus{driver} but no collector "
                        f"reads it: {reason}",
                        value=fn.bus_id,
                        threshold=patrols if count is not None else None,
                    )
                )
        # a watched card is only counted (the patrol line keeps the unwatched ones)
        entry = {"plugin": plugin, "card_type": cc.card_type} if watched else cc.to_dict()
        entry["watched"] = watched
        entry["reason"] = reason
        if not watched:
            entry["patrols"] = count
        entries.append(entry)
    return findings, entries, counts


def summary(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The patrol line's ``pci_census`` key, bounded by the card types and the unwatched
    cards (not every card every patrol): ``cards`` (count), ``types`` (per plugin and
    card type: cards, unwatched) and ``unwatched`` (bus id, plugin, card type, PCI id,
    driver, reason and ``patrols`` of each: the patrols in a row its tool did not list
    it, null when that is not why it is unwatched)."""
    types: dict[tuple[str, str | None], list[int]] = {}
    for e in entries:
        t = types.setdefault((e["plugin"], e["card_type"]), [0, 0])
        t[0] += 1
        t[1] += not e["watched"]
    keep = ("bus_id", "plugin", "card_type", "pci_id", "driver", "reason", "patrols")
    return {
        "cards": len(entries),
        "types": [
            {"vendor": v, "card_type": k, "cards": n, "unwatched": u}
            for (v, k), (n, u) in sorted(types.items(), key=lambda i: (i[0][0], i[0][1] or ""))
        ],
        "unwatched": [{k: e[k] for k in keep} for e in entries if not e["watched"]],
    }


class PciCensusCheck:
    """The node check: the census of this patrol (``provider()``, None when the census
    is switched off) against the collectors' cards. ``counts()`` gives the mapping the
    unlisted counts live in across patrols (bus id -> patrols in a row; the patrol's
    :attr:`hetpatrol.boot.BootWatch.unlisted_patrols`, kept per boot and in the state
    file); without it the check keeps its own, for its life."""

    name = NAME

    def __init__(
        self,
        provider: Callable[[], PatrolCensus | None],
        counts: Callable[[], MutableMapping[str, int]] | None = None,
    ):
        self.provider = provider
        own: dict[str, int] = {}
        self.counts = counts or (lambda: own)

    def run(
        self, cards: Sequence[CardRecord], collectors: Sequence[CollectorStatus], config: Any
    ) -> NodeCheckResult | None:
        settings: CensusSettings = config.top[NAME]
        pc = self.provider() if settings.enabled else None
        if pc is None:
            self.counts().clear()  # switched off: no count survives to a later patrol
            return None
        census = pc.census
        data: dict[str, Any] = {"source": census.source, "error": census.error}
        if not census.known:
            finding = Finding(
                "pci_census",
                SEVERITY_INFO,
                f"PCI bus could not be read, cards no collector lists cannot be seen: "
                f"{census.error}",
            )
            return NodeCheckResult((finding,), data)
        store = self.counts()
        findings, entries, counts = judge(
            pc, cards, collectors, dict(store), settings.unlisted_patrols
        )
        store.clear()
        store.update(counts)
        return NodeCheckResult(tuple(findings), {**data, **summary(entries)})


__all__ = ["NAME", "TOP_SCHEMA", "CensusSettings", "PatrolCensus", "PciCensusCheck", "judge"]
