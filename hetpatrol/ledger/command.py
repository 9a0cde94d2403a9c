"""``hetpatrol ledger``: card-hours per GRES type, the metering audit, quotas.

  hetpatrol ledger usage  [--start T] [--end T] [--by user,account,...] [--format F]
  hetpatrol ledger audit  [--format text|json]
  hetpatrol ledger quota  [--start T] [--end T] [--quota-file F] [--textfile P]
  hetpatrol ledger spans  [--start T] [--end T] [--format text|json]
  hetpatrol ledger capacity [--start T] [--end T] [--by day|week] [--html FILE]
  hetpatrol ledger faults JSONL... [--format text|json]

Times: ``now``, ``now-7days`` (units minutes, hours, days, weeks), or local
``YYYY-MM-DD[THH:MM[:SS]]``. Exit codes: usage 0; audit 0 fine / 1 warnings / 2 per-type
metering impossible; quota 0 all below 80 % / 1 one at 80 % / 2 one at 100 % / 3 (instead
of 0 or 1) when AllocTRES items could not be read; efficiency 0, 65 when Prometheus's
answer for a job could not be read; spans 0 none / 1 jobs across card classes;
69 (EX_UNAVAILABLE) when a Slurm command or Prometheus fails or sacct runs past
--timeout, 65 (EX_DATAERR) for unreadable input, 64 (EX_USAGE) for a window that
cannot be or a --sacct-file that cannot be opened (not a regular file).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import stat
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from hetpatrol.ledger import audit as audit_mod
from hetpatrol.ledger import capacity, capacity_report, faults, quotas, report
from hetpatrol.ledger import efficiency as eff_mod
from hetpatrol.ledger.sacct_stream import (
    SacctDataError,
    SacctError,
    TimeParser,
    parse_lines,
    read_lines,
    sacct_argv,
    stream_sacct,
)
from hetpatrol.ledger.slurm_state import SlurmQueryError, node_gres_types, read_node_gres, run
from hetpatrol.ledger.table import fit, wrap
from hetpatrol.ledger.usage import GROUP_FIELDS, aggregate
from hetpatrol.node_view import printable, terminal_width
from hetpatrol.progress import progress

EX_USAGE, EX_DATAERR, EX_UNAVAILABLE = 64, 65, 69


class LedgerUsageError(ValueError):
    """A window that cannot be (bad time, end before start), a file that cannot be
    opened: exit 64."""


_REL = re.compile(r"^now(?:-(\d+)(minutes?|hours?|days?|weeks?))?$")
_UNIT = {"minute": 60, "hour": 3600, "day": 86400, "week": 604800}


def parse_when(text: str, now: float | None = None) -> float:
    """``now``, ``now-7days`` or a local ISO time -> Unix seconds (argparse type)."""
    now = time.time() if now is None else now
    m = _REL.match(text.strip())
    try:
        if m:
            if not m.group(1):
                return float(int(now))
            when = float(int(now) - int(m.group(1)) * _UNIT[m.group(2).rstrip("s")])
        else:
            when = datetime.fromisoformat(text.strip()).timestamp()
        # the window is shown and passed to sacct as local and UTC times: it must be one
        datetime.fromtimestamp(when)
        datetime.fromtimestamp(when, tz=timezone.utc)
    except (OverflowError, OSError):
        raise argparse.ArgumentTypeError(f"{text!r}: out of the range of dates") from None
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not now, now-N(minutes|hours|days|weeks) or YYYY-MM-DD[THH:MM[:SS]]"
        ) from None
    return when


def _local(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%dT%H:%M:%S")


def _by(text: str) -> tuple[str, ...]:
    fields = tuple(f.strip() for f in text.split(",") if f.strip())
    bad = [f for f in fields if f not in GROUP_FIELDS]
    if bad:
        raise argparse.ArgumentTypeError(
            f"cannot group by {', '.join(bad)}; one of {', '.join(GROUP_FIELDS)}"
        )
    return fields


#: seconds sacct may run (a month of a busy cluster's records streams in well under this)
DEFAULT_TIMEOUT = 600.0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number of seconds > 0")
    return value


def _ratio(text: str) -> float:
    """An efficiency threshold: a number from 0 to 1 (``nan`` compared false with every
    job, so none was listed as idle)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:  # also nan
        raise argparse.ArgumentTypeError(f"{text!r}: not a ratio from 0 to 1")
    return value


