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
  the tool gave bus ids for its other cards: critical (the NVIDIA case is a GPU the
  driver lost: it needs a reset). When the tool gives no bus id for some cards, as many
  census cards as those are taken as watched (they cannot be told apart); only the
  rest are findings, at warning;
- the plugin is ``absent`` (its tool is not installed): warning.

A collector that failed or hung gives no ``pci_unwatched`` (its own finding says it).
When the bus could not be read, one ``pci_census`` info finding says so: the check is
then skipped, never silent. The section ``pci_census`` (``enabled``, ``root``,
``interval_seconds``, ``absent_recheck_seconds``) is declared here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
        },
    },
}


@dataclass(frozen=True)
class CensusSettings:
    """The ``pci_census`` section: read the bus (under ``root``) every
    ``interval_seconds``; a plugin ``absent`` whose vendor is not on the bus is asked
    again only every ``absent_recheck_seconds`` (or when its vendor appears)."""

    enabled: bool = True
    root: str = "/"
    interval_seconds: float = 60.0
    absent_recheck_seconds: float = 600.0


def build_top(data: Mapping[str, Any]) -> CensusSettings:
    """The ``pci_census`` section of the config file's top level ``data``."""
    s = data.get("pci_census") or {}
    base = CensusSettings()
    return CensusSettings(
        enabled=bool(s.get("enabled", base.enabled)),
        root=str(s.get("root", base.root)),
        interval_seconds=float(s.get("interval_seconds", base.interval_seconds)),
        absent_recheck_seconds=float(s.get("absent_recheck_seconds", base.absent_recheck_seconds)),
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
    pc: PatrolCensus, cards: Sequence[CardRecord], collectors: Sequence[CollectorStatus]
) -> tuple[list[Finding], list[dict[str, Any]]]:
    """``(findings, entries)``: a ``pci_unwatched`` finding per census card no collector
    listed, and every census card as a dict with ``plugin``, ``card_type``, ``watched``
    and ``reason`` (an unwatched one: all of :meth:`CensusCard.to_dict` as well)."""
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
            elif fn.driver is None:
                reason = "no driver bound (kernel module not loaded or failed to probe)"
            elif status is not None and status.state == STATE_ABSENT:
                reason = f"{plugin} collector absent: {status.error or 'tool not found'}"
            else:
                reason = f"the {plugin} tool does not list it"
                if listed.get(plugin) and not anonymous.get(plugin):
                    severity = HEALTH_CRITICAL
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
                    )
                )
        # a watched card is only counted (the patrol line keeps the unwatched ones)
        entry = {"plugin": plugin, "card_type": cc.card_type} if watched else cc.to_dict()
        entry["watched"] = watched
        entry["reason"] = reason
        entries.append(entry)
    return findings, entries


def summary(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The patrol line's ``pci_census`` key, bounded by the card types and the unwatched
    cards (not every card every patrol): ``cards`` (count), ``types`` (per plugin and
    card type: cards, unwatched) and ``unwatched`` (bus id, plugin, card type, PCI id,
    driver, reason of each)."""
    types: dict[tuple[str, str | None], list[int]] = {}
    for e in entries:
        t = types.setdefault((e["plugin"], e["card_type"]), [0, 0])
        t[0] += 1
        t[1] += not e["watched"]
    keep = ("bus_id", "plugin", "card_type", "pci_id", "driver", "reason")
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
    is switched off) against the collectors' cards."""

    name = NAME

    def __init__(self, provider: Callable[[], PatrolCensus | None]):
        self.provider = provider

    def run(
        self, cards: Sequence[CardRecord], collectors: Sequence[CollectorStatus], config: Any
    ) -> NodeCheckResult | None:
        settings: CensusSettings = config.top[NAME]
        pc = self.provider() if settings.enabled else None
        if pc is None:
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
        findings, entries = judge(pc, cards, collectors)
        return NodeCheckResult(tuple(findings), {**data, **summary(entries)})


__all__ = ["NAME", "TOP_SCHEMA", "CensusSettings", "PatrolCensus", "PciCensusCheck", "judge"]
