"""Stray processes: a process holding card memory outside the Slurm job the card belongs
to, for ``patrols`` patrols in a row, is ``stray_process`` (a user problem, not a card
fault: action ``watch``).

Stray means, on a card whose Slurm allocation was read this patrol:

- the card is allocated to a job, and the process is not in that job's cgroup (its
  :attr:`~hetpatrol.schema.ProcessInfo.job_id`, from the cgroup path as Slurm makes it,
  :mod:`hetpatrol.processes`, is another job or none): a process that escaped its job
  (``setsid`` + ``nohup`` from an earlier job, an ssh session outside
  ``pam_slurm_adopt``), or a daemon a user started;
- or the card is allocated to no job and a process holds memory on it.

Prior art: soperator (nebius/soperator PR #1392) drains a node on "processes on GPUs
that are not part of any Slurm job" and undrains it once they are gone. Here the
finding clears itself the first patrol the process is gone (or its job owns the card);
a site that wants such a node drained maps the check to a draining action
(``actions.overrides: {"check:stray_process": reset_card}``: the drain reason then
names ``stray_process``, the pid, user and memory).

Which processes: every vendor whose plugin lists card processes (``CardRecord.
processes``: NVML compute/graphics processes, ``npu-smi info`` process table, the
``amd-smi``/``hy-smi``/``cnmon``... process lists) with ``memory_bytes`` at least
``min_memory_bytes``. A card whose allocation could not be read is not judged (the
patrol says why in an ``info`` node finding ``card_jobs_unread``); nor is a card a job
holds unless ``ProctrackType=proctrack/cgroup`` (without a job cgroup a job's own
process cannot be told from an escaped one: ``info`` node finding
``stray_process_unjudged``, :mod:`hetpatrol.slurm.card_jobs`). A process whose
owner could not be read (``user`` None: ``/proc`` mounted ``hidepid=2`` for the
daemon's user, a pid gone between the vendor's list and the lookup, a pid of another
pid namespace) or whose job is a 26.05 SLUID (squeue's job ids are numbers: the two
cannot be compared) is not judged: it is no proof of a process outside its job, and
on a ``hidepid`` host it would make every busy card stray. Seen so for ``patrols``
patrols it is said in an ``info`` finding ``stray_process_unjudged`` (action ``none``)
naming the pids.

Config (top level)::

    stray_process:
      enabled: true          # judged only where the card's jobs are known (Slurm on)
      patrols: 3             # consecutive patrols a process must be seen stray
      min_memory_bytes: 1048576

State (how many patrols each process was seen stray) is keyed by card identity and pid,
never position, in :class:`StrayWatch`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetpatrol.actions.escalation import card_identity
from hetpatrol.schema import (
    HEALTH_WARNING,
    SEVERITY_INFO,
    CardRecord,
    Finding,
    ProcessInfo,
    worst,
)

NAME = "stray_process"
FINDING = "stray_process"
UNJUDGED = "stray_process_unjudged"
#: most pids an unjudged finding names
MAX_NAMED = 8
MIB = 1024 * 1024

TOP_SCHEMA: dict[str, Any] = {
    NAME: {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "enabled": {"type": "boolean"},
            "patrols": {"type": "integer", "minimum": 1},
            "min_memory_bytes": {"type": "integer", "minimum": 0},
        },
    }
}


@dataclass(frozen=True)
class StraySettings:
    """``stray_process`` (see the module docstring)."""

    enabled: bool = True
    patrols: int = 3
    min_memory_bytes: int = MIB


def build_top(data: Mapping[str, Any]) -> StraySettings:
    """The ``stray_process`` section of the config file's top level ``data``."""
    s = data.get(NAME) or {}
    base = StraySettings()
    return StraySettings(
        enabled=bool(s.get("enabled", base.enabled)),
        patrols=int(s.get("patrols", base.patrols)),
        min_memory_bytes=int(s.get("min_memory_bytes", base.min_memory_bytes)),
    )


