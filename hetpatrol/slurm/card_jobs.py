"""Which Slurm jobs each card of this node is allocated to, from ``squeue --json``.

Read the way the Prolog reads one job (:func:`hetpatrol.slurm.jobguard.
parse_squeue_json`): only Slurm's structured fields (``job_id``, ``job_state``,
``job_resources`` hosts, ``gres_detail`` with its ``(IDX:...)``), never text a user chose
(job name, comment, work directory). A job counts while it holds its cards: state
``RUNNING``, ``SUSPENDED`` or ``COMPLETING`` (squeue(1), JOB STATE CODES; 22.05 gives
``job_state`` as a string, later releases as a list). IDX -> card is
:func:`hetpatrol.slurm.jobguard.match_cards` (the cards of one GRES name in (index,
chip) order; on a GPU in MIG mode its MIG devices, each mapped to its GPU).

:class:`CardJobs` runs ``squeue --json`` (beside the given command: the daemon gives
the breaker's ``sinfo``, read-only, as its own user) at most once
per ``cache_seconds`` and answers ``jobs_of(card)``: the job ids (strings) of the card,
empty for none, None when the allocation could not be read (then nothing is judged on
it and :attr:`CardJobs.error` says why).

Whether a process is in its job can be told only where Slurm puts every task of a
step in the step's cgroup: ``ProctrackType=proctrack/cgroup``
(``src/plugins/proctrack/cgroup/proctrack_cgroup.c``: ``proctrack_p_create`` makes the
step's cgroup, ``proctrack_p_add`` puts each task in it). ``proctrack/linuxproc`` and
``proctrack/pgid`` make none (slurm.conf(5): they "can fail to identify all processes
associated with a job"; a real 22.05 slurmd with linuxproc leaves a job's ``sleep`` in
no Slurm cgroup, tests/test_stray_process.py). :class:`CardJobs` reads ``ProctrackType``
from ``scontrol show config`` (beside the same command, every ``config_cache_seconds``):
:meth:`CardJobs.stray_jobs_of` is then None (not judged) for a card a job holds, and
:attr:`CardJobs.stray_note` says why.
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
    unmapped_gres,
)
from hetpatrol.tool import run_tool

#: job states in which a job holds its cards (squeue(1), JOB STATE CODES)
HOLDING_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING"})
#: the ProctrackType that puts every task of a step in the step's cgroup (see above)
CGROUP_PROCTRACK = "proctrack/cgroup"


def proctrack_type(text: str) -> str | None:
    """``ProctrackType`` of ``scontrol show config`` (``ProctrackType           =
    proctrack/cgroup``), lower-case, printable and at most 64 characters (it goes into a
    message); None when the output names none."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "proctracktype" and value.strip():
            return "".join(ch for ch in value.strip().lower() if ch.isprintable())[:64]
    return None


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
        # MIG devices: Slurm's IDX counts them (jobguard._slurm_devices)
        "partitions": [p.to_dict() for p in card.partitions],
    }


