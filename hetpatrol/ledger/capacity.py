"""Capacity per card class: which cards to expand, which sit idle, which are unhealthy.

One pass over the window's sacct records (streamed, aggregated per class and time bucket,
never the history in memory), the nodes and their GRES (``scontrol show node -o``), the
nodes' down and drain events (``sacctmgr show event``), optionally the daemons'
utilization (Prometheus, :mod:`.efficiency`) and ``sreport cluster utilization`` for the
classes whose TRES Slurm tracks. A *class* is a GRES name and type, ``gpu:a100``.

Per class and bucket (``minute``, ``hour``, ``day`` or ``week``; local time):

* ``cards``: the cards of the class on the nodes Slurm lists now (``Gres=``); the
  inventory is read once, so a node added or removed during the window counts for the
  whole window (the report says the inventory's time);
* ``capacity_card_hours`` = cards x the bucket's hours inside the window;
* ``allocated_card_hours``: the ledger's own count (:mod:`.usage`, the same rules and the
  same untyped-to-typed attribution, so it equals ``ledger usage --by ''``);
* ``down_card_hours`` / ``drained_card_hours``: each node event's Start..End (an open
  event up to the window's end) cut at the window's edges, x the node's cards of the
  class, as a share of capacity. A drained node's running jobs keep their cards, so the
  same card-hour can be both drained and allocated. Drains whose reason hetpatrol wrote
  (``hetpatrol: ...``, hetpatrol/slurm/states.py) are counted apart
  (``drained_by_hetpatrol_card_hours``);
* ``busy_card_hours``: with ``--prometheus``, per job as ``ledger efficiency`` computes it
  (mean utilization of the job's cards over its span, the cards Prometheus saw), for up to
  ``busy_max_jobs`` jobs; the class's busy share = busy / allocated of the jobs measured,
  its busy card-hours = that share x its allocated card-hours (the report says how many
  jobs were measured).

Demand per class: wait (Start - Submit of the runs that started in the window) median and
p90 from a histogram (exact to the second below 1000 s, within 1 % above), the jobs
pending at the window's end and their card-hours (cards asked x time limit), and how the
class was asked for: ``jobs_by_name`` (``ReqTRES`` names ``gres/<name>:<type>``) against
``jobs_any_type`` (``ReqTRES`` has only ``gres/<name>``: any card of the name, the type
chosen by Slurm). Top accounts by allocated card-hours.

Verdict per class (:class:`Thresholds`, ``ledger.capacity`` in the config): ``unhealthy``
when down + drained exceed ``unhealthy_down_share`` of capacity; ``expand`` when allocated
exceeds ``expand_allocated_share`` and the p90 wait exceeds ``expand_wait_p90_hours``;
``underused`` when allocated is below ``underused_allocated_share`` or busy below
``underused_busy_share``; else ``fine``. The first that holds wins, in that order.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from hetpatrol.ledger.sacct_stream import (
    CAPACITY_FIELDS,
    JobRun,
    SacctDataError,
    decode_line,
    parse_lines,
)
from hetpatrol.ledger.tres import label, split_cards
from hetpatrol.ledger.usage import aggregate, node_types_of
from hetpatrol.slurm.gres import parse_scontrol_nodes
from hetpatrol.slurm.states import ours

#: ``sacctmgr show event`` fields (sacctmgr(1), "LIST/SHOW EVENT FORMAT OPTIONS")
EVENT_FIELDS = ("NodeName", "Start", "End", "State", "Reason", "User")
BUCKETS = ("minute", "hour", "day", "week")
VERDICTS = ("expand", "underused", "unhealthy", "fine")


class CapacityDataError(SacctDataError):
    """Input that is not what was asked for (line number and raw text in the message)."""


def capacity_sacct_argv(start: str, end: str, prefix: Sequence[str] = ("sacct",)) -> list[str]:
    """``sacct -P -n --noconvert -X -D -a -S START -E END -o <CAPACITY_FIELDS>``: the
    ledger's records (:func:`.sacct_stream.sacct_argv`) plus ``ReqTRES`` (what the job
    asked for, sacct(1) "minimum resource counts requested ... at submission time") and
    ``TimelimitRaw`` (minutes). Pending jobs are among them (no -s filter)."""
    return [*prefix, "-P", "-n", "--noconvert", "-X", "-D", "-a", "-S", start, "-E", end,
            "-o", ",".join(CAPACITY_FIELDS)]  # fmt: skip


def events_argv(start: str, end: str, prefix: Sequence[str] = ("sacctmgr",)) -> list[str]:
    """``sacctmgr -P -n show event Event=Node Start= End= Format=<EVENT_FIELDS>``: the node
    events (down, drain) that overlap the window (sacctmgr(1), SPECIFICATIONS FOR
    EVENTS)."""
    return [*prefix, "-P", "-n", "show", "event", "Event=Node", f"Start={start}", f"End={end}",
            "Format=" + ",".join(EVENT_FIELDS)]  # fmt: skip


def sreport_argv(
    tres: str, start: str, end: str, prefix: Sequence[str] = ("sreport",)
) -> list[str]:
    """``sreport -P -n -t seconds cluster utilization --tres=<tres> start= end=``."""
    return [*prefix, "-P", "-n", "-t", "seconds", f"--tres={tres}", "cluster",
            "utilization", f"start={start}", f"end={end}"]  # fmt: skip


@dataclass(slots=True)
class Request:
    """What one run asked for: ``req_tres`` raw, ``timelimit_minutes`` (None: unlimited
    or unknown)."""

    req_tres: str
    timelimit_minutes: int | None


def split_capacity_lines(
    lines: Iterable[str | bytes],
) -> Iterator[tuple[JobRun, Request]]:
    """:data:`CAPACITY_FIELDS` lines -> (:class:`JobRun`, :class:`Request`), lazily.

    The last two fields are cut off (neither ``ReqTRES`` nor ``TimelimitRaw`` can hold a
    ``|``) and the rest read by :func:`.sacct_stream.parse_lines`; its errors
    (:class:`SacctDataError`, with the line number) pass through. A line with fewer
    fields raises :class:`CapacityDataError`, as does a first line that is sacct's header
    (saved without ``-n``) naming other fields than :data:`CAPACITY_FIELDS` in order (that
    one is skipped)."""
    side: deque[Request] = deque()
    lineno = 0
    seen = False  # a line read: only the first may be sacct's header

    def heads() -> Iterator[str]:
        nonlocal lineno, seen
        for raw in lines:
            lineno += 1
            text = decode_line(raw, lineno, CapacityDataError).rstrip("\n")
            if not text.strip():
                continue
            if not seen:  # the first line may be sacct's header (saved without -n)
                seen = True
                names = [f.strip().lower() for f in text.split("|")]
                if "jobidraw" in names and not any(f.isdigit() for f in names):
                    if names != [f.lower() for f in CAPACITY_FIELDS]:
                        raise CapacityDataError(
                            f"sacct line {lineno}: a header other than "
                            f"{','.join(CAPACITY_FIELDS)}: {text[:200]!r}"
                        )
                    continue
            parts = text.rsplit("|", 2)
            if len(parts) != 3:
                raise CapacityDataError(
                    f"sacct line {lineno}: expected {len(CAPACITY_FIELDS)} fields "
                    f"({','.join(CAPACITY_FIELDS)}): {text[:200]!r}"
                )
            head, req, limit = parts
            side.append(Request(req, int(limit) if limit.isdigit() else None))
            yield head

    for run in parse_lines(heads()):
        yield run, side.popleft()


# ------------------------------------------------------------------ nodes and events
@dataclass(frozen=True)
class NodeCards:
    """A node now: its cards per class label (typed GRES only; an untyped ``gpu:8`` is
    the class ``gpu``), base state, drain flag and reason."""

    name: str
    cards: Mapping[str, int]
    state: str
    drained: bool
    reason: str | None
    partitions: tuple[str, ...] = ()


def read_inventory(scontrol_show_node: str) -> dict[str, NodeCards]:
    """``scontrol show node -o`` -> node name -> :class:`NodeCards` (GRES that are not
    cards, :data:`.tres.NOT_CARDS`, left out)."""
    from hetpatrol.ledger.tres import NOT_CARDS

    out: dict[str, NodeCards] = {}
    for n in parse_scontrol_nodes(scontrol_show_node):
        cards: dict[str, int] = {}
        for e in n.gres:
            name = e.name.lower()
            if name in NOT_CARDS or e.count <= 0:
                continue
            lab = f"{name}:{e.type.lower()}" if e.type else name
            cards[lab] = cards.get(lab, 0) + e.count
        parts = tuple(p for p in n.fields.get("Partitions", "").split(",") if p)
        out[n.name] = NodeCards(n.name, cards, n.base_state, n.drained, n.reason, parts)
    return out


@dataclass(frozen=True)
class NodeEvent:
    """One ``sacctmgr show event`` node event: Unix seconds (``end`` None while open),
    Slurm's state text (``DOWN``, ``DRAIN``, ``IDLE+DRAIN``...), the reason and who set
    it; ``kind`` is ``down``, ``drained`` or ``drained_by_hetpatrol``."""

    node: str
    start: float
    end: float | None
    state: str
    reason: str
    user: str

    @property
    def kind(self) -> str:
        # a node event is the node "down" (DOWN, or FAIL) or drained (the DRAIN flag) per
        # src/slurmctld/node_mgr.c: node_down/drain send clusteracct_storage_g_node_down
        # with the node's state; DRAIN and FAIL flags print as +DRAIN / +FAIL
        st = self.state.upper()
        if "DRAIN" in st and not st.startswith("DOWN"):
            return "drained_by_hetpatrol" if ours(self.reason) else "drained"
        return "down"


def parse_events(text: str, parse_time: Callable[[str], float | None]) -> list[NodeEvent]:
    """``sacctmgr -P -n show event Format=<EVENT_FIELDS>`` -> :class:`NodeEvent` list.

    ``End`` ``Unknown`` (still open) gives None. A line of another shape raises
    :class:`CapacityDataError` (with its number)."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        p = line.split("|")
        if len(p) < len(EVENT_FIELDS):
            raise CapacityDataError(
                f"sacctmgr event line {i}: {len(p)} fields, expected {len(EVENT_FIELDS)} "
                f"({','.join(EVENT_FIELDS)}): {line[:200]!r}"
            )
        # a reason may hold "|": the fields after it are fixed, so rejoin the middle
        node, start, end, state = p[0], p[1], p[2], p[3]
        reason, user = "|".join(p[4:-1]), p[-1]
        try:
            s = parse_time(start)
            e = parse_time(end)
        except ValueError as exc:
            raise CapacityDataError(f"sacctmgr event line {i}: {exc}: {line[:200]!r}") from None
        if not node or s is None:
            continue  # a cluster event (no node) or no start: nothing to count
        out.append(NodeEvent(node, s, e, state, reason, user))
    return out


