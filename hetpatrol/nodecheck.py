"""Node checks: judgements about the node as a whole, made before the report is built.

A node check looks at the judged cards of one patrol (after the recovery hold) and
returns node findings plus a JSON-ready summary that lands in the ``kind: "patrol"``
line under the check's :attr:`NodeCheck.name` (the GRES registration check writes
``gres``). It may read slow outside state (``scontrol``) but must bound and cache it
itself. It never changes the cards and never writes anywhere: data still flows one way,
collectors -> thresholds -> node checks -> immutable report -> exporters/actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from hetpatrol.schema import HEALTH_UNKNOWN, CardRecord, Finding

if TYPE_CHECKING:
    from hetpatrol.config import Config
    from hetpatrol.patrol import CollectorStatus

log = structlog.get_logger("hetpatrol.nodecheck")


@dataclass(frozen=True)
class NodeCheckResult:
    """Node findings of one check, and its summary for the patrol line (JSON-ready)."""

    findings: tuple[Finding, ...] = ()
    data: dict[str, Any] | None = None


class NodeCheck(Protocol):
    """The interface :class:`~hetpatrol.patrol.Patroller` calls once per patrol."""

    #: key of this check's summary in the patrol line
    name: str

    def run(
        self,
        cards: Sequence[CardRecord],
        collectors: Sequence[CollectorStatus],
        config: Config,
    ) -> NodeCheckResult | None:
        """Judge the node from ``cards`` (and how each collector fared); None when off."""
        ...


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


def default_node_checks() -> list[NodeCheck]:
    """The built-in node checks (each is a no-op while its config section is off)."""
    from hetpatrol.slurm.inventory import GresCheck

    return [GresCheck()]
