"""The ``hetpatrol`` command line.

Health, placement and accounting for Slurm clusters of several accelerator vendors: each
command below has its own ``--help``. Verdicts exit as Nagios checks do (0 ok, 1 warning,
2 critical, 3 unknown); usage errors exit 64 (EX_USAGE), a bad config 78 (EX_CONFIG), an
output path hetpatrol refuses to write (a symlink, another user's file or directory:
docs/failures.md) 73 (EX_CANTCREAT).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from hetpatrol import __version__, logs
from hetpatrol.collector import discover
from hetpatrol.config import EX_CONFIG, Config, ConfigError, load_config, parse_listen
from hetpatrol.output import plain_help, silence_stdout, write_stdout
from hetpatrol.patrol import Patroller, PatrolReport
from hetpatrol.replay import load_scenario
from hetpatrol.safe_files import UnsafePath
from hetpatrol.schema import jsonl_json_schema


def setup_logging(fmt: str = "console", level: str = "info") -> None:
    """Events to stderr (:mod:`hetpatrol.logs`): ``console`` key=value lines or ``json``
    lines (journald), at ``level`` (debug, info, warning, error) and above."""
    logs.configure(level, fmt)


def _load(args: argparse.Namespace, loader: Callable[..., Config] = load_config) -> Config:
    """The config, with the node name from ``--node`` or else the replay's scenario."""
    config = loader(args.config)
    node = getattr(args, "node", None)
    if getattr(args, "replay", None) is not None:
        from hetpatrol.replay import scenario_boots

        boots = scenario_boots(args.replay)
        if boots:  # its own directory holds no recording: it would read as no card
            raise ValueError(
                f"{args.replay} is a scenario of {len(boots)} boots (scenario.yaml boots:): "
                f"replay one of them, e.g. --replay {boots[0]}"
            )
    if node is None and getattr(args, "replay", None) is not None:
        node = load_scenario(args.replay).get("node")
    if getattr(args, "baseline", None) is not None:  # once --baseline FILE
        from hetpatrol.baseline_command import with_baseline_file

        config = with_baseline_file(config, args.baseline)
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


