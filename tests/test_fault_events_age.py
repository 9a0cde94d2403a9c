"""A kernel record older than what the daemon can know gets no jobs: ``jobs: null`` and
``jobs_unknown`` saying why, never the jobs on the card now (which may be a later job's).

- The ring buffer read at a start holds records from before the daemon's first read of
  the cards' jobs (a restart, or a daemon started after the fault);
- a restarted daemon reads again records it no longer keeps (past ``max_events``):
  only the kept ones keep the jobs of their first read;
- a text kernel log's content at its first read carries no time of its own.

The records are xid-79's recorded ``/dev/kmsg`` lines (fixtures/nodes/xid-79/kmsg.txt:
2103 ``Xid (PCI:0000:cb:00): 79``, 2104 ``fallen off the bus``, at 1843.308 s after
boot), handed out as the kernel's ring buffer does (:class:`RingBuffer`: every record at
the first read, then only those with a higher sequence number, each timed as
:class:`hetpatrol.kernel_log.KmsgReader` times it: boot time + its microseconds). The
card's jobs come from the stand-in of test_fault_events.py.
"""

from __future__ import annotations

import json
import time

from test_fault_events import BOOT, XID79, booted_replay, daemon, jsonl_events, state

from hetpatrol.checks.kernel_events import JOBS_UNKNOWN_EARLIER
from hetpatrol.cli import main
from hetpatrol.kernel_log import (
    KernelLog,
    ReadResult,
    TextLogReader,
    _named_events,
    registered_patterns,
)
from hetpatrol.schema import event_json_schema, fault_event_json_schema

RECORDS = (XID79 / "kmsg.txt").read_text().splitlines()
USEC_2103 = 1843308145  # the record's own stamp, microseconds since boot


class RingBuffer:
    """``/dev/kmsg`` as a reader sees it (the stand-in for the device: the records are
    the recorded ones): a new reader gets every record kept, then only newer ones."""

    path = "/dev/kmsg"

    def __init__(self, lines: list[str], boot_wall: float):
        self.lines, self.boot_wall = list(lines), boot_wall
        self.patterns = registered_patterns()
        self._last = -1
        self._uuids: dict[str, str] = {}

    def read(self) -> ReadResult:
        result = ReadResult(boot_clock=True)
        fresh = [x for x in self.lines if x[:1].isdigit() and int(x.split(",")[1]) > self._last]
        if fresh:
            self._last = max(int(x.split(",")[1]) for x in fresh)
        for item in _named_events(fresh, self._uuids, result, self.patterns):
            result.events.append((item, self.boot_wall + item.clock[1]))
        return result

    def close(self) -> None:
        pass


def _started(tmp_path, replay, job, ring, **actions):
    d = daemon(tmp_path, replay, job, **actions)
    d.patroller.kernel_log = KernelLog(ring)
    return d


