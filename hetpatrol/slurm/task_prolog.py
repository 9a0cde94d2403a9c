"""``hetpatrol task-prolog``: the device variables Slurm sets for no GRES but ``gpu``,
printed for slurmstepd from the job's GRES indices on this node.

Slurm sets ``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES`` only from its gpu plugin
(``gres_common_gpu_set_env()``, src/plugins/gres/common/gres_common.c); for ``ascend``,
``mlu`` and the other names it sets no device variable. slurmstepd runs ``TaskProlog=``
as the job's user before every task and sets each ``export NAME=value`` line the program
prints in the task's environment; a ``print ...`` line goes to the task's standard output
(slurm.conf(5), TaskProlog; "Prolog and Epilog Scripts"). The script ``hetpatrol
gres-conf`` writes for a node (:meth:`hetpatrol.slurm.gres_conf.Plan.task_prolog`) runs
:data:`TASK_PROLOG_PROGRAM` (``packaging/slurm/taskprolog``: ``hetpatrol task-prolog``)
with one ``--export NAME VAR TABLE`` per GRES name and variable, ``TABLE`` mapping
Slurm's index of a device of that name on the node (its position among that name's
``File=`` lines of gres.conf) to the vendor's id in ``VAR``: ``0=10,1=11``.

The job's indices come from Slurm's structured fields only: ``squeue --json`` (beside
:func:`hetpatrol.slurm.job_gres.find_scontrol`'s scontrol), the record whose ``job_id`` is
``SLURM_JOB_ID``, its ``gres_detail`` entry paired with the host ``SLURMD_NODENAME`` of
``job_resources`` (:func:`hetpatrol.slurm.job_gres.parse_squeue_json`, the pairing of
``slurm_sprint_job_info()``, src/api/job_info.c). ``--jobs=`` is passed but Slurm 22.05
ignores it ("All other formatting and filtering arguments will be ignored", squeue(1)
``--json``) and lists every job, so the record is picked by ``job_id`` all the same. A
job name, comment or work directory (free text, printed raw by ``scontrol show job -d``,
newlines too) is never read.

Costs, per task: one Python start that imports :mod:`hetpatrol.slurm.job_gres` only (no
config, no collectors) and one ``squeue --json`` (one slurmctld RPC; on 22.05 its answer
holds every job of the cluster, bounded at :data:`hetpatrol.slurm.job_gres.SQUEUE_JSON_MAX`
bytes and ``--timeout`` seconds). Measured on the cluster of tests/slurm_cluster.py
(slurmd 22.05, a 2-core machine under load): the shell script that read ``scontrol show
job -d`` took 28 ms a task, this 165 ms from an editable install (60-100 ms from a plain
one), 365 ms with 300 more jobs queued (squeue's answer 0.93 MB, 50 ms of it in squeue).
Whatever goes wrong (no job id, squeue failing or slow, a record that cannot be
read) sets no variable and prints one ``print hetpatrol TaskProlog: ...`` line; the exit
code is always 0: slurmstepd fails the task when a TaskProlog fails (seen on slurmd
22.05: "TaskProlog failed status=1", the job FAILED; tests/test_gres_conf.py).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from hetpatrol.slurm.job_gres import (
    Allocation,
    find_scontrol,
    parse_squeue_json,
    run_scontrol,
    squeue_argv,
)

#: the wrapper the packages install (packaging/slurm/taskprolog): ``hetpatrol task-prolog``
TASK_PROLOG_PROGRAM = "/usr/libexec/hetpatrol/taskprolog"
#: a GRES name as the config schema takes it (one word: gres.conf(5) Name=)
_GRES_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
#: an environment variable name (POSIX.1-2017, 8.1: letters, digits, '_', no digit first)
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TABLE = re.compile(r"[0-9]{1,6}=[0-9]{1,9}(?:,[0-9]{1,6}=[0-9]{1,9})*")
#: the job id as Slurm sets SLURM_JOB_ID (a number)
_JOB_ID = re.compile(r"[0-9]{1,12}")


class Export(NamedTuple):
    """One variable to set: ``VAR`` from the indices of GRES ``gres`` on this node, each
    index mapped through ``table`` (index -> the vendor's id; an index not in it is
    left out)."""

    gres: str
    var: str
    table: Mapping[int, int]


def format_table(pairs: Sequence[tuple[int, int]]) -> str:
    """``[(0, 10), (1, 11)]`` -> ``0=10,1=11`` (the ``--export`` table)."""
    return ",".join(f"{i}={ident}" for i, ident in pairs)


def parse_export(gres: str, var: str, table: str) -> Export:
    """One ``--export NAME VAR TABLE``; ValueError naming the part that is not one."""
    if not _GRES_WORD.fullmatch(gres):
        raise ValueError(f"GRES name {gres!r} is not one word")
    if not _VAR_NAME.fullmatch(var):
        raise ValueError(f"variable {var!r} is not a variable name")
    if not _TABLE.fullmatch(table):
        raise ValueError(f"table {table!r} is not INDEX=ID[,INDEX=ID...]")
    pairs: dict[int, int] = {}
    for item in table.split(","):
        i, _sep, ident = item.partition("=")
        if int(i) in pairs:
            raise ValueError(f"table {table!r}: index {int(i)} twice")
        pairs[int(i)] = int(ident)
    return Export(gres, var, pairs)


def export_lines(alloc: Allocation, exports: Sequence[Export]) -> list[str]:
    """``export VAR=id,id`` per export whose GRES the job holds on the node (ids in index
    order); nothing for a GRES it holds none of."""
    out = []
    for e in exports:
        idx = alloc.by_gres.get(e.gres.lower(), frozenset())
        ids = [str(e.table[i]) for i in sorted(idx) if i in e.table]
        if ids:
            out.append(f"export {e.var}={','.join(ids)}")
    return out


def _printable(text: str, limit: int = 300) -> str:
    """One line of at most ``limit`` characters, control characters as ``?``."""
    flat = "".join(ch if ch.isprintable() else "?" for ch in text)
    return flat[:limit]


def task_prolog_lines(
    env: Mapping[str, str],
    exports: Sequence[Export],
    *,
    scontrol: str,
    timeout: float = 10.0,
    runner: Callable[[Sequence[str], float], str] = run_scontrol,
) -> list[str]:
    """The lines for slurmstepd: ``export ...`` lines, or one ``print ...`` line saying
    why no variable is set. Never raises."""

    def unset(why: str) -> list[str]:
        return [f"print hetpatrol TaskProlog: {_printable(why)}: no device variable set"]

    if not exports:
        return []
    job = env.get("SLURM_JOB_ID", "")
    node = env.get("SLURMD_NODENAME", "")
    if not _JOB_ID.fullmatch(job):
        return unset(f"SLURM_JOB_ID {job[:40]!r} is not a job id")
    if not node:
        return unset("SLURMD_NODENAME is not set")
    argv = [*squeue_argv(scontrol), f"--jobs={job}"]
    try:
        import subprocess

        try:
            text = runner(argv, timeout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return unset(f"squeue --json: {type(exc).__name__}: {exc}")
        alloc = parse_squeue_json(text, job, node)
        if alloc.errors:
            return unset("; ".join(alloc.errors))
        return export_lines(alloc, exports)
    except Exception as exc:  # noqa: BLE001 - a bug of ours must not fail the task
        return unset(f"error: {type(exc).__name__}: {exc}")


def cli_main(argv: Sequence[str] | None = None) -> int:
    """``hetpatrol task-prolog --export NAME VAR TABLE ...``: print the lines of
    :func:`task_prolog_lines` for the process environment; returns 0 (a usage error is
    one ``print`` line too, then ``SystemExit(0)``: a TaskProlog that fails fails the
    task)."""
    import argparse

    class Said(argparse.ArgumentParser):
        """A usage error is a ``print`` line on stdout (the task's output) and exit 0."""

        def error(self, message: str):  # type: ignore[override]
            sys.stdout.write(f"print hetpatrol TaskProlog: {_printable(message)}\n")
            raise SystemExit(0)

    p = Said(
        prog="hetpatrol task-prolog",
        description="Slurm TaskProlog: print 'export VAR=ids' for each --export from the "
        "job's GRES indices on this node (squeue --json); run by the script gres-conf "
        "writes (docs/slurm.md).",
    )
    p.add_argument(
        "--export",
        nargs=3,
        action="append",
        default=[],
        metavar=("NAME", "VAR", "TABLE"),
        help="GRES name, variable, and INDEX=ID[,INDEX=ID...] (Slurm's index -> the id)",
    )
    p.add_argument(
        "--scontrol",
        default=None,
        help="scontrol (absolute path); squeue is run from its directory",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="squeue's limit in seconds")
    args = p.parse_args(argv)
    try:
        exports = [parse_export(*e) for e in args.export]
    except ValueError as exc:
        p.error(f"--export: {exc}")
    if not 0 < args.timeout <= 60:
        p.error(f"--timeout {args.timeout}: more than 0 and at most 60 seconds")
    lines = task_prolog_lines(
        os.environ,
        exports,
        scontrol=args.scontrol or find_scontrol(),
        timeout=args.timeout,
    )
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0
