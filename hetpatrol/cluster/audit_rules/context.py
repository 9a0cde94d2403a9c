"""What every audit rule reads: the input, the findings' shape, and the cluster as the
rules see it (nodes, partitions, card classes), built once per audit.

Card classes come from every source there is: the daemons' cards (``--prometheus``),
slurm.conf ``Gres=`` types, gres.conf ``Type=``, the vendor of the ``File=`` device
files (as each plugin declares its numbered device nodes in ``VendorInfo.device_nodes``:
``/dev/nvidia{n}``, ``/dev/davinci{n}``, ``/dev/cambricon_dev{n}``, ``/dev/accel/accel{n}``,
...), and the vendor whose profiles use the GRES name.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import entry_points

from hetpatrol.cluster.fleet import DaemonNode
from hetpatrol.cluster.hostlist import compress_hostlist, hostlist_problem
from hetpatrol.cluster.slurm_conf import NodeDecl, SlurmConf
from hetpatrol.cluster.slurm_nodes import SlurmNode
from hetpatrol.config import Profile
from hetpatrol.slurm.gres import (
    GresConf,
    GresConfLine,
    GresEntry,
    expand_hostlist,
    gres_conf_for_node,
    split_top,
)

SEVERITIES = ("error", "warning", "info")
GresKey = tuple[str, str | None]  # (name, type) lower-case; None = untyped
CardClass = tuple[str, str]  # (vendor, type) lower-case; "" = unknown
#: AutoDetect= values slurmd 22.05 detects with (src/common/gres.c
#: ``_handle_autodetect_flags``: nvml, rsmi, oneapi; "off"; anything else is "error:
#: unknown autodetect flag" and nothing is detected). Later releases add nrt (23.11),
#: nvidia (24.11), full (the development branch after 25.11).
AUTODETECT_22_05 = frozenset({"nvml", "rsmi", "oneapi"})
AUTODETECT_LATER = {"nrt": "23.11", "nvidia": "24.11", "full": "after 25.11"}


def detects(flag: str | None) -> bool:
    """Whether slurmd 22.05 detects cards with this ``AutoDetect=`` value."""
    return bool(flag) and any(f in AUTODETECT_22_05 for f in flag.lower().split(","))


#: GRES that share one card's device files (gres.conf(5) "Sharding", MPS): never a card
SHARING_GRES = frozenset({"mps", "shard"})


@dataclass(frozen=True)
class AuditFinding:
    """One finding: the rule (``check``), ``severity`` (``error``: slurmctld/slurmd
    refuses the config or a job can reach the wrong card; ``warning``: a gap that costs
    work or accounting; ``info``), ``where`` (``file:line``, or ``node``/``partition``
    with a compressed host list), what Slurm does (``message``) and the ``fix``."""

    check: str
    severity: str
    where: str
    message: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {
            "check": self.check,
            "severity": self.severity,
            "where": self.where,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass
class AuditInput:
    conf: SlurmConf
    gres_conf: list[GresConfLine] | None = None
    gres_conf_path: str = "gres.conf"
    cgroup: dict[str, str] | None = None  # lower-case key -> value
    cgroup_path: str = "cgroup.conf"
    live_nodes: Sequence[SlurmNode] | None = None
    daemons: dict[str, DaemonNode] | None = None
    profiles: Sequence[Profile] = ()
    #: what a source held but was ignored (a non-finite count from Prometheus...)
    notes: Sequence[str] = ()


@dataclass
class NodeView:
    """One node as the audit sees it: registration, features, partitions, where set."""

    name: str
    gres: tuple[GresEntry, ...]
    features: tuple[str, ...]
    where: str
    partitions: list[str] = field(default_factory=list)
    decl: NodeDecl | None = None


def where_of(where: str, names: list[str]) -> str:
    """The file line, or for nodes read live (no line) ``node X`` / ``nodes gn[01-40]``."""
    return where or f"node{'s' if len(names) != 1 else ''} {compress_hostlist(names)}"


def plural(count: int, word: str = "node") -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def label(k: GresKey) -> str:
    return f"{k[0]}:{k[1]}" if k[1] else k[0]


def group(items: Iterable[tuple[tuple, str]]) -> dict[tuple, list[str]]:
    out: dict[tuple, list[str]] = defaultdict(list)
    for key, name in items:
        out[key].append(name)
    return out


def vendor_of_gres(name: str, gtype: str | None, profiles: Sequence[Profile]) -> str:
    """The vendor of a GRES (name, type) by the profiles: the profile listing the type as
    a card type (whatever GRES name it maps to: Ascend registered as ``gpu:910b`` is
    still Ascend), else the only vendor whose profiles use that name; "" when unknown."""
    t = gtype.lower() if gtype else None
    if t:
        for p in profiles:
            types = {c.lower() for c in p.card_types}
            if p.gres_type:
                types.add(p.gres_type.lower())
            if t in types:
                return p.vendor
    vendors = {p.vendor for p in profiles if (p.gres or "").lower() == name.lower()}
    return vendors.pop() if len(vendors) == 1 else ""


@lru_cache(maxsize=1)
def device_patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """(vendor, regex) for every numbered device node a vendor plugin declares
    (``/dev/davinci{n}`` -> ``^/dev/davinci[0-9]+$``); a plugin that fails to load
    declares nothing."""
    out = []
    for ep in sorted(entry_points(group="hetpatrol.collectors"), key=lambda e: e.name):
        try:
            info = ep.load().vendor_info
        except Exception:  # noqa: BLE001 - a broken plugin is reported where configured
            continue
        for node in info.device_nodes:
            if "{n}" in node.path:
                rx = re.escape(node.path).replace(re.escape("{n}"), "[0-9]+")
                out.append((ep.name, re.compile(f"^{rx}$")))
    return tuple(out)


@lru_cache(maxsize=65536)
def vendor_of_file(path: str) -> str:
    """The one vendor whose plugin declares ``path`` as a card's device file, else ""."""
    vendors = {v for v, rx in device_patterns() if rx.match(path)}
    return vendors.pop() if len(vendors) == 1 else ""


