"""``gres_conf_autodetect`` (warning): an ``AutoDetect=`` value slurmd 22.05 does not
know. gres.conf(5) AutoDetect (22.05): nvml, rsmi, oneapi, off; slurmd logs "error:
unknown autodetect flag 'nvidia'" and detects nothing (src/common/gres.c
``_handle_autodetect_flags``; run on the real slurmd in
tests/test_audit_rules_daemons.py), so the counts come from the lines alone. Later
releases add ``nrt`` (23.11), ``nvidia`` (24.11) and ``full`` (after 25.11).
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import (
    AUTODETECT_22_05,
    AUTODETECT_LATER,
    AuditFinding,
    Context,
)

NAME = "gres_conf_autodetect"
SOURCE = "gres.conf(5) AutoDetect; src/common/gres.c _handle_autodetect_flags"


def check(ctx: Context) -> Iterator[AuditFinding]:
    inp = ctx.inp
    for ln in inp.gres_conf or ():
        if ln.autodetect is None:
            continue
        for flag in ln.autodetect.split(","):
            if flag in AUTODETECT_22_05 or flag == "off":
                continue
            later = AUTODETECT_LATER.get(flag)
            yield AuditFinding(
                NAME,
                "warning",
                f"{inp.gres_conf_path}:{ln.line}",
                f"AutoDetect={flag}: slurmd 22.05 does not know it (error: unknown "
                f"autodetect flag '{flag}') and detects nothing"
                + (
                    f"; {flag} is Slurm {later}" + (" and later" if later[0].isdigit() else "")
                    if later
                    else ""
                ),
                "AutoDetect=nvml (NVIDIA), rsmi (AMD), oneapi (Intel) or off on 22.05",
            )