def test_records_from_before_the_first_read_of_the_jobs_get_none(tmp_path, capsys):
    """The daemon starts 30 minutes after GPU 6 fell off the bus (the records still in
    the ring buffer): the jobs on the card now (4242) are not credited with them. A
    record written while it runs gets the jobs."""
    boot = time.time() - 1843.308145 - 1800  # the records are half an hour old
    replay = booted_replay(tmp_path, int(boot))
    ring = RingBuffer(RECORDS, boot)
    d = _started(tmp_path, replay, "4242", ring)
    try:
        d.patrol_once()
        since = d.patroller.jobs_known_since
        events = jsonl_events(tmp_path)
        assert [e["kmsg_seq"] for e in events] == [2103, 2104]
        for e in events:
            assert e["jobs"] is None and e["boot_id"] == BOOT
            assert e["jobs_unknown"].startswith("older than this daemon's first read of the ")
        assert since is not None and time.time() - 60 < since <= time.time()
        # a record the kernel writes now (XID 79 again, a new sequence number)
        late = RECORDS[2].replace(
            "4,2103,1843308145,", f"4,2200,{int((time.time() - boot) * 1e6)},"
        )
        ring.lines.append(late)
        d.patrol_once()
    finally:
        d.shutdown()
    events = jsonl_events(tmp_path)
    assert [(e["kmsg_seq"], e["jobs"]) for e in events] == [
        (2103, None),
        (2104, None),
        (2200, ["4242"]),
    ]
    assert "jobs_unknown" not in events[2]
    import jsonschema

    for e in events:
        jsonschema.validate(e, event_json_schema())
    kept = state(tmp_path)["fault_events"]
    assert [(e["kmsg_seq"], e["jobs"]) for e in kept] == [
        (2103, None),
        (2104, None),
        (2200, ["4242"]),
    ]
    assert kept[0]["jobs_unknown"] == events[0]["jobs_unknown"]
    for e in kept:
        jsonschema.validate(e, fault_event_json_schema())
    # the ledger credits job 4242 with the new record only; status says why not the others
    path = tmp_path / "state" / "state.json"
    assert main(["ledger", "faults", str(path), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [f["ts"] for f in doc["jobs"]["4242"]] == [kept[2]["ts"]]
    assert doc["counts"]["without_jobs"] == 2
    from hetpatrol.node_view import render

    out = render(json.loads(path.read_text()), width=400)
    assert "fallen_off_bus on nvidia/6 0000:cb:00.0: jobs unknown (older than this daemon's" in out


def test_a_restarted_daemon_credits_only_the_records_it_kept(tmp_path):
    """Both records are written while the first daemon runs (job 4242); it keeps one
    (``max_events: 1``). Restarted with job 5555 on the card, it reads both again: the
    kept one is known (no second line), the other is older than its first read and gets
    no jobs, not 5555."""
    boot = time.time() - 1843.308145 + 5  # the records are 5 s in the future of now
    replay = booted_replay(tmp_path, int(boot) - 1)
    ring = RingBuffer(RECORDS[:1], boot)  # the buffer holds only the GPU's name line yet
    d = _started(tmp_path, replay, "4242", ring, max_events=1)
    try:
        d.patrol_once()
        time.sleep(max(0.0, boot + 1843.31 - time.time()) + 0.01)
        ring.lines = list(RECORDS)  # GPU 6 falls off the bus
        d.patrol_once()
    finally:
        d.shutdown()
    first = jsonl_events(tmp_path)
    assert [(e["kmsg_seq"], e["jobs"]) for e in first] == [(2103, ["4242"]), (2104, ["4242"])]
    assert [e["kmsg_seq"] for e in state(tmp_path)["fault_events"]] == [2104]

    d = _started(tmp_path, replay, "5555", RingBuffer(RECORDS, boot), max_events=1)
    try:
        d.patrol_once()
    finally:
        d.shutdown()
    again = [e for e in jsonl_events(tmp_path) if e["run_id"] != first[0]["run_id"]]
    # 2104 is kept: known, its first line (jobs 4242) stands and none is written again;
    # 2103 is not (past max_events): a line again, with no jobs rather than 5555's
    assert [(e["kmsg_seq"], e["jobs"]) for e in again] == [(2103, None)]
    assert again[0]["jobs_unknown"].startswith("older than this daemon's first read")


def test_a_text_logs_content_at_its_first_read_gets_no_jobs(tmp_path):
    """A kernel log file (not a replay): what it held before the first read has no time
    the reader can tell; a line appended later is read as it happens."""
    replay = booted_replay(tmp_path, int(time.time()) - 3600)
    log = tmp_path / "kern.log"
    log.write_text("\n".join(RECORDS[:4]) + "\n")
    d = daemon(tmp_path, replay, "4242")
    d.patroller.kernel_log = KernelLog(TextLogReader(log))
    try:
        d.patrol_once()
        with log.open("a") as f:
            # ten minutes later by its stamp: a new episode, not a repeat folded in
            f.write(RECORDS[2].replace("4,2103,1843308145,", "4,2300,2443308145,") + "\n")
        d.patrol_once()
    finally:
        d.shutdown()
    events = jsonl_events(tmp_path)
    assert [(e["kmsg_seq"], e["jobs"]) for e in events] == [
        (2103, None),
        (2104, None),
        (2300, ["4242"]),
    ]
    assert events[0]["jobs_unknown"] == JOBS_UNKNOWN_EARLIER
    assert [e.get("jobs_unknown") for e in state(tmp_path)["fault_events"]] == [
        JOBS_UNKNOWN_EARLIER,
        JOBS_UNKNOWN_EARLIER,
        None,
    ]


def test_a_reload_keeping_the_reader_keeps_the_time_a_new_reader_starts_again(tmp_path):
    """A reload whose kernel-log settings are unchanged keeps the reader (nothing is
    read again) and the time the jobs began to be known; one that changes them starts a
    new reader, which reads the ring buffer again: its older records get no jobs."""
    from dataclasses import replace

    from hetpatrol.patrol import Patroller

    replay = booted_replay(tmp_path, int(time.time()) - 3600)
    d = daemon(tmp_path, replay, "4242")
    try:
        d.patrol_once()
        old = d.patroller
        same = Patroller(old.config, replay_dir=replay)
        same.adopt(old)
        assert same.jobs_known_since == old.jobs_known_since is not None
        rules = old.config.top["kernel_events"]
        changed = replace(
            old.config, top={**old.config.top, "kernel_events": replace(rules, burst_seconds=9.0)}
        )
        fresh = Patroller(changed, replay_dir=replay)
        fresh.adopt(same)
        assert fresh.jobs_known_since is None
        for p in (same, fresh):
            p.close()
    finally:
        d.shutdown()


def test_a_wall_clock_stepped_back_since_the_first_read_keeps_the_jobs(tmp_path, monkeypatch):
    """Hostile trial (h35c): the node booted with its RTC an hour ahead; the daemon's
    first patrol read the cards' jobs on that clock, then NTP stepped the wall clock
    back. A record the kernel writes afterwards is timed on the corrected clock (the
    kmsg reader: the wall clock now less the record's age on CLOCK_MONOTONIC), an hour
    before the first read's wall time: it was 'older than this daemon's first read', so
    every fault of the next hour was credited to no job. The first read's time is now
    kept on CLOCK_MONOTONIC too: the record gets the job on the card (4242)."""
    real = time.time
    boot = real() - 1843.308145 - 1800
    replay = booted_replay(tmp_path, int(boot))
    ring = RingBuffer(RECORDS, boot + 3600)  # timed on the clock an hour ahead
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    d = _started(tmp_path, replay, "4242", ring)
    try:
        d.patrol_once()
        assert [e["jobs"] for e in jsonl_events(tmp_path)] == [None, None]
        monkeypatch.setattr(time, "time", real)  # NTP steps the clock back an hour
        ring.boot_wall = boot
        late = RECORDS[2].replace("4,2103,1843308145,", f"4,2200,{int((real() - boot) * 1e6)},")
        ring.lines.append(late)
        d.patrol_once()
    finally:
        d.shutdown()
    events = jsonl_events(tmp_path)
    assert [(e["kmsg_seq"], e["jobs"]) for e in events][-1] == (2200, ["4242"])
    assert "jobs_unknown" not in events[-1]
