"""``hetpatrol check``: the Slurm ``HealthCheckProgram`` (and Nagios plugin) mode.

Answers at once from the running daemon's last verdict, the state file that
:mod:`hetpatrol.exporters.state` writes atomically after every patrol. It reads that one
file and nothing else: no vendor tool, no patrol, and never ``scontrol`` (slurmd runs
the health check as root, also before it has registered with slurmctld, and kills it
after ``HealthCheckTimeout``, 60 s before Slurm 26.05).

Prints one line and exits with the Nagios code of the verdict: 0 ok, 1 warning,
2 critical, 3 unknown. A missing, unreadable or stale state file is 3 with the reason;
so is the state file of a daemon stopped cleanly (``stopped``, its time and signal, with
the last verdict), at once.
A verdict is stale when it is older than ``--max-age`` seconds (default: 3 patrol
intervals + 10 s, the interval read from the state file).
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Mapping

from hetpatrol.exporters.state import STATE_SCHEMA, boot_clock, read_state
from hetpatrol.output import silence_stdout, write_stdout
from hetpatrol.path_walk import MAX_SYMLINKS, resolve_checked  # noqa: F401 - kept here
from hetpatrol.verdict import EXIT_CODES

# typing and argparse are imported only where needed: `check --state-path` is started by
# slurmd on every node at every health interval, and they are ~40 % of its imports
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from pathlib import Path
    from typing import Any

EXIT_UNKNOWN = 3
STATE_WORDS = {0: "OK", 1: "WARNING", 2: "CRITICAL", 3: "UNKNOWN"}
STALE_INTERVALS = 3
STALE_GRACE_SECONDS = 10.0
#: bad cards named in the line before "+N more"
NAMED_CARDS = 4


#: the longest patrol interval a config may set (``interval_seconds``, 1 day): a state
#: file that says more was not written by a daemon and cannot keep a verdict fresh
MAX_INTERVAL_SECONDS = 86400.0


def default_max_age(doc: Mapping[str, Any]) -> float:
    """3 patrol intervals + 10 s, with the interval the daemon wrote in its state; NaN
    (then :data:`DEFAULT_MAX_AGE_SECONDS`) when that interval is not one a daemon can run
    (not a number, not above 0, above :data:`MAX_INTERVAL_SECONDS`)."""
    value = doc.get("interval_seconds")
    if value is None:
        return STALE_INTERVALS * 10.0 + STALE_GRACE_SECONDS
    try:
        interval = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError, OverflowError):
        return math.nan
    if not 0 < interval <= MAX_INTERVAL_SECONDS:  # also nan and inf
        return math.nan
    return STALE_INTERVALS * interval + STALE_GRACE_SECONDS


def _card_name(card: Mapping[str, Any]) -> str:
    name = f"{card.get('vendor')}/{card.get('index')}"
    return name + (f"/{card['chip']}" if card.get("chip") is not None else "")


def summarize(doc: Mapping[str, Any], age: float) -> str:
    """The text after ``HETPATROL <STATE> - `` for a fresh verdict."""
    cards = [c for c in doc.get("cards") or [] if isinstance(c, Mapping)]
    bad = [c for c in cards if c.get("health") not in ("ok", None)]
    counts: dict[str, int] = {}
    for c in cards:
        counts[str(c.get("health"))] = counts.get(str(c.get("health")), 0) + 1
    parts = [", ".join(f"{n} {h}" for h, n in sorted(counts.items())) or "no cards"]
    named = []
    for f in doc.get("findings") or []:
        if isinstance(f, Mapping) and f.get("severity") not in ("ok", "info"):
            named.append(f"node {f.get('check')}: {f.get('message')}")
    rank = {"critical": 0, "unknown": 1, "warning": 2}
    for c in sorted(bad, key=lambda c: rank.get(str(c.get("health")), 3)):
        # only the checks at the card's own health (its worst severity): an info or a
        # warning check beside a critical one is not what makes the card critical
        found = [f for f in c.get("findings") or [] if isinstance(f, Mapping)]
        checks = list(
            dict.fromkeys(
                str(f.get("check")) for f in found if f.get("severity") == c.get("health")
            )
        )
        named.append(f"{_card_name(c)} {c.get('health')} {'+'.join(checks) or '?'}")
    if named:
        more = f", +{len(named) - NAMED_CARDS} more" if len(named) > NAMED_CARDS else ""
        parts.append("; ".join(named[:NAMED_CARDS]) + more)
    return f"{doc.get('node')}: {'; '.join(parts)} (patrol {doc.get('seq')}, {age:.0f} s ago)"


#: A patrol time this far in the future is refused (a clock step, a forged file).
CLOCK_SLACK_SECONDS = 300
#: Staleness limit used when the state file's interval is unusable.
DEFAULT_MAX_AGE_SECONDS = 60.0


def verdict_code(doc: Mapping[str, Any]) -> int | None:
    """The exit code (0-3) of the state's ``health`` word; None when there is no such
    word, or when ``exit_code`` is there but no valid code (a bool, out of 0-3): a
    damaged file. The word wins over a valid but different ``exit_code``."""
    health = doc.get("health")
    code = EXIT_CODES.get(health) if isinstance(health, str) else None
    copied = doc.get("exit_code", code)
    if code is None or isinstance(copied, bool) or not isinstance(copied, int):
        return None
    return code if 0 <= copied <= 3 else None


def patrol_time(doc: Mapping[str, Any], now: float) -> float | None:
    """The state's ``finished`` (s since the epoch) when usable: a finite number, not
    more than :data:`CLOCK_SLACK_SECONDS` after ``now``; else None (not to be trusted)."""
    value = doc.get("finished")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        finished = float(value)
    except ValueError:
        return None
    if not math.isfinite(finished) or finished > now + CLOCK_SLACK_SECONDS:
        return None
    return finished


def stale_limit(doc: Mapping[str, Any], max_age: float | None = None) -> float:
    """Seconds after which the verdict is stale: ``max_age``, else
    :func:`default_max_age`; :data:`DEFAULT_MAX_AGE_SECONDS` when that is not finite."""
    try:
        limit = default_max_age(doc) if max_age is None else float(max_age)
    except (TypeError, ValueError, OverflowError):
        limit = float("nan")
    return limit if math.isfinite(limit) else DEFAULT_MAX_AGE_SECONDS


def boot_age(doc: Mapping[str, Any], boot: tuple[str, float] | None) -> float | None:
    """Seconds since the patrol on this boot's clock (``finished_boot`` of a document
    written in the boot ``boot`` names: (boot id, ``CLOCK_BOOTTIME`` seconds now)), or
    None when the document was written in another boot, has no such time, or one after
    ``boot``'s (not to be trusted)."""
    if boot is None or doc.get("boot_id") != boot[0]:
        return None
    finished = doc.get("finished")
    if isinstance(finished, bool) or not isinstance(finished, (int, float)):
        return None
    if not math.isfinite(finished):
        return None  # no patrol time at all: a damaged file, whatever else it says
    value = doc.get("finished_boot")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value > boot[1] + 1.0:
        return None
    return max(0.0, boot[1] - float(value))


