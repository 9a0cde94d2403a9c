"""``hetpatrol status``: this node at a glance, from the running daemon's state file.

Reads only the state file (:func:`hetpatrol.healthcheck.read_trusted_state`, as
``check`` does: one that root, the daemon's user or the reader owns and alone can write):
no vendor tool, no daemon round trip, so it answers at once even while ``npu-smi`` hangs. The
view is :mod:`hetpatrol.node_view`'s, the same as ``hetpatrol once``'s, with how old
the verdict is. Health is coloured on a terminal (ANSI), plain when piped or when
``NO_COLOR`` is set; ``--json`` prints the state document with ``age_seconds`` and
``stale`` added, for scripts.

Exit code: the verdict's (0 ok, 1 warning, 2 critical, 3 unknown); 3 as well when the
verdict is stale, the daemon was stopped (the state file's ``stopped`` mark: the view
says when and by which signal, and that the verdict is from then) or the state file
cannot be read.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from hetpatrol.healthcheck import (
    UntrustedStateFile,
    read_trusted_state,
    stopped_mark,
    verdict_age,
    verdict_code,
)
from hetpatrol.node_view import render, terminal_width, use_color
from hetpatrol.output import write_stdout

EXIT_UNKNOWN = 3


def _state_path(args: argparse.Namespace) -> Path | None:
    if args.state_path is not None:
        return args.state_path
    from hetpatrol.config import load_config

    return load_config(args.config).state_path


def cmd_status(args: argparse.Namespace) -> int:
    path = _state_path(args)
    if path is None:
        print("hetpatrol status: no state_path in the config; use --state-path", file=sys.stderr)
        return EXIT_UNKNOWN
    try:
        doc = read_trusted_state(path)
    except UntrustedStateFile as exc:  # someone else's word: not shown as the verdict
        print(f"hetpatrol status: untrusted state file {path}: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN
    except ValueError as exc:  # not JSON, nested too deep, too large, not a state file
        print(f"hetpatrol status: the state file {path} is damaged: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN
    except OSError as exc:
        print(
            f"hetpatrol status: cannot read the state file {path}: {exc}\n"
            "  (is `hetpatrol run` running with this config? see `systemctl status hetpatrol`)",
            file=sys.stderr,
        )
        return EXIT_UNKNOWN
    try:
        age, stale = verdict_age(doc)  # the same test as `hetpatrol check`
        if args.json:
            out = dict(doc)
            age_seconds = round(age, 3) if math.isfinite(age) else None
            out.update(state_path=str(path), age_seconds=age_seconds, stale=stale)
            text = json.dumps(out, indent=2) + "\n"
        else:
            text = render(
                doc,
                color=use_color(sys.stdout, args.color),
                source=str(path),
                verbose=args.verbose,
                width=terminal_width(sys.stdout),
            )
    except Exception as exc:  # noqa: BLE001 - a damaged state file is UNKNOWN, no traceback
        print(
            f"hetpatrol status: the state file {path} is damaged: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return EXIT_UNKNOWN
    write_stdout(text)  # a reader gone (`| head`) keeps the exit code below
    if stale or stopped_mark(doc) is not None:  # as `check`: nothing watches the cards
        return EXIT_UNKNOWN
    code = verdict_code(doc)  # the same verdict as `hetpatrol check`
    if code is None:
        print(f"hetpatrol status: the state file {path} has no valid verdict", file=sys.stderr)
        return EXIT_UNKNOWN
    return code


def add_status_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``status`` on the CLI's subparsers."""
    p = sub.add_parser(
        "status",
        help="this node at a glance, from the daemon's state file (exit 0/1/2/3)",
        description=(
            "This node at a glance, from the running daemon's state file (no vendor tool is "
            "run): a table per vendor and card type, findings and processes under each card, "
            "the collectors, how old the verdict is. Exit: the verdict's 0 ok, 1 warning, 2 "
            "critical, 3 unknown; 3 when the verdict is stale, the daemon was stopped or the file "
            "unreadable."
        ),
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="config file whose state_path to read (default: the bundled config)",
    )
    p.add_argument(
        "--state-path",
        type=Path,
        default=None,
        metavar="P",
        help="state file (overrides the config)",
    )
    p.add_argument("--json", action="store_true", help="the state document as JSON, for scripts")
    p.add_argument(
        "-v", "--verbose", action="store_true", help="also show info findings (hidden otherwise)"
    )
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="auto: on a terminal unless NO_COLOR is set",
    )
    p.set_defaults(func=cmd_status)
    return p
