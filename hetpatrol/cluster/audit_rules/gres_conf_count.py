"""``gres_conf_count``: what slurmd registers from gres.conf against slurm.conf
``Gres=``, per node and GRES name, as slurmd 22.05 merges them (src/common/gres.c
``_merge_gres`` / ``_node_config_validate``; every case below run on the real daemons in
tests/test_audit_rules_daemons.py):

- a typed ``Gres=gpu:a100:8`` takes the gres.conf lines of that type; an untyped
  ``Gres=gpu:8`` takes every line of that name (their types dropped: ``untyped_gres``);
  an untyped gres.conf line for a typed ``Gres=`` is not taken (without AutoDetect);
- fewer taken than configured (also: gres.conf read, but no line for the node): the
  node registers fewer and slurmctld sets it INVAL + DRAIN: "gres/gpu count reported
  lower than configured (4 < 8)" (error);
- more: slurmd logs "A line in gres.conf for GRES gpu:a100 has 4 more configured than
  expected in slurm.conf. Ignoring extra GRES." and registers the configured count
  (warning: those lines do nothing);
- a ``MultipleFiles=`` line is one GRES (gres.conf(5) MultipleFiles);
- with ``AutoDetect=`` (nvml, rsmi, oneapi, nrt; 23.02 adds ``nrt``, 23.11 ``full``) on
  the node, the detected cards are merged with the lines (gres.conf(5) AutoDetect):
  not compared here;
- no gres.conf at all: slurmd registers the configured counts without device files
  (gres.conf(5): File is optional); the ``confinement`` rule says what that costs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context, detects, where_of
from hetpatrol.cluster.hostlist import compress_hostlist
from hetpatrol.slurm.gres import sum_gres

NAME = "gres_conf_count"
SOURCE = "gres.conf(5) File, MultipleFiles, AutoDetect; src/common/gres.c _merge_gres"


def _taken(want: dict, have: dict, name: str) -> tuple[int, int, int]:
    """(configured, taken, extra) for one GRES name on one node."""
    configured = sum(n for (gn, _t), n in want.items() if gn == name)
    have_all = sum(n for (gn, _t), n in have.items() if gn == name)
    if (name, None) in want and not any(gn == name and t for gn, t in want):
        taken = min(have_all, configured)
        return configured, taken, have_all - taken
    taken = sum(min(have.get((name, t), 0), n) for (gn, t), n in want.items() if gn == name and t)
    return configured, taken, have_all - taken


def _on(where: str, names: list[str]) -> str:
    """Where the ``Gres=`` to change is: the finding's slurm.conf line, or for nodes read
    live (no line to point at) their ``NodeName=`` in slurm.conf."""
    return (
        "on this line"
        if where
        else f"on the slurm.conf NodeName= line(s) of {compress_hostlist(names)}"
    )


def check(ctx: Context) -> Iterator[AuditFinding]:
    inp = ctx.inp
    if inp.gres_conf is None:
        return
    low: dict[tuple, list[str]] = defaultdict(list)
    high: dict[tuple, list[str]] = defaultdict(list)
    seen: dict[tuple, list[tuple[str, int, int, int]]] = {}
    for v in ctx.nodes:
        gc = ctx.gres_conf_of(v.name)
        if detects(gc.autodetect):
            continue
        key = (v.gres, gc.entries)  # nodes of one line with the same gres.conf: one answer
        if key not in seen:
            want = {e.key: e.count for e in sum_gres(v.gres) if ctx.is_card(e.name)}
            have = {e.key: e.count for e in gc.entries if ctx.is_card(e.name)}
            seen[key] = [
                (name, *_taken(want, have, name))
                for name in sorted({k[0] for k in want} | {k[0] for k in have})
            ]
        for name, configured, taken, extra in seen[key]:
            if taken < configured:
                low[(v.where, name, configured, taken)].append(v.name)
            elif extra > 0:
                high[(v.where, name, configured, extra)].append(v.name)
    for (where, name, configured, taken), names in low.items():
        yield AuditFinding(
            NAME,
            "error",
            where_of(where, names),
            f"{compress_hostlist(names)}: slurm.conf configures {configured} {name}, "
            f"gres.conf gives {taken} of them: slurmctld sets the node INVAL and drains it "
            f"(gres/{name} count reported lower than configured ({taken} < {configured}))",
            f"make Gres= {_on(where, names)} and {inp.gres_conf_path} agree (name, type, count)",
        )
    for (where, name, configured, extra), names in high.items():
        yield AuditFinding(
            NAME,
            "warning",
            where_of(where, names),
            f"{compress_hostlist(names)}: gres.conf gives {extra} {name} more than the "
            f"{configured} slurm.conf configures: slurmd ignores them (slurmd log: "
            "Ignoring extra GRES)",
            f"make Gres= {_on(where, names)} and {inp.gres_conf_path} agree (name, type, count)",
        )
