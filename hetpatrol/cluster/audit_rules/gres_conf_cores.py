"""``gres_conf_cores`` (warning): a gres.conf ``Cores=`` (or its old name ``CPUs=``, read
the same way: ``_parse_gres_config`` in src/common/gres.c 22.05) naming a core the node
does not have. gres.conf(5) Cores: "Specify the first thread CPU index numbers for the specific
cores which can use this resource" (0 .. cores-1, the node's Sockets x CoresPerSocket
of slurm.conf, or CPUs / ThreadsPerCore). slurmd 22.05 logs "Invalid GRES data for gpu,
Cores=0-511" and slurmctld "_node_config_validate: gres/gpu: invalid GRES core
specification (0-511) on node ...", and drops the line's core binding: the node still
registers (idle) and the cards are handed out with no core affinity (src/common/gres.c
22.05 ``_node_config_validate``; run on the real daemons in
tests/test_audit_rules_daemons.py). slurmd is fatal ("only N CPUs are available") only
where the cores exist in the node's layout but not in its CPU count.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import AuditFinding, Context, plural
from hetpatrol.cluster.hostlist import compress_hostlist
from hetpatrol.cluster.slurm_conf import NodeDecl

NAME = "gres_conf_cores"
SOURCE = "gres.conf(5) Cores; src/common/gres.c _node_config_validate"


def _int(fields: dict[str, str], key: str) -> int | None:
    v = fields.get(key.lower())
    return int(v) if v is not None and v.isdigit() else None


def node_cores(decl: NodeDecl) -> int | None:
    """Cores of a NodeName line (slurm.conf(5): Boards x SocketsPerBoard (or Sockets) x
    CoresPerSocket; else CPUs / ThreadsPerCore); None when the line does not say."""
    f = decl.fields
    cps = _int(f, "CoresPerSocket")
    sockets = _int(f, "Sockets")
    if sockets is None and _int(f, "SocketsPerBoard") is not None:
        sockets = _int(f, "SocketsPerBoard") * (_int(f, "Boards") or 1)
    if cps is not None:
        return cps * (sockets or 1)
    cpus = _int(f, "CPUs") or _int(f, "Procs")
    if cpus is not None:
        return cpus // (_int(f, "ThreadsPerCore") or 1)
    return None


def highest_core(text: str) -> int | None:
    """The highest index of a ``Cores=`` list (``0-15,32-47`` -> 47, ``[0-3]`` -> 3);
    None when it cannot be read."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]  # Cores=[0-3]: bit_unfmt takes the bracketed form too
    nums = [int(n) for n in re.findall(r"[0-9]+", text)]
    if not nums or not re.fullmatch(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*", text):
        return None
    return max(nums)


def check(ctx: Context) -> Iterator[AuditFinding]:
    inp = ctx.inp
    for ln in inp.gres_conf or ():
        if not ln.cores:
            continue
        top = highest_core(ln.cores)
        if top is None:
            continue
        bad: list[str] = []
        have = 0
        for v in ctx.nodes:
            if v.decl is None or not ctx.covers(ln, v.name):
                continue
            if not any(e.name.lower() == (ln.name or "").lower() for e in v.gres):
                continue  # a GRES the node does not configure: slurmd drops the line
            cores = node_cores(v.decl)
            if cores is not None and top >= cores:
                bad.append(v.name)
                have = cores
        if bad:
            yield AuditFinding(
                NAME,
                "warning",
                f"{inp.gres_conf_path}:{ln.line}",
                f"Cores={ln.cores} names core {top}, but {compress_hostlist(bad)} "
                f"{'has' if len(bad) == 1 else 'have'} {plural(have, 'core')} (0-{have - 1}): "
                "slurmctld "
                "drops the line's core binding (invalid GRES core specification)",
                f"Cores= within 0-{have - 1} (or fix the node's Sockets/CoresPerSocket)",
            )
