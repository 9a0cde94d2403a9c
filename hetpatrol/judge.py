"""Running the checks: every card check family on a record, and a node check safely.

The families are listed in :mod:`hetpatrol.checks.registry`; each gets its own settings
for the card's profile (``profile.checks[NAME]``), its top-level settings
(``config.top[NAME]``) and the words of the card's vendor, declared by its plugin
(:attr:`hetpatrol.collector.Collector.vendor_info`). Only judges: never reads hardware.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from hetpatrol.checks.facts import BootFacts, CardFacts, NodeCheck, NodeCheckResult
from hetpatrol.checks.registry import CARD_CHECKS
from hetpatrol.collector import CollectorStatus, VendorInfo, load_collector
from hetpatrol.config import Config
from hetpatrol.logs import get_logger
from hetpatrol.schema import HEALTH_OK, HEALTH_UNKNOWN, CardRecord, Finding, worst

log = get_logger("hetpatrol.judge")


@lru_cache(maxsize=64)
def vendor_info(vendor: str) -> VendorInfo:
    """The words the plugin registered as ``vendor`` declares; empty when there is no
    such plugin or it cannot be loaded (its health words are then ``unknown``)."""
    try:
        return load_collector(vendor).vendor_info
    except Exception:  # noqa: BLE001 - a broken plugin is reported where it is configured
        return VendorInfo()


def judge(record: CardRecord, config: Config, boot: BootFacts | None = None) -> CardRecord:
    """Apply the matching profile to ``record`` in place: GRES name, findings, health.
    ``boot``: the card's place in this boot (post-boot grace, learned links), none
    outside the daemon's patrols.

    Returns the same record. ``health`` is the worst finding severity, ``ok`` when there
    is none; a record that could not be read is never ``ok``.
    """
    profile = config.profile_for(record.vendor, record.card_type, record.model)
    if record.gres is None:
        record.gres = profile.gres
    vendor = vendor_info(record.vendor)
    for check in CARD_CHECKS:
        settings = profile.checks.get(check.NAME)
        if settings is None:
            continue
        facts = CardFacts(vendor=vendor, top=config.top.get(check.NAME), boot=boot or BootFacts())
        record.findings.extend(check.evaluate(record, settings, facts))
    record.health = worst(*(f.severity for f in record.findings))
    if not record.read_ok and record.health == HEALTH_OK:
        record.health = HEALTH_UNKNOWN
    return record


def run_node_check(
    check: NodeCheck,
    cards: Sequence[CardRecord],
    collectors: Sequence[CollectorStatus],
    config: Config,
) -> NodeCheckResult | None:
    """Run ``check``; a bug in it becomes an ``unknown`` node finding, never a crash."""
    try:
        return check.run(cards, collectors, config)
    except Exception as exc:  # noqa: BLE001 - a broken check must not stop the patrol
        log.error("node_check_failed", check=check.name, error=f"{type(exc).__name__}: {exc}")
        return NodeCheckResult(
            findings=(
                Finding(
                    f"{check.name}_check_failed",
                    HEALTH_UNKNOWN,
                    f"node check {check.name} failed: {type(exc).__name__}: {exc}",
                ),
            )
        )