def judged(proc: ProcessInfo, settings: StraySettings) -> bool | None:
    """Whether ``proc`` is one to judge: False below ``min_memory_bytes`` (or memory not
    said), None when it holds enough but its owner was not read or its job is no job
    number (see the module docstring: not judged, said), else True."""
    if proc.memory_bytes is None or proc.memory_bytes < settings.min_memory_bytes:
        return False
    if proc.user is None or (proc.job_id is not None and not proc.job_id.isdigit()):
        return None
    return True


def stray(proc: ProcessInfo, jobs: frozenset[str], settings: StraySettings) -> bool:
    """True when ``proc`` holds at least ``min_memory_bytes`` on a card allocated to
    ``jobs`` (empty: to no job), its owner was read (:func:`judged`), and it is in none
    of them."""
    if not judged(proc, settings):
        return False
    return proc.job_id is None or proc.job_id not in jobs


def _describe(proc: ProcessInfo, jobs: frozenset[str]) -> str:
    user = proc.user if proc.user is not None else "unknown user"
    mib = (proc.memory_bytes or 0) / MIB
    job = f"job {proc.job_id}" if proc.job_id else "no Slurm job"
    where = f"a card allocated to job {', '.join(sorted(jobs))}" if jobs else "a card with no job"
    return f"pid {proc.pid} ({user}, {job}) holds {mib:.0f} MiB on {where}"


class StrayWatch:
    """Counts, per (card identity, pid), the consecutive patrols a process was stray.

    :meth:`observe`: ``jobs_of`` gives the Slurm job ids a card is allocated to (empty:
    none) or None when unknown (the card is then not judged, and its counts kept)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], int] = {}
        #: (card identity, pid) -> patrols in a row the process could not be judged
        self.unjudged: dict[tuple[str, int], int] = {}

    def observe(
        self,
        cards: Sequence[CardRecord],
        jobs_of: Callable[[CardRecord], frozenset[str] | None],
        settings: StraySettings,
    ) -> None:
        if not settings.enabled:
            self.seen.clear()
            self.unjudged.clear()
            return
        now: dict[tuple[str, int], int] = {}
        unjudged: dict[tuple[str, int], int] = {}
        for rec in cards:
            jobs = jobs_of(rec)
            ident = card_identity(rec)
            if jobs is None:
                now.update({k: v for k, v in self.seen.items() if k[0] == ident})
                continue
            unread = []
            for proc in rec.processes:
                if judged(proc, settings) is None:
                    key = (ident, proc.pid)
                    unjudged[key] = self.unjudged.get(key, 0) + 1
                    if unjudged[key] >= settings.patrols:
                        unread.append(proc.pid)
            if unread:
                named = ", ".join(f"pid {p}" for p in sorted(unread)[:MAX_NAMED])
                more = f" and {len(unread) - MAX_NAMED} more" if len(unread) > MAX_NAMED else ""
                rec.findings.append(
                    Finding(
                        UNJUDGED,
                        SEVERITY_INFO,
                        f"{named}{more} hold card memory, but whose process it is could not "
                        "be read (/proc/<pid> hidden, e.g. hidepid=2, or a pid of another "
                        "namespace; or a SLUID job): not judged as stray",
                        value={"pids": sorted(unread)[:MAX_NAMED]},
                        threshold=settings.patrols,
                    )
                )
            for proc in rec.processes:
                if not stray(proc, jobs, settings):
                    continue
                key = (ident, proc.pid)
                count = now[key] = self.seen.get(key, 0) + 1
                if count < settings.patrols:
                    continue
                rec.findings.append(
                    Finding(
                        FINDING,
                        HEALTH_WARNING,
                        f"{_describe(proc, jobs)} for {count} patrols: outside the job "
                        "the card belongs to (a user problem, not a card fault)",
                        value={
                            "pid": proc.pid,
                            "user": proc.user,
                            "memory_bytes": proc.memory_bytes,
                            "job_id": proc.job_id,
                            "card_jobs": sorted(jobs),
                        },
                        threshold=settings.patrols,
                    )
                )
                rec.health = worst(rec.health, HEALTH_WARNING)
        self.seen = now
        self.unjudged = unjudged
