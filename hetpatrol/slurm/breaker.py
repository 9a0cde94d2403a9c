"""The drain circuit breaker: never let one bad rule take a whole partition down.

Before hetpatrol drains its node it counts the nodes of the same partition(s) that are
already drained with hetpatrol's own reason, the reason set within the last
``window_seconds``. When that count has reached the share ``max_share`` of the
partitions' nodes (at least one node may always be drained), the drain is held: a
fleet-wide false positive (a bad driver push, a threshold set too low, a broken tool
version) then drains a few nodes, not every node of the partition. Real faults on many
nodes at once are rare; an operator who sees the breaker open decides.

The count comes from ``sinfo`` (read-only, no privilege needed; the root drain helper is
not involved): ``sinfo -h -N -p <partitions> -o "%N|%T|%H|%E"``, one line per node and
partition: the node, its state (``drained``, ``draining``, ``idle``...), the time its
reason was set (``%H``, local time ``YYYY-MM-DDTHH:MM:SS``) and the reason (``%E``, last:
it may hold ``|``). Format letters from sinfo(1).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass

from hetpatrol.slurm.settings import BreakerSettings
from hetpatrol.slurm.states import ours

#: sinfo's --format for the breaker's count
SINFO_FORMAT = "%N|%T|%H|%E"
#: a reason time at most this far after ``now`` still counts (the controller's clock and
#: this node's may differ a little); one further ahead is a clock step, never recent
CLOCK_SKEW_SECONDS = 60.0


@dataclass(frozen=True)
class NodeRow:
    """One node of the partitions, as sinfo says it."""

    name: str
    state: str
    reason_time: float | None
    reason: str


def parse_sinfo(text: str) -> list[NodeRow]:
    """The rows of ``sinfo -h -N -o "%N|%T|%H|%E"`` (a node listed once per partition is
    kept once). Lines that do not have the four fields are skipped."""
    rows: dict[str, NodeRow] = {}
    for line in text.splitlines():
        parts = line.split("|", 3)
        if len(parts) != 4 or not parts[0].strip():
            continue
        name, state, when, reason = (p.strip() for p in parts)
        try:
            stamp = dt.datetime.fromisoformat(when).timestamp()
        except ValueError:  # "Unknown", "n/a": no reason set
            stamp = None
        rows.setdefault(name, NodeRow(name, state.lower(), stamp, reason))
    return list(rows.values())


def out_of_service(state: str) -> bool:
    """True for the sinfo states (``%T``) of a node taken out: ``drained``/``draining``,
    and, after ``scontrol reboot ASAP nextstate=DOWN``, ``reboot`` / ``reboot^`` (reboot
    requested / issued, seen on slurmctld 22.05.8) and ``down`` (the reboot done)."""
    return "drain" in state or state.startswith(("reboot", "down"))


def recent_drains_of_ours(rows: Iterable[NodeRow], now: float, window: float) -> list[str]:
    """Nodes drained (:func:`out_of_service`) with hetpatrol's reason set within
    ``window`` seconds before ``now``. A reason time more than
    :data:`CLOCK_SKEW_SECONDS` after ``now`` (slurmctld's clock or this node's was
    stepped) is not recent: counted, it would hold every drain until that time came."""
    return [
        r.name
        for r in rows
        if out_of_service(r.state)
        and ours(r.reason)
        and r.reason_time is not None
        and -CLOCK_SKEW_SECONDS <= now - r.reason_time <= window
    ]


def hold_reason(
    rows: list[NodeRow], node: str, now: float, settings: BreakerSettings
) -> str | None:
    """Why this node's drain is held, or None to drain. ``rows``: every node of its
    partitions (this node included)."""
    others = [r for r in rows if r.name != node]
    total = len(others) + 1
    allowed = max(1, math.floor(settings.max_share * total + 1e-9))
    drained = recent_drains_of_ours(others, now, settings.window_seconds)
    if len(drained) < allowed:
        return None
    shown = ", ".join(sorted(drained)[:5]) + (", ..." if len(drained) > 5 else "")
    return (
        f"circuit breaker: {len(drained)} of {total} nodes of its partitions drained by "
        f"hetpatrol in the last {settings.window_seconds:g} s ({shown}); at most "
        f"{allowed} ({settings.max_share:.0%}) may be: the drain is held, look at the fleet"
    )