def tracked_tres(scontrol_show_config: str) -> frozenset[str]:
    """The lower-case TRES names of ``AccountingStorageTRES`` (slurm.conf(5): the typed
    ``gres/gpu:a100`` is recorded only when named there)."""
    for line in scontrol_show_config.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "AccountingStorageTRES":
            return frozenset(t.strip().lower() for t in value.split(",") if t.strip())
    return frozenset()


def parse_sreport_utilization(text: str) -> dict[str, float] | None:
    """``sreport -P -n -t seconds cluster utilization --tres=X`` -> its fields in seconds
    (``allocated``, ``down``, ``planned_down``, ``idle``, ``reserved``/``planned``,
    ``reported``), or None when it printed no row (no rolled-up hour in the window).

    Slurm 22.05 prints ``Cluster|TRES Name|Allocated|Down|PLND Down|Idle|Planned|Reported``
    (src/sreport/cluster_reports.c, ``cluster_utilization``; ``Reserved`` before 22.05)."""
    for line in text.splitlines():
        p = line.split("|")
        if len(p) < 8:
            continue
        try:
            nums = [float(x) for x in p[2:8]]
        except ValueError:
            continue
        keys = ("allocated", "down", "planned_down", "idle", "planned", "reported")
        return dict(zip(keys, nums, strict=True))
    return None


