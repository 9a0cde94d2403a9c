"""``hetpatrol fleet``: the command, its table and its JSON.

One block per card class (vendor, card type, GRES name): the class total, then a row per
partition and under it a row per node batch (nodes of one name prefix with the same
number of cards of the class registered, hostlist-compressed: ``gn[001-040]``), then the
driver/firmware versions in use with node counts. After the classes: nodes Slurm knows
but Prometheus does not, the reverse, and nodes whose daemon is silent.

Exit code: 0 all cards healthy, 1 warning, 2 critical, 3 unknown (an unknown card, a
silent daemon, registered cards not seen, a node with card GRES that Prometheus lacks,
or a source that cannot be read).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from hetpatrol.cluster.audit import vendor_of_gres
from hetpatrol.cluster.fleet import HEALTHS, FleetReport, build_fleet, read_daemons
from hetpatrol.cluster.prom_query import PrometheusClient, PrometheusError, RecordedPrometheus
from hetpatrol.cluster.slurm_nodes import (
    SlurmReadError,
    parse_nodes,
    read_nodes,
    require_nodes,
)
from hetpatrol.cluster.sources import read_regular, timeout_seconds
from hetpatrol.config import load_config
from hetpatrol.node_view import Painter, printable, terminal_width, use_color
from hetpatrol.output import write_stdout
from hetpatrol.progress import progress
from hetpatrol.recorded import Recording

EXIT_UNKNOWN = 3
HEADERS = (
    "class / partition / nodes",
    "nodes",
    "slurm",
    "seen",
    "ok",
    "warn",
    "crit",
    "unkn",
    "alloc",
    "idle",
    "down",
    "drain-hp",
    "drain-other",
    "silent",
)
_HEALTH_COL = {"ok": 4, "warning": 5, "critical": 6, "unknown": 7}


def _cells(label: str, c: dict[str, Any]) -> list[str]:
    h = c["health"]
    return [
        label,
        str(c["nodes"]),
        str(c["cards_slurm"]),
        str(c["cards_seen"]),
        *(str(h[k]) for k in HEALTHS),
        str(c["allocated"]),
        str(c["idle"]),
        str(c["down"]),
        str(c["drained_hetpatrol"]),
        str(c["drained_other"]),
        str(c["silent"]),
    ]


def _styles(c: dict[str, Any], base: str = "") -> list[str]:
    styles = [base] * len(HEADERS)
    for health, col in _HEALTH_COL.items():
        if c["health"][health]:
            styles[col] = health
    if c["cards_seen"] < c["cards_slurm"]:
        styles[3] = "unknown"
    if c["down"]:
        styles[10] = "warning"
    if c["silent"]:
        styles[13] = "unknown"
    if c["drained_hetpatrol"]:
        styles[11] = "warning"
    return styles


#: the numbers' headers in the narrow layout (the label on a line of its own)
SHORT_HEADERS = (
    "nodes", "slurm", "seen", "ok", "warn", "crit", "unkn", "alloc", "idle", "down",
    "dr-hp", "dr-oth", "silent",
)  # fmt: skip


def _wrap(text: str, width: int | None, indent: int = 2) -> list[str]:
    if width is None or len(text) <= width:
        return [text]
    import textwrap

    return textwrap.wrap(text, width, subsequent_indent=" " * indent, break_on_hyphens=False)


def render(doc: dict[str, Any], *, color: bool = False, width: int | None = None) -> str:
    """The human table of :meth:`FleetReport.to_json`'s document.

    ``width``: the terminal's columns (None: a pipe, the wide table whole). Where the wide
    table (label and numbers on one line) does not fit, each label gets a line of its own
    and its numbers go on the next, under short headers (``dr-hp`` drained by hetpatrol,
    ``dr-oth`` by others); the lines below the table wrap."""
    doc = printable(doc)
    paint = Painter(color)
    rows: list[tuple[list[str], list[str]] | str] = [(list(HEADERS), ["bold"] * len(HEADERS))]
    for cls in doc["classes"]:
        vendor = cls["vendor"] or "?"
        ctype = cls["card_type"] or "(untyped)"
        gres = cls["gres"] or "?"
        worst = next((h for h in ("critical", "unknown", "warning") if cls["health"][h]), "ok")
        rows.append("")
        rows.append(
            ([f"{vendor} {ctype}  gres {gres}", *_cells("", cls)[1:]], [worst] + _styles(cls)[1:])
        )
        for part in cls["partitions"]:
            label = f"  partition {part['partition']}"
            rows.append(([label, *_cells("", part)[1:]], _styles(part)))
            for b in part["batches"]:
                rows.append(([f"    {b['hosts']}", *_cells("", b)[1:]], _styles(b, "dim")))
        versions = cls["versions"]
        drift = len(versions) > 1
        for v in versions:
            fw = f"  firmware {v['firmware_version']}" if v["firmware_version"] else ""
            text = (
                f"  driver {v['driver_version'] or '?'}{fw}"
                f": {v['nodes']} node{'s' if v['nodes'] != 1 else ''}"
            )
            rows.append(paint(text + ("  (drift)" if drift else ""), "warning" if drift else "dim"))
    widths = [0] * len(HEADERS)
    for r in rows:
        if isinstance(r, tuple):
            for i, cell in enumerate(r[0]):
                widths[i] = max(widths[i], len(cell))
    out = []
    wide = sum(widths) + 2 * (len(widths) - 1)
    if width is not None and wide > width:
        # narrow: the label alone, its numbers below it under the short headers
        tables = [r[0] for r in rows if isinstance(r, tuple) and r[0][0] != HEADERS[0]]
        num_w = [max(len(h), *(len(c[i + 1]) for c in tables)) for i, h in enumerate(SHORT_HEADERS)]
        for r in rows:
            if isinstance(r, str):
                out.extend(_wrap(r, width, 4) if r and "\033" not in r else [r])
                continue
            cells, styles = r
            if cells[0] == HEADERS[0]:  # the header row
                out.append(paint(HEADERS[0], "bold"))
                numbers = [h.rjust(w) for h, w in zip(SHORT_HEADERS, num_w, strict=True)]
                out.append("    " + paint(" ".join(numbers), "bold"))
                continue
            out.append(paint(cells[0], styles[0]) if styles[0] else cells[0])
            numbers = []
            for i, cell in enumerate(cells[1:], start=1):
                text = cell.rjust(num_w[i - 1])
                numbers.append(paint(text, styles[i]) if styles[i] else text)
            out.append("    " + " ".join(numbers))
    else:
        for r in rows:
            if isinstance(r, str):
                out.append(r)
                continue
            cells, styles = r
            parts = []
            for i, cell in enumerate(cells):
                text = cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
                parts.append(paint(text, styles[i]) if styles[i] else text)
            out.append("  ".join(parts).rstrip())
    out.append("")
    for key, title in (
        ("slurm_only", "in Slurm, not in Prometheus"),
        ("prometheus_only", "in Prometheus, not in Slurm"),
        ("silent", "daemon silent (down, stale or not ready)"),
    ):
        part = doc[key]
        if part["nodes"]:
            line = f"{title}: {part['nodes']} node{'s' if part['nodes'] != 1 else ''}: "
            line += part["hosts"]
            if part.get("with_card_gres"):
                line += f"  (with card GRES: {part['with_card_gres']})"
            out.extend(paint(x, "unknown") for x in _wrap(line, width))
    for bad in doc.get("gres_unreadable", ()):
        line = f"Slurm GRES of {bad['node']} unreadable: {bad['error']}"
        out.extend(paint(x, "unknown") for x in _wrap(line, width))
    for bad in doc.get("slurm_unreadable", ()):
        line = f"Slurm node {bad['node']} unreadable: {bad['error']}"
        out.extend(paint(x, "unknown") for x in _wrap(line, width))
    if doc.get("duplicates"):
        line = f"listed twice by Slurm (counted once): {doc['duplicates']}"
        out.extend(paint(x, "warning") for x in _wrap(line, width))
    unreg = doc.get("unregistered") or {}
    if unreg.get("nodes"):
        line = (
            f"cards seen but not registered in Slurm Gres=: {unreg['nodes']} "
            f"node{'s' if unreg['nodes'] != 1 else ''}: {unreg['hosts']}"
        )
        out.extend(paint(x, "warning") for x in _wrap(line, width))
    for note in doc.get("notes", ()):
        out.extend(paint(x, "dim") for x in _wrap(f"note: {note}", width))
    health = doc["health"]
    out.append(
        paint(
            f"fleet: {doc['nodes']} nodes, {health.upper()} (exit {doc['exit_code']})",
            health,
        )
    )
    return "\n".join(out) + "\n"


#: what scontrol prints on a host without a slurm.conf (nor DNS SRV records):
#: slurm_conf_init() in src/common/read_config.c, "Could not establish a configuration
#: source" (the last of those lines with Debian 12's Slurm 22.05.8), as `ledger` reads it
_NO_CONF = "Could not establish a configuration source"


def cmd_fleet(args: argparse.Namespace) -> int:
    notes: list[str] = []
    deadline = time.monotonic() + args.timeout
    try:
        recording = Recording(args.replay) if args.replay is not None else None
        runner = recording.run if recording is not None else None
        if args.slurm_nodes is not None:
            source = f"file {args.slurm_nodes}"
            try:
                nodes = parse_nodes(read_regular(args.slurm_nodes))
            except ValueError as exc:
                raise SlurmReadError(f"{source}: {exc}") from None
            require_nodes(nodes, source)
        else:
            with progress("hetpatrol fleet: reading Slurm's nodes", enabled=not args.json):
                nodes, source = read_nodes(args.scontrol, args.timeout, runner)
        # --timeout is for the whole command: scontrol and every query together
        client = (
            RecordedPrometheus(recording)
            if recording is not None
            else PrometheusClient(args.prometheus, args.timeout, deadline=deadline)
        )
        prometheus = args.prometheus or f"recording {args.replay}"
        with progress(f"hetpatrol fleet: querying {prometheus}", enabled=not args.json):
            daemons = read_daemons(client, args.node_label, args.job, notes)
    except (SlurmReadError, PrometheusError, OSError, ValueError) as exc:  # RecordingError too
        print(printable(f"hetpatrol fleet: {exc}"), file=sys.stderr)
        if isinstance(exc, SlurmReadError) and _NO_CONF in str(exc):
            # the same hint as `ledger`'s (hetpatrol/ledger/command.py)
            print(
                "hint: no slurm.conf found: set SLURM_CONF or pass --scontrol/--slurm-nodes",
                file=sys.stderr,
            )
        return EXIT_UNKNOWN
    if not daemons:
        print(
            printable(
                f"hetpatrol fleet: no series of job {args.job!r} in {prometheus}: "
                "check --job and the scrape config"
            ),
            file=sys.stderr,
        )
    profiles = load_config().profiles
    report: FleetReport = build_fleet(
        nodes, daemons, vendor_of=lambda name, gtype: vendor_of_gres(name, gtype, profiles)
    )
    report.slurm_source = source
    report.notes = notes
    report.prometheus = prometheus
    doc = report.to_json()
    if args.json:
        write_stdout(json.dumps(doc, indent=1) + "\n")
    else:
        width = terminal_width(sys.stdout)
        write_stdout(render(doc, color=use_color(sys.stdout, args.color), width=width))
    return report.exit_code


def add_fleet_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "fleet",
        help="the cluster per card class, partition and node batch (Slurm + Prometheus); "
        "exit 0/1/2/3",
        description=(
            "The cluster per card class, then per partition and node batch: Slurm's nodes "
            "joined with the daemons' metrics read from Prometheus (cards registered and "
            "seen, verdicts, allocated, idle and on down nodes, drained by hetpatrol or "
            "others, silent daemons, driver and firmware versions). Exit: the fleet's worst "
            "verdict, 0 ok, 1 warning, 2 critical, 3 unknown (also when Slurm or Prometheus "
            "cannot be read)."
        ),
    )
    source = p.add_mutually_exclusive_group(required=True)  # one, else a usage error (64)
    source.add_argument(
        "--prometheus",
        default=None,
        metavar="URL",
        help="Prometheus base URL, e.g. http://prometheus:9090",
    )
    source.add_argument(
        "--replay",
        type=Path,
        default=None,
        metavar="DIR",
        help="a recorded cluster (scontrol's output and Prometheus's answers, e.g. "
        "fixtures/cluster/mixed) instead of Slurm and --prometheus",
    )
    p.add_argument(
        "--scontrol",
        type=shlex.split,
        default=["scontrol"],
        metavar="CMD",
        help='scontrol command line (default "scontrol"; e.g. "env SLURM_CONF=/x scontrol")',
    )
    p.add_argument(
        "--slurm-nodes",
        type=Path,
        default=None,
        metavar="FILE",
        help="read the nodes from this file (scontrol --json show node, sinfo --json or "
        "scontrol -d -o show node output; - for stdin) instead of running scontrol",
    )
    p.add_argument(
        "--node-label",
        default="node",
        help="the target label holding the Slurm node name (default: node; without it "
        "the host of `instance`)",
    )
    p.add_argument("--job", default="hetpatrol", help="the scrape job (default: hetpatrol)")
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=60.0,
        help="one deadline in seconds for the whole command (scontrol and every Prometheus "
        "query together), in (0, 86400] (default 60)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the table: on a terminal (auto, not with NO_COLOR), always, never",
    )
    p.set_defaults(func=cmd_fleet)
    return p