def _interval(text: str) -> float:
    """``--interval``: seconds in (0, 86400]; a usage error of ``run`` itself otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 86400:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds in (0, 86400]")
    return value


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
    from hetpatrol.config_check import load_config_isolated
    from hetpatrol.daemon import Daemon

    # the schema check (jsonschema) runs in a child: the daemon never holds it in memory
    config = _load(args, load_config_isolated)
    overrides: dict[str, Any] = {
        "listen": args.listen,
        "jsonl_path": args.jsonl_path,
        "state_path": args.state_path,
        "textfile_path": args.textfile_path,
        "interval_seconds": args.interval,
        "node": config.node,
    }
    daemon = Daemon(
        config,
        config_path=args.config,
        replay_dir=args.replay,
        overrides=overrides,
        config_loader=load_config_isolated,
    )
    daemon.install_signals()
    return daemon.run()


def format_table(
    report: PatrolReport, *, verbose: bool = False, color: bool = False, width: int | None = None
) -> str:
    """The node view (:mod:`hetpatrol.node_view`, as ``status`` shows it) of one patrol:
    a table per vendor and card type, findings and processes under each card, the
    collectors, node findings and kernel-log events. Control characters and bidi
    controls in any text are shown escaped, never sent to the terminal raw."""
    from hetpatrol.exporters.state import state_document
    from hetpatrol.node_view import render

    doc = state_document(report, 0.0)
    events = [json.loads(line) for line in report.event_lines]
    return render(doc, verbose=verbose, color=color, width=width, events=events, live=False)


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
        from hetpatrol.node_view import terminal_width, use_color

        text = format_table(
            report,
            verbose=args.verbose,
            color=use_color(sys.stdout, args.color),
            width=terminal_width(sys.stdout),
        )
    write_stdout(text)  # a reader gone (`| head`) leaves the exit code the verdict's
    return report.exit_code


def cmd_baseline(args: argparse.Namespace) -> int:
    """Record this node's driver and firmware versions per card type as a baseline."""
    from hetpatrol.baseline_command import write_baseline

    report = _one_patrol(args)
    try:
        return write_baseline(report, args.write, sys.stdout, sys.stderr, force=args.force)
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
    if args.effective:
        from hetpatrol.config import effective_settings
        from hetpatrol.node_view import printable

        rows = [
            (k, json.dumps(v, ensure_ascii=False), w) for k, v, w in effective_settings(args.path)
        ]
        width = min(72, max((len(k) + len(v) + 2 for k, v, _ in rows), default=0))
        write_stdout(
            "".join(printable(f"{f'{k}: {v}':<{width}}  # {w}") + "\n" for k, v, w in rows)
        )
        return 0
    installed = discover()
    unknown = [c.name for c in config.collectors if c.enabled and c.name not in installed]
    if unknown:  # the daemon would report them failed, patrol after patrol
        from hetpatrol.config import did_you_mean
        from hetpatrol.yaml_document import format_key_path, key_text

        raise ConfigError(
            f"no collector plugin named '{key_text(unknown[0])}' is installed"
            f"{did_you_mean(unknown[0], sorted(installed))} "
            f"(installed: {', '.join(sorted(installed)) or 'none'})",
            path=config.source,
            line=config.key_lines.get(("collectors", unknown[0])),
            key=format_key_path(("collectors", unknown[0])),
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


def _cmd_prolog(args: argparse.Namespace) -> int:
    from hetpatrol.slurm.jobguard import cli_main

    return cli_main(args.args)


def _cmd_task_prolog(args: argparse.Namespace) -> int:
    from hetpatrol.slurm.task_prolog import cli_main

    return cli_main(args.args)


def _epilog_patrol(args: argparse.Namespace):
    """The epilog's one patrol: the command's config and replay, collectors closed after;
    with the config's ``missing_patrols``."""
    import functools

    from hetpatrol.slurm.epilog import EpilogPatrol

    # read when the patrol runs, not before (no state file: nothing to check, no config)
    config = functools.cache(lambda: _load(args))

    def patrol() -> PatrolReport:
        patroller = Patroller(config(), replay_dir=args.replay)
        try:
            return patroller.run()
        finally:
            patroller.close()

    return EpilogPatrol(patrol, lambda: config().missing_patrols)


def _gres_conf_patrol(args: argparse.Namespace) -> tuple[PatrolReport, Config]:
    """gres-conf's one patrol and the config it ran with (collectors closed after)."""
    config = _load(args)
    patroller = Patroller(config, replay_dir=args.replay)
    try:
        return patroller.run(), config
    finally:
        patroller.close()


EX_USAGE = 64
EX_CANTCREAT = 73


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 64 (EX_USAGE): never 2, which Nagios reads as CRITICAL."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


class _PartialParser(_Parser):
    """The parser of ``run`` alone: a usage error of the top level is raised, not
    printed, so that :func:`main` says it with every command in the usage line."""

    def error(self, message: str) -> NoReturn:
        raise _PartialUsage(message)


class _PartialUsage(Exception):
    pass


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


class ParagraphHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, the description wrapped paragraph by paragraph (blank lines
    kept) to the help's width (``COLUMNS``, else the terminal's, as argparse has it)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = text.strip("\n").split("\n\n")
        fill = super()._fill_text
        return "\n\n".join([fill(p, width, indent) for p in paragraphs])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser. ``only="run"``: the daemon's subcommand alone (the other
    subcommands' modules are then never imported: they would stay in its memory)."""
    parser = (_PartialParser if only else _Parser)(
        prog="hetpatrol",
        description=plain_help(__doc__),
        formatter_class=ParagraphHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"hetpatrol {__version__}")
    _add_log_options(parser, None)
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, title="commands", metavar="COMMAND"
    )

    p = sub.add_parser(
        "run",
        help="the daemon: patrol forever; /metrics, JSONL, state file (systemd service)",
        description="The node daemon: patrols on a fixed schedule, serves /metrics, appends "
        "the JSONL log and writes the state file. SIGHUP reloads the config (a bad one is "
        "refused and the running one kept); SIGTERM finishes the patrol and exits 0. Exit 78 "
        "on a bad config, 1 when the address is taken or another daemon holds the same files.",
    )
    _add_common(p)
    p.add_argument(
        "--listen",
        type=_listen,
        default=None,
        metavar="ADDR:PORT",
        help="metrics address (overrides the config)",
    )
    p.add_argument(
        "--jsonl-path", type=Path, default=None, metavar="P", help="JSONL patrol log (overrides)"
    )
    p.add_argument(
        "--state-path", type=Path, default=None, metavar="P", help="state file (overrides)"
    )
    p.add_argument(
        "--textfile-path",
        type=_prom_path,
        default=None,
        metavar="P",
        help="also write the metrics to P (*.prom) for node_exporter's textfile collector",
    )
    p.add_argument(
        "--interval",
        type=_interval,
        default=None,
        metavar="S",
        help="seconds between patrol starts, in (0, 86400] (overrides the config)",
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "once",
        help="one patrol, printed; exit 0/1/2/3 = ok/warning/critical/unknown",
        description="One patrol of this node's cards, printed as the node view (a table per "
        "vendor and card type, findings under each card), JSON or the JSONL lines the daemon "
        "would write. Exit 0 ok, 1 warning, 2 critical, 3 unknown.",
    )
    _add_common(p)
    p.add_argument(
        "--format",
        choices=("table", "json", "jsonl"),
        default="table",
        help="table for a person (default); json: {patrol, cards, events}; "
        "jsonl: the lines the JSONL sink writes",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="table: also show info findings")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="table colours; auto: on a terminal unless NO_COLOR is set",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="FILE",
        help="baseline file to check against (overrides the config's baseline_file)",
    )
    p.set_defaults(func=cmd_once)

    p = sub.add_parser(
        "baseline",
        help="record the driver/firmware versions per card type as a baseline file",
        description="This node's driver and firmware versions per card type, from one patrol, "
        "as a baseline file for the drift check (baseline_file in the config). Exit 0; 3 when "
        "a card or collector could not be read (nothing written unless --force); 73 when the "
        "--write PATH cannot be written.",
    )
    _add_common(p)
    p.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the baseline file here (atomically); default: print it",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="write the baseline even when some cards or collectors could not be read",
    )
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser(
        "schema",
        help="print the JSON Schema of the JSONL lines",
        description="Print the JSON Schema (draft 2020-12) that every line of the daemon's "
        "JSONL log and of 'once --format jsonl' follows, and exit 0: one of a card line "
        "(kind card, schema hetpatrol.card/1), a patrol line (hetpatrol.patrol/1) or an "
        "event line (hetpatrol.event/1). Fields may be added, none renamed (docs/record.md).",
    )
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser(
        "validate-config",
        help="check a config file (exit 78 when bad)",
        description="Check a config file as the daemon will use it: laid over the bundled "
        "config key by key, each value checked against the schema and its bounds, each "
        "collector named installed. Exit 0, or 78 naming the file, line and key. "
        "--effective prints every setting with the file and line it came from.",
    )
    p.add_argument("path", type=Path, help="the YAML config file to check")
    p.add_argument(
        "--effective",
        action="store_true",
        help="print every setting as it will be used (laid over the bundled config), "
        "with the file and line it came from, or 'bundled'",
    )
    p.set_defaults(func=cmd_validate_config)
    if only == "run":
        for command in sub.choices.values():
            _add_log_options(command, argparse.SUPPRESS)
        return parser
    _add_other_commands(sub)
    for command in sub.choices.values():
        _add_log_options(command, argparse.SUPPRESS)
    return parser


