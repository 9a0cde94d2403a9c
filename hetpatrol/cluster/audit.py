"""``hetpatrol audit-slurm``: the mixed-cluster checklist over slurm.conf, gres.conf,
cgroup.conf and, when given, the live nodes and the daemons' cards.

Each :class:`AuditFinding` names the check, a severity (``error``: jobs can land on the
wrong cards or Slurm will drain nodes; ``warning``: a gap an operator should close;
``info``: how the cluster is laid out), where (``file:line``, or ``node``/``partition``
with a compressed host list) and the fix. The checks:

``gres_syntax``
    A ``Gres=`` that cannot be read (the node is kept, without GRES).
``hostlist``
    A ``NodeName=`` or partition ``Nodes=`` host list Slurm would refuse, or longer than
    ``HOSTLIST_MAX`` names (an error naming the line; its nodes are not checked).
``gres_types``
    ``GresTypes`` lists every GRES name used by ``NodeName ... Gres=`` and gres.conf
    ``Name=`` (slurm.conf(5): GresTypes, "A comma-delimited list of generic resources
    to be managed"; a name missing there makes slurmctld refuse the node's Gres).
``untyped_gres``
    Every card class has its own GRES type: a card GRES registered without a type is an
    error when the cluster has two card classes under that name (``--gres=gpu:1`` may land
    on either), a warning otherwise. ``shared_gres_name``: one GRES name used by two
    vendors (an untyped CUDA request can land on an NPU).
``gres_conf_count``
    gres.conf and slurm.conf agree per node and (name, type) (else slurmd registers fewer
    and Slurm drains the node: "gres/gpu count reported lower than configured").
``gres_vs_daemons``
    Node ``Gres=`` equals what the daemons found, per (name, type): ``sinfo -o "%n %G"``
    against the cards, for the whole cluster.
``layout``
    Per partition: one card class (homogeneous), several classes (node ``Features`` must
    carry the card type so ``--constraint`` works: ``node_features``), or mixed nodes
    (``mixed_node``: crosstalk risk; devices must be isolated per job: ``TaskPlugin``
    with ``task/cgroup`` and cgroup.conf ``ConstrainDevices=yes``,
    https://slurm.schedmd.com/cgroup.conf.html; and, with the daemons' metrics, the
    runtimes: no ``library_path_mix`` / ``global_ld_library_path`` finding on the node).
``tres``
    ``AccountingStorageTRES`` holds ``gres/<name>`` and ``gres/<name>:<type>`` of every
    typed class (https://slurm.schedmd.com/tres.html: only the listed GRES are tracked);
    ``TRESBillingWeights`` of a partition with several classes weighs each type.
``healthcheck``
    ``HealthCheckProgram`` runs hetpatrol with a non-zero ``HealthCheckInterval``;
    ``Prolog`` runs it (a card that failed since the last check is caught before a job).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hetpatrol.cluster.fleet import RUNTIME_CHECKS, DaemonNode
from hetpatrol.cluster.hostlist import compress_hostlist, hostlist_problem
from hetpatrol.cluster.slurm_conf import Setting, SlurmConf
from hetpatrol.cluster.slurm_nodes import SlurmNode
from hetpatrol.config import Profile
from hetpatrol.slurm.gres import (
    GresConf,
    GresConfLine,
    GresEntry,
    expand_hostlist,
    gres_conf_for_node,
    split_top,
    sum_gres,
)

SEVERITIES = ("error", "warning", "info")
GresKey = tuple[str, str | None]  # (name, type) lower-case; None = untyped


@dataclass(frozen=True)
class AuditFinding:
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
class NodeView:
    """One node as the audit sees it: registration, features, partitions, where set."""

    name: str
    gres: tuple[GresEntry, ...]
    features: tuple[str, ...]
    where: str
    partitions: list[str] = field(default_factory=list)


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
class AuditReport:
    findings: list[AuditFinding]
    layouts: dict[str, str]
    nodes: int

    @property
    def exit_code(self) -> int:
        """2 with an error, 1 with a warning, else 0."""
        sev = {f.severity for f in self.findings}
        return 2 if "error" in sev else 1 if "warning" in sev else 0

    def to_json(self) -> dict[str, Any]:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        return {
            "nodes": self.nodes,
            "layouts": self.layouts,
            "exit_code": self.exit_code,
            "findings": [
                f.to_json() for f in sorted(self.findings, key=lambda f: order[f.severity])
            ],
        }


def _members(
    spec: str,
    views: dict[str, NodeView],
    nodesets: dict[str, dict[str, str]],
    bad: list[str] | None = None,
) -> list[str]:
    """The nodes of a partition's ``Nodes=``: ``ALL``, host lists, and NodeSet names
    (a NodeSet's ``Nodes=`` list or the nodes carrying its ``Feature=``), slurm.conf(5).
    A host list that cannot be read is skipped and its problem added to ``bad``."""
    if spec.upper() == "ALL":
        return list(views)
    out: list[str] = []
    for item in split_top(spec):
        ns = nodesets.get(item)
        if ns is not None:
            if "nodes" in ns:
                out.extend(_members(ns["nodes"], views, {}, bad))
            feature = (ns.get("feature") or "").lower()
            if feature:
                out.extend(n for n, v in views.items() if feature in map(str.lower, v.features))
            continue
        problem = hostlist_problem(item)
        if problem is None:
            try:
                out.extend(n for n in expand_hostlist(item) if n in views)
                continue
            except ValueError as exc:
                problem = str(exc)
        if bad is not None:
            bad.append(problem)
    return out


def _where(where: str, names: list[str]) -> str:
    """The file line, or for nodes read live (no line) ``node X`` / ``nodes gn[01-40]``."""
    return where or f"node{'s' if len(names) != 1 else ''} {compress_hostlist(names)}"


def _n(count: int) -> str:
    return f"{count} node{'s' if count != 1 else ''}"


def _key(e: GresEntry) -> GresKey:
    return e.key


def _label(k: GresKey) -> str:
    return f"{k[0]}:{k[1]}" if k[1] else k[0]


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


def _hostlist_finding(where: str, what: str, problem: str) -> AuditFinding:
    return AuditFinding(
        "hostlist",
        "error",
        where,
        f"{what} cannot be read: {problem}; its nodes are not checked",
        "a Slurm host list: name[lo-hi,n,...] with decimal numbers, brackets closed "
        "(slurm.conf(5), NODE CONFIGURATION); split a list of more names into several lines",
    )


def _nodes(inp: AuditInput, add: Callable[[AuditFinding], None]) -> list[NodeView]:
    """The nodes of the NodeName lines (or, with none, the live ones); a host list that
    cannot be read (malformed, or more names than ``HOSTLIST_MAX``) is an ``error``
    finding naming its line."""
    views: dict[str, NodeView] = {}
    for decl in inp.conf.nodes:
        problem = hostlist_problem(decl.names)
        if problem is None:
            try:
                names = expand_hostlist(decl.names)
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            add(_hostlist_finding(decl.where, f"NodeName={decl.names[:80]}", problem))
            continue
        gres = decl.gres  # parsed once per line, shared by its nodes
        for n in names:
            views[n] = NodeView(n, gres, decl.features, decl.where)
    if not views and inp.live_nodes:
        for sn in inp.live_nodes:
            views[sn.name] = NodeView(sn.name, sn.gres, sn.features, "")  # no file line
    parts = inp.conf.partitions
    if parts:
        for p in parts:
            bad: list[str] = []
            for n in dict.fromkeys(_members(p.nodes, views, inp.conf.nodesets, bad)):
                views[n].partitions.append(p.name)
            for problem in bad:
                add(_hostlist_finding(p.where, f"PartitionName={p.name} Nodes=", problem))
    elif inp.live_nodes:
        for sn in inp.live_nodes:
            if sn.name in views:
                views[sn.name].partitions.extend(sn.partitions)
    return list(views.values())


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
    daemons: dict[str, DaemonNode], live: Sequence[SlurmNode]
) -> dict[str, DaemonNode]:
    """Daemons keyed by Slurm NodeName: a key that is a node's NodeHostName or NodeAddr
    (and no NodeName) is renamed, as ``hetpatrol fleet`` matches them."""
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


def _group(items: Iterable[tuple[tuple, str]]) -> dict[tuple, list[str]]:
    out: dict[tuple, list[str]] = defaultdict(list)
    for key, name in items:
        out[key].append(name)
    return out


def audit(inp: AuditInput) -> AuditReport:
    """Run every check; see the module docstring."""
    conf, findings = inp.conf, []
    add = findings.append
    for problem in conf.problems:
        add(AuditFinding("slurm_conf", "warning", problem.split(": ", 1)[0], problem))
    for note in inp.notes:
        add(AuditFinding("prometheus", "info", "prometheus", note))
    nodes = _nodes(inp, add)
    profiles = inp.profiles
    card_names = {(p.gres or "").lower() for p in profiles if p.gres}
    if inp.daemons is not None and inp.live_nodes:
        inp = replace(inp, daemons=_by_node_name(inp.daemons, inp.live_nodes))
    daemon_classes: dict[str, set[tuple[str, str]]] = defaultdict(set)  # name -> {(vendor, type)}
    for d in (inp.daemons or {}).values():
        for vendor, ctype, gres in d.cards:
            if gres:
                card_names.add(gres.lower())
                daemon_classes[gres.lower()].add((vendor, ctype.lower()))

    for decl in conf.nodes:
        if (err := decl.gres_error) is not None:
            add(
                AuditFinding(
                    "gres_syntax",
                    "error",
                    decl.where,
                    f"Gres= cannot be read: {err}",
                    "Gres=<name>[:<type>]:<count>,... (slurm.conf(5), NodeName Gres)",
                )
            )

    # ---- gres_types
    used: dict[str, str] = {}
    for decl in conf.nodes:
        for e in decl.gres:
            used.setdefault(e.name.lower(), decl.where)
    for ln in inp.gres_conf or ():
        if ln.name:
            used.setdefault(ln.name.lower(), f"{inp.gres_conf_path}:{ln.line}")
    if inp.live_nodes and not conf.nodes:
        for sn in inp.live_nodes:
            for e in sn.gres:
                used.setdefault(e.name.lower(), f"node {sn.name}")
    gt: Setting | None = conf.get("GresTypes")
    listed = {g.strip().lower() for g in (gt.value if gt else "").split(",") if g.strip()}
    missing = sorted(n for n in used if n not in listed)
    if missing:
        want = ",".join(sorted(listed | set(missing)))
        add(
            AuditFinding(
                "gres_types",
                "error",
                gt.where if gt else conf.source,
                f"GresTypes does not list {', '.join(missing)} (used at "
                + ", ".join(used[n] for n in missing)
                + ")",
                f"GresTypes={want}",
            )
        )

    # ---- card classes per GRES name (registration + gres.conf + daemons)
    types_by_name: dict[str, set[str | None]] = defaultdict(set)
    for v in nodes:
        for e in v.gres:
            if e.name.lower() in card_names:
                types_by_name[e.name.lower()].add(e.type.lower() if e.type else None)
    for ln in inp.gres_conf or ():
        if ln.name and ln.name.lower() in card_names:
            types_by_name[ln.name.lower()].add(ln.type.lower() if ln.type else None)
    for name, classes in daemon_classes.items():
        types_by_name[name].update(t for _v, t in classes if t)

    # ---- untyped_gres
    untyped = _group(
        ((e.name.lower(), v.where), v.name)
        for v in nodes
        for e in v.gres
        if e.name.lower() in card_names and not e.type
    )
    for (name, where), names in sorted(untyped.items()):
        classes = sorted(t for t in types_by_name[name] if t)
        several = len(classes) >= 2 or len(daemon_classes.get(name, ())) >= 2
        add(
            AuditFinding(
                "untyped_gres",
                "error" if several else "warning",
                _where(where, names),
                f"{compress_hostlist(names)}: GRES {name} has no type"
                + (
                    f"; the cluster has {', '.join(classes)} under {name}: "
                    f"--gres={name}:1 may land on any of them"
                    if several
                    else "; a job cannot ask for this card class by name"
                ),
                f"Gres={name}:<card type>:<count> on this line, and Type=<card type> in gres.conf",
            )
        )
    for ln in inp.gres_conf or ():
        if ln.name and ln.name.lower() in card_names and not ln.type:
            add(
                AuditFinding(
                    "untyped_gres",
                    "error"
                    if len([t for t in types_by_name[ln.name.lower()] if t]) >= 2
                    else "warning",
                    f"{inp.gres_conf_path}:{ln.line}",
                    f"gres.conf Name={ln.name} without Type=",
                    f"add Type=<card type> (the type in slurm.conf Gres={ln.name}:<type>:N)",
                )
            )

    # ---- shared_gres_name: one name, two vendors
    for name in sorted(types_by_name):
        vendors = {v for v, _t in daemon_classes.get(name, ())} or {
            vendor_of_gres(name, t, profiles) for t in types_by_name[name] if t
        }
        vendors.discard("")
        if len(vendors) >= 2:
            add(
                AuditFinding(
                    "shared_gres_name",
                    "warning",
                    gt.where if gt else conf.source,
                    f"GRES {name} is used by {' and '.join(sorted(vendors))} cards: an untyped "
                    f"--gres={name}:1 can land on either vendor",
                    "one GRES name per vendor (gpu for NVIDIA, npu/ascend for Ascend)",
                )
            )

    # ---- gres_conf_count
    if inp.gres_conf:
        mism: dict[tuple, list[str]] = defaultdict(list)
        gres_conf_of = _gres_conf_index(inp.gres_conf)
        for v in nodes:
            gc = gres_conf_of(v.name)
            if not gc.entries or not gc.complete:
                continue
            want = {_key(e): e.count for e in sum_gres(v.gres) if e.name.lower() in card_names}
            have = {_key(e): e.count for e in gc.entries if e.name.lower() in card_names}
            diff = tuple(
                (_label(k), want.get(k, 0), have.get(k, 0))
                for k in sorted(set(want) | set(have), key=lambda k: (k[0], k[1] or ""))
                if want.get(k, 0) != have.get(k, 0)
            )
            if diff:
                mism[(v.where, diff)].append(v.name)
        for (where, diff), names in mism.items():
            text = "; ".join(f"{lab}: slurm.conf {w}, gres.conf {h}" for lab, w, h in diff)
            add(
                AuditFinding(
                    "gres_conf_count",
                    "error",
                    _where(where, names),
                    f"{compress_hostlist(names)}: {text} (slurmd registers the gres.conf "
                    "count; Slurm drains a node with fewer than configured)",
                    f"make Gres= on this line and {inp.gres_conf_path} agree",
                )
            )

    # ---- gres_vs_daemons
    if inp.daemons is not None:
        by_name = {v.name: v for v in nodes}
        mism = defaultdict(list)
        unseen = []
        for v in nodes:
            d = inp.daemons.get(v.name)
            if d is None:
                if any(e.name.lower() in card_names for e in v.gres):
                    unseen.append(v.name)
                continue
            found: dict[GresKey, int] = defaultdict(int)
            for (_v, ctype, gres), n in d.cards.items():
                found[(gres.lower(), ctype.lower() or None)] += n
            reg = {_key(e): e.count for e in sum_gres(v.gres) if e.name.lower() in card_names}
            # an untyped registration counts every card of that name
            have = dict(found)
            for k in reg:
                if k[1] is None:
                    have[k] = sum(n for fk, n in found.items() if fk[0] == k[0])
                    for fk in [fk for fk in have if fk[0] == k[0] and fk[1] is not None]:
                        if fk not in reg:
                            del have[fk]
            diff = tuple(
                (_label(k), reg.get(k, 0), have.get(k, 0))
                for k in sorted(set(reg) | set(have), key=lambda k: (k[0], k[1] or ""))
                if reg.get(k, 0) != have.get(k, 0)
            )
            if diff:
                mism[(v.where, diff)].append(v.name)
        for (where, diff), names in mism.items():
            text = "; ".join(f"{lab}: Gres= {r}, daemons found {h}" for lab, r, h in diff)
            fix = ",".join(f"{lab}:{h}" for lab, _r, h in diff if h)
            add(
                AuditFinding(
                    "gres_vs_daemons",
                    "error",
                    _where(where, names),
                    f"{compress_hostlist(names)}: {text}",
                    f"Gres={fix} (or repair the missing cards)" if fix else "repair the cards",
                )
            )
        extra = sorted(k for k in inp.daemons if k not in by_name)
        if unseen:
            add(
                AuditFinding(
                    "gres_vs_daemons",
                    "info",
                    f"nodes {compress_hostlist(unseen)}",
                    f"{_n(len(unseen))} with card GRES {'have' if len(unseen) != 1 else 'has'} no "
                    "daemon metrics: not compared",
                )
            )
        if extra:
            add(
                AuditFinding(
                    "gres_vs_daemons",
                    "warning",
                    f"nodes {compress_hostlist(extra)}",
                    f"{_n(len(extra))} in Prometheus but not in Slurm's node list",
                    "add NodeName lines for them, or fix the scrape config's node label",
                )
            )

    # ---- layout per partition
    def classes_of(v: NodeView) -> set[tuple[str, str]]:
        d = (inp.daemons or {}).get(v.name)
        if d is not None and d.cards:
            return {(vendor, ctype.lower()) for vendor, ctype, _g in d.cards}
        out = set()
        for e in v.gres:
            if e.name.lower() in card_names:
                out.add((vendor_of_gres(e.name, e.type, profiles), (e.type or "").lower()))
        return out

    node_classes = {v.name: classes_of(v) for v in nodes}
    layouts: dict[str, str] = {}
    by_part: dict[str, list[NodeView]] = defaultdict(list)
    for v in nodes:
        for p in v.partitions:
            by_part[p].append(v)
    part_where = {p.name: p.where for p in conf.partitions}
    mixed_nodes = [v for v in nodes if len({c[0] for c in node_classes[v.name]}) >= 2]
    for pname, members in sorted(by_part.items()):
        classes = set().union(*(node_classes[v.name] for v in members))
        vendors = {c[0] for c in classes}
        mixed = [v.name for v in members if len({c[0] for c in node_classes[v.name]}) >= 2]
        if not classes:
            layouts[pname] = "no cards"
            continue
        if mixed:
            layouts[pname] = "mixed nodes"
        elif len(classes) == 1:
            layouts[pname] = "one card class"
        elif len(vendors) == 1:
            layouts[pname] = "one vendor, several card types (features)"
        else:
            layouts[pname] = "several vendors (features)"
        if len(classes) >= 2:
            lacking = _group(
                ((v.where, tuple(sorted(t for _vv, t in node_classes[v.name] if t))), v.name)
                for v in members
                if node_classes[v.name]
                and len({c[0] for c in node_classes[v.name]}) < 2  # mixed: mixed_node
                and not {t for _vv, t in node_classes[v.name] if t}
                <= {f.lower() for f in v.features}
            )
            for (where, types), names in lacking.items():
                add(
                    AuditFinding(
                        "node_features",
                        "error",
                        _where(where, names),
                        f"partition {pname} holds {len(classes)} card classes, but "
                        f"{compress_hostlist(names)} "
                        f"{'lacks' if len(names) == 1 else 'lack'} the feature "
                        f"{','.join(types) or '(card type unknown)'}: --constraint cannot "
                        "pick the card type",
                        f"Features={','.join(types)} on the node's line",
                    )
                )
    if mixed_nodes:
        names = [v.name for v in mixed_nodes]
        task = (conf.get("TaskPlugin").value if conf.get("TaskPlugin") else "").lower()
        add(
            AuditFinding(
                "mixed_node",
                "warning",
                f"nodes {compress_hostlist(names)}",
                f"{_n(len(names))} with cards of two vendors: "
                "a job sees the other vendor's "
                "devices unless they are constrained per job (crosstalk risk)",
                "prefer one vendor per node; else isolate devices (below)",
            )
        )
        if inp.daemons is not None:
            leaky = _group(
                (tuple(sorted(inp.daemons[n].node_findings & set(RUNTIME_CHECKS))), n)
                for n in names
                if n in inp.daemons and inp.daemons[n].node_findings & set(RUNTIME_CHECKS)
            )
            for checks, hosts in sorted(leaky.items()):
                add(
                    AuditFinding(
                        "mixed_node",
                        "error",
                        _where("", hosts),
                        f"{compress_hostlist(hosts)}: CUDA and CANN runtimes are not kept "
                        f"apart (daemon finding {', '.join(checks)}): a job loads the other "
                        "vendor's libraries",
                        "keep vendor libraries out of ld.so.conf and the login-wide "
                        "LD_LIBRARY_PATH; set them per job (module, job script, container)",
                    )
                )
            unread = [n for n in names if n not in inp.daemons]
            if unread:
                add(
                    AuditFinding(
                        "mixed_node",
                        "info",
                        _where("", unread),
                        f"{_n(len(unread))} without daemon metrics: runtime isolation not checked",
                    )
                )
        if "task/cgroup" not in task:
            s = conf.get("TaskPlugin")
            add(
                AuditFinding(
                    "mixed_node",
                    "error",
                    s.where if s else conf.source,
                    f"TaskPlugin={task or '(not set)'}: jobs on mixed nodes are not confined "
                    "to their GRES devices",
                    "TaskPlugin=task/cgroup,task/affinity and ConstrainDevices=yes in cgroup.conf",
                )
            )
        if inp.cgroup is None:
            add(
                AuditFinding(
                    "mixed_node",
                    "warning",
                    inp.cgroup_path,
                    "cgroup.conf not read: ConstrainDevices not checked",
                    "pass --cgroup-conf",
                )
            )
        elif inp.cgroup.get("constraindevices", "no").lower() != "yes":
            add(
                AuditFinding(
                    "mixed_node",
                    "error",
                    inp.cgroup_path,
                    "ConstrainDevices is not yes: a job on a mixed node can open every "
                    "vendor's device files",
                    "ConstrainDevices=yes",
                )
            )
    for pname, layout in sorted(layouts.items()):
        add(
            AuditFinding(
                "layout",
                "info",
                part_where.get(pname, f"partition {pname}"),
                f"partition {pname}: {layout}",
            )
        )

    # ---- tres
    typed = sorted(
        {(n, t) for n, ts in types_by_name.items() for t in ts if t},
    )
    if typed:
        s = conf.get("AccountingStorageTRES")
        have = {x.strip().lower() for x in (s.value if s else "").split(",") if x.strip()}
        want = sorted({f"gres/{n}" for n, _t in typed} | {f"gres/{n}:{t}" for n, t in typed})
        lacking = [w for w in want if w not in have]
        if lacking:
            add(
                AuditFinding(
                    "tres",
                    "warning",
                    s.where if s else conf.source,
                    f"AccountingStorageTRES lacks {','.join(lacking)}: usage per card class "
                    "is not recorded",
                    f"AccountingStorageTRES={','.join(sorted(have | set(lacking)))}",
                )
            )
        any_weights = False
        for p in conf.partitions:
            w = p.fields.get("tresbillingweights")
            members = by_part.get(p.name, [])
            ptypes = set().union(*(node_classes[v.name] for v in members)) if members else set()
            if w is None:
                continue
            any_weights = True
            weights = {x.split("=", 1)[0].strip().lower() for x in w.split(",") if "=" in x}
            lacking = sorted(
                f"gres/{n}:{t}"
                for n, t in typed
                if any(t == ct for _v, ct in ptypes) and f"gres/{n}:{t}" not in weights
            )
            if len(ptypes) >= 2 and lacking:
                add(
                    AuditFinding(
                        "tres",
                        "warning",
                        p.where,
                        f"partition {p.name}: TRESBillingWeights does not weigh "
                        f"{','.join(lacking)}: every card class is billed alike",
                        "TRESBillingWeights=...,"
                        + ",".join(f"{x.upper()[:4]}{x[4:]}=<weight>" for x in lacking),
                    )
                )
        if not any_weights:
            add(
                AuditFinding(
                    "tres",
                    "info",
                    conf.source,
                    "no partition sets TRESBillingWeights: billing counts CPUs only, a card "
                    "class costs nothing",
                    "TRESBillingWeights=CPU=1.0,GRES/gpu:<type>=<weight>,... per partition",
                )
            )

    # ---- healthcheck
    hc = conf.get("HealthCheckProgram")
    if hc is None or "hetpatrol" not in hc.value:
        add(
            AuditFinding(
                "healthcheck",
                "warning",
                hc.where if hc else conf.source,
                f"HealthCheckProgram={hc.value if hc and hc.value else '(not set)'} does not run "
                "hetpatrol",
                "HealthCheckProgram=/usr/local/sbin/hetpatrol-healthcheck (runs `hetpatrol "
                "check`), HealthCheckInterval=60",
            )
        )
    else:
        hi = conf.get("HealthCheckInterval")
        if hi is None or hi.value.strip() in ("", "0"):
            add(
                AuditFinding(
                    "healthcheck",
                    "warning",
                    hi.where if hi else conf.source,
                    "HealthCheckInterval is 0: the health check runs only at slurmd start",
                    "HealthCheckInterval=60",
                )
            )
    pro = conf.get("Prolog")
    if pro is None or "hetpatrol" not in pro.value:
        add(
            AuditFinding(
                "healthcheck",
                "info",
                pro.where if pro else conf.source,
                f"Prolog={pro.value if pro and pro.value else '(not set)'} does not run hetpatrol: "
                "a card that "
                "failed since the last health check can still get a job",
                "a Prolog that runs `hetpatrol check` (exit non-zero drains the node)",
            )
        )
    return AuditReport(findings, layouts, len(nodes))
