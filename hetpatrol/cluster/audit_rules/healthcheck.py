"""``healthcheck`` (warning): ``HealthCheckProgram`` runs hetpatrol, with a non-zero
``HealthCheckInterval`` (slurm.conf(5) HealthCheckProgram: "Fully qualified pathname of
a script to execute as user root periodically on all compute nodes";
HealthCheckInterval: "The interval in seconds between executions of
HealthCheckProgram. The default value is zero, which disables execution"). Without it
slurmd's periodic check says nothing of the cards (the daemon's drain and the Prolog
still act). The advice text is :mod:`hetpatrol.cluster.audit_rules.advice`.
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules import advice
from hetpatrol.cluster.audit_rules.context import AuditFinding, Context

NAME = "healthcheck"
SOURCE = "slurm.conf(5) HealthCheckProgram, HealthCheckInterval"


def check(ctx: Context) -> Iterator[AuditFinding]:
    hc = ctx.setting("HealthCheckProgram")
    if advice.PROGRAM_MARK not in hc:
        yield AuditFinding(
            NAME,
            "warning",
            ctx.setting_where("HealthCheckProgram"),
            f"HealthCheckProgram={hc or '(not set)'} does not run hetpatrol: slurmd's health "
            "check (at its start and every HealthCheckInterval) does not see the cards' verdict",
            advice.healthcheck_fix(),
        )
        return
    hi = ctx.setting("HealthCheckInterval")
    if hi in ("", "0"):
        yield AuditFinding(
            NAME,
            "warning",
            ctx.setting_where("HealthCheckInterval"),
            "HealthCheckInterval is 0: the health check runs only at slurmd start",
            f"HealthCheckInterval={advice.HEALTHCHECK_INTERVAL}",
        )