def verdict_age(
    doc: Mapping[str, Any],
    now: float | None = None,
    max_age: float | None = None,
    *,
    boot: tuple[str, float] | None = None,
) -> tuple[float, bool]:
    """(age in seconds, stale?) of a state document, for ``check`` and ``status`` alike.

    The age is read on this boot's clock when the document was written in this boot
    (:func:`boot_age`; ``boot``: (boot id, ``CLOCK_BOOTTIME`` seconds), read here when
    ``now`` is not given): a step of the wall clock (+2 h, -3 h) neither makes a fresh
    verdict stale nor a stale one fresh. Else the wall clock: a missing, non-finite or
    future (see :func:`patrol_time`) patrol time gives ``(nan, True)``: stale,
    whatever the interval says.
    """
    if now is None and boot is None:
        boot = boot_clock()
    on_boot = boot_age(doc, boot)
    if on_boot is not None:
        return on_boot, on_boot > stale_limit(doc, max_age)
    now = time.time() if now is None else now
    finished = patrol_time(doc, now)
    if finished is None:
        return math.nan, True
    age = max(0.0, now - finished)
    return age, age > stale_limit(doc, max_age)


#: the stop reasons a daemon writes are signal names (``SIGTERM``) or these words
_REASON_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 _-")


def stopped_mark(doc: Mapping[str, Any]) -> tuple[float, str] | None:
    """(when in s since the epoch, why: ``SIGTERM``) of the clean stop the daemon wrote
    into its state file (``stopped``, :func:`hetpatrol.exporters.state.mark_stopped`);
    None when there is none, or none a daemon writes (not a mapping, no finite ``at``:
    the verdict is then judged as if it had no mark). A reason that is not a short
    word is shown as ``?``."""
    mark = doc.get("stopped")
    if not isinstance(mark, Mapping):
        return None
    at = mark.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return None
    reason = mark.get("reason")
    ok = isinstance(reason, str) and 0 < len(reason) <= 40 and set(reason) <= _REASON_CHARS
    return float(at), reason if ok else "?"


