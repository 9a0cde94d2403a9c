"""``device_vendor``: a gres.conf line whose ``File=`` device files belong to one vendor
(as its plugin declares them: ``/dev/davinci{n}`` Ascend, ``/dev/nvidia{n}`` NVIDIA, ...)
under a GRES name or ``Type=`` that the profiles give another vendor (``Name=gpu
File=/dev/davinci[0-7]``). Error when that GRES name also holds the other vendor's
cards (an untyped ``--gres=gpu:1``, slurm.conf(5) Gres, can hand a CUDA job an NPU);
warning otherwise (the name misleads users and accounting).
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpatrol.cluster.audit_rules.context import (
    AuditFinding,
    Context,
    vendor_of_file,
    vendor_of_gres,
)

NAME = "device_vendor"
SOURCE = "gres.conf(5) File, Name, Type; the plugins' VendorInfo.device_nodes"


def check(ctx: Context) -> Iterator[AuditFinding]:
    inp = ctx.inp
    lines = [ln for ln in inp.gres_conf or () if ln.name and ln.files]
    by_name: dict[str, set[str]] = {}
    for ln in lines:
        for f in ln.files:
            if v := vendor_of_file(f):
                by_name.setdefault(ln.name.lower(), set()).add(v)
    for ln in lines:
        file_vendors = {vendor_of_file(f) for f in ln.files} - {""}
        if len(file_vendors) != 1:
            continue
        hw = next(iter(file_vendors))
        named = vendor_of_gres(ln.name, ln.type, ctx.profiles)
        if not named or named == hw:
            continue
        shared = len(by_name.get(ln.name.lower(), set())) >= 2
        what = f"Name={ln.name}" + (f" Type={ln.type}" if ln.type else "")
        yield AuditFinding(
            NAME,
            "error" if shared else "warning",
            f"{inp.gres_conf_path}:{ln.line}",
            f"{what} names {named} cards, but its File= {ln.files[0]}... are {hw} devices"
            + (
                f"; {ln.name} also holds {named} cards: --gres={ln.name}:1 can hand a job "
                f"for {named} a {hw} card"
                if shared
                else ""
            ),
            f"a GRES name and type of {hw}'s own (and the same in slurm.conf Gres=)",
        )
