"""``confinement`` (error): jobs are confined to the cards they were given, on every node
with card GRES.

Slurm confines a job's device files only with the cgroup task plugin and
``ConstrainDevices=yes`` (cgroup.conf(5) ConstrainDevices: "If configured to "yes" then
constrain the job's allowed devices based on GRES allocated resources"; default "no";
slurm.conf(5) TaskPlugin ``task/cgroup``). Without both, any job on the node can open
every ``/dev/nvidia*`` / ``/dev/davinci*`` (``CUDA_VISIBLE_DEVICES`` is only advice
to the program): a job can reach another job's card. Only devices named by gres.conf
``File=`` (or found by ``AutoDetect``) are confined: count-only GRES are not.
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context, plural
from hetpatrol.cluster.hostlist import compress_hostlist

NAME = "confinement"
SOURCE = "cgroup.conf(5) ConstrainDevices; slurm.conf(5) TaskPlugin"


def check(ctx: Context) -> Iterator[AuditFinding]:
    inp = ctx.inp
    cards = [v.name for v in ctx.nodes if any(ctx.is_card(e.name) for e in v.gres)]
    if not cards:
        return
    plugins = [
        p.strip().removeprefix("task/") for p in ctx.setting("TaskPlugin").lower().split(",")
    ]
    has_cgroup = "cgroup" in plugins
    gaps = []
    if not has_cgroup:
        gaps.append(f"TaskPlugin={ctx.setting('TaskPlugin') or '(not set)'} has no task/cgroup")
    if inp.cgroup is None:
        gaps.append(f"no cgroup.conf read ({inp.cgroup_path}): ConstrainDevices defaults to no")
    elif inp.cgroup.get("constraindevices", "no").lower() != "yes":
        value = inp.cgroup.get("constraindevices", "(not set)")
        gaps.append(f"{inp.cgroup_path}: ConstrainDevices={value}, not yes")
    if not gaps:
        return
    where = ctx.setting_where("TaskPlugin") if not has_cgroup else inp.cgroup_path
    yield AuditFinding(
        NAME,
        "error",
        where,
        f"jobs are not confined to their cards on {compress_hostlist(cards)} "
        f"({plural(len(cards))}): " + "; ".join(gaps) + ": a job can open every card's device",
        "TaskPlugin=task/cgroup,task/affinity in slurm.conf and ConstrainDevices=yes in "
        "cgroup.conf",
    )
