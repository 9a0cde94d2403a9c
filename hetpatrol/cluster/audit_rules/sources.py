"""``slurm_conf`` / ``prometheus`` / ``hostlist``: what the sources held that the audit
could not use.

- ``slurm_conf`` (warning): an Include that cannot be read or loops, too deep, a line
  that is not ``Key=Value`` (slurm.conf(5): "Include ... ", parse_config.c).
- ``hostlist`` (error): a NodeName or partition ``Nodes=`` host list Slurm refuses
  (``_parse_single_range`` in src/common/hostlist.c: "Invalid range"); its nodes are
  not checked.
- ``prometheus`` (info): a daemon series value that was ignored (NaN, Inf).
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context

NAME = "sources"
SOURCE = "slurm.conf(5) Include; src/common/parse_config.c; src/common/hostlist.c"


def check(ctx: Context) -> Iterator[AuditFinding]:
    for problem in ctx.conf.problems:
        yield AuditFinding("slurm_conf", "warning", problem.split(": ", 1)[0], problem)
    for note in ctx.inp.notes:
        yield AuditFinding("prometheus", "info", "prometheus", note)
    yield from ctx.build_findings
