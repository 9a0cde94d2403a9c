"""Fault to job in Slurm itself (``slurm.admin_comment``, off by default): one line per
card fault appended to the ``AdminComment`` of each job that was on the card.

``scontrol update JobId=<id> AdminComment=<text>`` (scontrol(1): "AdminComment=<spec>
Arbitrary descriptive string. Can only be set by a Slurm administrator"; there is no
append form), so the daemon reads the job's current value and writes it back with `` |
hetpatrol: <xid 79|reason> <card> <time>`` after it. A note already there is not written
again; a value longer than :data:`ADMIN_COMMENT_MAX` is not written (logged). It needs
root or the SlurmUser: through the root helper (:mod:`hetpatrol.scontrol_helper`), which
takes ``update JobId=<n> AdminComment=<v>`` only for a job that ran on its node and only
when ``v`` is the job's current AdminComment with a ``hetpatrol:`` note appended
(:func:`check_append`).

The job is read alone (:func:`job_note_argv`, one ``REQUEST_JOB_INFO_SINGLE``, never the
whole queue): ``squeue --jobs=ID --states=all --noheader
--Format=JobID:|,NodeList:|,admin_comment:0``, the same in Slurm 22.05 to 25.11 (squeue.c
``_print_job()``: one job id -> ``slurm_load_job()``; opts.c ``_parse_long_token()``:
``:|`` is size 0 with the suffix ``|``, and print.c ``_print_str()`` pads and cuts
nothing at size 0). Those three fields only: the job number, the host list (node names
of slurm.conf) and the AdminComment (set by admins and hetpatrol); nothing the job's
owner chose is in the answer, so a job name, comment or work directory holding
``AdminComment=...``, ``|`` or a line break cannot stand in for the value (read by
:func:`parse_job_note`; ``scontrol show job`` prints those texts raw beside
``AdminComment=``, and prints no ``AdminComment=`` line at all when it is empty, so a
copy there could not be told apart).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from hetpatrol.logs import get_logger
from hetpatrol.slurm.gres import hostlist_contains
from hetpatrol.slurm.inventory import Runner, run_scontrol, tool_error
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


#: the fields asked, in this order (squeue(1) ``--Format``: "type[:[.][size][sufix]]")
NOTE_FORMAT = "JobID:|,NodeList:|,admin_comment:0"
#: most characters of the answer read (three fields of one job; slurmctld 22.05 keeps an
#: AdminComment of 70000 characters whole, tests/test_admin_comment.py)
NOTE_ANSWER_MAX = 1024 * 1024
#: squeue prints an unset AdminComment with printf("%s", NULL): glibc's ``(null)``
_UNSET = "(null)"
#: a host list as Slurm prints one (node names of slurm.conf, brackets, ranges, commas)
_HOSTLIST = re.compile(r"[A-Za-z0-9_.\-\[\],]*")


class JobNote(NamedTuple):
    """One job as :func:`parse_job_note` reads it: ``job`` (its number, ``squeue -O
    JobID``: the raw id, an array task's own), ``nodes`` (Slurm's host list of the job,
    ``""`` while pending) and ``admin_comment`` (``""`` when unset)."""

    job: str
    nodes: str
    admin_comment: str


def squeue_beside(tool: str) -> str:
    """``squeue`` in the directory of ``tool`` (``/opt/slurm/bin/sinfo`` ->
    ``/opt/slurm/bin/squeue``), else the bare name."""
    head, sep, _tail = tool.rpartition("/")
    return f"{head}{sep}squeue" if sep else "squeue"


def job_note_argv(squeue: str, job: str) -> list[str]:
    """The one-job read of job ``job`` (module docstring): ``--states=all`` since
    squeue without ``--states`` drops jobs that ended (print.c ``_filter_job()``: only
    PENDING, RUNNING, STAGE_OUT, SUSPENDED, COMPLETING), and the fault's job has often
    just ended."""
    return [squeue, f"--jobs={job}", "--states=all", "--noheader", f"--Format={NOTE_FORMAT}"]


def parse_job_note(text: str, job: str) -> JobNote | str:
    """Job ``job``'s record from :func:`job_note_argv`'s answer ``JOBID|NODELIST|
    ADMIN_COMMENT\n``, or why it cannot be read (a string): not exactly one line (an
    array's or heterogeneous job's id lists several records; an AdminComment with a
    line break is not read, the job gets no note; nor may it be: ``scontrol update
    JobId=<array's id>`` sets every task of the array, seen on slurmctld 22.05, so a note
    for the last task would be credited to the others too), another job's number, a
    host list of other characters, more than :data:`NOTE_ANSWER_MAX` characters. The
    AdminComment is
    the rest of the line after the second ``|`` (it may hold ``|`` itself); ``(null)``
    is an unset one (so an AdminComment of exactly ``(null)`` reads as empty)."""
    if len(text) > NOTE_ANSWER_MAX:
        return f"squeue answered more than {NOTE_ANSWER_MAX} characters"
    if not text.strip():
        return f"squeue does not list job {job}"
    body = text[:-1] if text.endswith("\n") else text
    if "\n" in body or "\r" in body:
        return (
            "squeue answered more than one line (several records, or a line break in "
            "the AdminComment)"
        )
    jid, sep1, rest = body.partition("|")
    nodes, sep2, comment = rest.partition("|")
    if not (sep1 and sep2):
        return f"squeue answered {body[:80]!r}, not JOBID|NODELIST|ADMIN_COMMENT"
    if jid != job or not (jid.isascii() and jid.isdigit()):
        return f"squeue answered for job {jid[:20]!r}, not {job}"
    nodes = "" if nodes == _UNSET else nodes
    if not _HOSTLIST.fullmatch(nodes):
        return f"NodeList {nodes[:80]!r} is not a host list"
    return JobNote(jid, nodes, "" if comment == _UNSET else comment)


def on_node(record: JobNote, node: str) -> bool:
    """True when the job's host list includes ``node``."""
    try:
        return bool(record.nodes) and hostlist_contains(record.nodes, node)
    except (ValueError, RecursionError):
        return False


