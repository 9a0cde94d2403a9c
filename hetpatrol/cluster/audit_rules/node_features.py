"""``node_features`` (warning): in a partition holding several card classes, each class
has a node feature that picks it with ``--constraint``.

A feature picks a class when every node of the class in the partition carries it and
no node of another class does (slurm.conf(5) NodeName Features; sbatch(1)
``--constraint``: "Nodes can have features assigned to them"). Features are compared as
users write them: case folded, and a feature counts as naming the class when the card
type (or the vendor, between vendors) is one of its words (``GPU_SKU:V100``,
``gpu_a100``, ``a100-80gb``); any other feature unique to the class (``sm_90``) picks it
as well. A warning: with typed GRES ``--gres=gpu:a100`` still picks the type, and a job
cannot reach the wrong card through a missing feature.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from hetpatrol.cluster.audit_rules.context import (
    AuditFinding,
    Context,
    feature_tokens,
    group,
    where_of,
)
from hetpatrol.cluster.hostlist import compress_hostlist

NAME = "node_features"
SOURCE = "slurm.conf(5) NodeName Features; sbatch(1) --constraint"


@lru_cache(maxsize=4096)
def _tokens(features: tuple[str, ...]) -> frozenset[str]:
    return frozenset().union(*(feature_tokens(f) for f in features))


def check(ctx: Context) -> Iterator[AuditFinding]:
    for pname, members in sorted(ctx.by_part.items()):
        single = [
            v
            for v in members
            if ctx.node_classes[v.name] and len({c[0] for c in ctx.node_classes[v.name]}) < 2
        ]  # nodes with two vendors' cards: mixed_node
        classes = {frozenset(ctx.node_classes[v.name]) for v in single}
        if len(classes) < 2:
            continue
        # a class of no known vendor (an untyped name several vendors' profiles use, no
        # device file naming it) is no second vendor: by vendor only where two known
        # vendors share the partition
        vendors = {c[0] for cls in classes for c in cls if c[0]}
        by_vendor = len(vendors) >= 2
        # the class a user picks: the vendor between vendors, else the card type (the
        # same type with and without a known vendor is one class)
        key_of = {
            v.name: frozenset(c[0] for c in ctx.node_classes[v.name])
            if by_vendor
            else frozenset(c[1] for c in ctx.node_classes[v.name])
            for v in single
        }
        keys = set(key_of.values())
        if len(keys) < 2:
            continue
        lacking: list[tuple[tuple, str]] = []
        for key in keys:
            own = [v for v in single if key_of[v.name] == key]
            others = [v for v in single if key_of[v.name] != key]
            common = frozenset.intersection(*(_tokens(v.features) for v in own))
            elsewhere = set().union(*(_tokens(v.features) for v in others))
            if common - elsewhere:
                continue
            for v in own:
                want = sorted(
                    {c[1] for c in ctx.node_classes[v.name] if c[1]}
                    or {c[0] for c in ctx.node_classes[v.name] if c[0]}
                )
                lacking.append(((v.where, tuple(want), tuple(sorted(key))), v.name))
        if not lacking:
            continue
        groups = group(lacking)
        what = " and ".join(sorted(vendors)) if by_vendor else "several card types"
        parts = []
        fixes = []
        for (_where, want, _key), names in sorted(groups.items(), key=lambda kv: kv[1][0]):
            text = ",".join(want) or "(card type unknown)"
            parts.append(f"{compress_hostlist(names)} ({text})")
            fixes.append(f"Features={text} on {compress_hostlist(names)}")
        yield AuditFinding(
            NAME,
            "warning",
            ctx.part_where.get(pname) or where_of("", [v.name for v in single]),
            f"partition {pname} mixes {what}, and no node feature tells "
            f"{', '.join(parts)} apart: --constraint cannot pick one",
            "; ".join(fixes),
        )
