"""``sacct`` job records, streamed: one allocation (one run of a job) per line, never the
whole history in memory.

The command (:func:`sacct_argv`)::

    sacct -P -n --noconvert -X -D -a -S START -E END -o JobIDRaw,User,Account,...

* ``-X`` (``--allocations``): one line per allocation, not per step; ``AllocTRES`` of the
  allocation holds the cards.
* ``-D`` (``--duplicates``): every record that matches, so every run of a requeued job
  (the earlier runs end in state ``REQUEUED``, each with its own Start/End; plain sacct
  returns the most recent record per job id, sacct(1) ``--duplicates``). ``sreport job``
  reports count every run too (tests/test_ledger_live.py compares them).
* ``-S``/``-E`` without ``-T``: sacct(1) (Slurm 22.05, https://slurm.schedmd.com/sacct.html)
  "Select jobs in any state after" ``--starttime`` and "before" ``--endtime``, with their
  real Start and End; ``-T`` (``--truncate``) would set a Start before the window to
  ``--starttime`` and an End after it to ``--endtime``. The ledger cuts at the edges
  itself (:mod:`.usage`, the same arithmetic), so the wait time and a job's real span
  stay readable.
* ``--noconvert``: memory TRES in M as recorded, no unit scaling (the card counts are
  plain numbers either way).

Times are the local wall-clock times sacct prints (``2026-12-01T07:21:22``; ``Unknown``
for a job not started or not ended, ``None`` here).
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import BinaryIO

from hetpatrol.tool import kill_tree

#: the ``--format`` fields, in order (``-P`` output has no header with ``-n``)
FIELDS = (
    "JobIDRaw",
    "JobID",
    "User",
    "Account",
    "Partition",
    "QOS",
    "NodeList",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "State",
    "AllocTRES",
)


class SacctError(RuntimeError):
    """sacct could not be run, or exited non-zero (its stderr in the message)."""


class SacctDataError(SacctError):
    """A line that is not a record of the fields asked for (line number and raw text)."""


@dataclass(slots=True)
class JobRun:
    """One allocation (one run of a job) of ``sacct -X -D``.

    Times are Unix seconds (None for ``Unknown``: not started, or still running);
    ``elapsed`` is ``ElapsedRaw`` in seconds; ``state`` the first word of ``State``
    (``CANCELLED by 0`` -> ``CANCELLED``); ``alloc_tres`` the raw ``AllocTRES`` string.
    """

    job_id: str
    job_label: str
    user: str
    account: str
    partition: str
    qos: str
    nodes: str
    submit: float | None
    start: float | None
    end: float | None
    elapsed: int
    state: str
    alloc_tres: str


def sacct_argv(
    start: str, end: str, prefix: Sequence[str] = ("sacct",), extra: Sequence[str] = ()
) -> list[str]:
    """The sacct command for the window [start, end) (sacct time formats)."""
    return [
        *prefix,
        "-P",
        "-n",
        "--noconvert",
        "-X",
        "-D",
        "-a",
        "-S",
        start,
        "-E",
        end,
        "-o",
        ",".join(FIELDS),
        *extra,
    ]


class TimeParser:
    """sacct's local ``YYYY-MM-DDTHH:MM:SS`` -> Unix seconds, fast.

    The local epoch of each ``YYYY-MM-DDTHH:MM`` is computed once (``datetime.timestamp``,
    so the time zone and its DST rules apply) and the seconds are added: a million records
    over a month cost some 40,000 real conversions (the cache is emptied past
    ``max_minutes`` entries). ``Unknown``, ``None``, ``N/A`` and empty give None; anything
    else unreadable raises ``ValueError``.
    """

    def __init__(self, max_minutes: int = 1 << 20) -> None:
        self._minutes: dict[str, float] = {}
        self._max = max_minutes

    def __call__(self, text: str) -> float | None:
        base = self._minutes.get(text[:16])
        if base is not None and len(text) == 19:
            return base + _SECONDS[text[17:]]
        if len(text) != 19 or text[10] != "T" or text[16] != ":" or text[17:] not in _SECONDS:
            if text in ("Unknown", "None", "", "N/A"):
                return None
            return datetime.fromisoformat(text).timestamp()
        base = datetime.fromisoformat(text[:16] + ":00").timestamp()
        if len(self._minutes) >= self._max:
            self._minutes.clear()
        self._minutes[text[:16]] = base
        return base + _SECONDS[text[17:]]


_SECONDS = {f"{i:02d}": i for i in range(60)}


#: Longest sacct line read (a record is a few hundred bytes); a longer one is refused.
MAX_LINE_BYTES = 1 << 20
#: Most bytes of sacct's stderr kept for the error message (the rest is read and dropped).
STDERR_KEEP = 64 * 1024


def read_lines(handle: BinaryIO, max_line: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of a binary stream, one at a time, each at most ``max_line`` bytes:
    a longer one raises :class:`SacctDataError` (a device such as ``/dev/zero`` or a
    runaway writer is never read whole)."""
    lineno = 0
    while True:
        raw = handle.readline(max_line + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > max_line:
            raise SacctDataError(
                f"sacct line {lineno}: longer than {max_line} bytes: {raw[:200]!r}..."
            )
        yield raw


#: the sacct fields of ``ledger capacity`` (and of its recorded sample,
#: fixtures/ledger-sample/sacct.txt): :data:`FIELDS`, then the request and time limit
CAPACITY_FIELDS = (*FIELDS, "ReqTRES", "TimelimitRaw")
#: positional layouts a saved file without a header may have (by field count)
_LAYOUTS = {len(FIELDS): FIELDS, len(CAPACITY_FIELDS): CAPACITY_FIELDS}


def _header(parts: list[str], lineno: int) -> list[int] | None:
    """The positions of :data:`FIELDS` when ``parts`` is sacct's header line (``sacct -P``
    or ``-p`` without ``-n`` prints the ``--format`` field names first, sacct(1)
    "--noheader"); None when it is not a header. ``SacctDataError`` when it is one that
    lacks a field the ledger needs."""
    names = [p.strip().lower() for p in parts]
    # a record always has digits-only fields (JobIDRaw, ElapsedRaw): a user or account
    # named "JobIDRaw" does not make its line a header
    if "jobidraw" not in names or any(p.isdigit() for p in names):
        return None
    missing = [f for f in FIELDS if f.lower() not in names]
    if missing:
        raise SacctDataError(
            f"sacct line {lineno}: a header without {','.join(missing)}: save sacct's output "
            f"with -o {','.join(FIELDS)}"
        )
    return [names.index(f.lower()) for f in FIELDS]


def _expected() -> str:
    return (
        f"expected {len(FIELDS)} fields ({','.join(FIELDS)}), or {len(CAPACITY_FIELDS)} "
        f"(those, ReqTRES,TimelimitRaw: ledger capacity's), or a header line naming them "
        f"(sacct -P without -n)"
    )


def decode_line(raw: str | bytes, lineno: int, error: type[SacctDataError] | None = None) -> str:
    """One line of sacct's output as text: bytes must be UTF-8 (sacct writes what the
    database holds: invalid bytes mean the input is not sacct output). Raises ``error``
    (default :class:`SacctDataError`) naming line ``lineno``, the byte and the raw text."""
    if not isinstance(raw, bytes):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise (error or SacctDataError)(
            f"sacct line {lineno}: not UTF-8 ({exc.reason} at byte {exc.start}): "
            f"{raw.rstrip()[:200]!r}"
        ) from None


def parse_lines(lines: Iterable[str | bytes]) -> Iterator[JobRun]:
    """``sacct -P -n -o`` :data:`FIELDS` lines -> :class:`JobRun`, lazily.

    Saved output is read by its header when it has one (``sacct -P`` without ``-n``: the
    field names, in any order, others among them ignored), else by position: the
    :data:`FIELDS` layout or ``ledger capacity``'s :data:`CAPACITY_FIELDS` (its two extra
    fields last, ignored here), told apart by the field count.
    Lines may be text or bytes; bytes must be UTF-8 (sacct writes what the database
    holds: invalid bytes mean the input is not sacct output). Blank lines are skipped.
    A line that is not UTF-8, has the wrong number of fields or an unreadable time raises
    :class:`SacctDataError` with its line number, the fields expected and the raw text (a
    job name or other free text with ``|`` in it is not among the fields, so this means
    the output is not what was asked for).
    """
    pt = TimeParser()
    n = None  # fields a line has: set by the header or the first record
    at = None  # where each of FIELDS is in a line: set by a header, else in order
    lineno = 0
    for raw in lines:
        lineno += 1
        raw = decode_line(raw, lineno)
        q = raw.rstrip("\n").split("|")
        if n is None:
            if not raw.strip():
                continue
            where = _header(q, lineno)
            if where is not None:
                at, n = where, len(q)
                continue
            n = len(q) if len(q) in _LAYOUTS else len(FIELDS)
        if len(q) != n:
            if not raw.strip():
                continue
            raise SacctDataError(
                f"sacct line {lineno}: {len(q)} fields, {_expected()}: {raw.rstrip()[:200]!r}"
            )
        p = q if at is None else [q[i] for i in at]
        try:
            state = p[11]
            yield JobRun(
                p[0], p[1], p[2], p[3], p[4], p[5], p[6], pt(p[7]), pt(p[8]), pt(p[9]),
                int(p[10]) if p[10] else 0,
                state if " " not in state else state.split(" ", 1)[0],
                p[12],
            )  # fmt: skip
        except (ValueError, KeyError, OverflowError, OSError) as exc:
            raise SacctDataError(f"sacct line {lineno}: {exc}: {raw.rstrip()[:200]!r}") from None


def _drain(pipe: BinaryIO, keep: bytearray, cap: int) -> None:
    """Read ``pipe`` to EOF, keeping the last ``cap`` bytes in ``keep`` (sacct's errors
    come last): a chatty stderr never fills its pipe nor memory."""
    try:
        while chunk := pipe.read1(1 << 16):
            keep += chunk
            if len(keep) > cap:
                del keep[: len(keep) - cap]
    except (OSError, ValueError):  # pragma: no cover - closed under us
        pass


def stream_sacct(
    argv: Sequence[str], timeout: float = 600.0, parse: Callable = parse_lines
) -> Iterator[JobRun]:
    """Run ``argv`` (see :func:`sacct_argv`) and yield its records as they arrive.

    ``SacctError`` when sacct cannot be started, exits non-zero (with the end of its
    stderr) or is not done ``timeout`` seconds after it started (an overall deadline, as
    :func:`hetpatrol.tool.run_tool` has: sacct waiting on a dead slurmdbd, or a consumer
    loop that stalls). sacct runs in its own process group; at the deadline, or when the
    consumer stops early, the whole group is killed (SIGKILL) and reaped. Its stderr is
    read concurrently by a thread (the last :data:`STDERR_KEEP` bytes kept), so sacct
    never blocks on a full stderr pipe while stdout is read; stdout is read line by line
    (:func:`read_lines`), never the whole history in memory. ``parse`` turns the lines
    into what is yielded (:func:`parse_lines`; the capacity report reads more fields).
    """
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise SacctError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    assert proc.stdout is not None and proc.stderr is not None
    err = bytearray()
    drainer = threading.Thread(target=_drain, args=(proc.stderr, err, STDERR_KEEP), daemon=True)
    drainer.start()
    expired = threading.Event()

    def _expire() -> None:
        expired.set()
        kill_tree(proc)

    watchdog = threading.Timer(timeout, _expire)
    watchdog.daemon = True
    watchdog.start()
    finished = False
    try:
        yield from parse(read_lines(proc.stdout))
        finished = True
    finally:
        if not finished:
            kill_tree(proc)
        try:
            # stdout is at EOF: wait for the exit, within what is left of the deadline
            # (the watchdog kills the group at the deadline, so this wait ends)
            rc = proc.wait()
        finally:
            watchdog.cancel()
            drainer.join(timeout=5)
            proc.stdout.close()
            if not drainer.is_alive():
                proc.stderr.close()
    if expired.is_set():
        raise SacctError(f"{argv[0]} did not finish within {timeout:g} s (--timeout): killed")
    if rc != 0:
        text = bytes(err).decode("utf-8", errors="replace").strip()
        raise SacctError(f"{argv[0]} exited with {rc}: {text[-2000:]}")
