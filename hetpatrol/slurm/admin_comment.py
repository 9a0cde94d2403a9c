"""Fault to job in Slurm itself (``slurm.admin_comment``, off by default): one line per
card fault appended to the ``AdminComment`` of each job that was on the card.

``scontrol update JobId=<id> AdminComment=<text>`` (scontrol(1): "AdminComment=<spec>
Arbitrary descriptive string. Can only be set by a Slurm administrator"; there is no
append form), so the daemon reads the job's current ``admin_comment`` from ``squeue
--json`` (Slurm's field: never the text of ``scontrol show job``, where a user's
``Comment`` may forge an ``AdminComment=``) and writes it back with `` | hetpatrol:
<xid 79|reason> <card> <time>`` after it. A note already there is not written again; a
value longer than :data:`ADMIN_COMMENT_MAX` is not written (logged). It needs root or
the SlurmUser: through the root helper (:mod:`hetpatrol.scontrol_helper`), which takes
``update JobId=<n> AdminComment=<v>`` only for a job that ran on its node and only when
``v`` is the job's current ``admin_comment`` with a ``hetpatrol:`` note appended
(:func:`check_append`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hetpatrol.logs import get_logger
from hetpatrol.slurm.inventory import Runner, run_scontrol, tool_error
from hetpatrol.slurm.jobguard import SQUEUE_JSON_MAX, _job_nodes, squeue_argv
from hetpatrol.slurm.settings import SlurmSettings
from hetpatrol.slurm.states import REASON_PREFIX
from hetpatrol.tool import run_tool

log = get_logger("hetpatrol.slurm")

#: the longest AdminComment hetpatrol writes (its notes are ~80 characters each); the
#: limit is hetpatrol's own: slurmctld 22.05 takes and gives back 70000 characters
#: whole (tests/test_admin_comment.py); a note that would pass it is logged
#: (``admin_comment_skipped``), not written
ADMIN_COMMENT_MAX = 1000
SEPARATOR = " | "
FAULT_EVENTS = ("xid", "kernel")


def note(event: Mapping[str, Any]) -> str:
    """``hetpatrol: xid 79 nvidia/6 2026-12-01T20:53:21.490Z`` for a fault event."""
    what = f"xid {event['xid']}" if isinstance(event.get("xid"), int) else event.get("reason")
    if isinstance(event.get("vendor"), str) and isinstance(event.get("index"), int):
        card = f"{event['vendor']}/{event['index']}"
    else:
        card = str(event.get("uuid") or event.get("bus_id") or "card")
    text = f"{REASON_PREFIX} {what or event.get('event')} {card} {event.get('ts')}"
    return "".join(c for c in text if c.isprintable())[:160]


def job_records(text: str) -> dict[str, Mapping[str, Any]]:
    """Job id -> its ``squeue --json`` record; ``{}`` when the output cannot be read."""
    if len(text) > SQUEUE_JSON_MAX:
        return {}
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    jobs = doc.get("jobs") if isinstance(doc, Mapping) else None
    out: dict[str, Mapping[str, Any]] = {}
    for record in jobs if isinstance(jobs, list) else ():
        if isinstance(record, Mapping):
            jid = record.get("job_id")
            if isinstance(jid, int) and not isinstance(jid, bool):
                out[str(jid)] = record
    return out


def on_node(record: Mapping[str, Any], node: str) -> bool:
    """True when the job's hosts (``job_resources``) include ``node``."""
    try:
        return node in _job_nodes(record)
    except (ValueError, RecursionError):
        return False


def current(record: Mapping[str, Any]) -> str:
    value = record.get("admin_comment")
    return value if isinstance(value, str) else ""


def appended(old: str, text: str) -> str | None:
    """``old`` with ``text`` appended; None when it is there already or too long."""
    if text in old.split(SEPARATOR):
        return None
    new = f"{old}{SEPARATOR}{text}" if old else text
    return new if len(new) <= ADMIN_COMMENT_MAX else None


def check_append(record: Mapping[str, Any], node: str, value: str) -> str | None:
    """The root helper's rule: None when ``value`` may be written as the AdminComment
    of the job of ``record`` (it ran on ``node``; ``value`` is its current
    ``admin_comment`` with one ``hetpatrol:`` note appended), else why not."""
    if not on_node(record, node):
        return f"job {record.get('job_id')} did not run on {node}"
    old = current(record)
    if old:
        if not value.startswith(old + SEPARATOR):
            return "the new AdminComment does not keep the current one"
        added = value[len(old) + len(SEPARATOR) :]
    else:
        added = value
    if not added.startswith(REASON_PREFIX) or SEPARATOR in added:
        return f"only one note starting with {REASON_PREFIX!r} may be appended"
    if len(value) > ADMIN_COMMENT_MAX:
        return f"AdminComment longer than {ADMIN_COMMENT_MAX} characters"
    return None


class AdminCommenter:
    """Appends the notes of a report's fault events to their jobs' AdminComment."""

    def __init__(self, runner: Runner = run_tool):
        self.runner = runner
        self.written = 0

    def on_events(
        self, events: Iterable[Mapping[str, Any]], settings: SlurmSettings, node: str
    ) -> list[list[str]]:
        """Write the notes; returns the scontrol argument lists run (tests, logs)."""
        notes = [
            (str(job), note(e))
            for e in events
            if e.get("event") in FAULT_EVENTS and isinstance(e.get("jobs"), list)
            for job in e["jobs"]
        ]
        if not notes or not (settings.enabled and settings.admin_comment):
            return []
        # read-only, as the daemon's user: beside the breaker's sinfo (scontrol may be the
        # root helper, which runs no squeue)
        sinfo = settings.drain.breaker.sinfo
        squeue = [*sinfo[:-1], *squeue_argv(sinfo[-1])]
        try:
            out = self.runner(squeue, settings.timeout_seconds)
        except OSError as exc:
            log.warning("admin_comment_unread", error=exc.strerror or str(exc))
            return []
        error = tool_error(out)
        if error is not None:
            log.warning("admin_comment_unread", error=error)
            return []
        records = job_records(out.stdout)
        done: list[list[str]] = []
        comments: dict[str, str] = {}
        for job, text in notes:
            record = records.get(job)
            if record is None or not on_node(record, node):
                log.warning("admin_comment_skipped", job=job, why="job not found on this node")
                continue
            old = comments.get(job, current(record))
            new = appended(old, text)
            if new is None:
                if text not in old.split(SEPARATOR):  # not written before: too long
                    log.warning(
                        "admin_comment_skipped",
                        job=job,
                        why=f"the AdminComment would pass {ADMIN_COMMENT_MAX} characters "
                        f"(it has {len(old)})",
                    )
                continue
            args = ["update", f"JobId={job}", f"AdminComment={new}"]
            _, error = run_scontrol(settings, args, self.runner)
            if error is not None:
                log.warning("admin_comment_failed", job=job, error=error)
                continue
            comments[job] = new
            self.written += 1
            done.append(args)
        return done


def job_on_node_argv(scontrol: str) -> Sequence[str]:
    """The squeue the root helper reads a job's record with (beside its scontrol)."""
    return squeue_argv(scontrol)
