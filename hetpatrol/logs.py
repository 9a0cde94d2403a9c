"""hetpatrol's structured log: one event per line on stderr, standard library only.

Every module logs through :func:`get_logger`::

    log = get_logger("hetpatrol.daemon")
    log.warning("patrol_overran", seq=67, missed_slots=1, seconds=0.014)

An event is a name (``snake_case``, what happened) and keyword fields. :func:`configure`
(called by ``hetpatrol.cli`` from ``--log-format`` / ``--log-level``) picks the line
format, the lowest level written and the stream:

``console`` (the default), one ``key=value`` line::

    2026-12-01T09:59:58.433851Z [warning  ] patrol_overran                 missed_slots=1 ...

the ISO 8601 UTC time with microseconds and a ``Z``, the level in brackets padded to 9,
the event padded to 30, then the fields sorted by key (here ``missed_slots=1
seconds=0.014 seq=67``). A field's value is written as ``str`` when it is a string of
printable characters without a space, tab, ``=`` or quote, and as ``repr()`` otherwise
(so ``error='No such file'`` is quoted and a newline inside a value is written ``\\n``).
This is the line structlog's ``ConsoleRenderer(colors=False)`` wrote before this module
replaced it (issue 17), except that a string with any non-printable character is quoted
(an escape sequence from a vendor tool's output never reaches the terminal raw) and the
time always has its six digits of microseconds (structlog left them out at .000000).

``json``, one JSON object per line (for journald and log shippers)::

    {"timestamp": "2026-12-01T09:59:58.433851Z", "level": "warning",
     "event": "patrol_overran", "seq": 67, "missed_slots": 1, "seconds": 0.014}

(here folded; one line in the stream)

``timestamp``, ``level`` and ``event`` first, then the fields in call order; a value JSON
cannot encode is written as its ``str()`` (a float NaN or infinity as ``"nan"``,
``"inf"``, ``"-inf"``: JSON has no such numbers); non-ASCII is escaped (``\\uXXXX``). A field
named ``timestamp``, ``level`` or ``event`` is kept as ``field_<name>``.

Each line leaves in one ``write()`` of the whole line, newline included, under a lock
(several threads log: the patrol loop, the bounded collector threads, the HTTP server),
followed by a ``flush()`` (journald sees the line at once; a daemon killed between two
writes would otherwise leave half a line glued to the next daemon's). A line that cannot
be written (stderr closed, its reader gone: ``OSError``/``ValueError``; ``sys.stderr``
None when the process started with fd 2 closed) is counted in :data:`dropped_lines` and
never raises into the caller: a log line lost must not stop a patrol. Nor does a value:
one whose ``__repr__``/``__str__`` raises, or that nests too deep to render
(``RecursionError``), is written as ``<unprintable TYPE: ERROR>``; a string value longer
than :data:`VALUE_MAX_CHARS` is cut (``...[N more chars]``), and a line longer than
:data:`LINE_MAX_CHARS` is written with every value as its cut ``str()``.

A write to a stderr whose reader is slow (journald under load) blocks, under the lock, as
every journald client does: lines are not dropped for a slow journal. A journal stuck
for longer than ``WatchdogSec=`` stops the patrol loop's watchdog pings and systemd
restarts the daemon (systemd/hetpatrol.service); ``/metrics`` is served meanwhile (its
thread does not log).

Why not structlog or :mod:`logging`: structlog imported asyncio, and rich and pygments
where rich is installed, for the few calls hetpatrol makes: 3 MB of ``import
hetpatrol.cli``'s resident memory without rich, 7 MB and 120 modules with it (issue 17;
ssl, which asyncio imports too, still comes in with http.server). This module needs
neither and does not import :mod:`logging`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, TextIO

#: the levels, by name, with :mod:`logging`'s numbers
DEBUG, INFO, WARNING, ERROR, CRITICAL = 10, 20, 30, 40, 50
LEVELS = {"debug": DEBUG, "info": INFO, "warning": WARNING, "error": ERROR, "critical": CRITICAL}
FORMATS = ("console", "json")

#: console column widths: the longest level name structlog knew ("exception"), its event pad
_LEVEL_WIDTH = 9
_EVENT_WIDTH = 30
#: the characters that make structlog's console renderer quote a string value
_QUOTE_IF = frozenset(" \t=\r\n\"'")
#: field names the json line sets itself
_RESERVED = ("timestamp", "level", "event")
#: longest string value written whole; a longer one is cut, with "...[N more chars]".
#: journald splits a line longer than its LineMax= (48K by default, journald.conf(5)),
#: and the pieces of a json line are no longer JSON; a vendor tool's stderr (up to 1 MiB,
#: hetpatrol.tool.STDERR_CAP) in an error field would otherwise make such a line.
VALUE_MAX_CHARS = 8192
#: a line longer than this (a huge list or dict value) is written with every value as
#: its clipped ``str()``
LINE_MAX_CHARS = 32768


class LogConfig(NamedTuple):
    """What :func:`configure` set: the lowest level written (a number of :data:`LEVELS`),
    the format (one of :data:`FORMATS`) and the stream (None: ``sys.stderr`` as it is at
    each write)."""

    level: int = INFO
    fmt: str = "console"
    stream: TextIO | None = None


_config = LogConfig()
#: the capture lists of :func:`capture_logs` in force (innermost last); empty: write lines
_captures: list[list[dict[str, Any]]] = []
_lock = threading.Lock()
#: lines that could not be written (the stream closed or its reader gone)
dropped_lines = 0


def _new_lock_in_child() -> None:
    # a fork while another thread held the lock would leave the child's copy held forever
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def level_number(level: str | int) -> int:
    """``"warning"`` (any case) or 30 -> 30. Raises ValueError for an unknown name."""
    if isinstance(level, int):
        return level
    try:
        return LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}; one of {', '.join(LEVELS)}") from None


def configure(
    level: str | int = "info", fmt: str = "console", stream: TextIO | None = None
) -> None:
    """Write events at ``level`` and above (``debug``, ``info``, ``warning``, ``error``,
    ``critical`` or a number) as ``fmt`` lines (``console`` or ``json``) to ``stream``
    (None: whatever ``sys.stderr`` is at each write). Raises ValueError for an unknown
    level or format. Applies to every logger, also those made before."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; one of {', '.join(FORMATS)}")
    set_config(LogConfig(level_number(level), fmt, stream))