# ------------------------------------------------------------------ time buckets
def bucket_edges(start: float, end: float, by: str) -> list[float]:
    """Edges of the ``by`` buckets (local time: minutes, hours, midnights, Mondays) that
    cover [start, end): ``[start, edge1, ..., end]``, the first and last cut at the
    window. ``ValueError`` for another ``by`` or more than 100,000 buckets."""
    if by not in BUCKETS:
        raise ValueError(f"bucket {by!r}: one of {', '.join(BUCKETS)}")
    t = datetime.fromtimestamp(start)
    if by == "minute":
        t, step = t.replace(second=0, microsecond=0), timedelta(minutes=1)
    elif by == "hour":
        t, step = t.replace(minute=0, second=0, microsecond=0), timedelta(hours=1)
    elif by == "day":
        t, step = t.replace(hour=0, minute=0, second=0, microsecond=0), timedelta(days=1)
    else:
        t = t.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=t.weekday())
        step = timedelta(weeks=1)
    edges = [start]
    while True:
        t = t + step
        # wall-clock steps (a DST day has 23 or 25 hours, as the calendar has it)
        ts = t.timestamp()
        if ts >= end:
            break
        if ts > edges[-1]:
            edges.append(ts)
        if len(edges) > 100_000:
            raise ValueError(f"more than 100,000 {by} buckets: choose a larger bucket")
    edges.append(end)
    return edges


