"""``hetpatrol fleet``: Slurm's node list joined with the daemons' metrics in Prometheus.

Sources (read once, no state kept):

- Slurm: every node (:func:`hetpatrol.cluster.slurm_nodes.read_nodes`): partitions,
  ``Gres=`` (cards registered), ``GresUsed=`` (allocated), state and drain reason.
- Prometheus, four instant queries (:data:`QUERIES`), aggregated on the server so a
  10,000-node answer stays small: cards per node and (vendor, card type, GRES name,
  driver, firmware) from ``hetpatrol_card_info``; cards per node and verdict from the
  ``hetpatrol_card_health`` state set; ``up`` of the scrape job; daemons whose last patrol
  is older than three patrol intervals and a minute (the HetpatrolPatrolStale alert's
  rule) or that have not finished one
  (``hetpatrol_last_patrol_timestamp_seconds``, ``hetpatrol_patrol_interval_seconds``,
  ``hetpatrol_patrol_ready``).

The daemon's series carry no node name: Prometheus adds it as a target label (``node``
by default, ``--node-label``), from the scrape config (a ``labels:`` block of a static or
file_sd target, or a relabel of ``__address__``; see docs/fleet.md "Fleet view"). A series
without that label is keyed by the host part of ``instance``. A Prometheus key matches a
Slurm node by NodeName, else NodeHostName, else NodeAddr.

A card class is (vendor, card type, GRES name) as the daemons report it; a Slurm GRES
``name:type`` counts under the class of that name and type (case-insensitive, as Slurm
compares), an untyped one under the single class of that name on the node, else under an
untyped class. Only card GRES names count: those the daemons report, and ``gpu``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetpatrol.cluster.hostlist import compress_hostlist, name_prefix
from hetpatrol.cluster.prom_query import PrometheusClient, Sample
from hetpatrol.cluster.slurm_nodes import SlurmNode
from hetpatrol.schema import EXIT_CODES

HEALTHS = ("ok", "warning", "critical", "unknown")
#: A daemon whose last patrol is older than this many patrol intervals plus the slack
#: (the scrape interval and a slow patrol) is silent: the rule of the HetpatrolPatrolStale
#: alert in config/prometheus/hetpatrol-rules.yml.
STALE_INTERVALS = 3
STALE_SLACK_SECONDS = 60
#: GRES names that are cards even when no daemon reports them.
DEFAULT_CARD_GRES = frozenset({"gpu"})
NO_PARTITION = "(none)"
NOT_IN_SLURM = "(not in Slurm)"

ClassKey = tuple[str, str, str]  # (vendor, card_type, gres); "" = not known
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def queries(node_label: str = "node", job: str = "hetpatrol") -> dict[str, str]:
    """The PromQL of each source, keyed ``cards``, ``health``, ``up``, ``silent``.

    ``ValueError`` when ``node_label`` is not a Prometheus label name.
    """
    if not _LABEL_RE.match(node_label):
        raise ValueError(f"{node_label!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
    sel = "{job=" + json.dumps(job) + "}"  # a PromQL string literal: quotes escaped
    by = f"{node_label}, instance"
    return {
        "cards": (
            f"count by ({by}, vendor, card_type, gres, driver_version, firmware_version) "
            f"(hetpatrol_card_info{sel})"
        ),
        "health": (
            f"count by ({by}, vendor, card_type, hetpatrol_card_health) "
            f"(hetpatrol_card_health{sel} == 1)"
        ),
        "up": f"up{sel}",
        "silent": (
            f"(time() - hetpatrol_last_patrol_timestamp_seconds{sel} > {STALE_INTERVALS} "
            f"* hetpatrol_patrol_interval_seconds{sel} + {STALE_SLACK_SECONDS}) "
            f"or (hetpatrol_patrol_ready{sel} == 0)"
        ),
    }


#: The daemon's node checks that say a node's vendor runtimes are not kept apart
#: (docs/checks.md "Environment crosstalk").
RUNTIME_CHECKS = ("library_path_mix", "global_ld_library_path")


def runtime_query(node_label: str = "node", job: str = "hetpatrol") -> str:
    """Nodes with an active runtime-crosstalk finding, per check (for audit-slurm)."""
    queries(node_label, job)  # the same checks of the label
    checks = "|".join(RUNTIME_CHECKS)
    return (
        f"count by ({node_label}, instance, check) (hetpatrol_node_finding"
        "{job=" + json.dumps(job) + f', check=~"{checks}"' + "} == 1)"
    )


def add_node_findings(
    daemons: dict[str, DaemonNode], samples: Iterable[Sample], node_label: str
) -> None:
    """Attach the answer of :func:`runtime_query` to the daemons (new keys are added)."""
    for s in samples:
        k = _key(s.labels, node_label)
        daemons.setdefault(k, DaemonNode(k)).node_findings.add(s.labels.get("check", ""))


#: The queries with the default node label and job (documented in docs/fleet.md).
QUERIES = queries()


# --------------------------------------------------------------------------- daemons
@dataclass
class DaemonNode:
    """What Prometheus holds for one node (one key)."""

    key: str
    up: bool | None = None  # None: no ``up`` series (no target for it)
    silent: bool = False  # stale or not ready
    cards: Counter = field(default_factory=Counter)  # ClassKey -> cards (chip records)
    health: dict[ClassKey, Counter] = field(default_factory=dict)
    versions: dict[ClassKey, set[tuple[str, str]]] = field(default_factory=dict)
    #: active node-level findings by check name (audit-slurm reads the runtime ones)
    node_findings: set[str] = field(default_factory=set)

    @property
    def quiet(self) -> bool:
        """Its target is down (``up == 0``), or its last patrol is stale or missing."""
        return self.up is False or self.silent


def _host(instance: str) -> str:
    if instance.startswith("["):  # [::1]:9477
        return instance[1:].split("]", 1)[0]
    return instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance


def _key(labels: dict[str, str], node_label: str) -> str:
    return labels.get(node_label) or _host(labels.get("instance", "")) or "(no node label)"


def _count(s: Sample, source: str, notes: list[str] | None) -> int | None:
    """A count series' value as an int; None (and a note) for a value that is not a
    finite count >= 0 (NaN, +Inf, -Inf, a null value)."""
    if math.isfinite(s.value) and s.value >= 0:
        return int(s.value)
    if notes is not None:
        notes.append(f"{source} series {s.labels} has value {s.value}: not a count, ignored")
    return None


def daemon_nodes(
    answers: dict[str, list[Sample]], node_label: str, notes: list[str] | None = None
) -> dict[str, DaemonNode]:
    """The answers of :func:`queries`, per node key. A count that is not finite (NaN,
    +-Inf) is ignored, with a line in ``notes`` when given."""
    out: dict[str, DaemonNode] = {}

    def get(labels: dict[str, str]) -> DaemonNode:
        k = _key(labels, node_label)
        node = out.get(k)
        if node is None:
            node = out[k] = DaemonNode(k)
        return node

    for s in answers.get("up", ()):
        node = get(s.labels)
        up = s.value == 1
        node.up = up if node.up is None else node.up and up
    for s in answers.get("silent", ()):
        get(s.labels).silent = True
    for s in answers.get("cards", ()):
        lab = s.labels
        ck = (lab.get("vendor", ""), lab.get("card_type", ""), lab.get("gres", ""))
        node = get(lab)
        n = _count(s, "hetpatrol_card_info", notes)
        if n is None:
            continue
        node.cards[ck] += n
        node.versions.setdefault(ck, set()).add(
            (lab.get("driver_version", ""), lab.get("firmware_version", ""))
        )
    for s in answers.get("health", ()):
        lab = s.labels
        node = get(lab)
        vendor, ctype = lab.get("vendor", ""), lab.get("card_type", "")
        ck = next((c for c in node.cards if c[0] == vendor and c[1] == ctype), (vendor, ctype, ""))
        health = lab.get("hetpatrol_card_health", "unknown")
        n = _count(s, "hetpatrol_card_health", notes)
        if n is None:
            continue
        node.health.setdefault(ck, Counter())[health if health in HEALTHS else "unknown"] += n
    for node in out.values():
        _fold_typeless(node)
        for ck, n in node.cards.items():  # cards without a verdict series are unknown
            missing = n - sum(node.health.get(ck, Counter()).values())
            if missing > 0:
                node.health.setdefault(ck, Counter())["unknown"] += missing
    return out


def _fold_typeless(node: DaemonNode) -> None:
    """A card read without a type (lost from the bus: nvidia-smi names no product) counts
    under the node's only class of the same vendor and GRES name, if there is one."""
    for ck in [c for c in node.cards if not c[1]]:
        same = [c for c in node.cards if c[1] and c[0] == ck[0] and c[2] == ck[2]]
        if len(same) != 1:
            continue
        into = same[0]
        node.cards[into] += node.cards.pop(ck)
        node.health.setdefault(into, Counter()).update(node.health.pop(ck, Counter()))
        node.versions.pop(ck, None)


