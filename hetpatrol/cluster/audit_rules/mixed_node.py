"""``mixed_node``: nodes with the cards of two vendors.

- warning: crosstalk risk (one vendor per node is the simpler layout);
- error, with ``--prometheus``: the node's daemon reports ``library_path_mix`` or
  ``global_ld_library_path`` (its CUDA and CANN runtimes are not kept apart: a job loads
  the other vendor's libraries); info for mixed nodes without daemon metrics.

Whether jobs are confined to their cards is the ``confinement`` rule, for every node.
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context, group, plural, where_of
from hetpatrol.cluster.fleet import RUNTIME_CHECKS
from hetpatrol.cluster.hostlist import compress_hostlist

NAME = "mixed_node"
SOURCE = "hetpatrol daemon findings library_path_mix, global_ld_library_path"


def check(ctx: Context) -> Iterator[AuditFinding]:
    names = [v.name for v in ctx.nodes if len({c[0] for c in ctx.node_classes[v.name]}) >= 2]
    if not names:
        return
    yield AuditFinding(
        NAME,
        "warning",
        where_of("", names),
        f"{plural(len(names))} with cards of two vendors: a job sees the other vendor's "
        "devices unless they are constrained per job (crosstalk risk)",
        "prefer one vendor per node; else confine devices (confinement)",
    )
    daemons = ctx.daemons
    if daemons is None:
        return
    leaky = group(
        (tuple(sorted(daemons[n].node_findings & set(RUNTIME_CHECKS))), n)
        for n in names
        if n in daemons and daemons[n].node_findings & set(RUNTIME_CHECKS)
    )
    for checks, hosts in sorted(leaky.items()):
        yield AuditFinding(
            NAME,
            "error",
            where_of("", hosts),
            f"{compress_hostlist(hosts)}: CUDA and CANN runtimes are not kept "
            f"apart (daemon finding {', '.join(checks)}): a job loads the other "
            "vendor's libraries",
            "keep vendor libraries out of ld.so.conf and the login-wide "
            "LD_LIBRARY_PATH; set them per job (module, job script, container)",
        )
    unread = [n for n in names if n not in daemons]
    if unread:
        yield AuditFinding(
            NAME,
            "info",
            where_of("", unread),
            f"{plural(len(unread))} without daemon metrics: runtime isolation not checked",
        )