def feature_tokens(feature: str) -> set[str]:
    """The words of a node feature as ``--constraint`` users write them: case folded,
    split at ``:``, ``=``, ``_``, ``-``, ``.``, ``/`` (``GPU_SKU:V100`` -> gpu, sku, v100;
    ``a100-80gb`` -> a100, 80gb), and the whole feature."""
    f = feature.strip().lower()
    return {f, *(t for t in re.split(r"[:=_\-./]+", f) if t)}


class Context:
    """The cluster as the rules see it; built once, read by every rule.

    Attributes: ``inp``, ``conf``, ``nodes`` (NodeView, in file order), ``views`` (by
    name), ``profiles``, ``card_names`` (GRES names that are cards), ``daemons`` (keyed
    by Slurm NodeName), ``daemon_classes`` (GRES name -> {(vendor, type)} the daemons
    found), ``types_by_name`` (GRES name -> types seen anywhere, None for untyped),
    ``node_classes`` (node -> {(vendor, type)}), ``by_part`` (partition -> NodeViews),
    ``undefined`` (partition -> names its ``Nodes=`` gives that no NodeName defines),
    ``unreadable_nodes`` (a NodeName host list could not be read), ``build_findings``
    (the ``hostlist`` findings met while reading).
    """

    def __init__(self, inp: AuditInput) -> None:
        self.inp = inp
        self.conf = inp.conf
        self.profiles = inp.profiles
        self.build_findings: list[AuditFinding] = []
        self.unreadable_nodes = False
        self.undefined: dict[str, list[str]] = {}
        self.nodes = self._read_nodes()
        self.views = {v.name: v for v in self.nodes}
        self.daemons = _by_node_name(inp.daemons, inp.live_nodes) if inp.daemons else inp.daemons
        self.gres_conf_of = lru_cache(maxsize=None)(_gres_conf_index(inp.gres_conf or []))
        # each gres.conf line's NodeName= expanded once (None: every node; a list too
        # long to expand is asked name by name)
        self._line_names: dict[int, frozenset[str] | None] = {}
        for ln in inp.gres_conf or ():
            names: frozenset[str] | None = None
            if ln.nodes is not None:
                try:
                    names = frozenset(expand_hostlist(ln.nodes.text))
                except ValueError:
                    names = frozenset()
            self._line_names[id(ln)] = names
        self._lines_of: dict[str, list[GresConfLine]] = {}
        self._class_cache: dict[tuple, set[CardClass]] = {}
        self.card_names = {(p.gres or "").lower() for p in self.profiles if p.gres}
        self.daemon_classes: dict[str, set[CardClass]] = defaultdict(set)
        for d in (self.daemons or {}).values():
            for vendor, ctype, gres in d.cards:
                if gres:
                    self.card_names.add(gres.lower())
                    self.daemon_classes[gres.lower()].add((vendor, ctype.lower()))
        for ln in inp.gres_conf or ():
            # mps and shard share a card's device files (gres.conf(5) MPS, Shard): no cards
            name = (ln.name or "").lower()
            if name and name not in SHARING_GRES and any(vendor_of_file(f) for f in ln.files):
                self.card_names.add(name)
        self.types_by_name: dict[str, set[str | None]] = defaultdict(set)
        for v in self.nodes:
            for e in v.gres:
                if e.name.lower() in self.card_names:
                    self.types_by_name[e.name.lower()].add(e.type.lower() if e.type else None)
        for ln in inp.gres_conf or ():
            if ln.name and ln.name.lower() in self.card_names:
                self.types_by_name[ln.name.lower()].add(ln.type.lower() if ln.type else None)
        for name, classes in self.daemon_classes.items():
            self.types_by_name[name].update(t for _v, t in classes if t)
        self.node_classes = {v.name: self._classes_of(v) for v in self.nodes}
        self.by_part: dict[str, list[NodeView]] = defaultdict(list)
        for v in self.nodes:
            for p in v.partitions:
                self.by_part[p].append(v)
        self.part_where = {p.name: p.where for p in self.conf.partitions}

    # ------------------------------------------------------------------ helpers
    def is_card(self, name: str) -> bool:
        return name.lower() in self.card_names

    def covers(self, ln: GresConfLine, node: str) -> bool:
        """Whether gres.conf line ``ln`` applies to ``node`` (gres.conf(5) NodeName)."""
        if ln.nodes is None:
            return True
        names = self._line_names.get(id(ln))
        if names:
            return node in names
        return node in ln.nodes

    def gres_conf_lines_of(self, node: str) -> list[GresConfLine]:
        """The gres.conf lines slurmd on ``node`` reads (global ones and those naming it)."""
        got = self._lines_of.get(node)
        if got is None:
            got = [ln for ln in self.inp.gres_conf or () if ln.name and self.covers(ln, node)]
            self._lines_of[node] = got
        return got

    def setting(self, key: str) -> str:
        s = self.conf.get(key)
        return s.value.strip() if s else ""

    def setting_where(self, key: str) -> str:
        s = self.conf.get(key)
        return s.where if s else self.conf.source

    def _classes_of(self, v: NodeView) -> set[CardClass]:
        d = (self.daemons or {}).get(v.name)
        if d is not None and d.cards:
            return {(vendor, ctype.lower()) for vendor, ctype, _g in d.cards}
        lines = self.gres_conf_lines_of(v.name)
        # nodes of one NodeName line read by the same gres.conf lines: one answer
        key = (v.gres, tuple(id(ln) for ln in lines))
        got = self._class_cache.get(key)
        if got is None:
            got = self._class_cache[key] = self._classes_from(v, lines)
        return set(got)

    def classes_under(self, node: str, name: str) -> set[CardClass]:
        """The (vendor, type) classes of ``node``'s cards under the GRES ``name`` alone:
        the daemon's cards it reports under that name, else the node's ``Gres=`` entries
        of that name with its gres.conf lines; a node's other GRES never count (a mixed
        ``Gres=gpu:h100:8,ascend:910b:8`` puts no Ascend card under ``gpu``)."""
        name = name.lower()
        d = (self.daemons or {}).get(node)
        if d is not None and d.cards:
            return {(vd, ct.lower()) for vd, ct, g in d.cards if (g or "").lower() == name}
        v = self.views[node]
        return self._classes_from(v, self.gres_conf_lines_of(node), only=name)

    def _classes_from(
        self, v: NodeView, lines: list[GresConfLine], only: str | None = None
    ) -> set[CardClass]:
        out: set[CardClass] = set()
        for e in v.gres:
            if not self.is_card(e.name) or (only is not None and e.name.lower() != only):
                continue
            typed = [e.type] if e.type else []
            files: list[str] = []
            for ln in lines:
                if ln.name and ln.name.lower() == e.name.lower():
                    if not e.type and ln.type:
                        typed.append(ln.type)
                    if not e.type or (ln.type or "").lower() == e.type.lower():
                        files.extend(ln.files)
            by_file = {vendor_of_file(f) for f in files} - {""}
            for t in typed or [None]:
                vendor = vendor_of_gres(e.name, t, self.profiles)
                if len(by_file) == 1:
                    vendor = next(iter(by_file))  # the device file names the hardware
                out.add((vendor, (t or "").lower()))
        return out

    def _read_nodes(self) -> list[NodeView]:
        inp = self.inp
        views: dict[str, NodeView] = {}
        for decl in inp.conf.nodes:
            problem = hostlist_problem(decl.names)
            if problem is None:
                try:
                    names = expand_hostlist(decl.names)
                except ValueError as exc:
                    problem = str(exc)
            if problem is not None:
                self.unreadable_nodes = True
                self.build_findings.append(
                    hostlist_finding(decl.where, f"NodeName={decl.names[:80]}", problem)
                )
                continue
            gres = decl.gres  # parsed once per line, shared by its nodes
            for n in names:
                views[n] = NodeView(n, gres, decl.features, decl.where, decl=decl)
        if not views and inp.live_nodes:
            for sn in inp.live_nodes:
                views[sn.name] = NodeView(sn.name, sn.gres, sn.features, "")  # no file line
        parts = inp.conf.partitions
        if parts:
            for p in parts:
                bad: list[str] = []
                missing: list[str] = []
                members = _members(p.nodes, views, inp.conf.nodesets, bad, missing)
                for n in dict.fromkeys(members):
                    views[n].partitions.append(p.name)
                if missing:
                    self.undefined[p.name] = list(dict.fromkeys(missing))
                for problem in bad:
                    self.build_findings.append(
                        hostlist_finding(p.where, f"PartitionName={p.name} Nodes=", problem)
                    )
        elif inp.live_nodes:
            for sn in inp.live_nodes:
                if sn.name in views:
                    views[sn.name].partitions.extend(sn.partitions)
        return list(views.values())