def _add_window(p: argparse.ArgumentParser) -> None:
    p.add_argument("--start", default="now-1days", help="window start (default now-1days)")
    p.add_argument("--end", default="now", help="window end (default now)")
    p.add_argument("--sacct", default="sacct", help="sacct argv prefix (shell words)")
    p.add_argument("--scontrol", default="scontrol", help="scontrol argv prefix (shell words)")
    p.add_argument(
        "--sacct-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="read saved sacct -P output instead of running sacct ('-' = stdin): with a "
        "header line, or -n with the ledger's -o fields or ledger capacity's "
        "(fixtures/ledger-sample/sacct.txt)",
    )
    p.add_argument(
        "--nodes-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="saved `scontrol show node -o` instead of asking scontrol",
    )
    p.add_argument(
        "--no-node-types",
        action="store_true",
        help="do not ask scontrol for the nodes' GRES types (untyped time stays untyped)",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"give up on sacct (killed) S seconds after it started (default {DEFAULT_TIMEOUT:g})",
    )


def add_ledger_parser(sub) -> None:
    """Register ``ledger`` and its subcommands on the top-level subparsers ``sub``."""
    p = sub.add_parser(
        "ledger",
        help="card-hours per GRES type from Slurm accounting",
        description=(
            "Card-hours per GRES type from Slurm's accounting (sacct, streamed): usage "
            "grouped by user, account, partition, QOS or node; the metering audit of "
            "slurm.conf; quotas from sacctmgr or a quota file; per-job efficiency from "
            "Prometheus."
        ),
    )
    lsub = p.add_subparsers(dest="ledger_command", required=True)
    u = lsub.add_parser(
        "usage",
        help="card-hours, jobs and wait per GRES type",
        description="Card-hours, jobs, runs, mean wait and the largest allocation per "
        "group and GRES type over the window, from sacct. Exit 0.",
    )
    _add_window(u)
    u.add_argument(
        "--by",
        type=_by,
        default=("account",),
        metavar="FIELDS",
        help=f"comma-separated, of {', '.join(GROUP_FIELDS)} (default account; "
        "'' for the GRES types alone)",
    )
    u.add_argument("--format", choices=("table", "csv", "json"), default="table")
    u.set_defaults(func=cmd_usage)
    a = lsub.add_parser(
        "audit",
        help="can Slurm meter each card type? (exit 0/1/2)",
        description="Can this Slurm meter each card type? Says the slurm.conf line to add. "
        "Exit 0 fine, 1 warnings, 2 per-type metering impossible.",
    )
    a.add_argument("--scontrol", default="scontrol", help="scontrol argv prefix (shell words)")
    a.add_argument(
        "--replay",
        type=Path,
        default=None,
        metavar="DIR",
        help="a recorded cluster (fixtures/cluster/mixed): its scontrol output instead",
    )
    a.add_argument("--format", choices=("text", "json"), default="text")
    a.set_defaults(func=cmd_audit)
    q = lsub.add_parser(
        "quota",
        help="usage against sacctmgr limits or a quota file",
        description="Usage against the limits Slurm enforces (sacctmgr GrpTRESMins, "
        "GrpTRES, MaxTRESPerJob on gres/...) or a YAML quota file; --textfile writes the "
        "Prometheus text exposition. Exit 0 all below 80%, 1 one at 80%, 2 one at "
        "100%, 3 (instead of 0 or 1) when some AllocTRES items could not be read.",
    )
    _add_window(q)
    q.add_argument("--sacctmgr", default="sacctmgr", help="sacctmgr argv prefix (shell words)")
    q.add_argument(
        "--quota-file", type=Path, default=None, help="YAML quotas instead of sacctmgr's limits"
    )
    q.add_argument(
        "--textfile",
        type=Path,
        default=None,
        metavar="P",
        help="also write Prometheus text exposition to P (atomically)",
    )
    q.add_argument("--format", choices=("table", "json"), default="table")
    q.set_defaults(func=cmd_quota)
    s = lsub.add_parser(
        "spans",
        help="jobs whose nodes held different card classes (exit 0 none, 1 some)",
        description="The jobs whose nodes held two card classes or more (docs/ledger.md). "
        "Exit 0 none, 1 some.",
    )
    _add_window(s)
    s.add_argument(
        "--config",
        type=Path,
        default=None,
        help="config whose profiles name the card GRES (default: the bundled one)",
    )
    s.add_argument("--format", choices=("text", "json"), default="text")
    s.set_defaults(func=cmd_spans)
    e = lsub.add_parser(
        "efficiency",
        help="cards allocated vs busy per job (Prometheus)",
        description="Per job: card-hours allocated vs busy, per card type, from the "
        "daemons' series in Prometheus; lists the jobs that held cards idle. Exit 0; 65 "
        "when Prometheus's answer for a job was not the API's document (that job unknown).",
    )
    _add_window(e)
    e.add_argument("--prometheus", required=True, metavar="URL", help="http://host:9090")
    e.add_argument("--job", action="append", default=None, help="only this job id (repeat)")
    e.add_argument(
        "--idle-below",
        type=_ratio,
        default=0.1,
        metavar="R",
        help="list as idle the jobs below this efficiency (default 0.1)",
    )
    e.add_argument("--max-jobs", type=int, default=500)
    e.add_argument(
        "--prometheus-timeout",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="overall deadline of each Prometheus query, connection and answer (default 30)",
    )
    e.add_argument("--format", choices=("table", "json"), default="table")
    e.set_defaults(func=cmd_efficiency)
    _add_capacity(lsub)
    faults.add_parser(lsub)


