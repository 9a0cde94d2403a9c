"""``hetpatrol audit-slurm``: the command around :func:`hetpatrol.cluster.audit.audit`.

Sources: ``--slurm-conf`` (its Includes followed; gres.conf and cgroup.conf beside it are
read when present), else the running cluster's ``scontrol show config``, ``scontrol show
partition -o`` and ``scontrol -d -o show node``. ``--prometheus`` adds the daemons' cards
(the ``gres_vs_daemons`` check and the card classes of each node).

Exit code: 0 nothing to fix, 1 warnings, 2 errors, 3 a source could not be read.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from hetpatrol.cluster.audit import SEVERITIES, AuditInput, AuditReport, audit
from hetpatrol.cluster.fleet import add_node_findings, read_daemons, runtime_query
from hetpatrol.cluster.prom_query import PrometheusClient, PrometheusError, RecordedPrometheus
from hetpatrol.cluster.slurm_conf import (
    SlurmConf,
    parse_show_config,
    parse_show_partitions,
    parse_slurm_conf,
)
from hetpatrol.cluster.slurm_nodes import SlurmReadError, read_nodes, run_scontrol
from hetpatrol.cluster.sources import read_regular, timeout_seconds
from hetpatrol.config import load_config
from hetpatrol.node_view import Painter, printable, terminal_width, use_color
from hetpatrol.output import write_stdout
from hetpatrol.progress import progress
from hetpatrol.recorded import Recording
from hetpatrol.slurm.gres import parse_gres_conf

EXIT_UNKNOWN = 3
_STYLE = {"error": "critical", "warning": "warning", "info": "info"}


def parse_cgroup_conf(text: str) -> dict[str, str]:
    """``Key=Value`` lines of cgroup.conf, keys lower-case, comments dropped."""
    out = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def _wrapped(text: str, width: int | None, indent: str = "        ") -> list[str]:
    """``text`` at ``indent``, wrapped at ``width`` (None: one line, as in a pipe). A word
    too long for a line is broken after its commas first (a slurm.conf value such as
    ``AccountingStorageTRES=gres/a,gres/b:t``: whole items on each line, never a name cut
    in two), and only where an item alone is still too long, inside it."""
    if width is None or len(indent) + len(text) <= width:
        return [indent + text]
    import re
    import textwrap

    room = max(width, len(indent) + 20)

    class _AtCommas(textwrap.TextWrapper):
        def _split(self, chunk: str) -> list[str]:
            out: list[str] = []
            for piece in super()._split(chunk):
                if len(piece) > room - len(indent) - 2 and "," in piece:
                    out += [x for x in re.split(r"(?<=,)", piece) if x]
                else:
                    out.append(piece)
            return out

    return _AtCommas(
        room,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_on_hyphens=False,
        break_long_words=True,
    ).wrap(text)


def _count(n: int, word: str) -> str:
    """``1 error``, ``3 errors``, ``0 notes``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def render(doc: dict[str, Any], *, color: bool = False, width: int | None = None) -> str:
    """The human list of findings, errors first, each with where and the fix; ``width``:
    the terminal's columns, messages and fixes wrapped to it (None: a pipe, one line
    each)."""
    doc = printable(doc)
    paint = Painter(color)
    out = []
    for f in doc["findings"]:
        sev = f["severity"]
        head = f"{sev.upper().ljust(7)} {f['check']:<17} {f['where']}"
        if width is None or len(head) <= width:
            lines = [head]
        else:  # a long path: under the check, on lines of its own
            lines = [f"{sev.upper().ljust(7)} {f['check']}", *_wrapped(f["where"], width)]
        lines[0] = lines[0].replace(sev.upper(), paint(sev.upper(), _STYLE[sev]), 1)
        out.extend(lines)
        out.extend(_wrapped(f["message"], width))
        if f["fix"]:
            out.extend(paint(x, "dim") for x in _wrapped(f"fix: {f['fix']}", width))
    counts = {s: sum(1 for f in doc["findings"] if f["severity"] == s) for s in SEVERITIES}
    if doc.get("layouts"):
        out.append("")
        out.append("partitions:")
        for name, layout in doc["layouts"].items():
            out.extend(_wrapped(f"{name}: {layout}", width))
    out.append("")
    parts = [
        _count(doc["nodes"], "node"),
        _count(counts["error"], "error"),
        _count(counts["warning"], "warning"),
        _count(counts["info"], "note"),
    ]
    out.append(f"audit: {', '.join(parts)} (exit {doc['exit_code']})")
    return "\n".join(out) + "\n"