def hostlist_finding(where: str, what: str, problem: str) -> AuditFinding:
    return AuditFinding(
        "hostlist",
        "error",
        where,
        f"{what} cannot be read: {problem}; its nodes are not checked",
        "a Slurm host list: name[lo-hi,n,...] with decimal numbers, brackets closed "
        "(slurm.conf(5), NODE CONFIGURATION); split a list of more names into several lines",
    )


def _members(
    spec: str,
    views: dict[str, NodeView],
    nodesets: dict[str, dict[str, str]],
    bad: list[str] | None = None,
    missing: list[str] | None = None,
) -> list[str]:
    """The nodes of a partition's ``Nodes=``: ``ALL``, host lists, and NodeSet names
    (a NodeSet's ``Nodes=`` list or the nodes carrying its ``Feature=``), slurm.conf(5).
    A host list that cannot be read is skipped and its problem added to ``bad``; names
    no NodeName defines go to ``missing``."""
    if spec.upper() == "ALL":
        return list(views)
    out: list[str] = []
    for item in split_top(spec):
        ns = nodesets.get(item)
        if ns is not None:
            if "nodes" in ns:
                out.extend(_members(ns["nodes"], views, {}, bad, missing))
            feature = (ns.get("feature") or "").lower()
            if feature:
                out.extend(n for n, v in views.items() if feature in map(str.lower, v.features))
            continue
        problem = hostlist_problem(item)
        if problem is None:
            try:
                for n in expand_hostlist(item):
                    if n in views:
                        out.append(n)
                    elif missing is not None:
                        missing.append(n)
                continue
            except ValueError as exc:
                problem = str(exc)
        if bad is not None:
            bad.append(problem)
    return out


