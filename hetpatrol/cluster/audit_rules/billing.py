"""``billing``: a partition holding several card classes weighs each type in
``TRESBillingWeights`` (slurm.conf(5) PartitionName TRESBillingWeights: "Billing
weights ... for each TRES type"; an unlisted TRES weighs 0): warning where a type is
missing; info when accounting is on, the cluster has several card types and no
partition sets weights (billing counts CPUs
only, the default CPU=1.0).
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context

NAME = "billing"
SOURCE = "slurm.conf(5) PartitionName TRESBillingWeights"


def check(ctx: Context) -> Iterator[AuditFinding]:
    typed = sorted({(n, t) for n, ts in ctx.types_by_name.items() for t in ts if t})
    if not typed:
        return
    any_weights = False
    for p in ctx.conf.partitions:
        w = p.fields.get("tresbillingweights")
        if w is None:
            continue
        any_weights = True
        members = ctx.by_part.get(p.name, [])
        ptypes = set().union(*(ctx.node_classes[v.name] for v in members)) if members else set()
        weights = {x.split("=", 1)[0].strip().lower() for x in w.split(",") if "=" in x}
        lacking = sorted(
            f"gres/{n}:{t}"
            for n, t in typed
            if any(t == ct for _v, ct in ptypes) and f"gres/{n}:{t}" not in weights
        )
        if len(ptypes) >= 2 and lacking:
            yield AuditFinding(
                NAME,
                "warning",
                p.where,
                f"partition {p.name}: TRESBillingWeights does not weigh "
                f"{','.join(lacking)}: every card class is billed alike",
                "TRESBillingWeights=...,"
                + ",".join(f"{x.upper()[:4]}{x[4:]}=<weight>" for x in lacking),
            )
    kind = ctx.setting("AccountingStorageType").lower()
    if not any_weights and len(typed) >= 2 and kind not in ("", "accounting_storage/none", "none"):
        yield AuditFinding(
            NAME,
            "info",
            ctx.conf.source,
            "no partition sets TRESBillingWeights: billing counts CPUs only, a card "
            "class costs nothing",
            "TRESBillingWeights=CPU=1.0,GRES/gpu:<type>=<weight>,... per partition",
        )
