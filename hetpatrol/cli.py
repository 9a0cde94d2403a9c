"""The ``hetpatrol`` command line.

Commands:
  run              patrol forever: /metrics, JSONL, state file (systemd service)
  once             one patrol, printed; exit 0 ok, 1 warning, 2 critical, 3 unknown
  schema           print the JSON Schema of the JSONL lines
  validate-config  check a config file; exit 78 (EX_CONFIG) when it is bad
  check            Slurm HealthCheckProgram: the daemon's last verdict, exit 0/1/2/3
  status           this node at a glance, from the running daemon's state file
  baseline         record the driver/firmware versions per card type as a baseline
  fleet            the cluster per card class, partition and node batch (Slurm + Prometheus)
  audit-slurm      check slurm.conf / gres.conf / the nodes for a mixed cluster

Usage errors exit 64 (EX_USAGE).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import structlog

from hetpatrol import __version__, deep_health
from hetpatrol.cluster.audit_view import add_audit_parser
from hetpatrol.cluster.fleet_view import add_fleet_parser
from hetpatrol.collector import discover
from hetpatrol.config import EX_CONFIG, Config, ConfigError, load_config, parse_listen
from hetpatrol.healthcheck import add_check_parser
from hetpatrol.output import silence_stdout, write_stdout
from hetpatrol.patrol import Patroller, PatrolReport
from hetpatrol.replay import load_scenario
from hetpatrol.schema import jsonl_json_schema
from hetpatrol.status_view import _printable, add_status_parser


def setup_logging(fmt: str = "console", level: str = "info") -> None:
    """structlog to stderr: ``console`` key=value lines (journald friendly) or ``json``."""
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            getattr(logging, level.upper(), logging.INFO)
        ),
        # one write() per line (print() makes two: a kill between them tears the line)
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def _load(args: argparse.Namespace) -> Config:
    """The config, with the node name from ``--node`` or else the replay's scenario."""
    config = load_config(args.config)
    node = getattr(args, "node", None)
    if node is None and getattr(args, "replay", None) is not None:
        node = load_scenario(args.replay).get("node")
    if getattr(args, "baseline", None) is not None:  # once --baseline FILE
        config = replace(config, **deep_health.baseline_override(args.baseline))
    return replace(config, node=str(node)) if node else config


def _existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: not a directory")
    return path


def _node_name(text: str) -> str:
    """``--node``: a name as Slurm's NodeName, never empty, no space or control character
    (it lands in the JSONL, the state file and ``check``'s one-line verdict)."""
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a node name, not empty, without spaces or control characters"
        )
    return text


def _listen(text: str) -> str:
    """``--listen``: checked here, so that a bad flag is a usage error (64), not 78."""
    try:
        parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _prom_path(text: str) -> Path:
    if not text.endswith(".prom"):
        raise argparse.ArgumentTypeError(f"{text}: node_exporter reads only *.prom files")
    return Path(text)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="config file (default: the bundled config/hetpatrol.yaml)",
    )
    p.add_argument(
        "--replay",
        type=_existing_dir,
        default=None,
        metavar="DIR",
        help="replay recorded vendor output from DIR instead of the hardware",
    )
    p.add_argument("--node", type=_node_name, default=None, help="node name (overrides the config)")


def cmd_run(args: argparse.Namespace) -> int:
    from hetpatrol.daemon import Daemon

    config = _load(args)
    overrides: dict[str, Any] = {
        "listen": args.listen,
        "jsonl_path": args.jsonl_path,
        "state_path": args.state_path,
        "textfile_path": args.textfile_path,
        "interval_seconds": args.interval,
        "node": config.node,
    }
    daemon = Daemon(config, config_path=args.config, replay_dir=args.replay, overrides=overrides)
    daemon.install_signals()
    return daemon.run()


