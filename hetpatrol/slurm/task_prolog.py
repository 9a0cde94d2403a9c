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
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from hetpatrol.slurm.job_gres import (
    SQUEUE_JSON_MAX,
    Allocation,
    find_scontrol,
    gres_detail_indices,
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


#: the first Slurm whose ``squeue --json`` keeps ``--jobs=`` (one job, one
#: slurm_load_job()): squeue(1) of slurm-23-02-3-1 "Formatting options are ignored;
#: however, filtering arguments are still used"; up to slurm-23-02-2-1 "All other
#: formatting and filtering arguments will be ignored" (doc/man/man1/squeue.1)
JSON_ONE_JOB_SINCE = (23, 2, 3)
#: ``scontrol --version``: ``slurm 23.11.4``, Debian's ``slurm-wlm 22.05.8``
_VERSION = re.compile(r"slurm(?:-wlm)? ([0-9]{1,4})\.([0-9]{1,2})\.([0-9]{1,3})(?![0-9])")
#: the lines of one job's per-node block in ``scontrol -d show job``, each of the exact
#: shape slurm_sprint_job_info() prints (src/api/job_info.c 20.11-23.02: "Line 15"
#: ``NumNodes=``, ``TRES=`` (23.02: ``ReqTRES=``/``AllocTRES=``), ``Socks/Node=``, with
#: details ``JOB_GRES=`` and one ``  Nodes=%s CPU_IDs=%s Mem=%u GRES=%s`` line per group
#: of hosts, then "Line 18" ``MinCPUsNode=``); ``line_end`` is "\n   "
_BLOCK_START = re.compile(r"   NumNodes=\S+ NumCPUs=\S+ NumTasks=\S+ CPUs/Task=\S+ ReqB:S:C:T=\S+")
_BLOCK_END = re.compile(r"   MinCPUsNode=\S+ MinMemory(?:Node|CPU)=\S+ MinTmpDiskNode=\S+")
_BLOCK_OTHER = re.compile(
    r"   (?:(?:Req|Alloc)?TRES=\S*|JOB_GRES=\S*"
    r"|Socks/Node=\S+ NtasksPerN:B:S:C=\S+ (?:Core|Thread)Spec=\S+)"
)
_NODE_LINE = re.compile(r"     Nodes=(?P<nodes>\S+) CPU_IDs=\S* Mem=[0-9]+ GRES=(?P<gres>\S*)")
SHOW_JOB = "scontrol show job -d"


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


def slurm_version(text: str) -> tuple[int, int, int] | None:
    """``slurm-wlm 22.05.8`` (``scontrol --version``'s first line) -> ``(22, 5, 8)``; None
    when the text names no Slurm version."""
    m = _VERSION.match(text.split("\n", 1)[0].strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def job_query(scontrol: str, job: str, version: tuple[int, int, int]) -> list[str]:
    """The command that gives job ``job``'s GRES indices in one single-job answer from
    slurmctld (module docstring): ``squeue --json --jobs=ID`` (beside ``scontrol``) from
    :data:`JSON_ONE_JOB_SINCE`, else ``scontrol -d show job ID``."""
    if version >= JSON_ONE_JOB_SINCE:
        return [*squeue_argv(scontrol), f"--jobs={job}"]
    return [scontrol, "-d", "show", "job", job]


def parse_show_job_detail(text: str, job: str, node: str) -> Allocation:
    """The GRES indexes Slurm gave job ``job`` on ``node`` from ``scontrol -d show job
    ID`` text (Slurm 23.02.2 and earlier, where no one-job JSON exists).

    Read: the record must begin ``JobId=<job> ``; each block from a line of exactly
    Slurm's ``NumNodes=`` shape to one of its ``MinCPUsNode=`` shape whose every line in
    between is one of Slurm's (``TRES=``, ``Socks/Node=``, ``JOB_GRES=``, the per-node
    ``     Nodes=HOSTLIST CPU_IDs=.. Mem=.. GRES=..`` lines); a block with any other
    line inside is not one. The node's entry (its name in ``Nodes=``' host list) gives
    the indexes (:func:`hetpatrol.slurm.job_gres.gres_detail_indices`). Lines are split
    at ``\n`` only (Slurm's line end; a ``\r`` in a name is not one). Slurm's own
    block is always there whole (free text is printed before or after it); when more
    than one block is found and they say different things for this node, nothing is
    taken: ``errors`` says so (the threat boundary: module docstring). Never raises."""
    from hetpatrol.slurm.gres import hostlist_contains  # this path only

    def fail(why: str) -> Allocation:
        return Allocation(sources=(SHOW_JOB,), errors=(f"{SHOW_JOB}: {why}",))

    if len(text) > SQUEUE_JSON_MAX:
        return fail(f"output larger than {SQUEUE_JSON_MAX} bytes")
    lines = text.split("\n")
    if not lines[0].startswith(f"JobId={job} "):
        return fail(f"the output does not begin with job {job}'s record")
    blocks: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] | None = None
    for line in lines:
        if _BLOCK_START.fullmatch(line):
            current = []  # an open block before this one was no block of Slurm's
        elif current is None:
            continue
        elif _BLOCK_END.fullmatch(line):
            blocks.append(current)
            current = None
        elif m := _NODE_LINE.fullmatch(line):
            current.append((m.group("nodes"), m.group("gres")))
        elif not _BLOCK_OTHER.fullmatch(line):
            current = None  # a line Slurm does not print here: not its block
    if not blocks:
        return fail("no per-node block (NumNodes= ... MinCPUsNode= lines of Slurm's shape)")
    readings = []
    errors: list[str] = []
    for block in blocks:
        by: dict[str, set[int]] = {}
        for nodes, gres in block:
            try:
                here = hostlist_contains(nodes, node)
            except (ValueError, RecursionError):
                here = False
                errors.append(f"Nodes={nodes[:80]!r} is not a host list")
            if here:
                gres_detail_indices(gres, by, errors)
        readings.append({k: frozenset(v) for k, v in by.items()})
    if any(r != readings[0] for r in readings[1:]):
        return fail(
            f"{len(readings)} per-node blocks that differ for {node} (a job name or "
            "comment copying Slurm's lines?)"
        )
    return Allocation(readings[0], sources=(SHOW_JOB,), errors=tuple(dict.fromkeys(errors)))


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
        import subprocess

        deadline = time.monotonic() + timeout
        try:
            said = runner([scontrol, "--version"], timeout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return unset(f"scontrol --version: {type(exc).__name__}: {exc}")
        version = slurm_version(said)
        if version is None:
            return unset(f"scontrol --version said {said[:60]!r}: no Slurm version")
        argv = job_query(scontrol, job, version)
        what = "squeue --json" if argv[1] == "--json" else SHOW_JOB
        left = deadline - time.monotonic()
        if left <= 0:
            return unset(f"{what}: no time left of {timeout:g} s")
        try:
            text = runner(argv, left)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return unset(f"{what}: {type(exc).__name__}: {exc}")
        if what == SHOW_JOB:
            alloc = parse_show_job_detail(text, job, node)
        else:
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
