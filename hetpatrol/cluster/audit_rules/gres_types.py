"""``gres_types`` (error): ``GresTypes`` lists every GRES name used by a NodeName
``Gres=`` and a gres.conf ``Name=``.

slurm.conf(5) GresTypes: "A comma-delimited list of generic resources to be managed";
a name not listed there is refused (src/common/gres.c ``gres_init_node_config``:
"Invalid GRES specification").
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context

NAME = "gres_types"
SOURCE = "slurm.conf(5) GresTypes; src/common/gres.c"


def check(ctx: Context) -> Iterator[AuditFinding]:
    conf, inp = ctx.conf, ctx.inp
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
    gt = conf.get("GresTypes")
    listed = {g.strip().lower() for g in (gt.value if gt else "").split(",") if g.strip()}
    missing = sorted(n for n in used if n not in listed)
    if missing:
        want = ",".join(sorted(listed | set(missing)))
        yield AuditFinding(
            NAME,
            "error",
            gt.where if gt else conf.source,
            f"GresTypes does not list {', '.join(missing)} (used at "
            + ", ".join(used[n] for n in missing)
            + ")",
            f"GresTypes={want}",
        )
