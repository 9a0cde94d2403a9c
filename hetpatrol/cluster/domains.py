"""One interconnect domain per training job: ``topology.conf`` switches and partitions
whose nodes span card classes with nothing to keep a multi-node job in one class.

``topology.conf`` (topology.conf(5), topology/tree): ``SwitchName=<name>`` with
``Nodes=<host list>`` (a leaf) or ``Switches=<switch list>``; keys are case-insensitive,
``#`` starts a comment; ``BlockName=<name> Nodes=...`` (topology/block) is read as a leaf.
topology/tree puts a job's nodes under as few leaf switches as it can; it knows nothing
of card classes.

A card class is (vendor, GRES type) of a node's card GRES (``slurm.conf`` ``Gres=``). A
domain (leaf switch or partition) whose nodes hold two classes or more keeps a job in one
class when:

- the classes have GRES names of their own (``gpu`` and ``ascend``): a job asks for one
  name, so it can only land on that name's nodes (no finding);
- else, when each class's nodes carry a feature no node of the other classes carries:
  a job stays in one class only if it asks, ``--constraint=[h100|a100]`` ("matching
  OR": all nodes of the job have one of the features, sbatch(1) ``--constraint``):
  ``info``;
- else nothing does: an untyped ``--gres=gpu:8 -N4`` may take H100 and A100 nodes in one
  job (a ring as slow as its slowest link): ``warning``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from hetpatrol.cluster.audit import AuditFinding, vendor_of_gres
from hetpatrol.cluster.hostlist import compress_hostlist
from hetpatrol.cluster.slurm_conf import SlurmConf
from hetpatrol.config import Profile
from hetpatrol.slurm.gres import expand_hostlist, split_top

Class = tuple[str, str, str]  # (vendor, GRES name, GRES type) lower-case; type "" untyped


@dataclass(frozen=True)
class Switch:
    """One ``topology.conf`` line: ``kind`` ``switch`` or ``block``, its ``nodes`` and
    ``switches`` host lists (None when absent), ``where`` ``file:line``."""

    name: str
    kind: str
    nodes: str | None
    switches: str | None
    where: str


def parse_topology_conf(text: str, source: str = "topology.conf") -> list[Switch]:
    """Every ``SwitchName=``/``BlockName=`` line. ``ValueError`` naming the line for a
    line with neither key (Slurm refuses the file then: topology.conf(5))."""
    out = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kv: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            kv[key.lower()] = value if sep else ""
        where = f"{source}:{lineno}"
        if "switchname" in kv:
            out.append(Switch(kv["switchname"], "switch", kv.get("nodes"), kv.get("switches"),
                              where))  # fmt: skip
        elif "blockname" in kv:
            out.append(Switch(kv["blockname"], "block", kv.get("nodes"), None, where))
        elif "blocksizes" in kv:
            continue  # topology/block's global line
        else:
            raise ValueError(f"{where}: neither SwitchName= nor BlockName=: {line[:80]!r}")
    return out


def _distinguishing(classes: dict[Class, list[str]], features: dict[str, set[str]]) -> dict:
    """Class -> a feature all its nodes here carry and no node of another class, or None."""
    out = {}
    for c, names in classes.items():
        common = set.intersection(*(features.get(n, set()) for n in names)) if names else set()
        others = set().union(
            *(features.get(n, set()) for c2, ns in classes.items() if c2 != c for n in ns)
        )
        keep = sorted(common - others)
        out[c] = keep[0] if keep else None
    return out


def domain_finding(
    what: str,
    where: str,
    names: Iterable[str],
    classes_of: Callable[[str], set[Class]],
    features: dict[str, set[str]],
) -> AuditFinding | None:
    """The finding for one domain (``what``: ``switch s1``, ``partition gpu``) of node
    ``names``, or None when it holds one class or its classes' GRES names keep jobs apart."""
    by_class: dict[Class, list[str]] = {}
    for n in names:
        for c in classes_of(n):
            by_class.setdefault(c, []).append(n)
    if len(by_class) < 2:
        return None
    by_name: dict[str, list[Class]] = {}
    for c in by_class:
        by_name.setdefault(c[1], []).append(c)
    shared = {name: cs for name, cs in by_name.items() if len(cs) >= 2}
    if not shared:
        return None  # one GRES name per class: a job's GRES request picks its class
    parts = []
    for cs in shared.values():
        for c in cs:
            parts.append(f"{c[1]}:{c[2] or '(untyped)'} on {compress_hostlist(by_class[c])}")
    keep = _distinguishing({c: by_class[c] for cs in shared.values() for c in cs}, features)
    spans = "; ".join(parts)
    if all(keep.values()):
        choice = "|".join(keep[c] for cs in shared.values() for c in cs)
        return AuditFinding(
            "job_domain",
            "info",
            where,
            f"{what} spans card classes of one GRES name ({spans}): a multi-node job stays "
            f"in one class only if it asks --constraint=[{choice}]",
            f"tell users to submit with --constraint=[{choice}] (or a job_submit rule); "
            "or one partition per card class",
        )
    lacking = [c for cs in shared.values() for c in cs if not keep[c]]
    return AuditFinding(
        "job_domain",
        "warning",
        where,
        f"{what} spans card classes of one GRES name ({spans}) and nothing keeps a "
        f"multi-node job in one class: an untyped --gres={lacking[0][1]} job may take "
        "nodes of each",
        "Features=<card type> on each class's NodeName lines and --constraint=[a|b], or "
        "one partition (or leaf switch) per card class",
    )


