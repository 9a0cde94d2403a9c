"""The layout of each partition (``AuditReport.layouts``, not a finding): no cards, one
card class, one vendor with several types, several vendors, or mixed nodes (a node with
two vendors' cards)."""

from __future__ import annotations

from hetpatrol.cluster.audit_rules.context import Context


def layouts(ctx: Context) -> dict[str, str]:
    out: dict[str, str] = {}
    for pname, members in sorted(ctx.by_part.items()):
        classes = set().union(*(ctx.node_classes[v.name] for v in members))
        vendors = {c[0] for c in classes}
        if not classes:
            out[pname] = "no cards"
        elif any(len({c[0] for c in ctx.node_classes[v.name]}) >= 2 for v in members):
            out[pname] = "mixed nodes"
        elif len(classes) == 1:
            out[pname] = "one card class"
        elif len(vendors) == 1:
            out[pname] = "one vendor, several card types (features)"
        else:
            out[pname] = "several vendors (features)"
    return out
