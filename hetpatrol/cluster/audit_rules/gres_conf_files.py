"""``gres_conf_files`` (warning): ``File=`` given for some nodes of a GRES name but not
for all. gres.conf(5) File: "NOTE: If you specify the File parameter for a resource on
some node, the option must be specified on all nodes and Slurm will track the
assignment of each specific resource on each specific node. Otherwise Slurm will only
track a count of allocated resources rather than the state of each individual device
file." Lines under ``AutoDetect=`` (files found by the plugin) count as having files.
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context, detects
from hetpatrol.cluster.hostlist import compress_hostlist

NAME = "gres_conf_files"
SOURCE = "gres.conf(5) File (NOTE: all nodes or none)"


def check(ctx: Context) -> Iterator[AuditFinding]:
    inp = ctx.inp
    if not inp.gres_conf:
        return
    with_files: dict[str, list[str]] = {}
    without: dict[str, list[str]] = {}
    first_without: dict[str, str] = {}
    for v in ctx.nodes:
        auto = detects(ctx.gres_conf_of(v.name).autodetect)
        for ln in ctx.gres_conf_lines_of(v.name):
            name = (ln.name or "").lower()
            if not ctx.is_card(name):
                continue
            if ln.files or auto:
                with_files.setdefault(name, []).append(v.name)
            else:
                without.setdefault(name, []).append(v.name)
                first_without.setdefault(name, f"{inp.gres_conf_path}:{ln.line}")
    for name in sorted(set(with_files) & set(without)):
        nodes = list(dict.fromkeys(without[name]))
        yield AuditFinding(
            NAME,
            "warning",
            first_without[name],
            f"GRES {name}: File= is given on {compress_hostlist(set(with_files[name]))} but "
            f"not on {compress_hostlist(nodes)}: gres.conf(5) wants it on all nodes or "
            "none, else Slurm tracks only a count, not which device a job holds",
            f"File=/dev/... on every {name} line",
        )