def utc_text(seconds: float) -> str:
    """``2026-12-01T22:40:05Z`` of a time in s since the epoch."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
    except (OverflowError, ValueError, OSError):
        return repr(seconds)


#: The packaged daemon's user (``User=hetpatrol`` in systemd/hetpatrol.service, made by
#: systemd/hetpatrol.sysusers and the Debian package): besides root and the reader itself,
#: the one owner a state file may have.
DAEMON_USER = "hetpatrol"


class UntrustedStateFile(ValueError):
    """A state file that hetpatrol may not believe: owned by, writable by, or reached
    through (a symlink, a directory) someone other than root, the daemon's user
    (:data:`DAEMON_USER`) and the reader. Its text says who and where."""


def trusted_uids() -> frozenset[int]:
    """The owners a state file, its directories and symlinks may have: root, this
    process's effective user, and :data:`DAEMON_USER` when that user exists."""
    uids = {0, os.geteuid()}
    import pwd  # a builtin module: no file is read until the lookup

    try:
        uids.add(pwd.getpwnam(DAEMON_USER).pw_uid)
    except KeyError:
        pass
    return frozenset(uids)


def _refuse_writable(where: str, st: os.stat_result, trusted: frozenset[int]) -> None:
    if st.st_uid not in trusted:
        raise UntrustedStateFile(f"{where} is owned by uid {st.st_uid}, not root or the daemon's")
    # a sticky directory (/tmp) lets no one but an entry's owner rename or remove it
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky:
        who = "everyone" if st.st_mode & stat.S_IWOTH else f"group {st.st_gid}"
        raise UntrustedStateFile(f"{where} is writable by {who} (mode {st.st_mode & 0o7777:o})")


def resolve_trusted(path: str | os.PathLike[str], trusted: frozenset[int]) -> str:
    """``path`` resolved component by component, each directory on the way and each
    symlink followed checked: owned by a ``trusted`` uid, and (directories) not writable
    by group or others unless sticky. Returns the real path of the last component (not
    itself checked: the caller opens it with ``O_NOFOLLOW`` and checks what it opened).
    Raises :class:`UntrustedStateFile`, or OSError (a missing component, a loop)."""

    def on_link(here: str, st: os.stat_result) -> None:
        if st.st_uid not in trusted:
            raise UntrustedStateFile(f"{here} is a symlink owned by uid {st.st_uid}")

    return resolve_checked(path, on_link, lambda here, st: _refuse_writable(here, st, trusted))


def read_trusted_state(path: str | os.PathLike[str], accept: str = STATE_SCHEMA) -> dict[str, Any]:
    """:func:`~hetpatrol.exporters.state.read_state` of a state file hetpatrol may believe:
    reached only through trusted directories and symlinks (:func:`resolve_trusted`), and
    the file opened (not followed) owned by root, :data:`DAEMON_USER` or the reader, not
    writable by group or others. Raises :class:`UntrustedStateFile` (a ValueError: why,
    with the uid or mode), else as ``read_state``."""
    trusted = trusted_uids()
    real = resolve_trusted(path, trusted)

    def verify(st: os.stat_result) -> None:
        _refuse_writable(f"state file {real}", st, trusted)

    return read_state(real, accept, verify=verify)  # type: ignore[arg-type]


def check(
    state_path: str | Path, max_age: float | None = None, now: float | None = None
) -> tuple[int, str]:
    """(exit code, one line) for the state file at ``state_path``. Never raises."""
    try:
        return _check(state_path, max_age, now)
    except Exception as exc:  # noqa: BLE001 - a damaged file is UNKNOWN, never a traceback
        return EXIT_UNKNOWN, (
            f"HETPATROL UNKNOWN - cannot use state file {state_path}: {type(exc).__name__}"
        )