def get_config() -> LogConfig:
    """The configuration in force (to put back later with :func:`set_config`)."""
    return _config


def set_config(config: LogConfig) -> None:
    """Put back a configuration :func:`get_config` returned."""
    global _config
    _config = config


def _timestamp(now_ns: int) -> str:
    """``2026-12-01T09:59:58.433851Z`` for ``time.time_ns()``: UTC, always with microseconds."""
    seconds, nanos = divmod(now_ns, 1_000_000_000)
    micros = nanos // 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


def _console_value(value: object) -> str:
    if isinstance(value, str) and _QUOTE_IF.isdisjoint(value) and value.isprintable():
        return value
    return repr(value)


def render_console(timestamp: str, level: str, event: str, fields: dict[str, Any]) -> str:
    """The console line for one event, without its newline (see the module docstring)."""
    if not event.isprintable():
        event = repr(event)
    parts = [timestamp, f"[{level:<{_LEVEL_WIDTH}}]", f"{event:<{_EVENT_WIDTH}}"]
    parts += [f"{key}={_console_value(fields[key])}" for key in sorted(fields)]
    line = " ".join(parts).rstrip(" ")
    if not line.isprintable():  # a repr() that spans lines (a custom __repr__)
        line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
    return line


def render_json(timestamp: str, level: str, event: str, fields: dict[str, Any]) -> str:
    """The json line for one event, without its newline (see the module docstring)."""
    doc: dict[str, Any] = {"timestamp": timestamp, "level": level, "event": event}
    for key, value in fields.items():
        if isinstance(value, float) and not math.isfinite(value):
            value = repr(value)  # "nan", "inf", "-inf": JSON has no such number
        doc[f"field_{key}" if key in _RESERVED else key] = value
    try:
        # allow_nan=False: NaN/Infinity are not JSON (RFC 8259 section 6), and strict
        # parsers (Go's encoding/json in log shippers) refuse the whole line
        return json.dumps(doc, default=str, allow_nan=False)
    except (TypeError, ValueError):  # a circular value, a dict with tuple keys, a nan inside
        return json.dumps({k: v if k in _RESERVED else str(v) for k, v in doc.items()})