def _scontrol(argv: list[str], args: list[str], timeout: float, runner=None) -> str:
    # bounded as the fleet's node read: killed at the timeout, its answer size capped
    proc = (runner or run_scontrol)([*argv, *args], timeout)
    if proc.returncode != 0:
        detail = (proc.stderr.strip() or "no output").splitlines()[-1]
        raise SlurmReadError(f"{' '.join([*argv, *args])}: {detail}")
    return proc.stdout


def gather(args: argparse.Namespace) -> AuditInput:
    """Read every source the options name; ``SlurmReadError``/``PrometheusError``/
    ``OSError`` when one cannot be read."""
    live = None
    deadline = time.monotonic() + args.timeout  # --timeout: the whole gathering

    def left() -> float:
        return deadline - time.monotonic()

    recording = Recording(args.replay) if args.replay is not None else None
    runner = recording.run if recording is not None else None
    if args.slurm_conf is not None:
        conf: SlurmConf = parse_slurm_conf(args.slurm_conf)
        base = args.slurm_conf.parent
    else:
        conf = parse_show_config(_scontrol(args.scontrol, ["show", "config"], left(), runner))
        conf.partitions = parse_show_partitions(
            _scontrol(args.scontrol, ["show", "partition", "-o"], left(), runner)
        )
        base = None
        s = conf.get("SLURM_CONF")
        if recording is not None:  # the recorded SLURM_CONF is a path of another machine
            base = recording.root
        elif s is not None and s.value:
            base = Path(s.value).parent
    if args.live or args.slurm_conf is None:
        with progress("hetpatrol audit-slurm: reading Slurm's nodes", enabled=not args.json):
            live, _source = read_nodes(args.scontrol, left(), runner)
    gres_path = args.gres_conf or (base / "gres.conf" if base else None)
    gres_lines = None
    if gres_path is not None and (args.gres_conf is not None or gres_path.is_file()):
        gres_lines = parse_gres_conf(read_regular(gres_path))
    cg_path = args.cgroup_conf or (base / "cgroup.conf" if base else None)
    cgroup = None
    if cg_path is not None and (args.cgroup_conf is not None or cg_path.is_file()):
        cgroup = parse_cgroup_conf(read_regular(cg_path))
    daemons = None
    notes: list[str] = []
    if args.prometheus or (recording is not None and recording.answers):
        client = (
            PrometheusClient(args.prometheus, args.timeout, deadline=deadline)
            if args.prometheus
            else RecordedPrometheus(recording)
        )
        with progress("hetpatrol audit-slurm: querying Prometheus", enabled=not args.json):
            daemons = read_daemons(client, args.node_label, args.job, notes)
            runtime = client.query(runtime_query(args.node_label, args.job))
        add_node_findings(daemons, runtime, args.node_label)
    return AuditInput(
        conf=conf,
        gres_conf=gres_lines,
        gres_conf_path=str(gres_path) if gres_path else "gres.conf",
        cgroup=cgroup,
        cgroup_path=str(cg_path) if cg_path else "cgroup.conf",
        live_nodes=live,
        daemons=daemons,
        profiles=load_config(args.config).profiles,
        notes=notes,
    )


