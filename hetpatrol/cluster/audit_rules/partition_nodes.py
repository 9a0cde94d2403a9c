"""``partition_nodes`` (error): every name a partition's ``Nodes=`` gives is defined by a
``NodeName`` line (or is ``ALL`` or a ``NodeSet``).

slurm.conf(5) PartitionName Nodes: "Comma-separated list of nodes or nodesets which are
associated with this partition"; slurmctld 22.05 refuses to start otherwise
(src/slurmctld/read_config.c ``_build_single_partitionline_info`` ->
``build_part_bitmap``: ``fatal: Invalid node names in partition <name>``; shown on the
real slurmctld in tests/test_audit_rules_daemons.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context, plural
from hetpatrol.cluster.hostlist import compress_hostlist

NAME = "partition_nodes"
SOURCE = "slurm.conf(5) PartitionName Nodes; src/slurmctld/read_config.c"


def check(ctx: Context) -> Iterator[AuditFinding]:
    if ctx.unreadable_nodes or not ctx.nodes:
        return  # a NodeName list that cannot be read: the defined set is not known
    for p in ctx.conf.partitions:
        names = ctx.undefined.get(p.name)
        if not names:
            continue
        yield AuditFinding(
            NAME,
            "error",
            p.where,
            f"partition {p.name}: {compress_hostlist(names)} ({plural(len(names))}) "
            "defined by no NodeName line: slurmctld does not start "
            f"(fatal: Invalid node names in partition {p.name})",
            "define them with NodeName=..., or drop them from Nodes=",
        )