def _add_other_commands(sub: Any) -> None:
    """The subcommands whose modules the daemon does not need."""
    from hetpatrol.cluster.audit_view import add_audit_parser
    from hetpatrol.cluster.fleet_view import add_fleet_parser
    from hetpatrol.doctor import add_doctor_parser
    from hetpatrol.healthcheck import add_check_parser
    from hetpatrol.slurm.epilog import add_epilog_parser
    from hetpatrol.status_view import add_status_parser

    add_check_parser(sub)

    add_status_parser(sub)
    from hetpatrol.ledger.command import add_ledger_parser  # the ledger: see its module

    add_ledger_parser(sub)
    # Slurm's Prolog and Epilog (hetpatrol/slurm/jobguard.py, epilog.py)
    p = sub.add_parser(
        "prolog",
        help="Slurm Prolog: refuse a job whose cards need a drain action (see docs/actions.md)",
        add_help=False,
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="hetpatrol prolog --help")
    p.set_defaults(func=_cmd_prolog)
    p = sub.add_parser(
        "task-prolog",
        help="run by the TaskProlog gres-conf writes: the vendors' device variables "
        "from the job's GRES indices (see docs/slurm.md)",
        add_help=False,
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="hetpatrol task-prolog --help")
    p.set_defaults(func=_cmd_task_prolog)
    add_epilog_parser(sub, _epilog_patrol)
    # the cluster-wide commands (hetpatrol/cluster/)
    add_fleet_parser(sub)
    add_audit_parser(sub)
    add_doctor_parser(sub)
    # this node's gres.conf lines from its own patrol (hetpatrol/slurm/gres_conf.py)
    from hetpatrol.slurm.gres_conf import add_gres_conf_parser

    add_gres_conf_parser(sub, _gres_conf_patrol, _add_common)
    # the reboot-survival history (hetpatrol/history_command.py)
    from hetpatrol.history_command import add_history_parser

    add_history_parser(sub)


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    # `run` (and `run --help`) parse with the daemon's subcommand alone
    first = next((a for a in args_in if not a.startswith("-")), None)
    before = args_in[: args_in.index(first)] if first else []
    only = "run" if first == "run" and not {"-h", "--help"} & set(before) else None
    try:
        args = build_parser(only=only).parse_args(args_in)
    except _PartialUsage:  # the same usage error, said with every command
        args = build_parser().parse_args(args_in)
    level = args.log_level or ("info" if args.command == "run" else "warning")
    setup_logging(args.log_format, level)
    try:
        code = int(args.func(args))
        write_stdout("")  # flush now: a reader gone (`| head`) keeps the command's code
        return code
    except BrokenPipeError:  # an OSError: must come first; stdout's reader has gone
        silence_stdout()
        return 0
    except ConfigError as exc:  # every error said, in the file's line order (bounded)
        print(exc.said(), file=sys.stderr)
        return EX_CONFIG
    except ValueError as exc:  # a replay scenario that cannot be read
        print(f"hetpatrol: {exc}", file=sys.stderr)
        return EX_CONFIG
    except UnsafePath as exc:  # a symlink or another user's directory at an output path
        print(f"hetpatrol: {exc}", file=sys.stderr)
        return EX_CANTCREAT
    except OSError as exc:  # e.g. the metrics port is taken, another daemon's log
        # the message itself, not "[Errno 98] ..."; a bare errno keeps its system text
        text = exc.strerror if exc.strerror and exc.filename is None else str(exc)
        print(f"hetpatrol: {text}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
