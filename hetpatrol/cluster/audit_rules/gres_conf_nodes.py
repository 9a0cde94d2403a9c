"""``gres_conf_nodes`` (warning): a gres.conf ``NodeName=`` naming nodes slurm.conf does
not define. gres.conf(5) NodeName: "the line applies to the named nodes"; slurmd reads
only the lines for its own node, so the line does nothing (slurmd 22.05 says nothing
of it: tests/test_audit_rules_daemons.py): a typo or a stale line. (Defined card nodes
that no line covers are ``gres_conf_count`` errors.)
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context, plural
from hetpatrol.cluster.hostlist import compress_hostlist
from hetpatrol.slurm.gres import expand_hostlist

NAME = "gres_conf_nodes"
SOURCE = "gres.conf(5) NodeName"


def check(ctx: Context) -> Iterator[AuditFinding]:
    inp = ctx.inp
    if not inp.gres_conf or not ctx.conf.nodes or ctx.unreadable_nodes:
        return
    for ln in inp.gres_conf:
        if ln.nodes is None:
            continue
        try:
            names = expand_hostlist(ln.nodes.text)
        except ValueError:
            continue
        missing = [n for n in names if n not in ctx.views]
        if missing:
            yield AuditFinding(
                NAME,
                "warning",
                f"{inp.gres_conf_path}:{ln.line}",
                f"NodeName={compress_hostlist(missing)} ({plural(len(missing))}) is defined "
                "by no NodeName line in slurm.conf: this gres.conf line does nothing there",
                "fix the node names, or drop the line",
            )
