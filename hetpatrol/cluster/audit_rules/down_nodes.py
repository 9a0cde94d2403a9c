"""``down_nodes`` (warning): a ``DownNodes=`` line naming nodes no NodeName defines.
slurm.conf(5) DownNodes: "Any node name, or list of node names, from the NodeName=
specifications"; slurmctld 22.05 logs "error: DownNode "ghost1" does not exist!" and
starts without them (src/slurmctld/read_config.c; run on the real slurmctld in
tests/test_audit_rules_daemons.py): the line does nothing for those names.
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context, plural
from hetpatrol.cluster.hostlist import compress_hostlist
from hetpatrol.slurm.gres import expand_hostlist

NAME = "down_nodes"
SOURCE = "slurm.conf(5) DownNodes; src/slurmctld/read_config.c"


def check(ctx: Context) -> Iterator[AuditFinding]:
    if ctx.unreadable_nodes or not ctx.conf.nodes:
        return
    for names, where in ctx.conf.downnodes:
        try:
            listed = expand_hostlist(names)
        except ValueError:
            continue
        missing = [n for n in listed if n not in ctx.views]
        if missing:
            yield AuditFinding(
                NAME,
                "warning",
                where,
                f"DownNodes={compress_hostlist(missing)} ({plural(len(missing))}) defined by no "
                'NodeName line: slurmctld logs "DownNode ... does not exist!" and ignores them',
                "fix the names, or drop them from DownNodes=",
            )