def card_jobs(
    text: str, node: str, cards: Sequence[CardRecord]
) -> tuple[dict[int, frozenset[str]], str | None]:
    """(position of each card in ``cards`` -> its job ids, error). The jobs are those of
    ``squeue --json`` ``text`` that hold cards on ``node``; an unreadable output is
    ``({}, why)``. A job whose GRES cannot be read is named in the error and left out.
    A job whose IDX cannot be mapped to cards (a node in MIG mode where Slurm's order is
    not known, :func:`~hetpatrol.slurm.jobguard.unmapped_gres`) is named in the error and
    the cards of that GRES name are left out of the answer: their jobs are unknown (the
    job is on one of them), never "none"."""
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
    unknown: set[int] = set()
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
        for gres, why in unmapped_gres(keys, alloc).items():
            errors.append(f"job {job_id}: {gres} IDX not mapped to cards: {why}")
            unknown.update(i for i, k in enumerate(keys) if str(k["gres"] or "").lower() == gres)
        matched, _missing = match_cards(keys, alloc)
        for card in matched:
            out[next(i for i, k in enumerate(keys) if k is card)].add(str(job_id))
    answer = {i: frozenset(v) for i, v in out.items() if i not in unknown}
    return answer, ("; ".join(errors) or None)


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
        config_cache_seconds: float = 600.0,
    ):
        head = list(scontrol[:-1])
        self.argv = [*head, *squeue_argv(scontrol[-1])]
        # scontrol beside the same command (squeue_argv's rule), read-only
        tool_dir, sep, _tail = scontrol[-1].rpartition("/")
        self.config_argv = [*head, f"{tool_dir}{sep}scontrol", "show", "config"]
        self.node, self.timeout, self.cache_seconds = node, timeout, cache_seconds
        self.config_cache_seconds = config_cache_seconds
        self.runner, self.clock = runner, clock
        self._text: str | None = None
        self._read_at: float | None = None
        self.error: str | None = None
        #: ``ProctrackType`` of ``scontrol show config`` (None: not read, see
        #: :attr:`stray_note`)
        self.proctrack: str | None = None
        self._proctrack_error: str | None = "not read yet"
        self._config_read_at: float | None = None
        self._by_identity: dict[int, frozenset[str]] = {}
        self._cards: list[CardRecord] = []
        #: the job ids squeue was read again for since the last read by age
        self._asked: set[str] = set()

    def refresh(self, cards: Sequence[CardRecord]) -> None:
        """Read ``ProctrackType`` (``scontrol show config``) every
        ``config_cache_seconds``, every ``cache_seconds`` while it is unknown. Read
        squeue if its cache is old, or if a process of ``cards`` is in a job (its
        cgroup's job number) that held no card of this node in the last read: a job
        started since that read, whose processes must not be judged against the
        allocation before it (read again once per such job until the next read by
        age). Then map this patrol's ``cards``."""
        now = self.clock()
        if self._config_read_at is None or now - self._config_read_at >= (
            self.config_cache_seconds if self.proctrack else self.cache_seconds
        ):
            self._config_read_at = now
            self._read_proctrack()
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

    def _read_proctrack(self) -> None:
        try:
            out = self.runner(self.config_argv, self.timeout)
        except OSError as exc:
            self.proctrack, self._proctrack_error = None, f"{exc.strerror or exc}"
            return
        error = tool_error(out)
        found = None if error else proctrack_type(out.stdout)
        if error is None and found is None:
            error = "no ProctrackType line"
        self.proctrack, self._proctrack_error = found, error

    @property
    def stray_note(self) -> str | None:
        """Why processes on the cards a job holds are not judged stray (None: they
        are): Slurm tracks the job's processes by no cgroup, or that is unknown."""
        if self.proctrack == CGROUP_PROCTRACK:
            return None
        if self.proctrack is None:
            why = f"ProctrackType unknown (scontrol show config: {self._proctrack_error})"
        else:
            why = f"ProctrackType={self.proctrack} (scontrol show config)"
        return (
            f"{why}: only proctrack/cgroup puts a job's processes in its cgroup, so "
            "processes on the cards a job holds are not judged stray; cards with no "
            "job are"
        )

    def stray_jobs_of(self, card: CardRecord) -> frozenset[str] | None:
        """:meth:`jobs_of` for the stray check: None (not judged) also for a card a
        job holds while the job's processes cannot be told (:attr:`stray_note`)."""
        jobs = self.jobs_of(card)
        if jobs and self.proctrack != CGROUP_PROCTRACK:
            return None
        return jobs

    def jobs_of(self, card: CardRecord) -> frozenset[str] | None:
        """The job ids of ``card`` (one of the last :meth:`refresh`'s cards), empty for
        none; None when unknown (squeue unread, or a job's IDX not mapped to cards)."""
        if self._text is None:
            return None
        for i, c in enumerate(self._cards):
            if c is card:
                return self._by_identity.get(i)  # absent: its jobs are unknown
        return None
