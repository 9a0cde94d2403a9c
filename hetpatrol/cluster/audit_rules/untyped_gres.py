"""``untyped_gres``: every card class has its own GRES type.

- A slurm.conf ``Gres=gpu:8`` (no type) whose nodes' gres.conf lines carry ``Type=``:
  slurmd 22.05 drops the types ("A line in gres.conf for GRES gpu:a100 has 1 more
  configured than expected in slurm.conf. Ignoring extra GRES.", src/common/gres.c
  ``_merge_gres``), keeps the device files, and the node registers ``gpu:8``;
  ``--gres=gpu:a100:1`` is refused ("Requested node configuration is not available").
  Both shown on the real daemons in tests/test_audit_rules_daemons.py. Warning.
- A card GRES without a type anywhere: a job cannot ask for the card class by name
  (slurm.conf(5) NodeName Gres "<name>[:<type>]..."; gres.conf(5) Type). Warning.
- Either, when the name holds cards of two vendors: ``--gres=gpu:1`` can land on the
  other vendor's card (error).
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import (
    AuditFinding,
    Context,
    detects,
    group,
    vendor_of_gres,
    where_of,
)
from hetpatrol.cluster.hostlist import compress_hostlist

NAME = "untyped_gres"
SOURCE = "slurm.conf(5) NodeName Gres; gres.conf(5) Type; src/common/gres.c _merge_gres"


def _vendors(ctx: Context, name: str) -> set[str]:
    out = {v for v, _t in ctx.daemon_classes.get(name, ())}
    # a class's vendor comes from its own GRES name and type, never from the node's
    # other GRES (slurm.conf(5) NodeName Gres: each "<name>[:<type>]:<count>" is its own
    # resource; --gres=gpu:1 draws only from the cards under gpu)
    for node in ctx.views:
        out |= {c[0] for c in ctx.classes_under(node, name)}
    out |= {vendor_of_gres(name, t, ctx.profiles) for t in ctx.types_by_name[name] if t}
    out.discard("")
    return out


def check(ctx: Context) -> Iterator[AuditFinding]:
    inp = ctx.inp
    untyped = group(
        ((e.name.lower(), v.where), v.name)
        for v in ctx.nodes
        for e in v.gres
        if ctx.is_card(e.name) and not e.type
    )
    for (name, where), names in sorted(untyped.items()):
        vendors = _vendors(ctx, name)
        several = len(vendors) >= 2
        conf_types = sorted(
            {
                ln.type
                for n in names
                for ln in ctx.gres_conf_lines_of(n)
                if ln.type and (ln.name or "").lower() == name
            }
        )
        head = f"{compress_hostlist(names)}: GRES {name} has no type"
        if conf_types:
            t = conf_types[0]
            text = (
                f"{head} while gres.conf gives Type={','.join(conf_types)}: slurmd drops "
                f"the type (Ignoring extra GRES), the node registers {name} untyped and "
                f"--gres={name}:{t}:1 cannot be asked (Requested node configuration is "
                "not available)"
            )
        else:
            text = f"{head}: a job cannot ask for this card class by name"
        if several:
            text += f"; {name} holds {' and '.join(sorted(vendors))} cards: --gres={name}:1 "
            text += "can land on either vendor"
        fix_type = conf_types[0] if conf_types else "<card type>"
        yield AuditFinding(
            NAME,
            "error" if several else "warning",
            where_of(where, names),
            text,
            f"Gres={name}:{fix_type}:<count> "
            + (
                "on this line"
                if where
                else f"on the slurm.conf NodeName= line(s) of {compress_hostlist(names)}"
            )
            + ("" if conf_types else ", and Type=<card type> in gres.conf"),
        )
    # untyped gres.conf lines, one finding per GRES name; a line read only on nodes
    # under AutoDetect gets its type from the plugin (gres.conf(5) AutoDetect)
    auto_nodes = {v.name for v in ctx.nodes if detects(ctx.gres_conf_of(v.name).autodetect)}
    by_name: dict[str, list[int]] = {}
    for ln in inp.gres_conf or ():
        if not (ln.name and ctx.is_card(ln.name) and not ln.type):
            continue
        covered = [v.name for v in ctx.nodes if ctx.covers(ln, v.name)]
        if covered and all(n in auto_nodes for n in covered):
            continue
        by_name.setdefault(ln.name, []).append(ln.line)
    for name, lines in by_name.items():
        several = len(_vendors(ctx, name.lower())) >= 2
        where = f"{inp.gres_conf_path}:{lines[0]}"
        more = f" (lines {', '.join(map(str, lines))})" if len(lines) > 1 else ""
        yield AuditFinding(
            NAME,
            "error" if several else "warning",
            where,
            f"gres.conf Name={name} without Type={more}"
            + (
                f": {name} holds the cards of two vendors, --gres={name}:1 can land on either"
                if several
                else ""
            ),
            f"add Type=<card type> (the type in slurm.conf Gres={name}:<type>:N)",
        )