def _domain_findings(args: argparse.Namespace, inp: AuditInput) -> list:
    """topology.conf (``--topology-conf``, else the one beside slurm.conf when there)
    and the partitions, by :mod:`hetpatrol.cluster.domains`."""
    from hetpatrol.cluster.domains import domain_findings, node_table, parse_topology_conf

    path = args.topology_conf
    if path is None and args.slurm_conf is not None:
        beside = args.slurm_conf.parent / "topology.conf"
        path = beside if beside.is_file() else None
    switches = parse_topology_conf(read_regular(path), str(path)) if path else None
    classes, features, parts = node_table(inp.conf, inp.profiles)
    return domain_findings(switches, parts, lambda n: classes.get(n, set()), features)


def cmd_audit(args: argparse.Namespace) -> int:
    try:
        inp = gather(args)
    except (SlurmReadError, PrometheusError, OSError, ValueError) as exc:
        print(printable(f"hetpatrol audit-slurm: {exc}"), file=sys.stderr)
        return EXIT_UNKNOWN
    report: AuditReport = audit(inp)
    try:  # one interconnect domain per job: leaf switches and partitions (domains.py)
        report.findings.extend(_domain_findings(args, inp))
    except (OSError, ValueError) as exc:
        print(printable(f"hetpatrol audit-slurm: {exc}"), file=sys.stderr)
        return EXIT_UNKNOWN
    doc = report.to_json()
    if args.json:
        write_stdout(json.dumps(doc, indent=1) + "\n")
    else:
        width = terminal_width(sys.stdout)
        write_stdout(render(doc, color=use_color(sys.stdout, args.color), width=width))
    return report.exit_code


def add_audit_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "audit-slurm",
        help="check slurm.conf / gres.conf / the nodes for a mixed cluster; exit 0/1/2/3",
        description=(
            "The mixed-cluster checklist over slurm.conf, gres.conf, cgroup.conf (files, or "
            "the running cluster with --live) and, with --prometheus, the cards the daemons "
            "found; each finding names its file and line (or the nodes) and the fix. Exit 0 "
            "nothing to fix, 1 warnings, 2 errors, 3 a source cannot be read."
        ),
    )
    p.add_argument(
        "--slurm-conf",
        type=Path,
        default=None,
        metavar="FILE",
        help="slurm.conf to check (default: the running cluster's scontrol show config)",
    )
    p.add_argument(
        "--gres-conf",
        type=Path,
        default=None,
        metavar="FILE",
        help="gres.conf (default: the one beside slurm.conf, when there)",
    )
    p.add_argument(
        "--cgroup-conf",
        type=Path,
        default=None,
        metavar="FILE",
        help="cgroup.conf (default: the one beside slurm.conf, when there)",
    )
    p.add_argument(
        "--topology-conf",
        type=Path,
        default=None,
        metavar="FILE",
        help="topology.conf (default: the one beside slurm.conf, when there)",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="also read the nodes from scontrol (implied without --slurm-conf)",
    )
    p.add_argument(
        "--scontrol",
        type=shlex.split,
        default=["scontrol"],
        metavar="CMD",
        help='scontrol command line (default "scontrol")',
    )
    p.add_argument(
        "--replay",
        type=Path,
        default=None,
        metavar="DIR",
        help="a recorded cluster (fixtures/cluster/mixed): its scontrol output, gres.conf "
        "and Prometheus answers instead of the running cluster's",
    )
    p.add_argument(
        "--prometheus", default=None, metavar="URL", help="compare Gres= with the daemons' cards"
    )
    p.add_argument(
        "--node-label",
        default="node",
        help="the target label holding the Slurm node name (default: node)",
    )
    p.add_argument("--job", default="hetpatrol", help="the scrape job (default: hetpatrol)")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="hetpatrol config whose profiles map GRES to vendors (default: the bundled one)",
    )
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=60.0,
        help="one deadline in seconds for the whole command (scontrol and every Prometheus "
        "query together), in (0, 86400] (default 60)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the list")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the list: on a terminal (auto, not with NO_COLOR), always, never",
    )
    p.set_defaults(func=cmd_audit)
    return p
