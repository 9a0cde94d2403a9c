"""``shared_gres_name`` (warning): one GRES name used by the cards of two vendors (Ascend
registered as ``gpu:910b`` beside NVIDIA ``gpu:a100``): an untyped ``--gres=gpu:1`` may
land on either vendor (slurm.conf(5) NodeName Gres: a request without a type matches
every type of that name). ``device_vendor`` names the lines whose device files show it.
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context, vendor_of_gres

NAME = "shared_gres_name"
SOURCE = "slurm.conf(5) NodeName Gres"


def check(ctx: Context) -> Iterator[AuditFinding]:
    where = ctx.setting_where("GresTypes")
    for name in sorted(ctx.types_by_name):
        vendors = {v for v, _t in ctx.daemon_classes.get(name, ())} or {
            vendor_of_gres(name, t, ctx.profiles) for t in ctx.types_by_name[name] if t
        }
        vendors.discard("")
        if len(vendors) >= 2:
            yield AuditFinding(
                NAME,
                "warning",
                where,
                f"GRES {name} is used by {' and '.join(sorted(vendors))} cards: an untyped "
                f"--gres={name}:1 can land on either vendor",
                "one GRES name per vendor (gpu for NVIDIA, npu/ascend for Ascend)",
            )