def _spread(edges: Sequence[float], s: float, e: float) -> Iterator[tuple[int, float]]:
    """(bucket index, seconds of [s, e) inside it) for the buckets [s, e) overlaps."""
    import bisect

    if e <= s:
        return
    i = max(0, bisect.bisect_right(edges, s) - 1)
    n = len(edges) - 1
    while i < n and edges[i] < e:
        lo = edges[i] if edges[i] > s else s
        hi = edges[i + 1] if edges[i + 1] < e else e
        if hi > lo:
            yield i, hi - lo
        i += 1


# ------------------------------------------------------------------ wait histogram
class WaitHistogram:
    """Waits in seconds, counted in bins: exact seconds below 1000 s, 1 % wide above
    (at most some 1,400 bins for waits up to a year): quantiles in bounded memory."""

    EXACT = 1000
    RATIO = math.log(1.01)

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.count = 0

    def add(self, seconds: float) -> None:
        s = max(0.0, seconds)
        k = int(s) if s < self.EXACT else self.EXACT + int(math.log(s / self.EXACT) / self.RATIO)
        self.bins[k] = self.bins.get(k, 0) + 1
        self.count += 1

    @classmethod
    def _value(cls, k: int) -> float:
        return float(k) if k < cls.EXACT else cls.EXACT * math.exp((k - cls.EXACT) * cls.RATIO)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (nearest rank) in seconds; None without waits."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for k in sorted(self.bins):
            seen += self.bins[k]
            if seen >= rank:
                return self._value(k)
        return self._value(max(self.bins))  # pragma: no cover

    def distribution(self) -> list[tuple[float, int]]:
        """(wait seconds of the bin, count), by wait."""
        return [(self._value(k), self.bins[k]) for k in sorted(self.bins)]


