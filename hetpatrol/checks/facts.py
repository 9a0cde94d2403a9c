"""What a check is given besides the records: the shapes shared by every check family.

A *card check* family is a module with ``NAME``, ``PROFILE_SCHEMA`` (the keys it adds to
a profile and to ``defaults``), ``build_profile(defaults, profile, where)`` (its settings
for one profile; ``where`` is the key path of ``profile`` in the file, for errors) and
``evaluate(record, settings, facts) -> list[Finding]``; it may also declare top-level
keys (``TOP_SCHEMA`` and ``build_top(data, source)``), handed to ``evaluate`` as
``facts.top``. A *node check* is an object with ``name`` and ``run(cards, collectors,
config)`` returning a :class:`NodeCheckResult` (None when switched off).
:mod:`hetpatrol.checks.registry` lists them; :mod:`hetpatrol.judge` runs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hetpatrol.collector import CollectorStatus, VendorInfo
from hetpatrol.schema import CardRecord, Finding


@dataclass(frozen=True)
class BootFacts:
    """Where the card's patrol stands in this boot (:class:`hetpatrol.boot.BootWatch`):
    ``patrols`` of this boot so far (1: the first after boot; 0: not counted, as in a
    check run outside the daemon), and ``learned_links``, link kind -> links up in the
    card's first healthy patrol of this boot (empty until there was one)."""

    patrols: int = 0
    learned_links: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CardFacts:
    """What a card check reads besides the record and its profile settings: the vendor's
    words (declared by its plugin), the check's top-level settings (or None) and the
    card's place in this boot."""

    vendor: VendorInfo = VendorInfo()
    top: Any = None
    boot: BootFacts = BootFacts()


@dataclass(frozen=True)
class NodeCheckResult:
    """Node findings of one check, and its summary for the patrol line (JSON-ready)."""

    findings: tuple[Finding, ...] = ()
    data: dict[str, Any] | None = None


class NodeCheck(Protocol):
    """The interface the patrol calls once per patrol. ``config`` is the
    :class:`hetpatrol.config.Config` (a node check reads its own section of it)."""

    #: key of this check's summary in the patrol line
    name: str

    def run(
        self,
        cards: Sequence[CardRecord],
        collectors: Sequence[CollectorStatus],
        config: Any,
    ) -> NodeCheckResult | None:
        """Judge the node from ``cards`` (and how each collector fared); None when off."""
        ...
