"""``gres_syntax`` (error): a NodeName ``Gres=`` that cannot be read.

slurm.conf(5) NodeName Gres: "A comma-delimited list of generic resources
specifications for a node. The format is: "<name>[:<type>][:no_consume]:<number>[K|M|G]""
(slurmctld 22.05 refuses the line: ``_node_config_validate``/``gres_init_node_config``
in src/common/gres.c). The node is kept, without GRES.
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context

NAME = "gres_syntax"
SOURCE = "slurm.conf(5) NodeName Gres; src/common/gres.c"


def check(ctx: Context) -> Iterator[AuditFinding]:
    for decl in ctx.conf.nodes:
        if (err := decl.gres_error) is not None:
            yield AuditFinding(
                NAME,
                "error",
                decl.where,
                f"Gres= cannot be read: {err}",
                "Gres=<name>[:<type>]:<count>,... (slurm.conf(5), NodeName Gres)",
            )