def read_daemons(
    client: PrometheusClient,
    node_label: str = "node",
    job: str = "hetpatrol",
    notes: list[str] | None = None,
) -> dict[str, DaemonNode]:
    """Run :func:`queries` against ``client``; ``PrometheusError`` on any failure;
    ignored values noted in ``notes``."""
    answers = {name: client.query(expr) for name, expr in queries(node_label, job).items()}
    return daemon_nodes(answers, node_label, notes)


# ----------------------------------------------------------------------------- join
@dataclass
class Counts:
    """One row: the nodes of one card class in a partition, a batch, or the whole class.

    - ``nodes``: Slurm nodes (and Prometheus-only nodes) holding or registering the class.
    - ``cards_slurm``: count registered in Slurm (``Gres=``); ``allocated``: in use by jobs
      (``GresUsed=``); ``idle``: registered minus allocated on nodes that can take jobs
      (not drained, not down); ``down``: registered minus allocated on nodes out of
      service (``DOWN``, ``NOT_RESPONDING``, ``FAIL``: :attr:`SlurmNode.down`).
    - ``cards_seen``: card (chip) records the daemons export (``hetpatrol_card_info``);
      ``health``: those per verdict (``hetpatrol_card_health``; a card without a verdict
      series counts as ``unknown``).
    - ``drained_hetpatrol`` / ``drained_other``: nodes with the DRAIN flag, by whether the
      reason starts ``hetpatrol:``; ``silent``: nodes whose daemon is down, stale, not
      ready or absent from Prometheus.
    - ``actions``: cards per action (see :func:`card_actions`); ``names``: the nodes.
    """

    nodes: int = 0
    cards_slurm: int = 0
    cards_seen: int = 0
    health: dict[str, int] = field(default_factory=dict)
    actions: dict[str, int] = field(default_factory=dict)  # hook: filled once cards carry one
    allocated: int = 0
    idle: int = 0
    down: int = 0
    drained_hetpatrol: int = 0
    drained_other: int = 0
    silent: int = 0
    names: list[str] = field(default_factory=list)

    def add(self, other: Counts) -> None:
        self.nodes += other.nodes
        self.cards_slurm += other.cards_slurm
        self.cards_seen += other.cards_seen
        for counter, more in ((self.health, other.health), (self.actions, other.actions)):
            for k, n in more.items():  # plain dicts: Counter.update is slow at this scale
                counter[k] = counter.get(k, 0) + n
        self.allocated += other.allocated
        self.idle += other.idle
        self.down += other.down
        self.drained_hetpatrol += other.drained_hetpatrol
        self.drained_other += other.drained_other
        self.silent += other.silent
        self.names.extend(other.names)

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "hosts": compress_hostlist(self.names),
            "cards_slurm": self.cards_slurm,
            "cards_seen": self.cards_seen,
            "health": {h: self.health.get(h, 0) for h in HEALTHS},
            "actions": dict(sorted(self.actions.items())),
            "allocated": self.allocated,
            "idle": self.idle,
            "down": self.down,
            "drained_hetpatrol": self.drained_hetpatrol,
            "drained_other": self.drained_other,
            "silent": self.silent,
        }


