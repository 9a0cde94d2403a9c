"""Card-seconds, jobs and wait time per GRES type over a window, from :class:`JobRun`\\ s.

Counting rules (what ``sreport`` counts, and where the ledger differs):

* A run holds its cards from Start to End; a running job (End ``Unknown``) up to ``now``.
  The time is cut at the window's edges, like the rollup and ``sacct -T``
  (sacct(1), ``--truncate``).
* Every run of a requeued or preempted-and-requeued job counts (``sacct -D``), each for
  its own Start..End, as the rollup counts allocated time. A preempted job that was
  cancelled counts up to its End, like any other ended job.
* Pending jobs (Start ``Unknown``) hold no cards and count nowhere.
* ``jobs`` counts a job once, by the run that is not ``REQUEUED`` (its last one); ``runs``
  counts every allocation with card time in the window. ``sreport job SizesByAccount``
  counts the same card-seconds, every run included (tests/test_ledger_live.py compares
  them); ``sreport cluster``/``user`` reports read the hourly rollup, so they see a job
  only once its hour is rolled up.
* Wait time is Start - Submit of the runs that started in the window (a requeued run's
  Submit is its requeue time, as sacct records it).
* Grouping by node splits a multi-node run's cards evenly over its nodes (``sacct -X``
  gives the allocation's total, not the per-node split).
* Suspended time is not subtracted: a suspended job keeps its cards allocated. sacct's
  Elapsed leaves suspended time out, so on suspended jobs the ledger counts more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from hetpatrol.ledger.sacct_stream import JobRun
from hetpatrol.ledger.tres import label, split_cards
from hetpatrol.slurm.gres import expand_hostlist

#: what runs can be grouped by (the :class:`JobRun` attribute of each)
GROUP_FIELDS = {
    "user": "user",
    "account": "account",
    "partition": "partition",
    "qos": "qos",
    "node": "nodes",
}
_CACHE_MAX = 65536


@dataclass(slots=True)
class Totals:
    """One group's figures: ``card_seconds`` (cards x seconds held in the window),
    ``jobs``, ``runs``, ``wait_seconds`` (sum over ``started`` runs that began in the
    window), ``max_cards`` (most cards of this type one run held)."""

    card_seconds: float = 0.0
    jobs: int = 0
    runs: int = 0
    started: int = 0
    wait_seconds: float = 0.0
    max_cards: int = 0

    @property
    def card_hours(self) -> float:
        return self.card_seconds / 3600.0

    @property
    def mean_wait_seconds(self) -> float | None:
        return self.wait_seconds / self.started if self.started else None


@dataclass
class Ledger:
    """The result: ``groups[(group values..., gres label)]`` -> :class:`Totals`.

    ``by`` names the group values (see :data:`GROUP_FIELDS`); ``window`` is (start, end)
    in Unix seconds; ``untyped`` the GRES names some of whose cards have no known type
    (their label is the bare name); ``bad_tres`` the first unreadable TRES items and
    ``bad_tres_count`` how many there were; ``records`` how many runs were read.
    """

    by: tuple[str, ...]
    window: tuple[float, float]
    groups: dict[tuple[str, ...], Totals] = field(default_factory=dict)
    running_cards: dict[tuple[str, ...], int] = field(default_factory=dict)
    untyped: set[str] = field(default_factory=set)
    bad_tres: list[str] = field(default_factory=list)
    bad_tres_count: int = 0
    records: int = 0

    def by_gres(self) -> dict[str, Totals]:
        """Totals per GRES label alone (every group added up)."""
        out: dict[str, Totals] = {}
        for key, t in self.groups.items():
            s = out.setdefault(key[-1], Totals())
            s.card_seconds += t.card_seconds
            s.jobs += t.jobs
            s.runs += t.runs
            s.started += t.started
            s.wait_seconds += t.wait_seconds
            s.max_cards = max(s.max_cards, t.max_cards)
        return out


def _split(alloc_tres: str, cache: dict, bad: list[str]) -> tuple:
    """(:class:`.tres.CardSplit` of ``alloc_tres``, its typed cards as (label, count)
    pairs), cached by the text; the unreadable items of a text not seen yet go to ``bad``."""
    hit = cache.get(alloc_tres)
    if hit is not None:
        return hit
    split = split_cards(alloc_tres)
    bad.extend(split.bad)
    hit = (split, tuple((label(k), c) for k, c in split.typed.items()))
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[alloc_tres] = hit
    return hit


def node_types_of(
    nodes: str, node_gres: Mapping[str, Mapping[str, frozenset[str]]]
) -> dict[str, frozenset[str]]:
    """The GRES types per name that the nodes of host list ``nodes`` have together."""
    out: dict[str, set[str]] = {}
    try:
        names = expand_hostlist(nodes) if nodes and nodes != "None assigned" else []
    except ValueError:
        names = []
    for n in names:
        for gname, types in node_gres.get(n, {}).items():
            out.setdefault(gname, set()).update(types)
    return {k: frozenset(v) for k, v in out.items()}


def aggregate(
    runs: Iterable[JobRun],
    window: tuple[float, float],
    now: float,
    by: Sequence[str] = (),
    node_gres: Mapping[str, Mapping[str, frozenset[str]]] | None = None,
) -> Ledger:
    """Add up ``runs`` over ``window`` = (start, end) Unix seconds, grouped by ``by``.

    ``node_gres`` (node -> GRES name -> types, from ``scontrol show node``) attributes an
    untyped GPU count to the node's one type (:meth:`hetpatrol.ledger.tres.CardSplit.cards`).
    ``ValueError`` for an unknown ``by`` field.
    """
    for b in by:
        if b not in GROUP_FIELDS:
            raise ValueError(f"cannot group by {b!r}; one of {', '.join(GROUP_FIELDS)}")
    attrs = [GROUP_FIELDS[b] for b in by]
    get_base = attrgetter(*attrs) if len(attrs) > 1 else None
    by_node = "node" in by
    node_pos = by.index("node") if by_node else -1
    ws, we = window
    ledger = Ledger(tuple(by), window)
    groups = ledger.groups
    running_cards = ledger.running_cards
    cache: dict = {}
    types_cache: dict[str, dict[str, frozenset[str]]] = {}
    held_cache: dict[tuple[str, str], tuple[list, list[str]]] = {}
    node_gres = node_gres or {}
    bad: list[str] = []
    count_running = now < we + 1
    for run in runs:
        ledger.records += 1
        start = run.start
        if start is None:
            continue
        end = run.end
        running = end is None
        if running:
            end = now
        s = start if start > ws else ws
        e = end if end < we else we
        secs = e - s if e > s else 0.0
        started_in = ws <= start < we
        if secs <= 0 and not started_in:
            continue
        split, typed = _split(run.alloc_tres, cache, bad)
        if split.bad:
            ledger.bad_tres_count += len(split.bad)
        if split.rest:
            hkey = (run.alloc_tres, run.nodes)
            got = held_cache.get(hkey)
            if got is None:
                types = types_cache.get(run.nodes)
                if types is None:
                    types = node_types_of(run.nodes, node_gres)
                    if len(types_cache) >= _CACHE_MAX:
                        types_cache.clear()
                    types_cache[run.nodes] = types
                # one (label, count) per label: a rest given a type adds to its cards
                held = split.cards(types)
                got = (
                    [(label(k), c) for k, c in held.items()],
                    [name for name, gtype in held if gtype is None],
                )
                if len(held_cache) >= _CACHE_MAX:
                    held_cache.clear()
                held_cache[hkey] = got
            cards, untyped = got
            if untyped:
                ledger.untyped.update(untyped)
        elif typed:
            cards = typed
        else:
            continue
        if get_base is not None:
            base = get_base(run)
        elif attrs:
            base = (getattr(run, attrs[0]),)
        else:
            base = ()
        if by_node:
            try:
                node_list = expand_hostlist(run.nodes) or [run.nodes]
            except ValueError:
                node_list = [run.nodes]
            bases = [(*base[:node_pos], n, *base[node_pos + 1 :]) for n in node_list]
        else:
            bases = (base,)
        share = 1.0 / len(bases)
        wait = start - run.submit if started_in and run.submit is not None else None
        last_run = run.state != "REQUEUED"
        for lab, count in cards:
            for b in bases:
                gk = (*b, lab)
                t = groups.get(gk)
                if t is None:
                    t = groups[gk] = Totals()
                t.card_seconds += count * secs * share
                t.runs += 1
                if last_run:
                    t.jobs += 1
                if wait is not None:
                    t.started += 1
                    t.wait_seconds += wait
                if count > t.max_cards:
                    t.max_cards = count
                if running and count_running:
                    running_cards[gk] = running_cards.get(gk, 0) + count
    ledger.bad_tres = bad[:20]
    return ledger
