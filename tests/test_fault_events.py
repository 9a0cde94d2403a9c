"""Fault to job in the state file (hetpatrol.actions.fault_events): the daemon keeps the
recent card fault events with their jobs in ``fault_events``, bounded by count and age,
and a restarted daemon goes on from them.

Replay: fixtures/nodes/xid-79 (its kmsg.txt: record 2103 ``Xid (PCI:0000:cb:00): 79``
and record 2104 ``The NVIDIA GPU 0000:cb:00.0 ... fallen off the bus`` at 1843.308 s
after boot; GPU 6 of its nvidia-smi-q.xml is ``GPU-d7051dd7-616a-cb6a-4aaf-7901dc199334``
at 0000:cb:00.0), given a boot (a boot id and a /proc/stat btime one hour ago) so the
kernel records have a boot and a time. The card's jobs come from a stand-in for
``squeue --json`` (the mapping is tested on recorded output in test_stray_process.py).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import NODES

from hetpatrol.actions.fault_events import (
    FaultEventRule,
    FaultLog,
    kept_event,
    rule_from_config,
)
from hetpatrol.actions.settings import ACTIONS_SCHEMA, parse_actions_section
from hetpatrol.config import load_config
from hetpatrol.daemon import Daemon
from hetpatrol.schema import rfc3339

XID79 = NODES / "xid-79"
UUID6 = "GPU-d7051dd7-616a-cb6a-4aaf-7901dc199334"
BOOT = "0b8e7d4c-2f61-4a3e-9c5d-7e1f2a3b4c5d"
STAT = NODES / "fault-survives-reboots" / "boots" / "1" / "proc" / "stat"


def booted_replay(tmp_path: Path, btime: int) -> Path:
    """xid-79's recordings with a boot: ``proc/sys/kernel/random/boot_id`` and the
    recorded ``proc/stat`` of fault-survives-reboots with ``btime`` changed."""
    root = tmp_path / "replay"
    (root / "proc" / "sys" / "kernel" / "random").mkdir(parents=True)
    for name in ("kmsg.txt", "nvidia-smi-q.xml", "scenario.yaml"):
        (root / name).symlink_to((XID79 / name).resolve())
    (root / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT + "\n")
    stat = [
        f"btime {btime}" if x.startswith("btime ") else x for x in STAT.read_text().splitlines()
    ]
    (root / "proc" / "stat").write_text("\n".join(stat) + "\n")
    return root


def jobs_stand_in(jobs: str | tuple[str, ...]) -> SimpleNamespace:
    """``jobs`` on GPU 6, none elsewhere. GPU 6 fell off the bus: it is matched by the
    index the kernel-log reader gave it."""
    held = frozenset({jobs} if isinstance(jobs, str) else jobs)
    return SimpleNamespace(
        refresh=lambda cards: None,
        error=None,
        jobs_of=lambda card: held if card.index == 6 else frozenset(),
        stray_jobs_of=lambda card: None,  # the CardJobs interface of later versions
        stray_note=None,
    )


def daemon(tmp_path: Path, replay: Path, job: str, **actions) -> Daemon:
    config = replace(
        load_config(),
        node="xid79-01",
        state_path=tmp_path / "state" / "state.json",
        jsonl_path=tmp_path / "state" / "patrol.jsonl",
        listen=None,
    )
    if actions:
        config = replace(config, actions=parse_actions_section({"fault_events": actions}))
    d = Daemon(config, replay_dir=replay)
    d.patroller.card_jobs = jobs_stand_in(job)
    d.restore_escalation()
    return d


def state(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "state" / "state.json").read_text())


def jsonl_events(tmp_path: Path) -> list[dict]:
    lines = (tmp_path / "state" / "patrol.jsonl").read_text().splitlines()
    return [d for d in map(json.loads, lines) if d.get("event") in ("xid", "kernel")]


def test_the_state_file_keeps_the_fault_events_with_their_jobs_across_a_restart(tmp_path, capsys):
    btime = int(time.time()) - 3600
    replay = booted_replay(tmp_path, btime)
    d = daemon(tmp_path, replay, "4242")
    try:
        read = time.time()
        d.patrol_once()
        d.patrol_once()  # nothing new: the same two events
        body = d.exposition.body
    finally:
        d.shutdown()
    assert b"hetpatrol_card_health" in body and b"4242" not in body  # never a label
    kept = state(tmp_path)["fault_events"]
    assert [(e["event"], e.get("xid"), e.get("reason")) for e in kept] == [
        ("xid", 79, None),
        ("kernel", None, "fallen_off_bus"),
    ]
    for e, seq in zip(kept, (2103, 2104), strict=True):
        assert e["boot_id"] == BOOT and e["kmsg_seq"] == seq
        assert e["uuid"] == UUID6 and e["bus_id"] == "0000:cb:00.0"
        assert (e["vendor"], e["index"]) == ("nvidia", 6)
        assert e["severity"] == "critical" and e["jobs"] == ["4242"]
    # a recorded log's records are stamped when read (the JSONL event's ts)
    assert rfc3339(read - 0.001) <= kept[0]["ts"] <= rfc3339(time.time())
    assert [e["ts"] for e in kept] == [e["ts"] for e in jsonl_events(tmp_path)]
    import jsonschema

    from hetpatrol.schema import fault_event_json_schema

    for e in kept:
        jsonschema.validate(e, fault_event_json_schema())
    first_run = {e["run_id"] for e in jsonl_events(tmp_path)}
    assert {e["run_id"] for e in kept} == first_run and len(first_run) == 1

    # restarted; another job now holds the card: the ring buffer is read again
    d = daemon(tmp_path, replay, "5555")
    try:
        d.patrol_once()
    finally:
        d.shutdown()
    # the same records, read again: their lines of the first read stand (jobs 4242, the
    # jobs when it happened), no second line; the patrol line counts them as read again
    assert [e for e in jsonl_events(tmp_path) if e["run_id"] not in first_run] == []
    assert len(jsonl_events(tmp_path)) == 2
    assert state(tmp_path)["fault_events"] == kept  # kept once, as first read
    patrols = [
        json.loads(line)
        for line in (tmp_path / "state" / "patrol.jsonl").read_text().splitlines()
        if json.loads(line).get("kind") == "patrol"
    ]
    assert [
        (p["kernel_log"]["new_events"], p["kernel_log"].get("reread_events")) for p in patrols
    ] == [
        (2, None),
        (0, None),
        (0, 2),
    ]

    # the ledger: both runs' JSONL lines and the state file are the same two faults
    from hetpatrol.cli import main

    files = [str(tmp_path / "state" / n) for n in ("patrol.jsonl", "state.json")]
    assert main(["ledger", "faults", *files, "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["counts"] == {
        "events": 2,
        "without_jobs": 0,
        "skipped": 0,
        "state_files": 1,
        "untrusted_files": 0,
        "foreign_files": 0,
    }
    assert [f["what"] for f in doc["jobs"]["4242"]] == ["xid 79", "fallen_off_bus"]
    assert "5555" not in doc["jobs"]


def test_a_fault_read_after_its_job_ended_is_credited_to_that_job_too(tmp_path):
    """Job 4242 holds GPU 6 at patrol 1; XID 79 (records 2103, 2104) is written after it,
    4242 ends (its cgroup gone) and 5555 is given the card before patrol 2 reads the
    record: the job the fault hit is 4242 (before the fix: ["5555"] alone)."""
    replay = booted_replay(tmp_path, int(time.time()) - 3600)
    lines = (XID79 / "kmsg.txt").read_text().splitlines(keepends=True)
    (replay / "kmsg.txt").unlink()
    (replay / "kmsg.txt").write_text("".join(lines[:2]))  # the GPU's lines, before the Xid
    d = daemon(tmp_path, replay, "4242")
    try:
        d.patrol_once()
        assert jsonl_events(tmp_path) == []
        (replay / "kmsg.txt").write_text("".join(lines))
        d.patroller.card_jobs = jobs_stand_in("5555")
        d.patrol_once()
        d.patrol_once()  # read already: no new line, and the kept jobs stay
    finally:
        d.shutdown()
    events = jsonl_events(tmp_path)
    assert [(e["kmsg_seq"], e["jobs"]) for e in events] == [
        (2103, ["4242", "5555"]),
        (2104, ["4242", "5555"]),
    ]
    assert [e["jobs"] for e in state(tmp_path)["fault_events"]] == [["4242", "5555"]] * 2


def test_a_restarted_daemon_drops_the_kept_faults_older_than_the_age_bound(tmp_path):
    replay = booted_replay(tmp_path, int(time.time()) - 3600)
    path = tmp_path / "state" / "state.json"
    path.parent.mkdir()
    now = time.time()
    old = {**_event(now - 8 * 86400, 1, uuid="GPU-old"), "boot_id": "a-week-ago"}
    recent = {**_event(now - 6 * 86400, 2, uuid="GPU-recent"), "boot_id": "last-week"}
    path.write_text(json.dumps({"schema": "hetpatrol.state/1", "fault_events": [old, recent]}))
    d = daemon(tmp_path, replay, "4242")
    try:
        d.patrol_once()
    finally:
        d.shutdown()
    kept = state(tmp_path)["fault_events"]
    assert [(e["uuid"], e["kmsg_seq"]) for e in kept] == [
        ("GPU-recent", 2),
        (UUID6, 2103),
        (UUID6, 2104),
    ]
    assert kept[0] == kept_event(recent)  # its kept form, as it was


def test_the_count_bound_keeps_the_newest(tmp_path):
    replay = booted_replay(tmp_path, int(time.time()) - 3600)
    d = daemon(tmp_path, replay, "4242", max_events=1)
    try:
        d.patrol_once()
    finally:
        d.shutdown()
    assert [e["kmsg_seq"] for e in state(tmp_path)["fault_events"]] == [2104]


def _event(ts: float, seq: int, **more) -> dict:
    return {
        "kind": "event",
        "event": "xid",
        "ts": rfc3339(ts),
        "run_id": "0123456789ab",
        "seq": seq,
        "severity": "critical",
        "xid": 48,
        "uuid": "GPU-x",
        "kmsg_seq": seq,
        "jobs": ["7"],
        **more,
    }


def test_a_step_of_the_wall_clock_ages_no_kept_event():
    """A kept event a day old; the wall clock is stepped 8 days ahead for one patrol (a
    bad time source), then back, while the monotonic clock goes on 60 s a patrol: the
    event stays (before the fix the ahead patrol dropped it for good). A real week on
    both clocks still drops it."""
    wall, mono = 1_800_000_000.0, 5000.0
    log = FaultLog()
    log.note_clock(wall, mono)
    log.observe([{**_event(wall - 86400, 1), "boot_id": "b"}], "b", wall)
    for step_wall, step_mono in ((60 + 8 * 86400, 60), (120, 120), (180, 180)):
        assert log.note_clock(wall + step_wall, mono + step_mono) in (8 * 86400, -8 * 86400, 0)
        log.observe([], "b", wall + step_wall)
        assert [e["kmsg_seq"] for e in log.events] == [1]
    assert log.events[0]["ts"] == rfc3339(wall - 86400)  # the JSONL's text, unchanged
    log.note_clock(wall + 7 * 86400, mono + 7 * 86400)
    log.observe([], "b", wall + 7 * 86400)
    assert log.events == []


def test_a_restart_in_the_same_boot_takes_the_clock_step_since_the_state_was_written():
    """The state file was written at wall W, 1000 s after boot; the daemon restarts 60 s
    later on the boot clock while the wall clock reads 8 days more: no kept event is
    dropped. Another boot, or no boot clock, has no such link: the wall clock ages it."""
    wall = 1_800_000_000.0
    doc = {
        "boot_id": "b",
        "finished": wall,
        "finished_boot": 1000.0,
        "fault_events": [{**_event(wall - 86400, 1), "boot_id": "b"}],
    }
    ahead = wall + 60 + 8 * 86400
    assert len(FaultLog.from_state(doc, ahead, boot=("b", 1060.0)).events) == 1
    assert FaultLog.from_state(doc, ahead, boot=("other", 1060.0)).events == []
    assert FaultLog.from_state(doc, ahead).events == []
    bad = {**doc, "finished_boot": "1000"}
    assert FaultLog.from_state(bad, ahead, boot=("b", 1060.0)).events == []


def test_the_daemon_keeps_its_fault_events_over_a_clock_step(tmp_path, monkeypatch):
    """The daemon's own patrols: XID 79 kept at patrol 1; patrol 2 runs with the wall
    clock 8 days ahead, patrol 3 with it back: both events are still in the state file
    (before the fix: none)."""
    import hetpatrol.patrol as patrol_module

    class Ahead:
        def __getattr__(self, name):
            return getattr(time, name)

        def time(self):
            return time.time() + 8 * 86400

    replay = booted_replay(tmp_path, int(time.time()) - 3600)
    d = daemon(tmp_path, replay, "4242")
    try:
        d.patrol_once()
        assert len(state(tmp_path)["fault_events"]) == 2
        monkeypatch.setattr(patrol_module, "time", Ahead())
        d.patrol_once()
        monkeypatch.undo()
        d.patrol_once()
    finally:
        d.shutdown()
    assert [e["kmsg_seq"] for e in state(tmp_path)["fault_events"]] == [2103, 2104]


def test_bounds_by_count_and_age_and_the_json_is_encoded_only_on_change():
    now = 1_800_000_000.0
    log = FaultLog(FaultEventRule(max_events=3, max_age_seconds=3600))
    log.observe([_event(now - 10 * i, i) for i in range(5, 0, -1)], "b", now)
    assert [e["seq"] for e in log.events] == [3, 2, 1]  # the newest three, oldest first
    text = log.json_text()
    log.observe([], "b", now + 1)
    assert log.json_text() is text  # nothing changed: not encoded again
    log.observe([], "b", now + 3600 - 25)  # seq 3 (now - 30) is past the hour now
    assert [e["seq"] for e in log.events] == [2, 1]
    assert json.loads(log.json_text()) == log.events


def test_an_applications_own_errors_never_push_a_card_fault_out():
    """Hostile trial (h35c): GPU x fell off the bus (XID 79, critical, job 7); then a
    user's program crashes over and over on another card (XID 13, an application's own
    error: warning). Each crash is a new event, and the kept events were the newest
    ``max_events``: a hundred crashes pushed the card fault out of the state file (the
    gathered ledger, a restarted daemon's record of its jobs). Past the count the
    lowest severity goes first; the age bound takes any."""
    now = 1_800_000_000.0
    log = FaultLog(FaultEventRule(max_events=5, max_age_seconds=3600))
    log.observe([_event(now - 600, 1, xid=79)], "b", now - 600)
    crash = {"severity": "warning", "xid": 13, "uuid": "GPU-y", "jobs": ["9"]}
    log.observe([_event(now - 500 + i, 2 + i, **crash) for i in range(100)], "b", now)
    assert [(e["xid"], e["severity"]) for e in log.events][0] == (79, "critical")
    assert [e["seq"] for e in log.events] == [1, 98, 99, 100, 101]
    assert json.loads(log.json_text()) == log.events
    # a dropped crash read again is the oldest warning: it goes again, the fault stays
    log.observe([_event(now - 500, 2, **crash)], "b", now)
    assert [e["seq"] for e in log.events] == [1, 98, 99, 100, 101]
    log.observe([], "b", now + 3600)  # a real hour: the age bound takes the fault too
    assert log.events == []


def test_many_jobs_on_one_card_are_bounded_and_counted():
    import jsonschema

    from hetpatrol.schema import fault_event_json_schema

    kept = kept_event(_event(1e9, 1, jobs=[str(i) for i in range(100)]))
    assert len(kept["jobs"]) == 64 and kept["jobs_more"] == 36
    jsonschema.validate(kept, fault_event_json_schema())


@pytest.mark.parametrize(
    "entry",
    [
        "not an event",
        {**_event(1e9, 1), "jobs": "4242"},  # not a list
        {**_event(1e9, 1), "jobs": [4242]},  # not text
        {**_event(1e9, 1), "seq": "1"},
        {**_event(1e9, 1), "xid": True},
        {**_event(1e9, 1), "ts": "yesterday"},
        {**_event(1e9, 1), "ts": "2026-12-01T22:35:12"},  # no zone
        {**_event(1e9, 1), "severity": "fatal"},
        {**_event(1e9, 1), "uuid": "G" * 10_000},  # too long
        {**_event(1e9, 1), "event": "drain"},
        {**_event(1e9, 1), "xid": None},  # neither XID nor reason
    ],
)
def test_a_damaged_entry_is_dropped_and_counted(entry):
    good = {**_event(1e9, 2), "boot_id": "b"}
    if isinstance(entry, dict):
        entry = {**entry, "boot_id": "b"}
    log = FaultLog.from_state({"fault_events": [entry, good]}, 1e9 + 60)
    assert log.dropped == 1
    assert [e["seq"] for e in log.events] == [2]


def test_a_foreign_fault_events_value_gives_an_empty_log():
    assert FaultLog.from_state({"fault_events": {"a": 1}}, 1e9).dropped == 1
    assert FaultLog.from_state({}, 1e9).events == []
    assert FaultLog.from_state(None, 1e9).events == []
    huge = [{**_event(1e9, i), "boot_id": "b"} for i in range(1000)]
    log = FaultLog.from_state({"fault_events": huge}, 1e9, FaultEventRule(max_events=10))
    assert [e["seq"] for e in log.events] == list(range(990, 1000))
    assert log.dropped == 1000 - 40  # the tail of 4 x max_events is looked at


def test_a_damaged_state_file_is_logged_and_the_daemon_goes_on(tmp_path, capfd):
    replay = booted_replay(tmp_path, int(time.time()) - 3600)
    path = tmp_path / "state" / "state.json"
    path.parent.mkdir()
    bad = {**_event(time.time(), 1), "boot_id": BOOT, "jobs": {"x": 1}}
    good = {**_event(time.time() - 5, 9, uuid="GPU-y", kmsg_seq=9), "boot_id": BOOT}
    path.write_text(json.dumps({"schema": "hetpatrol.state/1", "fault_events": [bad, good]}))
    os.chmod(path, 0o600)
    d = daemon(tmp_path, replay, "4242")
    try:
        d.patrol_once()
    finally:
        d.shutdown()
    kept = state(tmp_path)["fault_events"]
    assert [(e["uuid"], e["kmsg_seq"]) for e in kept] == [
        ("GPU-y", 9),
        (UUID6, 2103),
        (UUID6, 2104),
    ]
    line = next(x for x in capfd.readouterr().err.splitlines() if "state_fault_events" in x)
    assert "[warning" in line and "dropped=1" in line


def test_config_section():
    assert rule_from_config(None) == FaultEventRule(100, 604800.0)
    assert rule_from_config({"max_events": 5}) == FaultEventRule(5, 604800.0)
    with pytest.raises(ValueError, match="actions.fault_events"):
        rule_from_config({"max_age_seconds": 0})
    with pytest.raises(ValueError, match="actions.fault_events"):
        rule_from_config({"max_events": "many"})
    import jsonschema

    jsonschema.validate({"fault_events": {"max_events": 10}}, ACTIONS_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"fault_events": {"max_event": 10}}, ACTIONS_SCHEMA)
    assert load_config().actions.fault_events == FaultEventRule(100, 604800.0)


def test_status_lists_the_last_faults_with_their_jobs(tmp_path, capsys):
    from hetpatrol.cli import main
    from hetpatrol.node_view import render

    replay = booted_replay(tmp_path, int(time.time()) - 3600)
    path = tmp_path / "state" / "state.json"
    path.parent.mkdir()
    now = time.time()
    earlier = [
        {**_event(now - 7200 + i, i, uuid=f"GPU-{i}", index=i, vendor="nvidia"), "boot_id": "b"}
        for i in range(5)
    ]
    earlier[4]["jobs"] = None  # a card that was not one of the patrol's
    earlier[3]["jobs"] = ["17", "18\x1b[2J"]
    path.write_text(json.dumps({"schema": "hetpatrol.state/1", "fault_events": earlier}))
    d = daemon(tmp_path, replay, "4242")
    try:
        d.patrol_once()
    finally:
        d.shutdown()
    assert main(["status", "--state-path", str(path)]) == 2
    out = capsys.readouterr().out.splitlines()
    at = out.index("recent card faults (7 kept, newest first; ledger faults lists them):")
    shown = out[at + 1 : at + 6]
    # the age and severity in columns: "5 s ago    " beside "120 min ago" (were unaligned)
    assert len({line.index("critical") for line in shown}) == 1, "\n".join(shown)
    rows = [re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in shown]
    assert [text for _age, text in rows] == [
        "critical fallen_off_bus on nvidia/6 0000:cb:00.0: job 4242",
        "critical xid 79 on nvidia/6 0000:cb:00.0: job 4242",
        "critical xid 48 on nvidia/4 GPU-4: jobs unknown (not one of the patrol's cards)",
        "critical xid 48 on nvidia/3 GPU-3: jobs 17, 18\\x1b[2J",
        "critical xid 48 on nvidia/2 GPU-2: job 7",
    ]
    assert shown[0].startswith("  ") and rows[0][0].endswith(" s ago")
    assert rows[2][0] == "120 min ago"  # now - 7200 + 4 s (human_age)
    assert not out[at + 6].startswith("  ")  # five at most
    doc = json.loads(path.read_text())
    for width in (80, 160):
        lines = render(doc, width=width).splitlines()
        assert all(len(line) <= width for line in lines), width


def test_a_reload_keeps_the_fault_events_and_takes_the_new_bounds(tmp_path):
    from hetpatrol.patrol import Patroller

    replay = booted_replay(tmp_path, int(time.time()) - 3600)
    config = replace(load_config(), node="xid79-01")
    first = Patroller(config, replay_dir=replay)
    first.card_jobs = jobs_stand_in("4242")
    second = Patroller(
        replace(config, actions=parse_actions_section({"fault_events": {"max_events": 1}})),
        replay_dir=replay,
    )
    try:
        first.run()
        assert [e["kmsg_seq"] for e in first.fault_log.events] == [2103, 2104]
        second.adopt(first)
        report = second.run()
    finally:
        first.close()
        second.close()
    assert second.fault_log.rule == FaultEventRule(1, 604800.0)
    assert [e["kmsg_seq"] for e in json.loads(report.fault_events)] == [2104]


@pytest.mark.parametrize("hostile", ["symlink", "group_writable", "huge", "not_json"])
def test_a_hostile_state_file_is_refused_and_logged(tmp_path, capfd, monkeypatch, hostile):
    from hetpatrol.exporters import state as state_module

    replay = booted_replay(tmp_path, int(time.time()) - 3600)
    path = tmp_path / "state" / "state.json"
    path.parent.mkdir()
    keep = {**_event(time.time(), 1, uuid="GPU-z"), "boot_id": BOOT}
    text = json.dumps({"schema": "hetpatrol.state/1", "fault_events": [keep]})
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(text)
    if hostile == "symlink":
        path.symlink_to(elsewhere)
    else:
        path.write_text(text if hostile != "not_json" else text[:-1])
    if hostile == "group_writable":
        os.chmod(path, 0o660)
    if hostile == "huge":
        monkeypatch.setattr(state_module, "STATE_READ_MAX", 64)  # the file is larger
    d = daemon(tmp_path, replay, "4242")
    try:
        assert d.patroller.fault_log.events == []
    finally:
        d.shutdown()
    line = next(x for x in capfd.readouterr().err.splitlines() if "state_restore_refused" in x)
    assert "[warning" in line
    why = {
        "symlink": "a symbolic link: not followed",
        "group_writable": "writable by group or others (mode 660)",
        "huge": "is larger than 64 bytes",
        "not_json": "",
    }[hostile]
    assert why in line
