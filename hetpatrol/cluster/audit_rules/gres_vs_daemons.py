"""``gres_vs_daemons`` (with ``--prometheus``): node ``Gres=`` equals what the daemons
found, per (name, type). Error where they differ: slurmctld hands out the registered
cards (slurm.conf(5) NodeName Gres), so a job can be given a card that is not there;
nodes not compared are listed (info), daemons Slurm does not know are a warning. A
daemon that is not reporting (scrape target ``up == 0``, last patrol stale, not ready:
the ``silent`` rule of ``fleet``) has no card series: its node is not compared and is
named as silent (warning), never as missing cards.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import (
    AuditFinding,
    Context,
    GresKey,
    label,
    plural,
    where_of,
)
from hetpatrol.cluster.hostlist import compress_hostlist
from hetpatrol.slurm.gres import sum_gres

NAME = "gres_vs_daemons"
SOURCE = "slurm.conf(5) NodeName Gres"


def check(ctx: Context) -> Iterator[AuditFinding]:
    daemons = ctx.daemons
    if daemons is None:
        return
    mism: dict[tuple, list[str]] = defaultdict(list)
    unseen = []
    silent: dict[str, list[str]] = defaultdict(list)
    for v in ctx.nodes:
        d = daemons.get(v.name)
        if d is None:
            if any(ctx.is_card(e.name) for e in v.gres):
                unseen.append(v.name)
            continue
        if d.quiet:
            # a down target's series go stale (Prometheus staleness, 5 min): zero cards
            # found says nothing about the cards
            if any(ctx.is_card(e.name) for e in v.gres):
                silent[v.where].append(v.name)
            continue
        found: dict[GresKey, int] = defaultdict(int)
        for (_v, ctype, gres), n in d.cards.items():
            found[(gres.lower(), ctype.lower() or None)] += n
        reg = {e.key: e.count for e in sum_gres(v.gres) if ctx.is_card(e.name)}
        # an untyped registration counts every card of that name
        have = dict(found)
        for k in reg:
            if k[1] is None:
                have[k] = sum(n for fk, n in found.items() if fk[0] == k[0])
                for fk in [fk for fk in have if fk[0] == k[0] and fk[1] is not None]:
                    if fk not in reg:
                        del have[fk]
        diff = tuple(
            (label(k), reg.get(k, 0), have.get(k, 0))
            for k in sorted(set(reg) | set(have), key=lambda k: (k[0], k[1] or ""))
            if reg.get(k, 0) != have.get(k, 0)
        )
        if diff:
            mism[(v.where, diff)].append(v.name)
    for (where, diff), names in mism.items():
        text = "; ".join(f"{lab}: Gres= {r}, daemons found {h}" for lab, r, h in diff)
        fix = ",".join(f"{lab}:{h}" for lab, _r, h in diff if h)
        yield AuditFinding(
            NAME,
            "error",
            where_of(where, names),
            f"{compress_hostlist(names)}: {text}",
            f"Gres={fix} (or repair the missing cards)" if fix else "repair the cards",
        )
    for where, names in silent.items():
        yield AuditFinding(
            NAME,
            "warning",
            where_of(where, names),
            f"{compress_hostlist(names)}: daemon silent (scrape target down, last patrol "
            "stale or not ready): Gres= not compared with its cards",
            "bring hetpatrol's daemon and its exporter back on the node "
            "(systemctl status hetpatrol), then run audit-slurm again",
        )
    extra = sorted(k for k in daemons if k not in ctx.views)
    if unseen:
        yield AuditFinding(
            NAME,
            "info",
            where_of("", unseen),
            f"{plural(len(unseen))} with card GRES {'have' if len(unseen) != 1 else 'has'} no "
            "daemon metrics: not compared",
        )
    if extra:
        yield AuditFinding(
            NAME,
            "warning",
            where_of("", extra),
            f"{plural(len(extra))} in Prometheus but not in Slurm's node list",
            "add NodeName lines for them, or fix the scrape config's node label",
        )