def _gres_conf_index(lines: Sequence[GresConfLine]) -> Callable[[str], GresConf]:
    """``gres_conf_for_node`` for many nodes: each line's ``NodeName=`` list expanded
    once (a list too long to expand is asked name by name), the answer cached per
    distinct set of matching lines."""
    expanded: list[frozenset[str] | None] = []
    for ln in lines:
        if ln.nodes is None:
            expanded.append(None)
            continue
        try:
            expanded.append(frozenset(expand_hostlist(ln.nodes.text)))
        except ValueError:
            expanded.append(frozenset())
    cache: dict[tuple[int, ...], GresConf] = {}

    def lookup(node: str) -> GresConf:
        key = tuple(
            i
            for i, (ln, names) in enumerate(zip(lines, expanded, strict=True))
            if ln.nodes is None or node in names or (not names and node in ln.nodes)
        )
        if key not in cache:
            cache[key] = gres_conf_for_node([lines[i] for i in key], node)
        return cache[key]

    return lookup


def _by_node_name(
    daemons: dict[str, DaemonNode], live: Sequence[SlurmNode] | None
) -> dict[str, DaemonNode]:
    """Daemons keyed by Slurm NodeName: a key that is a node's NodeHostName or NodeAddr
    (and no NodeName) is renamed, as ``hetpatrol fleet`` matches them."""
    if not live:
        return daemons
    names = {n.name for n in live}
    alias: dict[str, str] = {}
    for n in live:
        for other in (n.hostname, n.address):
            if other and other not in names:
                alias[other] = n.name if other not in alias else ""
    out: dict[str, DaemonNode] = {}
    for key, d in daemons.items():
        out[key if key in names else alias.get(key) or key] = d
    return out