def _clip(text: str) -> str:
    if len(text) <= VALUE_MAX_CHARS:
        return text
    return f"{text[:VALUE_MAX_CHARS]}...[{len(text) - VALUE_MAX_CHARS} more chars]"


def _safe_text(value: object) -> str:
    """``str(value)``, clipped; a value whose ``__str__`` raises (or recurses too deep)
    is written as ``<unprintable TYPE: ERROR>`` instead of raising into the caller."""
    try:
        return _clip(value if isinstance(value, str) else str(value))
    except Exception as exc:  # noqa: BLE001 - a log line must never raise
        return f"<unprintable {type(value).__name__}: {type(exc).__name__}>"


def _render(fmt: str, stamp: str, level: str, event: object, fields: dict[str, Any]) -> str:
    render = render_json if fmt == "json" else render_console
    try:
        clipped = fields
        if any(isinstance(v, str) and len(v) > VALUE_MAX_CHARS for v in fields.values()):
            clipped = {k: _clip(v) if isinstance(v, str) else v for k, v in fields.items()}
        line = render(stamp, level, str(event), clipped)
        if len(line) <= LINE_MAX_CHARS:
            return line
    except Exception:  # noqa: BLE001 - a __repr__/__str__ that raises, RecursionError
        pass
    # every value as its clipped str(): never raises, never longer than the cap per value
    return render(stamp, level, _safe_text(event), {k: _safe_text(v) for k, v in fields.items()})


def _emit(name: str, level: str, event: str, fields: dict[str, Any]) -> None:
    global dropped_lines
    if _captures:
        _captures[-1].append({"event": event, "level": level, "logger": name, **fields})
        return
    config = _config
    line = _render(config.fmt, _timestamp(time.time_ns()), level, event, fields) + "\n"
    stream = config.stream if config.stream is not None else sys.stderr
    with _lock:
        if stream is None:  # started with fd 2 closed: Python sets sys.stderr to None
            dropped_lines += 1
            return
        try:
            stream.write(line)
            stream.flush()
        except (OSError, ValueError):  # stderr closed or its reader gone: not the patrol's end
            dropped_lines += 1


class Logger:
    """A named logger; :func:`get_logger` makes one. Each method writes one event if its
    level is at or above the configured one and does nothing else otherwise (one
    comparison). The name is not written in the line (as with structlog before); it is in
    the dicts :func:`capture_logs` collects."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def debug(self, event: str, /, **fields: Any) -> None:
        if _captures or _config.level <= DEBUG:
            _emit(self.name, "debug", event, fields)

    def info(self, event: str, /, **fields: Any) -> None:
        if _captures or _config.level <= INFO:
            _emit(self.name, "info", event, fields)

    def warning(self, event: str, /, **fields: Any) -> None:
        if _captures or _config.level <= WARNING:
            _emit(self.name, "warning", event, fields)

    def error(self, event: str, /, **fields: Any) -> None:
        if _captures or _config.level <= ERROR:
            _emit(self.name, "error", event, fields)

    def critical(self, event: str, /, **fields: Any) -> None:
        if _captures or _config.level <= CRITICAL:
            _emit(self.name, "critical", event, fields)

    def __repr__(self) -> str:
        return f"<Logger {self.name}>"


def get_logger(name: str = "hetpatrol") -> Logger:
    """The logger for ``name`` (by convention the module's dotted name)."""
    return Logger(name)


@contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """For tests: collect every event logged inside the block, at every level, instead of
    writing it; yields the list, each event a dict ``{"event", "level", "logger", **fields}``
    (the fields as passed, not rendered). Nests; the innermost block collects."""
    captured: list[dict[str, Any]] = []
    _captures.append(captured)
    try:
        yield captured
    finally:
        for i, c in enumerate(_captures):
            if c is captured:
                del _captures[i]
                break