# ------------------------------------------------------------------ the report
@dataclass
class Thresholds:
    """The verdict rules' thresholds (config ``ledger: capacity:``): shares are 0..1 of
    capacity (allocated, down) or of allocated (busy); the wait in hours."""

    expand_allocated_share: float = 0.8
    expand_wait_p90_hours: float = 1.0
    underused_allocated_share: float = 0.3
    underused_busy_share: float = 0.3
    unhealthy_down_share: float = 0.1

    @classmethod
    def from_mapping(cls, m: Mapping[str, float] | None) -> Thresholds:
        return cls(**{k: float(v) for k, v in (m or {}).items()})


#: per-bucket series, card-seconds
SERIES = ("capacity", "allocated", "down", "drained", "drained_by_hetpatrol",
          "busy", "busy_measured")  # fmt: skip


@dataclass
class ClassReport:
    """One card class over the window. Card-seconds throughout (``*_card_hours`` in
    :meth:`to_dict`); ``series[name][i]`` for bucket ``i`` (:data:`SERIES`; ``busy`` and
    ``busy_measured`` are the busy and allocated card-seconds of the jobs Prometheus
    measured)."""

    label: str
    cards: int = 0
    nodes: int = 0
    capacity: float = 0.0
    allocated: float = 0.0
    down: float = 0.0
    drained: float = 0.0
    drained_by_hetpatrol: float = 0.0
    busy: float = 0.0
    busy_measured: float = 0.0
    busy_jobs: int = 0
    jobs: int = 0
    waits: WaitHistogram = field(default_factory=WaitHistogram)
    pending_jobs: int = 0
    pending_card_seconds: float = 0.0
    pending_unlimited: int = 0
    jobs_by_name: int = 0
    jobs_any_type: int = 0
    accounts: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[float]] = field(default_factory=dict)
    #: allocated card-seconds inside the whole past hours sreport is asked about
    span_allocated: float = 0.0
    sreport: dict[str, float] | None = None
    sreport_note: str = ""
    verdict: str = "fine"
    why: str = ""

    def share(self, part: float, whole: float) -> float | None:
        return part / whole if whole > 0 else None

    @property
    def allocated_share(self) -> float | None:
        return self.share(self.allocated, self.capacity)

    @property
    def busy_share(self) -> float | None:
        return self.share(self.busy, self.busy_measured)

    @property
    def down_share(self) -> float | None:
        return self.share(self.down + self.drained + self.drained_by_hetpatrol, self.capacity)

    @property
    def busy_card_seconds(self) -> float | None:
        """The busy share of the measured jobs x all allocated card-seconds."""
        b = self.busy_share
        return None if b is None else b * self.allocated

    def top_accounts(self, n: int = 5) -> list[tuple[str, float]]:
        return sorted(self.accounts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


@dataclass
class CapacityReport:
    """The result: ``classes`` by label, the bucket ``edges``, ``notes`` for the reader."""

    window: tuple[float, float]
    bucket: str
    edges: list[float]
    classes: dict[str, ClassReport]
    records: int = 0
    #: when the node list was read (None: a saved file, time unknown)
    inventory_time: float | None = 0.0
    notes: list[str] = field(default_factory=list)
    untyped: set[str] = field(default_factory=set)
    bad_tres_count: int = 0


def judge(c: ClassReport, t: Thresholds) -> None:
    """Set ``c.verdict`` and ``c.why`` (the numbers behind it), rules in the module doc."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f}%"

    alloc, busy, down = c.allocated_share, c.busy_share, c.down_share
    p90 = c.waits.quantile(0.9)
    p90h = None if p90 is None else p90 / 3600
    if c.capacity <= 0:
        c.verdict, c.why = "fine", "no cards in service"
        return
    if down is not None and down > t.unhealthy_down_share:
        c.verdict = "unhealthy"
        c.why = f"down/drained {pct(down)} of capacity > {pct(t.unhealthy_down_share)}"
    elif (
        alloc is not None and alloc > t.expand_allocated_share
        and p90h is not None and p90h > t.expand_wait_p90_hours
    ):  # fmt: skip
        c.verdict = "expand"
        c.why = (f"allocated {pct(alloc)} > {pct(t.expand_allocated_share)} and wait p90 "
                 f"{p90h:.2f} h > {t.expand_wait_p90_hours:g} h")  # fmt: skip
    elif alloc is not None and alloc < t.underused_allocated_share:
        c.verdict = "underused"
        c.why = f"allocated {pct(alloc)} < {pct(t.underused_allocated_share)}"
    elif busy is not None and busy < t.underused_busy_share:
        c.verdict = "underused"
        c.why = f"busy {pct(busy)} of allocated < {pct(t.underused_busy_share)}"
    else:
        c.verdict = "fine"
        c.why = f"allocated {pct(alloc)}, busy {pct(busy)}, down/drained {pct(down)}"


def _node_gres(inventory: Mapping[str, NodeCards]) -> dict[str, dict[str, frozenset[str]]]:
    """node -> GRES name -> types, the shape :func:`.usage.aggregate` takes."""
    out: dict[str, dict[str, frozenset[str]]] = {}
    for n in inventory.values():
        per: dict[str, set[str]] = {}
        for lab in n.cards:
            name, _, gtype = lab.partition(":")
            per.setdefault(name, set())
            if gtype:
                per[name].add(gtype)
        out[n.name] = {k: frozenset(v) for k, v in per.items()}
    return out


def build(
    records: Iterable[tuple[JobRun, Request]],
    window: tuple[float, float],
    now: float,
    bucket: str,
    inventory: Mapping[str, NodeCards],
    events: Sequence[NodeEvent] = (),
    thresholds: Thresholds | None = None,
    busy_of: Callable[[JobRun], tuple[float, float] | None] | None = None,
    busy_max_jobs: int = 500,
    progress: Callable[[int], None] | None = None,
    span: tuple[float, float] | None = None,
) -> CapacityReport:
    """One pass over ``records`` (from :func:`split_capacity_lines`), aggregated per class
    and bucket; see the module doc for each figure. ``busy_of(run)`` gives (allocated,
    busy) card-seconds of a run from Prometheus, or None when unknown (called for at most
    ``busy_max_jobs`` runs); ``progress(records_read)`` is called every 10,000 records;
    ``span`` (Unix seconds) is where ``span_allocated`` is counted (see :func:`reconcile`).
    ``ValueError`` for a bad ``bucket``."""
    ws, we = window
    edges = bucket_edges(ws, we, bucket)
    nb = len(edges) - 1
    node_gres = _node_gres(inventory)
    classes: dict[str, ClassReport] = {}

    def cls(lab: str) -> ClassReport:
        c = classes.get(lab)
        if c is None:
            c = classes[lab] = ClassReport(lab)
            c.series = {k: [0.0] * nb for k in SERIES}
        return c

    # cards in service and capacity, from the inventory
    for n in inventory.values():
        for lab, count in n.cards.items():
            c = cls(lab)
            c.cards += count
            c.nodes += 1
    for c in classes.values():
        for i in range(nb):
            c.series["capacity"][i] = c.cards * (edges[i + 1] - edges[i])
        c.capacity = c.cards * (we - ws)
    # down and drained, from the node events (one node's events never overlap: the
    # earlier is cut at the later's start)
    by_node: dict[str, list[NodeEvent]] = {}
    for ev in events:
        by_node.setdefault(ev.node, []).append(ev)
    missing: set[str] = set()
    for node, evs in by_node.items():
        n = inventory.get(node)
        if n is None:
            missing.add(node)
            continue
        evs.sort(key=lambda e: e.start)
        for j, ev in enumerate(evs):
            end = ev.end if ev.end is not None else we
            if j + 1 < len(evs):
                end = min(end, evs[j + 1].start)
            s, e = max(ev.start, ws), min(end, we)
            kind = ev.kind
            for lab, count in n.cards.items():
                c = classes[lab]
                for i, secs in _spread(edges, s, e):
                    c.series[kind][i] += count * secs
    types_cache: dict[str, dict[str, frozenset[str]]] = {}
    class_cache: dict[tuple[str, str], tuple[dict[str, int], dict[str, int]]] = {}
    part_types: dict[str, dict[str, frozenset[str]]] = {}
    for n in inventory.values():
        for p in n.partitions:
            per = part_types.setdefault(p, {})
            for name, ts in node_gres.get(n.name, {}).items():
                per[name] = per.get(name, frozenset()) | ts
    measured = 0

    def classes_of(tres_text: str, nodes: str, partition: str):
        key = (tres_text, nodes or "@" + partition)
        hit = class_cache.get(key)
        if hit is None:
            if nodes and nodes != "None assigned":
                types = types_cache.get(nodes)
                if types is None:
                    types = node_types_of(nodes, node_gres)
                    if len(types_cache) > 65536:
                        types_cache.clear()
                    types_cache[nodes] = types
            else:  # a pending job: the types of its partition's nodes
                types = {}
                for p in partition.split(","):
                    for name, ts in part_types.get(p, {}).items():
                        types[name] = types.get(name, frozenset()) | ts
            # one split for the ledger and the report (.tres.split_cards): the cards per
            # class, and the typed ones alone (what ReqTRES names by type)
            split = split_cards(tres_text)
            hit = (
                {label(k): c for k, c in split.cards(types).items()},
                {label(k): c for k, c in split.typed.items()},
            )
            if len(class_cache) > 65536:
                class_cache.clear()
            class_cache[key] = hit
        return hit

    def runs() -> Iterator[JobRun]:
        for read, (run, req) in enumerate(records, 1):
            if progress is not None and read % 10000 == 0:
                progress(read)
            yield run
            _account(run, req)

    def _account(run: JobRun, req: Request) -> None:
        nonlocal measured
        start, end = run.start, run.end
        # pending at the window's end: submitted before it and not started by then
        # (still PENDING, or started after the end)
        submitted = run.submit is not None and run.submit < we
        pending_at_end = submitted and (
            (start is None and run.state == "PENDING") or (start is not None and start >= we)
        )
        if pending_at_end:
            asked, _named = classes_of(req.req_tres, "", run.partition)
            for lab, count in asked.items():
                c = cls(lab)
                c.pending_jobs += 1
                if req.timelimit_minutes is None:
                    c.pending_unlimited += 1
                else:
                    c.pending_card_seconds += count * req.timelimit_minutes * 60
            return
        if start is None:
            return
        if end is None:
            end = now
        s, e = max(start, ws), min(end, we)
        started_in = ws <= start < we
        if e <= s and not started_in:
            return
        held, _ = classes_of(run.alloc_tres, run.nodes, run.partition)
        if not held:
            return
        _asked, named = classes_of(req.req_tres, run.nodes, run.partition)
        busy = None
        if busy_of is not None and measured < busy_max_jobs:
            measured += 1
            busy = busy_of(run)
        total_cards = sum(held.values())
        for lab, count in held.items():
            c = cls(lab)
            if run.state != "REQUEUED":
                c.jobs += 1
                if named.get(lab):
                    c.jobs_by_name += 1
                else:
                    c.jobs_any_type += 1
            if started_in and run.submit is not None:
                c.waits.add(start - run.submit)
            secs = count * max(0.0, e - s)
            c.accounts[run.account] = c.accounts.get(run.account, 0.0) + secs
            ratio = None
            if busy is not None and busy[0] > 0:
                ratio = min(1.0, busy[1] / busy[0])
                c.busy_jobs += 1
            if span is not None:
                c.span_allocated += count * max(0.0, min(e, span[1]) - max(s, span[0]))
            for i, sec in _spread(edges, s, e):
                c.series["allocated"][i] += count * sec
                if ratio is not None:
                    c.series["busy_measured"][i] += count * sec
                    c.series["busy"][i] += count * sec * ratio
            if ratio is not None and e > s:
                share = count / total_cards
                c.busy_measured += busy[0] * share
                c.busy += busy[1] * share

    ledger = aggregate(runs(), window, now, ("account",), node_gres)
    report = CapacityReport(window, bucket, edges, classes, ledger.records, now)
    report.untyped = set(ledger.untyped)
    report.bad_tres_count = ledger.bad_tres_count
    # the ledger's own totals (ledger usage's arithmetic): allocated per class
    for lab, t in ledger.by_gres().items():
        c = cls(lab)
        c.allocated = t.card_seconds
    for c in classes.values():
        for k in ("down", "drained", "drained_by_hetpatrol"):
            setattr(c, k, sum(c.series[k]))
        judge(c, thresholds or Thresholds())
    if missing:
        report.notes.append(
            f"{len(missing)} node(s) with down/drain events are not in Slurm's node list "
            f"now, their time left out: {', '.join(sorted(missing)[:5])}"
        )
    return report


def hour_span(window: tuple[float, float], now: float) -> tuple[float, float] | None:
    """The whole local hours of ``window`` that are over by ``now``: what ``sreport
    cluster`` reports (it reads the hourly rollup, sreport(1); an hour is rolled up once
    it is over), or None when there is none."""
    t = datetime.fromtimestamp(window[0])
    hs = t.replace(minute=0, second=0, microsecond=0)
    if hs.timestamp() < window[0]:
        hs += timedelta(hours=1)
    he = datetime.fromtimestamp(min(window[1], now)).replace(minute=0, second=0, microsecond=0)
    if he <= hs:
        return None
    return hs.timestamp(), he.timestamp()


def reconcile(
    report: CapacityReport,
    tracked: frozenset[str],
    query: Callable[[str, float, float], dict[str, float] | None],
    span: tuple[float, float] | None,
) -> None:
    """Compare each class's allocated card-seconds over ``span`` (:func:`hour_span`) with
    ``query(tres, start, end)`` (:func:`parse_sreport_utilization` of ``sreport cluster
    utilization --tres=gres/<class>``) where ``tracked`` (``AccountingStorageTRES``)
    names the class; sets ``sreport`` and ``sreport_note`` (where they differ and why)."""
    for lab, c in sorted(report.classes.items()):
        tres = f"gres/{lab}"
        if ":" not in lab:
            c.sreport_note = f"{tres}: card time of no known type, not compared"
        elif tres not in tracked:
            c.sreport_note = (
                f"{tres} is not in AccountingStorageTRES: Slurm keeps no per-type record "
                "to compare with (hetpatrol ledger audit)"
            )
        elif span is None:
            c.sreport_note = (
                "the window holds no whole past hour (sreport reports the hourly rollup "
                "only): not compared"
            )
        else:
            got = query(tres, span[0], span[1])
            a, b = datetime.fromtimestamp(span[0]), datetime.fromtimestamp(span[1])
            hours = f"{a:%Y-%m-%dT%H:%M}..{b:%Y-%m-%dT%H:%M}"
            if got is None:
                c.sreport_note = f"sreport printed no row for {hours} (not rolled up yet)"
                continue
            c.sreport = got
            diff = got["allocated"] - c.span_allocated
            if abs(diff) < 1.0:
                c.sreport_note = (
                    f"agrees: {got['allocated'] / 3600:.3f} card-hours allocated in {hours}"
                )
            else:
                c.sreport_note = (
                    f"sreport {got['allocated'] / 3600:.3f}, ledger "
                    f"{c.span_allocated / 3600:.3f} card-hours allocated in {hours}: sreport "
                    "reads the hourly rollup (an hour rolled up before a job's record "
                    "changed, a job still running when its hour was rolled up), and counts "
                    "only the typed TRES Slurm recorded (the ledger gives an untyped "
                    "count the one type of the job's nodes)"
                )