def _window(args) -> tuple[float, float, float]:
    now = time.time()
    try:
        start, end = parse_when(args.start, now), parse_when(args.end, now)
    except argparse.ArgumentTypeError as exc:
        raise LedgerUsageError(str(exc)) from None
    if end <= start:
        raise LedgerUsageError(f"--end ({args.end}) must be after --start ({args.start})")
    return start, end, now


def _open_sacct_file(path: Path, flag: str = "--sacct-file"):
    """``--sacct-file`` (or the option ``flag``): a regular file, opened without blocking
    (a FIFO or a device is refused at once, never waited on nor read without end), as a
    binary stream; errors name ``flag``."""
    if str(path) == "-":
        return sys.stdin.buffer
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise LedgerUsageError(f"{flag} {path}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise LedgerUsageError(f"{flag} {path}: {what} (save the command's output to a file)")
    return os.fdopen(fd, "rb")


def _runs(args, start: float, end: float):
    # a person watching (stderr a terminal, a table asked for): the records read so far
    shown = getattr(args, "format", "table") in ("table", "text")
    name = f"hetpatrol ledger {getattr(args, 'ledger_command', '')}".rstrip()
    with progress(f"{name}: reading sacct", enabled=shown) as update:
        if args.sacct_file is not None:
            with _open_sacct_file(args.sacct_file) as handle:
                yield from _counted(parse_lines(read_lines(handle)), update)
            return
        argv = sacct_argv(_local(start), _local(end), shlex.split(args.sacct))
        yield from _counted(stream_sacct(argv, timeout=args.timeout), update)


def _counted(records, update, every: int = 1000):
    """``records`` passed on, ``update("N records")`` every ``every`` of them."""
    for n, r in enumerate(records, start=1):
        yield r
        if n % every == 0:
            update(f"{n} records")


def _node_gres(args):
    """The nodes' GRES types: from ``--nodes-file`` (a saved ``scontrol show node -o``)
    or scontrol."""
    if args.nodes_file is not None:
        return node_gres_types(_read_saved(args.nodes_file, "--nodes-file"))
    return read_node_gres(shlex.split(args.scontrol))


def _ledger(args, by: tuple[str, ...]):
    start, end, now = _window(args)
    node_gres = None
    if not args.no_node_types:
        node_gres = _node_gres(args)
    return aggregate(_runs(args, start, end), (start, end), now, by, node_gres)


#: what Slurm's commands print on a host without a slurm.conf (nor DNS SRV records):
#: slurm_conf_init() in src/common/read_config.c, "Could not establish a configuration
#: source" (the last of those lines with Debian 12's Slurm 22.05.8)
_NO_CONF = "Could not establish a configuration source"


def _width(args) -> int | None:
    """The terminal's columns for a table or text (None: a pipe, or csv/json)."""
    return terminal_width(sys.stdout) if args.format in ("table", "text") else None


def _error(exc: BaseException) -> None:
    # sacct's / Prometheus's text, escaped: it must not drive the operator's terminal;
    # its lines stay lines (each escaped on its own, so no control reaches the terminal)
    first, *rest = str(exc).strip("\n").split("\n")
    print(f"hetpatrol ledger: {printable(first)}", file=sys.stderr)
    for line in rest:
        print(f"  {printable(line)}", file=sys.stderr)
    if _NO_CONF in str(exc):
        flags = getattr(exc, "hint_flags", None) or (
            "--sacct/--sacct-file" if isinstance(exc, SacctError) else "--scontrol/--nodes-file"
        )
        print(f"hint: no slurm.conf found: set SLURM_CONF or pass {flags}", file=sys.stderr)


def _guard(fn):
    def wrapped(args) -> int:
        try:
            return fn(args)
        except LedgerUsageError as exc:
            _error(exc)
            return EX_USAGE
        except (SacctError, quotas.QuotaError) as exc:
            _error(exc)
            bad_data = isinstance(exc, SacctDataError | quotas.QuotaError)
            return EX_DATAERR if bad_data else EX_UNAVAILABLE
        except (SlurmQueryError, eff_mod.PrometheusError) as exc:
            _error(exc)
            return EX_UNAVAILABLE

    return wrapped


@_guard
def cmd_usage(args) -> int:
    ledger = _ledger(args, args.by)
    sys.stdout.write(report.render(ledger, args.format, _width(args)))
    return 0


@_guard
def cmd_spans(args) -> int:
    """Jobs of the window whose nodes held two card classes or more (ledger/spans.py)."""
    from hetpatrol.config import load_config
    from hetpatrol.ledger.spans import render_text, spanning_jobs

    if args.no_node_types:
        raise LedgerUsageError("spans needs the nodes' GRES types: drop --no-node-types")
    start, end, _now = _window(args)
    node_gres = _node_gres(args)
    names = {p.gres for p in load_config(args.config).profiles if p.gres}
    jobs = spanning_jobs(_runs(args, start, end), node_gres, names)
    if args.format == "json":
        sys.stdout.write(json.dumps([j.to_dict() for j in jobs], indent=2) + "\n")
    else:
        width = _width(args)
        text = render_text(jobs, printable)
        sys.stdout.write("".join(f"{ln}\n" for line in text.splitlines()
                                 for ln in wrap(line, width)))  # fmt: skip
    return 1 if jobs else 0


def _recorded_run(path: Path):
    """``run`` answered by the recorded cluster in ``path`` (``--replay``)."""
    from hetpatrol.recorded import Recording, RecordingError

    try:
        recording = Recording(path)
    except (RecordingError, OSError) as exc:
        raise LedgerUsageError(f"--replay: {exc}") from None

    def recorded(argv):
        out = recording.run(argv)
        if out.returncode != 0:
            raise SlurmQueryError(
                f"{' '.join(argv)} exited with {out.returncode}: {out.stderr.strip()[-1000:]}"
            )
        return out.stdout

    return recorded


@_guard
def cmd_audit(args) -> int:
    sc = shlex.split(args.scontrol)
    call = _recorded_run(args.replay) if args.replay is not None else run
    with progress("hetpatrol ledger audit: reading Slurm", enabled=args.format == "text"):
        findings = audit_mod.audit(
            call([*sc, "show", "config"]),
            call([*sc, "show", "node", "-o"]),
            call([*sc, "show", "partition", "-o"]),
        )
    if args.format == "json":
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    elif not findings:
        print("ok: every card type on the nodes is tracked and priced apart")
    else:
        width = _width(args)
        for f in findings:  # node names and GRES text come from scontrol: no controls
            print("\n".join(wrap(printable(f"{f.severity}: {f.message}"), width)))
            if f.fix:
                print("\n".join(wrap(printable(f"fix: {f.fix}"), width, indent=2)))
    return audit_mod.exit_code(findings)


def _used_text(used: float, limit: float) -> str:
    """``used`` with two decimals, or as many more (up to six) as it takes for a use
    below the limit not to read as the limit itself (0.0178 of 0.02 is ``0.018``) and a
    use above 0 not to read as none (0.0044 of 0.005, 89 %, is ``0.004``, not ``0.00``)."""
    for digits in range(2, 7):
        text = f"{used:.{digits}f}"
        if (used >= limit or float(text) < limit) and (used <= 0 or float(text) > 0):
            return text
    return text


@_guard
def cmd_quota(args) -> int:
    if args.quota_file is not None:
        limits, parents = quotas.load_quota_file(args.quota_file), {}
    else:
        try:
            text = run(quotas.sacctmgr_argv(shlex.split(args.sacctmgr)))
        except SlurmQueryError as exc:  # its hint names sacctmgr's flags, not scontrol's
            exc.hint_flags = "--sacctmgr/--quota-file"
            raise
        limits, parents = quotas.parse_assoc(text)
    ledger = _ledger(args, ("account", "user"))
    rows = quotas.evaluate(limits, ledger, parents)
    notes = report.notes(ledger)
    if args.textfile is not None:
        quotas.write_textfile(rows, ledger, args.textfile)
    if args.format == "json":
        print(json.dumps([r.to_dict() for r in rows], indent=2, allow_nan=False))
    else:
        head = ("ACCOUNT", "USER", "GRES", "LIMIT", "USED", "OF", "PCT", "STATUS")
        table = [head]
        for r in rows:
            lim = r.limit
            table.append(
                (
                    printable(lim.account),
                    printable(lim.user or "-"),
                    printable(lim.gres),
                    lim.kind,
                    _used_text(r.used, lim.value),
                    f"{lim.value:g} {quotas.KINDS[lim.kind]}",
                    f"{100 * r.ratio:.0f}%",
                    r.status,
                )
            )
        for line in fit(head, table[1:], _width(args), labels=3, left=head):
            print(line)
        if not rows:
            print("(no card limits)")
    for n in notes:
        print(f"note: {printable(n)}", file=sys.stderr)
    return quotas.exit_code(rows, unreadable=ledger.bad_tres_count)


@_guard
def cmd_efficiency(args) -> int:
    start, end, now = _window(args)
    prom = eff_mod.Prometheus(args.prometheus, timeout=args.prometheus_timeout)
    jobs = set(args.job) if args.job else None
    found = eff_mod.efficiencies(_runs(args, start, end), prom, now, jobs, args.max_jobs)
    idle = [
        e for e in found
        if e.status == "no_process" or (e.efficiency is not None and e.efficiency < args.idle_below)
    ]  # fmt: skip
    # 65 when Prometheus's answer for a job could not be read at all (that job unknown)
    code = EX_DATAERR if any(e.reason.startswith("Prometheus answered") for e in found) else 0
    if args.format == "json":
        print(json.dumps({"jobs": [e.to_dict() for e in found],
                          "idle": [e.job_id for e in idle]}, indent=2,
                         allow_nan=False))  # fmt: skip
        return code
    head = ("JOB", "USER", "ACCOUNT", "CARDS", "ALLOC_H", "BUSY_H", "EFF", "IDLE", "STATUS")
    table = [head]
    for e in found:
        eff = e.efficiency
        table.append((printable(e.job_id), printable(e.user), printable(e.account),
                      ",".join(f"{k}x{v}" for k, v in sorted(e.allocated.items())),
                      f"{e.allocated_card_seconds / 3600:.3f}", f"{e.busy_card_seconds / 3600:.3f}",
                      "-" if eff is None else f"{100 * eff:.0f}%",
                      "-" if e.idle_cards is None else str(e.idle_cards), e.status))  # fmt: skip
    width = _width(args)
    for line in fit(head, table[1:], width, labels=3, left=head, drop=("BUSY_H",)):
        print(line)
    if idle:
        ids = ", ".join(printable(e.job_id) for e in idle)
        text = f"held cards idle (efficiency < {args.idle_below:g} or no process seen): {ids}"
        print("\n".join(wrap(text, width)))
    for e in found:
        if e.reason:
            text = f"note: job {printable(e.job_id)} unknown: {printable(e.reason)}"
        elif e.dropped_samples:
            text = (
                f"note: job {printable(e.job_id)}: {e.dropped_samples} sample(s) dropped "
                "(utilization not a ratio in 0..1, or memory not a finite number >= 0)"
            )
        else:
            continue
        print("\n".join(wrap(text, width)))
    return code


def _add_capacity(lsub) -> None:
    c = lsub.add_parser(
        "capacity",
        help="per card class: capacity, allocated, busy, down, demand, a verdict",
        description=(
            "Per card class (GRES name and type) over the window: cards in service, "
            "capacity, allocated, busy (--prometheus), down and drained card-hours, waits, "
            "pending demand, top accounts, and a verdict (expand, underused, unhealthy, "
            "fine; thresholds in the config's ledger: capacity: section)."
        ),
    )
    _add_window(c)
    for action in c._actions:  # the window of capacity planning: a month by default
        if action.dest == "start":
            action.default, action.help = "now-30days", "window start (default now-30days)"
    c.add_argument(
        "--by",
        choices=capacity.BUCKETS,
        default="day",
        dest="bucket",
        help="time bucket of the series (default day)",
    )
    c.add_argument("--format", choices=("table", "csv", "json"), default="table")
    c.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write a self-contained HTML page (needs the 'report' extra)",
    )
    c.add_argument(
        "--config",
        type=Path,
        default=None,
        help="config file with ledger: capacity: thresholds (default: bundled)",
    )
    c.add_argument("--sacctmgr", default="sacctmgr", help="sacctmgr argv prefix (shell words)")
    c.add_argument("--sreport", default="sreport", help="sreport argv prefix (shell words)")
    c.add_argument("--no-sreport", action="store_true", help="do not compare with sreport")
    c.add_argument(
        "--events-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="saved `sacctmgr -P -n show event` (fields as events_argv asks)",
    )
    c.add_argument(
        "--config-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="saved `scontrol show config` (for AccountingStorageTRES)",
    )
    c.add_argument(
        "--prometheus",
        default=None,
        metavar="URL",
        help="busy card-hours from the daemons' series (as ledger efficiency)",
    )
    c.add_argument(
        "--busy-max-jobs",
        type=int,
        default=500,
        metavar="N",
        help="measure at most N jobs in Prometheus (default 500)",
    )
    c.add_argument("--prometheus-timeout", type=_seconds, default=30.0, metavar="S")
    c.set_defaults(func=cmd_capacity)


def _read_saved(path: Path, flag: str) -> str:
    with _open_sacct_file(path, flag) as handle:
        return handle.read(64 << 20).decode("utf-8", errors="replace")


@_guard
def cmd_capacity(args) -> int:
    from hetpatrol.config import ConfigError, load_config

    start, end, now = _window(args)
    try:
        thresholds = capacity.Thresholds.from_mapping(load_config(args.config).ledger_capacity)
    except ConfigError as exc:
        raise LedgerUsageError(f"--config: {exc.summary()}") from None
    sc = shlex.split(args.scontrol)
    if args.nodes_file is not None:
        nodes_text = _read_saved(args.nodes_file, "--nodes-file")
        inventory_time = None  # when it was saved is not known
    else:
        nodes_text, inventory_time = run([*sc, "show", "node", "-o"]), now
    inventory = capacity.read_inventory(nodes_text)
    if args.events_file is not None:
        events_text = _read_saved(args.events_file, "--events-file")
    else:
        argv = capacity.events_argv(_local(start), _local(end), shlex.split(args.sacctmgr))
        events_text = run(argv)
    events = capacity.parse_events(events_text, TimeParser())
    busy_of = None
    if args.prometheus:
        prom = eff_mod.Prometheus(args.prometheus, timeout=args.prometheus_timeout)

        def busy_of(r):
            e = eff_mod.job_efficiency(r, prom, now)
            if e is None or e.efficiency is None:
                return None
            return e.allocated_card_seconds, e.busy_card_seconds

    tty = sys.stderr.isatty()

    def progress(n: int) -> None:  # a person watching: stderr, only on a terminal
        sys.stderr.write(f"\rhetpatrol ledger capacity: {n} sacct records read")
        sys.stderr.flush()

    span = None if args.no_sreport else capacity.hour_span((start, end), now)
    if args.sacct_file is not None:
        handle = _open_sacct_file(args.sacct_file)
        records = capacity.split_capacity_lines(read_lines(handle))
    else:
        handle = None
        argv = capacity.capacity_sacct_argv(_local(start), _local(end), shlex.split(args.sacct))
        records = capacity.split_capacity_lines(
            stream_sacct(argv, timeout=args.timeout, parse=lambda lines: lines)
        )
    try:
        report = capacity.build(records, (start, end), now, args.bucket, inventory, events,
                                thresholds, busy_of, args.busy_max_jobs,
                                progress if tty else None, span)  # fmt: skip
    finally:
        if handle is not None:
            handle.close()
        if tty:
            sys.stderr.write("\r\033[K")
    report.inventory_time = inventory_time
    if not args.no_sreport:
        if args.config_file is not None:
            config_text = _read_saved(args.config_file, "--config-file")
        else:
            config_text = run([*sc, "show", "config"])
        sr = shlex.split(args.sreport)

        def query(tres: str, s: float, e: float):
            out = run(capacity.sreport_argv(tres, _local(s), _local(e), sr))
            return capacity.parse_sreport_utilization(out)

        capacity.reconcile(report, capacity.tracked_tres(config_text), query, span)
    # the report first: a page that cannot be written (no matplotlib, a bad path) still
    # leaves the figures read, then the exit code says the page is missing
    sys.stdout.write(capacity_report.render(report, args.format, _width(args)))
    sys.stdout.flush()
    if args.html is not None:
        from hetpatrol.ledger import capacity_html

        try:
            capacity_html.write(report, args.html)
        except capacity_html.MissingExtra as exc:
            _error(exc)
            return EX_UNAVAILABLE
        except OSError as exc:
            raise LedgerUsageError(f"--html {args.html}: {exc.strerror or exc}") from None
    return 0