def domain_findings(
    switches: Iterable[Switch] | None,
    partitions: Iterable[tuple[str, str, list[str]]],
    classes_of: Callable[[str], set[Class]],
    features: dict[str, set[str]],
) -> list[AuditFinding]:
    """Findings for every leaf switch (or block) of ``switches`` and every partition
    (``(name, where, node names)``). A host list that cannot be expanded is a finding of
    its own, never skipped silently."""
    out: list[AuditFinding] = []
    for sw in switches or ():
        if sw.nodes is None:
            continue  # an upper switch: its leaves are judged
        try:
            names = expand_hostlist(sw.nodes)
        except ValueError as exc:
            out.append(
                AuditFinding("job_domain", "warning", sw.where, f"Nodes={sw.nodes}: {exc}", "")
            )
            continue
        f = domain_finding(f"{sw.kind} {sw.name}", sw.where, names, classes_of, features)
        if f is not None:
            out.append(f)
    for name, where, names in partitions:
        f = domain_finding(f"partition {name}", where, names, classes_of, features)
        if f is not None:
            out.append(f)
    return out


def node_table(
    conf: SlurmConf, profiles: Sequence[Profile]
) -> tuple[dict[str, set[Class]], dict[str, set[str]], list[tuple[str, str, list[str]]]]:
    """From ``slurm.conf``: node -> its card classes (GRES names some profile gives
    cards), node -> its features (lower case), and the partitions as (name, where, node
    names). ``Nodes=ALL`` is every node; a NodeSet name its ``Nodes=`` or the nodes of its
    ``Feature=``; a host list that cannot be expanded leaves those nodes out (audit-slurm
    reports such lists itself)."""
    card_names = {p.gres.lower() for p in profiles if p.gres}
    classes: dict[str, set[Class]] = {}
    features: dict[str, set[str]] = {}
    for decl in conf.nodes:
        try:
            names = expand_hostlist(decl.names)
        except ValueError:
            continue
        cls = {
            (vendor_of_gres(e.name, e.type, profiles), e.name.lower(), (e.type or "").lower())
            for e in decl.gres
            if e.name.lower() in card_names
        }
        feats = {f.lower() for f in decl.features}
        for n in names:
            classes[n] = cls
            features[n] = feats
    parts = []
    for p in conf.partitions:
        members: list[str] = []
        for spec in split_top(p.nodes) if p.nodes else []:
            spec = spec.strip()
            if spec.upper() == "ALL":
                members += list(classes)
            elif spec in conf.nodesets:
                ns = conf.nodesets[spec]
                if "nodes" in ns:
                    members += _expand(ns["nodes"])
                if "feature" in ns:
                    want = ns["feature"].lower()
                    members += [n for n, fs in features.items() if want in fs]
            else:
                members += _expand(spec)
        parts.append((p.name, p.where, list(dict.fromkeys(members))))
    return classes, features, parts


def _expand(text: str) -> list[str]:
    try:
        return expand_hostlist(text)
    except ValueError:
        return []
