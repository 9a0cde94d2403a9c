"""``hetpatrol ledger faults JSONL...``: the jobs that ran on a card that faulted.

Reads the daemon's JSONL files (``patrol.jsonl`` and its rotated copies, in any order)
and keeps each card fault event (``kind: "event"``, ``event`` ``xid`` or ``kernel``,
schema ``hetpatrol.event/1``) with its ``jobs``: the Slurm jobs on the card when the
fault was read (:meth:`hetpatrol.patrol.Patroller._jobs_on_events`). One row per job:
the job id, then each fault (time, node, card, XID or reason, severity). Events without
``jobs`` (written before the field existed, or on a card that was not one of the
patrol's) are counted as such, never credited to a job.

Only the daemon's own structured fields are read; a line that is not JSON, or an event
whose fields have the wrong types, is skipped and counted. Names are printed without
control characters (:func:`hetpatrol.node_view.printable`). Exit 0 no fault with a
job, 1 at least one, 65 when no file could be read.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from hetpatrol.node_view import printable
from hetpatrol.output import plain_help

FAULT_EVENTS = ("xid", "kernel")
#: the longest line looked at (a patrol line of a big node is far below it)
MAX_LINE = 1 << 20
EX_DATAERR = 65


#: the type each field read may have (absent or null is fine; bool is no int)
_FIELD_TYPES: dict[str, type] = {
    "run_id": str,
    "seq": int,
    "ts": str,
    "node": str,
    "vendor": str,
    "index": int,
    "uuid": str,
    "bus_id": str,
    "xid": int,
    "reason": str,
    "severity": str,
}


def _well_typed(event: Mapping[str, Any]) -> bool:
    """Whether every field this command reads is absent, null or of its type."""
    for key, kind in _FIELD_TYPES.items():
        value = event.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            return False
    return True


def _card(event: Mapping[str, Any]) -> str:
    if isinstance(event.get("vendor"), str) and isinstance(event.get("index"), int):
        return f"{event['vendor']}/{event['index']}"
    for key in ("uuid", "bus_id"):
        if isinstance(event.get(key), str):
            return event[key]
    return "unknown card"


def _what(event: Mapping[str, Any]) -> str:
    if isinstance(event.get("xid"), int):
        return f"xid {event['xid']}"
    return str(event.get("reason") or event.get("event"))


def faults_by_job(lines: Iterable[str]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """(job id -> its faults, counts of ``events``, ``without_jobs``, ``skipped``) from
    JSONL ``lines``. A fault is ``{ts, node, card, what, severity}``; one event seen
    twice (a file and its rotated copy overlapping) counts once."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    counts = {"events": 0, "without_jobs": 0, "skipped": 0}
    seen: set[tuple] = set()
    for line in lines:
        if not line.strip():
            continue
        try:
            doc = json.loads(line) if len(line) <= MAX_LINE else None
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict):
            counts["skipped"] += 1
            continue
        if doc.get("kind") != "event" or doc.get("event") not in FAULT_EVENTS:
            continue
        if not _well_typed(doc):  # a field of the wrong type: a forged or foreign line
            counts["skipped"] += 1
            continue
        key = (doc.get("run_id"), doc.get("seq"), doc.get("ts"), _card(doc), _what(doc))
        if key in seen:
            continue
        seen.add(key)
        counts["events"] += 1
        ids = doc.get("jobs")
        if not isinstance(ids, list) or not all(isinstance(j, str) for j in ids):
            counts["without_jobs" if ids is None else "skipped"] += 1
            continue
        fault = {
            "ts": doc.get("ts"),
            "node": doc.get("node"),
            "card": _card(doc),
            "what": _what(doc),
            "severity": doc.get("severity"),
        }
        for job in ids:
            jobs.setdefault(job, []).append(fault)
    return jobs, counts


def render_text(jobs: Mapping[str, list[dict[str, Any]]], counts: Mapping[str, int]) -> str:
    out = []
    for job in sorted(jobs, key=lambda j: (len(j), j)):
        out.append(f"job {printable(job)}")
        for f in sorted(jobs[job], key=lambda f: str(f["ts"])):
            out.append(
                "  "
                + " ".join(printable(str(f[k])) for k in ("ts", "node", "card", "what", "severity"))
            )
    out.append(
        f"{len(jobs)} job(s) on faulted cards; {counts['events']} fault event(s), "
        f"{counts['without_jobs']} without jobs, {counts['skipped']} line(s) skipped"
    )
    return "\n".join(out) + "\n"


def _lines(paths: Iterable[str], errors: list[str]) -> Iterable[str]:
    """The lines of each file, read at most :data:`MAX_LINE` bytes at a time: a longer
    line is given cut (so skipped by :func:`faults_by_job`) and its rest read past,
    never held whole. A file that is not a regular file (``/dev/zero``, a FIFO) or
    cannot be read is named in ``errors``."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    errors.append(f"{path}: not a regular file")
                    continue
                while raw := handle.readline(MAX_LINE + 1):
                    if len(raw) > MAX_LINE:
                        while raw and not raw.endswith(b"\n"):
                            raw = handle.readline(MAX_LINE + 1)
                        yield "\x00" * (MAX_LINE + 1)  # too long: counted as skipped
                        continue
                    yield raw.decode("utf-8", errors="replace")
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror or exc}")


def cmd_faults(args: argparse.Namespace) -> int:
    """``ledger faults``: see the module docstring."""
    errors: list[str] = []
    jobs, counts = faults_by_job(_lines(args.jsonl, errors))
    for error in errors:
        print(f"hetpatrol ledger faults: {printable(error)}", file=sys.stderr)
    if len(errors) == len(args.jsonl):
        return EX_DATAERR
    if args.format == "json":
        sys.stdout.write(json.dumps({"jobs": jobs, "counts": counts}, indent=2) + "\n")
    else:
        sys.stdout.write(render_text(jobs, counts))
    return 1 if jobs else 0


def add_parser(lsub: Any) -> None:
    """Register ``faults`` on the ``ledger`` subparsers ``lsub``."""
    p = lsub.add_parser(
        "faults",
        help="the jobs that ran on a card that faulted (from the daemon's JSONL)",
        # argparse's own formatter wraps it to the terminal (every --help fits 80 columns)
        description=plain_help(__doc__.split("\n\n", 1)[1]),
    )
    p.add_argument("jsonl", nargs="+", help="patrol.jsonl and its rotated copies")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_faults)
