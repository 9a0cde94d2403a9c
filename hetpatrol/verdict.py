"""Verdict words, their order and their Nagios exit codes: the bottom of the record.

Imported by :mod:`hetpatrol.schema` (which re-exports every name) and by the paths Slurm
runs on every node (``hetpatrol check``), which must not pay for the record's dataclasses.
"""

from __future__ import annotations

HEALTH_OK = "ok"
HEALTH_WARNING = "warning"
HEALTH_CRITICAL = "critical"
HEALTH_UNKNOWN = "unknown"
HEALTH_STATES = (HEALTH_OK, HEALTH_WARNING, HEALTH_CRITICAL, HEALTH_UNKNOWN)

SEVERITY_INFO = "info"
SEVERITIES = (SEVERITY_INFO, HEALTH_WARNING, HEALTH_CRITICAL, HEALTH_UNKNOWN)

#: Order used to combine verdicts: the worst wins. ``unknown`` ranks between warning and
#: critical: a card nobody can read is worse than a warm one, better than a dead one.
_RANK = {HEALTH_OK: 0, SEVERITY_INFO: 0, HEALTH_WARNING: 1, HEALTH_UNKNOWN: 2, HEALTH_CRITICAL: 3}

#: Nagios plugin exit codes for a verdict.
EXIT_CODES = {HEALTH_OK: 0, HEALTH_WARNING: 1, HEALTH_CRITICAL: 2, HEALTH_UNKNOWN: 3}


def worst(*states: str) -> str:
    """Return the worst of the given verdicts (``ok`` when none is given)."""
    result = HEALTH_OK
    for state in states:
        if _RANK[state] > _RANK[result]:
            result = state
    return HEALTH_OK if result == SEVERITY_INFO else result
