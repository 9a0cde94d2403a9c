"""``accounting`` (warning): card usage is metered per card class.

- ``AccountingStorageType`` unset or ``accounting_storage/none`` (slurm.conf(5)
  AccountingStorageType; the 22.05 default is none): no job record is stored, nothing is
  metered per type;
- otherwise ``AccountingStorageTRES`` names ``gres/<name>`` and ``gres/<name>:<type>``
  of every typed card class: GRES are tracked only when listed (slurm.conf(5)
  AccountingStorageTRES; https://slurm.schedmd.com/tres.html: "By default Billing, CPU,
  Energy, Memory, Node, FS/Disk, Pages and VMem are tracked").
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context

NAME = "accounting"
SOURCE = "slurm.conf(5) AccountingStorageType, AccountingStorageTRES; tres.html"


def wanted_tres(ctx: Context) -> list[str]:
    """``gres/<name>`` and ``gres/<name>:<type>`` of every card class seen."""
    typed = {(n, t) for n, ts in ctx.types_by_name.items() for t in ts if t}
    names = {n for n in ctx.types_by_name}
    return sorted({f"gres/{n}" for n in names} | {f"gres/{n}:{t}" for n, t in typed})


def check(ctx: Context) -> Iterator[AuditFinding]:
    want = wanted_tres(ctx)
    if not want:
        return
    kind = ctx.setting("AccountingStorageType").lower()
    if kind in ("", "accounting_storage/none", "none"):
        yield AuditFinding(
            NAME,
            "warning",
            ctx.setting_where("AccountingStorageType"),
            f"AccountingStorageType={ctx.setting('AccountingStorageType') or '(not set)'}: "
            "accounting is off, nothing is metered per card type; when it is on, "
            f"AccountingStorageTRES must name {','.join(want)}",
            f"AccountingStorageType=accounting_storage/slurmdbd, "
            f"AccountingStorageTRES={','.join(want)}",
        )
        return
    s = ctx.conf.get("AccountingStorageTRES")
    have = {x.strip().lower() for x in (s.value if s else "").split(",") if x.strip()}
    lacking = [w for w in want if w not in have]
    if lacking:
        yield AuditFinding(
            NAME,
            "warning",
            s.where if s else ctx.conf.source,
            f"AccountingStorageTRES lacks {','.join(lacking)}: usage per card class "
            "is not recorded",
            f"AccountingStorageTRES={','.join(sorted(have | set(lacking)))}",
        )