def format_table(report: PatrolReport) -> str:
    """Human-readable table of one patrol: a row per card, findings under it.

    Control characters and bidi controls in any text (a vendor tool's error, a model
    name) are shown escaped (``\\x1b``, ``\\u202e``), never sent to the terminal raw."""
    head = (
        "VENDOR",
        "TYPE",
        "IDX",
        "CHIP",
        "MODEL",
        "BUS ID",
        "HEALTH",
        "TEMP",
        "POWER",
        "UTIL",
        "MEMORY",
    )
    rows = []
    notes: list[list[str]] = []

    def num(v: float | None, unit: str, fmt: str = "{:.0f}") -> str:
        return "-" if v is None else fmt.format(v) + unit

    for c in sorted(report.cards, key=lambda r: (r.vendor, r.index, r.chip or 0)):
        mem = "-"
        if c.memory_used_bytes is not None and c.memory_total_bytes:
            mem = f"{c.memory_used_bytes / 2**30:.1f}/{c.memory_total_bytes / 2**30:.1f} GiB"
        row = (
            c.vendor,
            c.card_type or "-",
            str(c.index),
            "-" if c.chip is None else str(c.chip),
            c.model or "-",
            c.bus_id or "-",
            c.health.upper(),
            num(c.temperature_celsius, " C"),
            num(c.power_watts, " W", "{:.1f}"),
            num(None if c.utilization_ratio is None else c.utilization_ratio * 100, "%"),
            mem,
        )
        rows.append(tuple(_printable(v) for v in row))
        notes.append([f"{f.severity}: {f.check}: {f.message}" for f in c.findings])
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    for row, note in zip(rows, notes, strict=True):
        out.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
        out.extend(f"    {n}" for n in note)
    for s in report.collectors:
        line = f"collector {s.name}: {s.state}, {s.cards} cards, {s.duration_seconds:.3f} s"
        out.append(line + (f" ({s.error})" if s.error else ""))
    for f in report.node_findings:
        out.append(f"node {f.severity}: {f.check}: {f.message}")
    for line in report.event_lines:  # kernel log faults first read in this patrol
        e = json.loads(line)
        what = f"xid {e['xid']}" if e["xid"] is not None else str(e["reason"])
        out.append(f"event {e['severity']}: {what} on {e['bus_id']} x{e['count']}")
    out.append(f"node {report.node}: {report.health.upper()} (exit {report.exit_code})")
    return "\n".join(_printable(line) for line in out) + "\n"


def _one_patrol(args: argparse.Namespace) -> PatrolReport:
    """One patrol with the command's config and replay directory, collectors closed after."""
    patroller = Patroller(_load(args), replay_dir=args.replay)
    try:
        return patroller.run()
    finally:
        patroller.close()


def cmd_once(args: argparse.Namespace) -> int:
    report = _one_patrol(args)
    if args.format == "jsonl":
        text = "".join(report.jsonl_lines())
    elif args.format == "json":
        doc = {
            "patrol": json.loads(report.patrol_line),
            "cards": [json.loads(line) for line in report.card_lines],
            "events": [json.loads(line) for line in report.event_lines],
        }
        text = json.dumps(doc, indent=2) + "\n"
    else:
        text = format_table(report)
    write_stdout(text)  # a reader gone (`| head`) leaves the exit code the verdict's
    return report.exit_code


def cmd_baseline(args: argparse.Namespace) -> int:
    """Record this node's driver and firmware versions per card type as a baseline."""
    report = _one_patrol(args)
    try:
        return deep_health.write_baseline(report, args.write, sys.stdout, sys.stderr)
    except BrokenPipeError:  # stdout, not the file: main() handles it
        raise
    except OSError as exc:
        print(
            f"hetpatrol baseline: cannot write {args.write}: {exc.strerror or exc}", file=sys.stderr
        )
        return EX_CANTCREAT


def cmd_schema(args: argparse.Namespace) -> int:
    write_stdout(json.dumps(jsonl_json_schema(), indent=2) + "\n")
    return 0


