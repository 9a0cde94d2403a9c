"""``sacct`` job records, streamed: one allocation (one run of a job) per line, never the
whole history in memory.

The command (:func:`sacct_argv`)::

    sacct -P -n --noconvert -X -D -a -S START -E END -o JobIDRaw,User,Account,...

* ``-X`` (``--allocations``): one line per allocation, not per step; ``AllocTRES`` of the
  allocation holds the cards.
* ``-D`` (``--duplicates``): every run of a requeued job (the earlier runs end in state
  ``REQUEUED``, each with its own Start/End), as the usage rollup behind ``sreport
  cluster``/``user`` reports counts them; plain ``sacct`` shows only the last run.
* ``-S``/``-E`` without ``-T``: sacct(1) (Slurm 22.05, https://slurm.schedmd.com/sacct.html,
  ``--starttime``/``--endtime``/``--truncate``) selects the jobs that were in any state
  during the window, with their real Start and End; ``-T`` would move Start/End to the
  window's edges. The ledger cuts at the edges itself (:mod:`.usage`), so that the wait
  time and a job's real span stay readable.
* ``--noconvert``: memory TRES in M as recorded, no unit scaling (the card counts are
  plain numbers either way).

Times are the local wall-clock times sacct prints (``2026-12-01T07:21:22``; ``Unknown``
for a job not started or not ended, ``None`` here).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

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
    """sacct could not be run, exited non-zero, or printed a line that is not a record."""


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

    The local epoch of each ``YYYY-MM-DDTHH`` is computed once (``datetime.timestamp``,
    so the time zone and its DST rules apply) and minutes and seconds are added: a
    million records cost a few thousand real conversions. ``Unknown``, ``None`` and empty
    give None; anything else unreadable raises ``ValueError``.
    """

    def __init__(self) -> None:
        self._hours: dict[str, float] = {}

    def __call__(self, text: str) -> float | None:
        if len(text) != 19 or text[10] != "T":
            if text in ("Unknown", "None", "", "N/A"):
                return None
            return datetime.fromisoformat(text).timestamp()
        hour = text[:13]
        base = self._hours.get(hour)
        if base is None:
            base = datetime.fromisoformat(hour + ":00:00").timestamp()
            self._hours[hour] = base
        return base + int(text[14:16]) * 60 + int(text[17:19])


def parse_lines(lines: Iterable[str]) -> Iterator[JobRun]:
    """``sacct -P -n -o`` :data:`FIELDS` lines -> :class:`JobRun`, lazily.

    Blank lines are skipped. A line with the wrong number of fields or an unreadable
    time raises :class:`SacctError` with its line number and raw text (a job name or
    other free text with ``|`` in it is not among the fields, so this means the output
    is not what was asked for).
    """
    parse_time = TimeParser()
    n = len(FIELDS)
    for lineno, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n")
        if not line:
            continue
        parts = line.split("|")
        if len(parts) != n:
            raise SacctError(
                f"sacct line {lineno}: {len(parts)} fields, expected {n} "
                f"({','.join(FIELDS)}): {line[:200]!r}"
            )
        try:
            elapsed = int(parts[10]) if parts[10] else 0
            yield JobRun(
                parts[0],
                parts[1],
                parts[2],
                parts[3],
                parts[4],
                parts[5],
                parts[6],
                parse_time(parts[7]),
                parse_time(parts[8]),
                parse_time(parts[9]),
                elapsed,
                parts[11].split(" ", 1)[0],
                parts[12],
            )
        except ValueError as exc:
            raise SacctError(f"sacct line {lineno}: {exc}: {line[:200]!r}") from None


def stream_sacct(argv: Sequence[str], timeout: float = 600.0) -> Iterator[JobRun]:
    """Run ``argv`` (see :func:`sacct_argv`) and yield its records as they arrive.

    ``SacctError`` when sacct cannot be started or exits non-zero (with its stderr).
    The process is killed if the consumer stops early or ``timeout`` seconds pass.
    """
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1 << 16,
        )
    except OSError as exc:
        raise SacctError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    assert proc.stdout is not None and proc.stderr is not None
    finished = False
    try:
        yield from parse_lines(proc.stdout)
        finished = True
    finally:
        if not finished:
            proc.kill()
        try:
            err = proc.stderr.read()
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            err = f"timed out after {timeout:.0f} s"
        proc.stdout.close()
        proc.stderr.close()
    if rc != 0:
        raise SacctError(f"{' '.join(argv[:1])} exited with {rc}: {err.strip()[-2000:]}")
