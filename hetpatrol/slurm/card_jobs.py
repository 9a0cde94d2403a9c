"""Which Slurm jobs each card of this node is allocated to, from ``squeue --json``.

Read the way the Prolog reads one job (:func:`hetpatrol.slurm.jobguard.
parse_squeue_json`): only Slurm's structured fields (``job_id``, ``job_state``,
``job_resources`` hosts, ``gres_detail`` with its ``(IDX:...)``), never text a user chose
(job name, comment, work directory). A job counts while it holds its cards: state
``RUNNING``, ``SUSPENDED`` or ``COMPLETING`` (squeue(1), JOB STATE CODES; 22.05 gives
``job_state`` as a string, later releases as a list). IDX -> card is
:func:`hetpatrol.slurm.jobguard.match_cards` (the cards of one GRES name in (index,
chip) order).

:class:`CardJobs` runs ``squeue --json`` (beside the given command: the daemon gives
the breaker's ``sinfo``, read-only, as its own user) at most once
per ``cache_seconds`` and answers ``jobs_of(card)``: the job ids (strings) of the card,
empty for none, None when the allocation could not be read (then nothing is judged on
it and :attr:`CardJobs.error` says why).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hetpatrol.schema import CardRecord
from hetpatrol.slurm.inventory import tool_error
from hetpatrol.slurm.jobguard import (
    SQUEUE_JSON_MAX,
    _job_nodes,
    match_cards,
    parse_squeue_json,
    squeue_argv,
)
from hetpatrol.tool import run_tool

#: job states in which a job holds its cards (squeue(1), JOB STATE CODES)
HOLDING_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING"})


def _states(record: Mapping[str, Any]) -> set[str]:
    state = record.get("job_state")
    if isinstance(state, str):
        return {state.upper()}
    if isinstance(state, list):
        return {s.upper() for s in state if isinstance(s, str)}
    return set()


def _card_key(card: CardRecord) -> dict[str, Any]:
    return {
        "vendor": card.vendor,
        "index": card.index,
        "chip": card.chip,
        "gres": card.gres,
        "uuid": card.uuid,
    }


def card_jobs(
    text: str, node: str, cards: Sequence[CardRecord]
) -> tuple[dict[int, frozenset[str]], str | None]:
    """(position of each card in ``cards`` -> its job ids, error). The jobs are those of
    ``squeue --json`` ``text`` that hold cards on ``node``; an unreadable output is
    ``({}, why)``. A job whose GRES cannot be read is named in the error and left out."""
    if len(text) > SQUEUE_JSON_MAX:
        return {}, f"squeue --json: output larger than {SQUEUE_JSON_MAX} bytes"
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return {}, f"squeue --json: not JSON ({type(exc).__name__})"
    jobs = doc.get("jobs") if isinstance(doc, Mapping) else None
    if not isinstance(jobs, list):
        return {}, "squeue --json: no jobs list"
    keys = [_card_key(c) for c in cards]
    out: dict[int, set[str]] = {i: set() for i in range(len(cards))}
    errors: list[str] = []
    for record in jobs:
        if not isinstance(record, Mapping) or not (_states(record) & HOLDING_STATES):
            continue
        job_id = record.get("job_id")
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            continue
        try:
            if node not in _job_nodes(record):
                continue
        except (ValueError, RecursionError):
            continue
        alloc = parse_squeue_json(json.dumps({"jobs": [record]}), str(job_id), node)
        if alloc.errors:
            errors.append(f"job {job_id}: {'; '.join(alloc.errors)}")
            continue
        matched, _missing = match_cards(keys, alloc)
        for card in matched:
            out[next(i for i, k in enumerate(keys) if k is card)].add(str(job_id))
    return {i: frozenset(v) for i, v in out.items()}, ("; ".join(errors) or None)


class CardJobs:
    """``squeue --json`` at most once per ``cache_seconds``; ``jobs_of(card)`` answers
    from the last read (see the module docstring)."""

    def __init__(
        self,
        scontrol: Sequence[str],
        node: str,
        timeout: float = 10.0,
        cache_seconds: float = 60.0,
        runner: Callable[..., Any] = run_tool,
        clock: Callable[[], float] = time.monotonic,
    ):
        head = list(scontrol[:-1])
        self.argv = [*head, *squeue_argv(scontrol[-1])]
        self.node, self.timeout, self.cache_seconds = node, timeout, cache_seconds
        self.runner, self.clock = runner, clock
        self._text: str | None = None
        self._read_at: float | None = None
        self.error: str | None = None
        self._by_identity: dict[int, frozenset[str]] = {}
        self._cards: list[CardRecord] = []
        #: the job ids squeue was read again for since the last read by age
        self._asked: set[str] = set()

    def refresh(self, cards: Sequence[CardRecord]) -> None:
        """Read squeue if the cache is old, or if a process of ``cards`` is in a job
        (its cgroup's job number) that held no card of this node in the last read: a
        job started since that read, whose processes must not be judged against the
        allocation before it (read again once per such job until the next read by
        age). Then map this patrol's ``cards``."""
        now = self.clock()
        aged = self._read_at is None or now - self._read_at >= self.cache_seconds
        unknown: set[str] = set()
        if not aged and self._text is not None:
            held = set().union(*self._by_identity.values()) | self._asked
            unknown = {
                p.job_id
                for c in cards
                for p in c.processes
                if p.job_id is not None and p.job_id.isdigit() and p.job_id not in held
            }
        # asked once per job until the next read by age: a process of a job that holds
        # no card here (a CPU job's process on a GPU: stray) is no reason to read again
        self._asked = set() if aged else self._asked | unknown
        if aged or unknown:
            self._read_at = now
            try:
                out = self.runner(self.argv, self.timeout)
            except OSError as exc:
                self._text, self.error = None, f"squeue: {exc.strerror or exc}"
            else:
                error = tool_error(out)
                self._text, self.error = (None, error) if error else (out.stdout, None)
        self._cards = list(cards)
        if self._text is None:
            self._by_identity = {}
            return
        self._by_identity, self.error = card_jobs(self._text, self.node, self._cards)

    def jobs_of(self, card: CardRecord) -> frozenset[str] | None:
        """The job ids of ``card`` (one of the last :meth:`refresh`'s cards), empty for
        none; None when unknown."""
        if self._text is None:
            return None
        for i, c in enumerate(self._cards):
            if c is card:
                return self._by_identity.get(i, frozenset())
        return None