def cmd_validate_config(args: argparse.Namespace) -> int:
    config = load_config(args.path)
    installed = discover()
    unknown = [c.name for c in config.collectors if c.enabled and c.name not in installed]
    if unknown:  # the daemon would report them failed, patrol after patrol
        raise ConfigError(
            f"no collector plugin named {unknown[0]!r} is installed "
            f"(installed: {', '.join(sorted(installed)) or 'none'})",
            path=config.source,
            line=config.key_lines.get(("collectors", unknown[0])),
            key=f"collectors.{unknown[0]}",
        )
    if not any(c.enabled for c in config.collectors):
        print(
            f"{config.source}: warning: no collector is enabled: nothing will be patrolled",
            file=sys.stderr,
        )
    print(
        f"{config.source}: ok ({len(config.profiles)} profiles, "
        f"collectors: {', '.join(c.name for c in config.collectors if c.enabled) or 'none'})"
    )
    return 0


EX_USAGE = 64
EX_CANTCREAT = 73


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 64 (EX_USAGE): never 2, which Nagios reads as CRITICAL."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


def _add_log_options(p: argparse.ArgumentParser, default: Any) -> None:
    """--log-format/--log-level, accepted before and after the command."""
    p.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console" if default is None else default,
        help="stderr log format: console key=value lines or json (journald)",
    )
    p.add_argument(
        "--log-level",
        default=default,
        choices=("debug", "info", "warning", "error"),
        help="default: info for run, warning for the other commands",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hetpatrol", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"hetpatrol {__version__}")
    _add_log_options(parser, None)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="patrol forever (the daemon)")
    _add_common(p)
    p.add_argument(
        "--listen",
        type=_listen,
        default=None,
        metavar="ADDR:PORT",
        help="metrics address (overrides the config)",
    )
    p.add_argument("--jsonl-path", type=Path, default=None, help="JSONL patrol log path")
    p.add_argument("--state-path", type=Path, default=None, help="state file path")
    p.add_argument(
        "--textfile-path",
        type=_prom_path,
        default=None,
        metavar="P",
        help="also write the metrics to P (*.prom) for node_exporter's textfile collector",
    )
    p.add_argument("--interval", type=float, default=None, help="seconds between patrols")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("once", help="one patrol; exit 0/1/2/3 = ok/warning/critical/unknown")
    _add_common(p)
    p.add_argument("--format", choices=("table", "json", "jsonl"), default="table")
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="FILE",
        help="baseline file to check against (overrides the config's baseline_file)",
    )
    p.set_defaults(func=cmd_once)

    p = sub.add_parser(
        "baseline", help="record the driver/firmware versions per card type as a baseline file"
    )
    _add_common(p)
    p.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the baseline file here (atomically); default: print it",
    )
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("schema", help="print the JSON Schema of the JSONL lines")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("validate-config", help="check a config file (exit 78 when bad)")
    p.add_argument("path", type=Path)
    p.set_defaults(func=cmd_validate_config)

    add_check_parser(sub)

    add_status_parser(sub)
    # the cluster-wide commands (hetpatrol/cluster/)
    add_fleet_parser(sub)
    add_audit_parser(sub)
    for command in sub.choices.values():
        _add_log_options(command, argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = args.log_level or ("info" if args.command == "run" else "warning")
    setup_logging(args.log_format, level)
    interval = getattr(args, "interval", None)
    if interval is not None and not 0 < interval <= 86400:  # also refuses nan
        parser.error("--interval must be a number of seconds in (0, 86400]")
    try:
        code = int(args.func(args))
        write_stdout("")  # flush now: a reader gone (`| head`) keeps the command's code
        return code
    except BrokenPipeError:  # an OSError: must come first; stdout's reader has gone
        silence_stdout()
        return 0
    except ConfigError as exc:
        print(f"hetpatrol: configuration error: {exc}", file=sys.stderr)
        return EX_CONFIG
    except ValueError as exc:  # a replay scenario that cannot be read
        print(f"hetpatrol: {exc}", file=sys.stderr)
        return EX_CONFIG
    except OSError as exc:  # e.g. the metrics port is taken, another daemon's log
        # the message itself, not "[Errno 98] ..."; a bare errno keeps its system text
        text = exc.strerror if exc.strerror and exc.filename is None else str(exc)
        print(f"hetpatrol: {text}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
