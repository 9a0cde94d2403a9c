"""``hetpatrol history``: the reboot-survival history of this node's cards.

``hetpatrol history show`` prints it (``--json`` for scripts); ``hetpatrol history clear
--card <UUID | serial | bus id>`` forgets one card (after a replacement, or once an
operator has judged the fault) and appends an audit line to the JSONL log: ``kind:
event``, ``event: history_clear``, the card as given, the identities cleared, their
history before, the operator (uid and user name). See :mod:`hetpatrol.actions.
reboot_history` for the rule and :mod:`hetpatrol.exporters.history_file` for the file.
Exit: 0 done, 1 no such card in the history (nothing written), 64 no log known to be
that state directory's daemon's (nothing cleared: see :func:`audit_log_path`), 73 the JSONL
log refused (a symlink, another user's file: nothing cleared), 78 a bad config.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
import time
from pathlib import Path
from typing import Any

from hetpatrol.config import load_config
from hetpatrol.exporters.history_file import history_path, locked, read_history, write_history
from hetpatrol.node_view import printable
from hetpatrol.output import write_stdout
from hetpatrol.safe_files import UnsafePath, open_for_append
from hetpatrol.schema import EVENT_SCHEMA, rfc3339

EX_USAGE = 64
#: sysexits.h: a temporary failure, the same command may work later
EX_TEMPFAIL = 75
#: a file that may not be written (sysexits.h EX_CANTCREAT), as the CLI's other writers
EX_CANTCREAT = 73


def add_history_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``history`` (``show``, ``clear``) on the CLI's subparsers."""
    p = sub.add_parser(
        "history",
        help="the reboot-survival history of this node's cards (show, clear a card)",
        description=(
            "The boots in which each card's critical fault families were seen (a fault "
            "back after actions.reboot_survival.reboots reboots makes the card "
            "replace_card). 'clear --card' forgets a card and writes an audit line to the "
            "JSONL log."
        ),
    )
    _add_common(p, None)
    # the same options after the subcommand too (``history show --state-path P``): a parent
    # whose defaults are SUPPRESS, so that a subcommand given none keeps those given before it
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, argparse.SUPPRESS)
    hs = p.add_subparsers(dest="history_command", required=True)
    show = hs.add_parser(
        "show",
        help="print the history",
        description="Print each card identity's fault families and the boots they were "
        "seen in (reboot-history.json beside the state file). --json: the document. Exit 0.",
        parents=[common],
    )
    show.add_argument("--json", action="store_true", help="the history document as JSON")
    clear = hs.add_parser(
        "clear",
        help="forget one card's history (audit line in the log)",
        description="Forget one card's reboot-survival history (after a replacement, or once "
        "the fault is judged) and append an audit line (event history_clear) to the JSONL "
        "log of the daemon whose state it is. Exit 0 done, 1 no such card, 64 no log known "
        "to be that daemon's, 73 the log refused, 75 the history lock held (nothing "
        "cleared).",
        parents=[common],
    )
    clear.add_argument(
        "--card", required=True, metavar="ID", help="the card's UUID, serial or PCI bus id"
    )
    p.set_defaults(func=_cmd_history)
    return p


def _add_common(p: argparse.ArgumentParser, default: Any) -> None:
    """``--config``, ``--state-path``, ``--jsonl-path`` on ``p`` with ``default``."""
    p.add_argument("--config", type=Path, default=default, help="config file (default: bundled)")
    p.add_argument("--state-path", type=Path, default=default, metavar="P", help="state file")
    p.add_argument(
        "--jsonl-path",
        type=Path,
        default=default,
        metavar="P",
        help="the JSONL log of the daemon whose state this is (takes the clear's audit line)",
    )