def card_actions(node: DaemonNode | None, ck: ClassKey) -> Counter:
    """Hook for the cards-by-action column: cards per action of this class on ``node``.

    Empty until the daemons export a per-card action; the column then fills from here.
    """
    return Counter()


def _class_of(
    entry_name: str,
    entry_type: str | None,
    local: Iterable[ClassKey],
    known: dict[tuple[str, str], ClassKey],
    vendor_of: Callable[[str, str | None], str] | None = None,
) -> ClassKey:
    name = entry_name.lower()
    if entry_type:
        t = entry_type.lower()
        for ck in local:
            if ck[2].lower() == name and ck[1].lower() == t:
                return ck
        if (name, t) in known:
            return known[(name, t)]
        vendor = vendor_of(entry_name, entry_type) if vendor_of else ""
        return (vendor, entry_type, entry_name)
    same = [ck for ck in local if ck[2].lower() == name]
    return same[0] if len(same) == 1 else ("", "", entry_name)


@dataclass
class FleetReport:
    """The joined view; :meth:`to_json` is ``hetpatrol fleet --json``::

        {"health": "critical", "exit_code": 2, "nodes": 5, "sources": {...},
         "classes": [{"vendor", "card_type", "gres", <Counts>, "hosts",
                      "partitions": [{"partition", <Counts>, "batches": [<Counts>...]}],
                      "versions": [{"driver_version", "firmware_version", "nodes"}]}],
         "slurm_only": {"nodes", "hosts", "with_card_gres"},
         "prometheus_only": {"nodes", "hosts"}, "silent": {"nodes", "hosts"}}

    ``hosts`` are Slurm host lists (:func:`compress_hostlist`).
    """

    classes: dict[ClassKey, dict[str, dict[tuple[str, int], Counts]]]
    totals: dict[ClassKey, Counts]
    versions: dict[ClassKey, Counter]
    slurm_only: list[str]
    slurm_only_with_cards: list[str]
    prometheus_only: list[str]
    silent: list[str]
    nodes_total: int
    #: (node, why) for nodes whose Gres=/GresUsed= Slurm text could not be read
    gres_unreadable: list[tuple[str, str]] = field(default_factory=list)
    #: (node or position, why) for node objects/lines of the Slurm source left out
    slurm_unreadable: list[tuple[str, str]] = field(default_factory=list)
    #: node names Slurm listed more than once (the first kept)
    duplicates: list[str] = field(default_factory=list)
    #: Slurm nodes where the daemon sees more cards of a class than Gres= registers
    #: (``Gres=(null)`` with a card present): cards Slurm cannot schedule
    unregistered: list[str] = field(default_factory=list)
    #: what was read but ignored (a non-finite count from Prometheus...)
    notes: list[str] = field(default_factory=list)
    slurm_source: str = ""
    prometheus: str = ""
    generated_at: float = 0.0

    def class_totals(self, ck: ClassKey) -> Counts:
        """The class over all partitions (a node in two partitions counts once)."""
        return self.totals[ck]

    @property
    def health(self) -> str:
        """Worst of the fleet: critical > unknown > warning > ok (as ``status`` orders)."""
        worst = "ok"
        rank = {"ok": 0, "warning": 1, "unknown": 2, "critical": 3}
        for ck in self.classes:
            t = self.class_totals(ck)
            for h in HEALTHS:
                if t.health.get(h) and rank[h] > rank[worst]:
                    worst = h
            if (t.silent or t.cards_seen < t.cards_slurm) and rank[worst] < rank["unknown"]:
                worst = "unknown"
        quiet = (
            self.slurm_only_with_cards or self.silent or self.gres_unreadable
        ) or self.slurm_unreadable
        if quiet and rank[worst] < rank["unknown"]:
            worst = "unknown"
        if (self.unregistered or self.duplicates) and rank[worst] < rank["warning"]:
            worst = "warning"
        return worst

    @property
    def exit_code(self) -> int:
        """0 ok, 1 warning, 2 critical, 3 unknown (cards or daemons not accounted for)."""
        return EXIT_CODES[self.health]

    def to_json(self) -> dict[str, Any]:
        classes = []
        for ck in self.classes:
            vendor, ctype, gres = ck
            parts = []
            for part, batches in sorted(self.classes[ck].items()):
                ptotal = Counts()
                for c in batches.values():
                    ptotal.add(c)
                parts.append(
                    {
                        "partition": part,
                        **ptotal.to_json(),
                        "batches": [c.to_json() for _k, c in sorted(batches.items())],
                    }
                )
            classes.append(
                {
                    "vendor": vendor,
                    "card_type": ctype,
                    "gres": gres,
                    **self.class_totals(ck).to_json(),
                    "partitions": parts,
                    "versions": [
                        {"driver_version": d, "firmware_version": f, "nodes": n}
                        for (d, f), n in sorted(
                            self.versions.get(ck, Counter()).items(), key=lambda kv: -kv[1]
                        )
                    ],
                }
            )
        return {
            "generated_at": self.generated_at,
            "sources": {"slurm": self.slurm_source, "prometheus": self.prometheus},
            "health": self.health,
            "exit_code": self.exit_code,
            "nodes": self.nodes_total,
            "classes": classes,
            "slurm_only": {
                "nodes": len(self.slurm_only),
                "hosts": compress_hostlist(self.slurm_only),
                "with_card_gres": compress_hostlist(self.slurm_only_with_cards),
            },
            "prometheus_only": {
                "nodes": len(self.prometheus_only),
                "hosts": compress_hostlist(self.prometheus_only),
            },
            "silent": {"nodes": len(self.silent), "hosts": compress_hostlist(self.silent)},
            "gres_unreadable": [{"node": n, "error": e} for n, e in self.gres_unreadable],
            "slurm_unreadable": [{"node": n, "error": e} for n, e in self.slurm_unreadable],
            "duplicates": compress_hostlist(self.duplicates),
            "unregistered": {
                "nodes": len(self.unregistered),
                "hosts": compress_hostlist(self.unregistered),
            },
            "notes": list(self.notes),
        }


