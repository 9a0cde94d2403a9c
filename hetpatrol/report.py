"""The report of one patrol: what every exporter, sink and action reads.

Built by :class:`hetpatrol.patrol.Patroller`, immutable once built; the JSONL lines are
encoded once here, so every sink writes the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetpatrol.collector import CollectorStatus
from hetpatrol.kernel_log import KernelLogSnapshot
from hetpatrol.pci_census import Census
from hetpatrol.schema import EXIT_CODES, PATROL_SCHEMA, CardRecord, Finding, rfc3339


@dataclass(frozen=True)
class PatrolReport:
    """The immutable result of one patrol, read by every exporter.

    ``cards`` are judged records; ``card_lines``/``patrol_line`` are the JSONL lines,
    encoded once here so every sink writes the same bytes. ``node_checks`` holds each
    node check's summary by name (``gres``: Slurm registration vs cards), as written
    in the patrol line.
    """

    seq: int
    node: str
    started: float
    finished: float
    cards: tuple[CardRecord, ...]
    collectors: tuple[CollectorStatus, ...]
    node_findings: tuple[Finding, ...]
    changes: tuple[dict[str, Any], ...]
    health: str
    node_checks: Mapping[str, Any] = field(default_factory=dict, repr=False)
    card_lines: tuple[str, ...] = field(default=(), repr=False)
    patrol_line: str = field(default="", repr=False)
    #: ``kind: "event"`` lines of the GPU faults first read from the kernel log in
    #: this patrol (XIDs...), written after the card lines; and that log's snapshot
    event_lines: tuple[str, ...] = field(default=(), repr=False)
    kernel_log: KernelLogSnapshot | None = field(default=None, repr=False)
    #: the PCI census this patrol judged (:mod:`hetpatrol.pci_census`), None without one
    #: (switched off, the scripted collectors of tests)
    census: Census | None = field(default=None, repr=False)
    #: what to do about the node: the highest action of its cards and node findings
    #: (:mod:`hetpatrol.actions`); the escalation state after this patrol (for the state
    #: file, so counts survive a restart)
    action: str = "none"
    #: the id of the run (the daemon's process, kept over reloads) on every JSONL line
    run_id: str = ""
    escalation: Mapping[str, Any] | None = field(default=None, repr=False)
    #: the recent card fault events with their jobs (hetpatrol.actions.fault_events), as
    #: JSON text of a list: the state file's ``fault_events``, encoded when it changes
    fault_events: str = field(default="[]", repr=False)

    @property
    def duration_seconds(self) -> float:
        return self.finished - self.started

    @property
    def exit_code(self) -> int:
        """Nagios convention: 0 ok, 1 warning, 2 critical, 3 unknown."""
        return EXIT_CODES[self.health]

    def jsonl_lines(self) -> tuple[str, ...]:
        """Every JSONL line of this patrol (cards then the patrol summary), with newlines."""
        return (*self.card_lines, *self.event_lines, self.patrol_line)


def patrol_summary(
    seq: int,
    node: str,
    started: float,
    finished: float,
    cards: Sequence[CardRecord],
    collectors: Sequence[CollectorStatus],
    node_findings: Sequence[Finding],
    changes: Sequence[dict[str, Any]],
    health: str,
    node_checks: Mapping[str, Any] | None = None,
    action: str | None = None,
) -> dict[str, Any]:
    """The ``kind: "patrol"`` line as a dict (schema ``hetpatrol.patrol/1``).

    ``node_checks`` adds one key per node check (``gres``).
    """
    counts = {h: 0 for h in ("ok", "warning", "critical", "unknown")}
    for c in cards:
        counts[c.health] += 1
    return {
        "kind": "patrol",
        "schema": PATROL_SCHEMA,
        "ts": rfc3339(finished),
        "node": node,
        "seq": seq,
        "health": health,
        "exit_code": EXIT_CODES[health],
        **({"action": action} if action is not None else {}),
        "duration_seconds": round(finished - started, 6),
        "cards": counts,
        "collectors": {s.name: s.to_dict() for s in collectors},
        "findings": [f.to_dict() for f in node_findings],
        "changes": list(changes),
        **dict(node_checks or {}),
    }


def encode_line(obj: dict[str, Any]) -> str:
    """One JSONL line: compact JSON, UTF-8 text kept, no NaN, a newline at the end."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"