def _cmd_history(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    state_path = args.state_path or config.state_path
    if state_path is None:
        write_stdout("hetpatrol history: no state_path configured: no history is kept\n")
        return 1
    path = history_path(state_path)
    now = time.time()
    if args.history_command == "show":
        history = read_history(path, now, config.actions.reboot_survival)
        if args.json:
            write_stdout(json.dumps(history.to_dict(), indent=2) + "\n")
            return 0
        if not history.cards:
            write_stdout(f"no card in {path}\n")
        for identity, families in sorted(history.cards.items()):
            for family, entry in sorted(families.items()):
                write_stdout(
                    f"{printable(identity)}  {printable(family)}  seen in "
                    f"{len(entry['boots'])} boot(s), last {rfc3339(entry['last'])}\n"
                )
        return 0
    try:
        log_path = audit_log_path(args.jsonl_path, args.state_path, config.state_path, config)
    except ValueError as e:
        print(f"hetpatrol history clear: {e}; nothing cleared", file=sys.stderr)
        return EX_USAGE
    # the log that takes the audit line is opened first: a clear it cannot record is no
    # clear (raises UnsafePath / OSError before anything is forgotten)
    try:
        log_fd = open_log(log_path) if log_path is not None else None
    except UnsafePath as e:
        print(f"hetpatrol history clear: {e}; nothing cleared{_owner_hint(path)}", file=sys.stderr)
        return EX_CANTCREAT
    try:
        with locked(path):
            history = read_history(path, now, config.actions.reboot_survival)
            before = history.to_dict()["cards"]
            cleared = history.clear(args.card)
            if not cleared:
                write_stdout(f"hetpatrol history: no card {printable(args.card)!s} in {path}\n")
                return 1
            write_history(path, history)
        node = daemon_node(state_path, config.node)
        line = audit_line(node, args.card, {i: before[i] for i in cleared}, now)
        if log_fd is not None:
            write_line(log_fd, line)
    except UnsafePath as e:
        print(f"hetpatrol history clear: {e}; nothing cleared{_owner_hint(path)}", file=sys.stderr)
        return EX_CANTCREAT
    except TimeoutError as e:  # the daemon (or another clear) stopped holding the lock
        print(
            f"hetpatrol history clear: the lock {printable(str(e.filename))} is {e.strerror}; "
            "nothing cleared (is a hetpatrol process stopped? try again)",
            file=sys.stderr,
        )
        return EX_TEMPFAIL
    finally:
        if log_fd is not None:
            os.close(log_fd)
    write_stdout(f"cleared {', '.join(printable(i) for i in cleared)} from {path}\n")
    return 0


def _owner_hint(path: Path) -> str:
    """What to do when the history's directory is another user's (the daemon's
    StateDirectory, ``hetpatrol``'s): root too is refused there (that user could point a
    name in it anywhere root writes), so the clear must run as that user. ``""`` when
    the directory is this user's or cannot be read."""
    try:
        uid = path.parent.stat().st_uid
    except OSError:
        return ""
    if uid == os.geteuid():
        return ""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return (
        f" (the directory is {printable(name)}'s, the daemon's user: run it as that user, "
        f"e.g. sudo -u {printable(name)} hetpatrol history clear ...)"
    )


def audit_log_path(
    jsonl_path: Path | None, state_path: Path | None, config_state: Path | None, config: Any
) -> Path | None:
    """The JSONL log that takes a clear's audit line: the log of the daemon whose state
    directory is changed, never another daemon's. ``jsonl_path`` (``--jsonl-path``) when
    given; else the config's ``jsonl.path`` when ``state_path`` (``--state-path``) is not
    given or names the config's own ``state_path`` (the config is that daemon's); None when
    that config keeps no log. A ``--state-path`` other than the config's (a daemon run with
    its own ``--state-path``) has no log known to be its own: ValueError, so that the line
    is never written into another daemon's log (``~/.local/state/hetpatrol/patrol.jsonl``
    of the bundled config) nor a file in the state directory nobody reads."""
    if jsonl_path is not None:
        return jsonl_path.expanduser()
    if state_path is None or _same_path(state_path, config_state):
        return config.jsonl_path
    where = f"config {printable(config.source)}"
    raise ValueError(
        f"--state-path {printable(str(state_path))} is not the state_path of {where} "
        f"({printable(str(config_state))}): its log is another daemon's; name the log of "
        "the daemon of that state directory with --jsonl-path (or its config with --config)"
    )


def daemon_node(state_path: Path, default: str) -> str:
    """The node name of the daemon whose state directory ``state_path`` is: the ``node``
    its state file holds (the daemon writes its own name there each patrol,
    :func:`hetpatrol.exporters.state.state_document`: its config's ``node``, or its
    ``--node``, or a replay scenario's), read as ``check`` reads it
    (:func:`hetpatrol.healthcheck.read_trusted_state`: a file of root, this user or the
    daemon's user only). ``default`` (this config's ``node``: the host name when the
    config names none) when the file is missing, refused, damaged, or holds no name a
    ``--node`` could be (not empty, no space or control character)."""
    from hetpatrol.healthcheck import read_trusted_state

    try:
        node = read_trusted_state(state_path.expanduser()).get("node")
    except (OSError, ValueError):
        return default
    if isinstance(node, str) and node and not any(c.isspace() or not c.isprintable() for c in node):
        return node
    return default


def _same_path(a: Path, b: Path | None) -> bool:
    """Whether ``a`` and ``b`` name the same file (``~`` expanded, made absolute, symlinks
    of the directories resolved; the files need not exist)."""
    if b is None:
        return False
    return a.expanduser().resolve() == b.expanduser().resolve()


def audit_line(node: str, card: str, cleared: dict[str, Any], now: float) -> dict[str, Any]:
    """The JSONL audit line of a clear: ``seq`` 0 (no patrol's), ``card`` as the
    operator gave it (printable), ``cleared`` identity -> its history before,
    ``operator`` {uid, user}."""
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = None
    return {
        "kind": "event",
        "schema": EVENT_SCHEMA,
        "ts": rfc3339(now),
        "node": node,
        "seq": 0,
        "event": "history_clear",
        "card": printable(card),
        "cleared": cleared,
        "operator": {"uid": uid, "user": user},
        "detail": f"reboot-survival history of {len(cleared)} card identity(ies) cleared",
    }


def open_log(path: Path) -> int:
    """The JSONL log opened for appending under :mod:`hetpatrol.safe_files`' rules (no
    symlink, no other user's file or directory; made 0600 when missing). Returns the
    fd; raises :class:`~hetpatrol.safe_files.UnsafePath` or OSError."""
    fd = open_for_append(path, 0o600)
    os.set_blocking(fd, True)
    return fd


def write_line(fd: int, line: dict[str, Any]) -> None:
    """Append ``line`` in one ``write`` (``O_APPEND``: whole beside the daemon's
    lines). Raises OSError."""
    os.write(fd, (json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n").encode())