def build_fleet(
    nodes: Sequence[SlurmNode],
    daemons: dict[str, DaemonNode],
    *,
    card_gres: Iterable[str] = DEFAULT_CARD_GRES,
    vendor_of: Callable[[str, str | None], str] | None = None,
) -> FleetReport:
    """Join Slurm's ``nodes`` with the ``daemons`` (from :func:`read_daemons`).

    ``vendor_of(gres_name, gres_type)`` names the vendor of a class no daemon reports
    (from the config's profiles; "" when unknown). A node name listed twice is kept once
    (the first) and named in ``duplicates``; the ``unreadable`` of a
    :class:`~hetpatrol.cluster.slurm_nodes.NodeList` land in ``slurm_unreadable``.
    """
    unreadable = list(getattr(nodes, "unreadable", ()))
    by_name: dict[str, SlurmNode] = {}
    duplicates: list[str] = []
    for n in nodes:
        if n.name in by_name:
            if n.name not in duplicates:
                duplicates.append(n.name)
            continue
        by_name[n.name] = n
    nodes = list(by_name.values())
    alias: dict[str, str] = {}
    for n in nodes:
        for other in (n.hostname, n.address):
            if other and other not in by_name:
                alias[other] = n.name if other not in alias else ""
    matched: dict[str, DaemonNode] = {}  # slurm name -> daemon
    prometheus_only = []
    for key, d in daemons.items():
        name = key if key in by_name else alias.get(key) or None
        if name is None:
            prometheus_only.append(key)
        else:
            matched[name] = d
    gres_names = {g.lower() for g in card_gres}
    known: dict[tuple[str, str], ClassKey] = {}
    for d in daemons.values():
        for ck in d.cards:
            if ck[2]:
                gres_names.add(ck[2].lower())
                known.setdefault((ck[2].lower(), ck[1].lower()), ck)

    classes: dict[ClassKey, dict[str, dict[tuple[str, int], Counts]]] = {}
    totals: dict[ClassKey, Counts] = {}
    versions: dict[ClassKey, Counter] = {}
    slurm_only, slurm_only_cards, silent, unregistered = [], [], [], []

    def row(name: str, node: SlurmNode | None, d: DaemonNode | None) -> None:
        registered: Counter = Counter()
        allocated: Counter = Counter()
        local = list(d.cards) if d else []
        if node is not None:
            for e in node.gres:
                if e.name.lower() in gres_names:
                    registered[_class_of(e.name, e.type, local, known, vendor_of)] += e.count
            for e in node.gres_used:
                if e.name.lower() in gres_names:
                    allocated[_class_of(e.name, e.type, local, known, vendor_of)] += e.count
        quiet = d is None or d.quiet
        for ck in dict.fromkeys([*registered, *local]):
            c = Counts(nodes=1, names=[name])
            c.cards_slurm = registered.get(ck, 0)
            c.cards_seen = d.cards.get(ck, 0) if d else 0
            if d:
                health = d.health.get(ck)
                if health:
                    c.health = dict(health)
                for v in d.versions.get(ck, ()):
                    versions.setdefault(ck, Counter())[v] += 1
            actions = card_actions(d, ck)
            if actions:
                c.actions = dict(actions)
            c.allocated = allocated.get(ck, 0)
            # idle: registered, not allocated, on a node that can take jobs (not drained,
            # not down); a down node's cards are counted apart: no job gets them
            # (sinfo(1) NODE STATE CODES, SlurmNode.down)
            free = max(c.cards_slurm - c.allocated, 0)
            if node is not None and node.down:
                c.down = free
            elif not (node is not None and node.drained):
                c.idle = free
            if node is not None and node.drained:
                if node.drained_by_hetpatrol:
                    c.drained_hetpatrol = 1
                else:
                    c.drained_other = 1
            c.silent = 1 if quiet else 0
            if node is not None and c.cards_seen > c.cards_slurm and name not in unregistered:
                unregistered.append(name)
            parts = (node.partitions or (NO_PARTITION,)) if node is not None else (NOT_IN_SLURM,)
            totals.setdefault(ck, Counts()).add(c)
            batch = (name_prefix(name), c.cards_slurm)
            for part in parts:
                slot = classes.setdefault(ck, {}).setdefault(part, {})
                slot.setdefault(batch, Counts()).add(c)
        if node is not None and d is None:
            slurm_only.append(name)
            if registered:
                slurm_only_cards.append(name)
        elif d is not None and d.quiet:
            silent.append(name)

    for node in nodes:
        row(node.name, node, matched.get(node.name))
    for key in prometheus_only:
        row(key, None, daemons[key])
    order = sorted(classes, key=lambda ck: (ck[0] == "", ck[0], ck[1], ck[2]))
    return FleetReport(
        classes={ck: classes[ck] for ck in order},
        totals=totals,
        versions=versions,
        slurm_only=slurm_only,
        slurm_only_with_cards=slurm_only_cards,
        prometheus_only=sorted(prometheus_only),
        silent=silent,
        nodes_total=len(nodes) + len(prometheus_only),
        gres_unreadable=[(n.name, n.gres_error) for n in nodes if n.gres_error],
        slurm_unreadable=unreadable,
        duplicates=duplicates,
        unregistered=unregistered,
        generated_at=time.time(),
    )
