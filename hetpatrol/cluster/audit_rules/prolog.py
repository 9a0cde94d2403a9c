"""``prolog`` (info): a ``Prolog`` runs hetpatrol, so a card that failed since the last
health check does not get the next job. slurm.conf(5) Prolog: a Prolog that exits
non-zero drains the node and requeues the job ("If the Prolog fails (returns a non-zero
exit code), this will result in the node being set to a DRAIN state and the job being
requeued"), hence the Prolog entry point (:data:`advice.PROLOG_PROGRAM`), not
``hetpatrol check`` (which exits 1 on a warning).
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules import advice
from hetpatrol.cluster.audit_rules.context import AuditFinding, Context

NAME = "prolog"
SOURCE = "slurm.conf(5) Prolog"


def check(ctx: Context) -> Iterator[AuditFinding]:
    pro = ctx.setting("Prolog")
    if advice.PROGRAM_MARK not in pro:
        yield AuditFinding(
            NAME,
            "info",
            ctx.setting_where("Prolog"),
            f"Prolog={pro or '(not set)'} does not run hetpatrol: a card that failed since "
            "the last health check can still get a job",
            advice.prolog_fix(),
        )