def _check(
    state_path: str | Path, max_age: float | None = None, now: float | None = None
) -> tuple[int, str]:
    boot = boot_clock() if now is None else None  # a given `now` is a test's clock
    now = time.time() if now is None else now
    try:
        doc = read_trusted_state(state_path)
    except FileNotFoundError:
        return EXIT_UNKNOWN, (
            f"HETPATROL UNKNOWN - no state file {state_path}: is the hetpatrol daemon running?"
        )
    except UntrustedStateFile as exc:
        return EXIT_UNKNOWN, f"HETPATROL UNKNOWN - untrusted state file {state_path}: {exc}"
    except (OSError, ValueError) as exc:  # unreadable, not JSON, not a state file
        reason = getattr(exc, "strerror", None) or str(exc)
        return EXIT_UNKNOWN, f"HETPATROL UNKNOWN - cannot read state file {state_path}: {reason}"
    try:
        float(doc["finished"])
    except (KeyError, TypeError, ValueError):
        return EXIT_UNKNOWN, f"HETPATROL UNKNOWN - state file {state_path} has no verdict"
    code = verdict_code(doc)  # the verdict itself, not a copied number
    if code is None:
        return EXIT_UNKNOWN, f"HETPATROL UNKNOWN - state file {state_path} has no verdict"
    age, stale = verdict_age(doc, now, max_age, boot=boot)
    if not math.isfinite(age):
        return EXIT_UNKNOWN, (
            f"HETPATROL UNKNOWN - state file {state_path} has an impossible patrol time "
            f"({doc['finished']!r}); is the clock right?"
        )
    stopped = stopped_mark(doc)
    if stopped is not None:
        # nothing watches the cards any more: UNKNOWN at once, not the verdict until it
        # goes stale (Slurm drains nothing for it, docs/slurm.md), saying who stopped
        # it and what the last patrol said
        at, reason = stopped
        return EXIT_UNKNOWN, (
            f"HETPATROL UNKNOWN - the hetpatrol daemon was stopped at {utc_text(at)} "
            f"({reason}); its last verdict, {STATE_WORDS[code]}: {summarize(doc, age)}"
        )
    if stale:
        limit = stale_limit(doc, max_age)
        return EXIT_UNKNOWN, (
            f"HETPATROL UNKNOWN - stale verdict: last patrol {age:.0f} s ago (max {limit:.0f} s), "
            f"it said {STATE_WORDS[code]}; is the hetpatrol daemon running?"
        )
    return code, f"HETPATROL {STATE_WORDS[code]} - {summarize(doc, age)}"


def cmd_check(args: argparse.Namespace) -> int:
    state_path = args.state_path
    if state_path is None:
        from hetpatrol.config import ConfigError, load_config

        try:
            state_path = load_config(args.config).state_path
        except ConfigError as exc:
            # one line (a monitoring plugin's verdict): validate-config says them all
            print(f"HETPATROL UNKNOWN - configuration error: {exc.summary()}")
            return EXIT_UNKNOWN
        if state_path is None:
            print("HETPATROL UNKNOWN - the configuration sets no state_path")
            return EXIT_UNKNOWN
    code, line = check(state_path, args.max_age)
    write_stdout(line.replace("\n", " ") + "\n")  # a reader gone keeps the exit code
    return code


def run_check(state_path: str, max_age: str | None) -> int | None:
    """``check --state-path P [--max-age S]`` without the CLI's parser (see
    :mod:`hetpatrol.entry`): prints the line, returns its exit code; None when
    ``max_age`` is not a valid ``--max-age`` (the full parser then reports the usage
    error) or the path is empty."""
    age = None if max_age is None else _seconds(max_age)
    if max_age is not None and age is None:
        return None
    if not state_path:
        return None
    code, line = check(state_path, age)
    try:
        write_stdout(line.replace("\n", " ") + "\n")
        write_stdout("")
    except BrokenPipeError:  # the reader has gone: the verdict's code all the same
        silence_stdout()
    return code


def _seconds(text: str) -> float | None:
    """A positive number of seconds below 10**9, else None (also nan and inf)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < 10**9 else None


def _positive(text: str) -> float:
    """``--max-age``'s argparse type."""
    value = _seconds(text)
    if value is None:
        import argparse

        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def add_check_parser(sub: Any) -> None:
    """Register ``hetpatrol check`` on the CLI's subparsers."""
    from pathlib import Path

    p = sub.add_parser(
        "check",
        help="Slurm HealthCheckProgram / Nagios: the daemon's last verdict, exit 0/1/2/3",
        description=(
            "Slurm's HealthCheckProgram (and a Nagios plugin): one line from the running "
            "daemon's last verdict (its state file), at once: no vendor tool, never scontrol."
            " Exit 0 ok, 1 warning, 2 critical, 3 unknown; 3 when the state file is missing, "
            "unreadable or older than --max-age (default: 3 patrol intervals + 10 s), and when "
            "the daemon was stopped (the file's stop mark: when, by which signal)."
        ),
    )
    p.add_argument(
        "--state-path",
        type=Path,
        default=None,
        metavar="P",
        help="state file written by the daemon (default: state_path of the config)",
    )
    p.add_argument(
        "--config", type=Path, default=None, help="config file naming state_path (default: bundled)"
    )
    p.add_argument(
        "--max-age",
        type=_positive,
        default=None,
        metavar="S",
        help="a verdict older than S seconds is stale: exit 3 (default: 3 intervals + 10 s)",
    )
    p.set_defaults(func=cmd_check)
