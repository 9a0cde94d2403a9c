"""``hetpatrol ledger spans``: the jobs whose nodes held different card classes.

A multi-node training job is as fast as its slowest card and link: one that ran on H100
and A100 nodes (an untyped ``--gres=gpu:8 -N4``), or on nodes of two vendors, is worth
finding. From ``sacct`` (the ledger's stream: ``NodeList`` and ``AllocTRES`` of each
allocation, ``-X``) and the nodes' GRES (``scontrol show node -o``, as ``ledger usage``
reads them): a node's card class is the set of (GRES name, type) of its card GRES (the
names the config's profiles give cards); a job *spans* classes when it allocated a card
GRES (``gres/<name>`` in ``AllocTRES``) and its nodes have two classes or more. A node
without card GRES, or one ``scontrol`` does not list, is not counted (and said: its
class is unknown).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hetpatrol.ledger.sacct_stream import JobRun
from hetpatrol.slurm.gres import expand_hostlist

NodeClass = frozenset[tuple[str, str]]  # {(GRES name, type or "")}


@dataclass(frozen=True)
class SpanningJob:
    """One allocation whose nodes held ``classes`` (class label -> its node names, in
    NodeList order); ``unknown``: nodes whose class scontrol did not give."""

    job_id: str
    user: str
    account: str
    partition: str
    nodes: str
    elapsed: int
    classes: tuple[tuple[str, tuple[str, ...]], ...]
    unknown: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "user": self.user,
            "account": self.account,
            "partition": self.partition,
            "nodes": self.nodes,
            "elapsed_seconds": self.elapsed,
            "classes": {label: list(hosts) for label, hosts in self.classes},
            "unknown_nodes": list(self.unknown),
        }


def class_label(cls: NodeClass) -> str:
    return "+".join(f"{n}:{t}" if t else n for n, t in sorted(cls))


def node_class(gres: Mapping[str, frozenset[str]], card_names: set[str]) -> NodeClass:
    """A node's card class from its GRES name -> types (``ledger.slurm_state``)."""
    out = set()
    for name, types in gres.items():
        if name not in card_names:
            continue
        if types:
            out.update((name, t) for t in types)
        else:
            out.add((name, ""))
    return frozenset(out)


def _card_tres(alloc_tres: str, card_names: set[str]) -> bool:
    for item in alloc_tres.split(","):
        key = item.split("=", 1)[0].strip().lower()
        if key.startswith("gres/") and key[5:].split(":", 1)[0] in card_names:
            return True
    return False


def spanning_jobs(
    runs: Iterable[JobRun],
    node_gres: Mapping[str, Mapping[str, frozenset[str]]],
    card_names: Iterable[str],
) -> list[SpanningJob]:
    """The runs (``sacct -X`` allocations) that allocated card GRES on nodes of two card
    classes or more, in sacct's order. A ``NodeList`` that cannot be expanded is skipped
    (sacct's own text, ``None assigned`` for a job that never ran)."""
    names = {n.lower() for n in card_names}
    classes = {n: node_class(g, names) for n, g in node_gres.items()}
    out = []
    for run in runs:
        if not run.nodes or run.nodes == "None assigned" or not _card_tres(run.alloc_tres, names):
            continue
        try:
            hosts = expand_hostlist(run.nodes)
        except ValueError:
            continue
        if len(hosts) < 2:
            continue
        by_class: dict[NodeClass, list[str]] = {}
        unknown = []
        for h in hosts:
            c = classes.get(h)
            if not c:
                unknown.append(h)
                continue
            by_class.setdefault(c, []).append(h)
        if len(by_class) < 2:
            continue
        out.append(
            SpanningJob(
                run.job_label,
                run.user,
                run.account,
                run.partition,
                run.nodes,
                run.elapsed,
                tuple(
                    (class_label(c), tuple(hs))
                    for c, hs in sorted(by_class.items(), key=lambda kv: class_label(kv[0]))
                ),
                tuple(unknown),
            )
        )
    return out


def _few(hosts: tuple[str, ...]) -> str:
    """``3 nodes (gn01, gn02, gn03)``; past three names, ``...`` (the JSON has them all)."""
    shown = ", ".join(hosts[:3]) + (", ..." if len(hosts) > 3 else "")
    return f"{len(hosts)} node{'s' if len(hosts) != 1 else ''} ({shown})"


def render_text(jobs: list[SpanningJob], printable) -> str:
    """One line per job: ``job user account partition elapsed: class on hosts; ...``."""
    if not jobs:
        return "ok: no job ran on nodes of two card classes\n"
    out = []
    for j in jobs:
        spans = "; ".join(f"{label} on {_few(hosts)}" for label, hosts in j.classes)
        extra = f"; class unknown: {_few(j.unknown)}" if j.unknown else ""
        out.append(
            printable(
                f"{j.job_id} user={j.user} account={j.account} partition={j.partition} "
                f"elapsed={j.elapsed}s: {spans}{extra}"
            )
        )
    return "\n".join(out) + "\n"
