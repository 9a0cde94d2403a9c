"""The audit rules, in the order their findings are listed (errors are sorted first by
the report). A new rule is one module in this package (``NAME``, ``SOURCE``: the man
page or source it follows, ``check(ctx)`` yielding
:class:`~hetpatrol.cluster.audit_rules.context.AuditFinding`), its line here, its row in
docs/fleet.md and its test file."""

from __future__ import annotations

from hetpatrol.cluster.audit_rules import (
    accounting,
    billing,
    confinement,
    device_vendor,
    down_nodes,
    gres_conf_autodetect,
    gres_conf_cores,
    gres_conf_count,
    gres_conf_files,
    gres_conf_nodes,
    gres_syntax,
    gres_types,
    gres_vs_daemons,
    healthcheck,
    mixed_node,
    node_features,
    partition_nodes,
    prolog,
    shared_gres_name,
    sources,
    untyped_gres,
)

RULES = (
    sources,
    gres_syntax,
    gres_types,
    partition_nodes,
    down_nodes,
    untyped_gres,
    shared_gres_name,
    device_vendor,
    gres_conf_autodetect,
    gres_conf_count,
    gres_conf_nodes,
    gres_conf_files,
    gres_conf_cores,
    gres_vs_daemons,
    node_features,
    mixed_node,
    confinement,
    accounting,
    billing,
    healthcheck,
    prolog,
)
