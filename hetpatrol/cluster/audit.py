"""``hetpatrol audit-slurm``: the mixed-cluster checklist over slurm.conf, gres.conf,
cgroup.conf and, when given, the live nodes and the daemons' cards.

The rules are the modules of :mod:`hetpatrol.cluster.audit_rules` (listed in
:mod:`hetpatrol.cluster.audit_rules.registry`), each citing the Slurm rule it follows;
docs/fleet.md has the table. Each :class:`AuditFinding` names the rule, a severity
(``error`` only where slurmctld/slurmd refuses the config or a job can reach the wrong
card; ``warning``: a gap that costs work or accounting; ``info``), where (``file:line``,
or ``node``/``partition`` with a compressed host list), what Slurm does and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetpatrol.cluster.audit_rules.context import (
    SEVERITIES,
    AuditFinding,
    AuditInput,
    Context,
    NodeView,
    vendor_of_gres,
)
from hetpatrol.cluster.audit_rules.layout import layouts
from hetpatrol.cluster.audit_rules.registry import RULES

__all__ = [
    "SEVERITIES",
    "AuditFinding",
    "AuditInput",
    "AuditReport",
    "NodeView",
    "audit",
    "vendor_of_gres",
]


@dataclass
class AuditReport:
    findings: list[AuditFinding]
    layouts: dict[str, str]
    nodes: int

    @property
    def exit_code(self) -> int:
        """2 with an error, 1 with a warning, else 0."""
        sev = {f.severity for f in self.findings}
        return 2 if "error" in sev else 1 if "warning" in sev else 0

    def to_json(self) -> dict[str, Any]:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        return {
            "nodes": self.nodes,
            "layouts": self.layouts,
            "exit_code": self.exit_code,
            "findings": [
                f.to_json() for f in sorted(self.findings, key=lambda f: order[f.severity])
            ],
        }


def audit(inp: AuditInput) -> AuditReport:
    """Run every rule of the registry over ``inp``; the findings in rule order."""
    ctx = Context(inp)
    findings: list[AuditFinding] = []
    for rule in RULES:
        findings.extend(rule.check(ctx))
    return AuditReport(findings, layouts(ctx), len(ctx.nodes))