def current(record: JobNote) -> str:
    return record.admin_comment


def appended(old: str, text: str) -> str | None:
    """``old`` with ``text`` appended; None when it is there already or too long."""
    if text in old.split(SEPARATOR):
        return None
    new = f"{old}{SEPARATOR}{text}" if old else text
    return new if len(new) <= ADMIN_COMMENT_MAX else None


def check_append(record: JobNote, node: str, value: str) -> str | None:
    """The root helper's rule: None when ``value`` may be written as the AdminComment
    of the job of ``record`` (it ran on ``node``; ``value`` is its current
    AdminComment with one ``hetpatrol:`` note appended), else why not."""
    if not on_node(record, node):
        return f"job {record.job} did not run on {node}"
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
        # root helper, which runs no squeue); each job alone, once per report
        squeue = squeue_beside(settings.drain.breaker.sinfo[-1])
        prefix = list(settings.drain.breaker.sinfo[:-1])
        records: dict[str, JobNote | None] = {}
        done: list[list[str]] = []
        comments: dict[str, str] = {}
        for job, text in notes:
            if not (job.isascii() and job.isdigit()):
                log.warning("admin_comment_skipped", job=job[:40], why="not a job number")
                continue
            if job not in records:
                records[job] = self._read(
                    [*prefix, *job_note_argv(squeue, job)], job, settings.timeout_seconds
                )
            record = records[job]
            if record is None:
                continue
            if not on_node(record, node):
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

    def _read(self, argv: list[str], job: str, timeout: float) -> JobNote | None:
        """Job ``job``'s record (:func:`parse_job_note`); None, logged, when unread."""
        try:
            out = self.runner(argv, timeout)
        except OSError as exc:
            log.warning("admin_comment_unread", job=job, error=exc.strerror or str(exc))
            return None
        error = tool_error(out)
        if error is not None:
            log.warning("admin_comment_unread", job=job, error=error)
            return None
        record = parse_job_note(out.stdout, job)
        if isinstance(record, str):
            log.warning("admin_comment_unread", job=job, error=record)
            return None
        return record


def job_on_node_argv(scontrol: str, job: str) -> list[str]:
    """The one-job read the root helper checks a note with (beside its scontrol)."""
    return job_note_argv(squeue_beside(scontrol), job)
