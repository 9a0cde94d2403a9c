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

Each task costs slurmctld one single-job answer (``REQUEST_JOB_INFO_SINGLE``,
``slurm_load_job()``), never the queue-wide dump (``REQUEST_JOB_INFO``, every job of the
cluster: several MB and seconds of slurmctld work a task on a big queue). Which command
gives one job's indices depends on the installed Slurm, read first from ``scontrol
--version`` (local: it asks no daemon) by :func:`job_query`:

- **Slurm 23.02.3 and later**: ``squeue --json --jobs=ID``, one job's record, read by
  :func:`hetpatrol.slurm.job_gres.parse_squeue_json` from Slurm's structured fields only
  (``gres_detail`` paired with the hosts of ``job_resources``; the record whose
  ``job_id`` is ``SLURM_JOB_ID``). squeue(1) 23.02.3: "Formatting options are ignored;
  however, filtering arguments are still used" (23.11, 24.05, 24.11: "filtering
  arguments are still used"), and squeue with one job id asks ``slurm_load_job()``
  (``_get_info()``, src/squeue/squeue.c; ``params.job_id`` when ``--jobs`` names one job,
  src/squeue/opts.c). ``scontrol show job ID --json`` exists from the same release
  (scontrol(1) 23.02.3: "Formats information from the show command as JSON").
- **Slurm 23.02.2 and earlier (22.05 here)**: squeue(1) ``--json``: "All other formatting
  and filtering arguments will be ignored" (the whole queue), and scontrol has no
  ``--json``. The indices are read from ``scontrol -d show job ID`` (one job,
  ``slurm_load_job()``) by :func:`parse_show_job_detail`: only the per-node lines of
  ``slurm_sprint_job_info()`` (src/api/job_info.c 22.05) between a ``NumNodes=`` line and
  a ``MinCPUsNode=`` line, each of Slurm's exact shape, and only when every such block in
  the text says the same for this node.

Threat boundary of the text path: ``scontrol show job -d`` prints the job name, comment,
command, work directory and output paths raw, newlines too, so a user can write lines
that look like Slurm's. The TaskProlog runs as the job's user, for that user's own job
and only sets variables in that job's task: whatever a forged line in the user's own job
name or comment could make it export, the user can export in their own job anyway (their
batch script sets any variable). Device confinement is Slurm's cgroup (``ConstrainDevices=
yes``, cgroup.conf(5)), never this variable. So text parsing is acceptable where no
one-job structured answer exists; the queue-wide dump never is. The rule still keeps the
common forgeries out: a free-text field is printed before the real block (the name) or
after it (comment, paths), so Slurm's own block is always there whole; a forged block of
another shape is ignored, and one of Slurm's exact shape that says otherwise makes the
readings differ: then no variable is set (a ``print`` line says why), never the forged
value. Telling such a copy from the real block needs the JSON of 23.02.3 and later.

Costs, per task: one Python start that imports :mod:`hetpatrol.slurm.job_gres` (and
:mod:`hetpatrol.slurm.gres`) only (no config, no collectors), one ``scontrol --version``
(no RPC) and one single-job query, bounded at :data:`hetpatrol.slurm.job_gres.
SQUEUE_JSON_MAX` bytes and ``--timeout`` seconds for both. Measured on the cluster of
tests/slurm_cluster.py (slurmd 22.05, a 2-core machine under load, editable install): see
docs/slurm.md, "The TaskProlog". Whatever goes wrong (no job id, a command failing or
slow, an answer that cannot be read) sets no variable and prints one ``print hetpatrol
TaskProlog: ...`` line; the exit code is always 0: slurmstepd fails the task when a
TaskProlog fails (seen on slurmd 22.05: "TaskProlog failed status=1", the job FAILED;
tests/test_gres_conf.py).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from hetpatrol.slurm.job_gres import (  # noqa: F401 - moved there, callers import them here
    JSON_ONE_JOB_SINCE,
    SHOW_JOB,
    SQUEUE_JSON_MAX,
    Allocation,
    ask_job,
    find_scontrol,
    job_query,
    parse_show_job_detail,
    run_scontrol,
    slurm_version,
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
    why no variable is set. ``runner(argv, seconds) -> stdout`` runs ``scontrol
    --version`` and then the one query of :func:`job_query` (``timeout`` seconds for
    both). Never raises."""

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
    try:
        alloc = ask_job(scontrol, job, node, timeout=timeout, runner=runner)
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
        "job's GRES indices on this node (one single-job query to slurmctld: squeue --json "
        "from Slurm 23.02.3, scontrol -d show job before); run by the script gres-conf "
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
        help="scontrol (absolute path); squeue (Slurm 23.02.3 and later) is run from its directory",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="the limit in seconds for scontrol --version and the job's query together",
    )
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
