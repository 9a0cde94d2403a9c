"""Fault events from text kernel logs, once (hetpatrol.kernel_log.TextLogReader's record
names, hetpatrol.actions.fault_events.record_key, ``ledger faults``).

A text kernel log (``/var/log/kern.log``, a journal's text, ``dmesg`` output) has no
sequence number: a daemon restarted from its state file reads the whole file again.
Before the record names, every record of it was kept a second time in the state file's
``fault_events``, written again as a JSONL event line and counted again by ``ledger
faults`` (and by the escalation, whose re-read rule is "within a second" of the first
time, while a text record is timed when read).

Recordings read (their sources: fixtures/vendor-outputs/SOURCES.md and
../shared/vendor-samples/nvidia/INDEX.md), with the event lines each makes at a 5 s
burst, counted by hand from the files:

- ``journalctl -k`` short (no kernel stamp), NVIDIA/open-gpu-kernel-modules #1151: five
  ``rm_init_adapter failed`` / ``RmInitAdapter failed!`` records of 0000:09:00.0 in one
  second (lines 1, 5 and 9 the same text, lines 4 and 8 the same text): 1 event;
- the bare ``kernel:`` tag (no time at all), NVIDIA/open-gpu-kernel-modules #1150: Xid 45
  on dc, ed, ba (two records each) and 97 (one): 4 events;
- ``journalctl -b`` short, a Fedora write-up: one Xid 120 on 0000:23:00: 1 event;
- ``dmesg`` ``[secs]`` (shared dmesg_xid-32-31_2015.txt): Xid 32 twice, the same text
  0.3 ms apart, then Xid 31: 2 events;
- ``/var/log/syslog`` with the ``[  199.234935]`` stamp (shared syslog_xid-48-...):
  ``RmInitAdapter`` on 0a:00 at 199.2 s, then 218.3-221.3 s (one burst), Xid 48, Xid
  64: 4 events;
- ``dmesg -T`` (shared dmesg_xid-13-109_H100.txt): Xid 13 three times in one second,
  Xid 109: 2 events;
- dmesg's indented multi-line ``fallen off the bus`` (shared, no Xid): 1 event.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import REPO, SAMPLES
from test_fault_events import booted_replay, daemon, jsonl_events, state

from hetpatrol.actions.fault_events import FaultLog, kept_event, record_key
from hetpatrol.cli import main
from hetpatrol.kernel_log import KernelLog, TextLogReader

OURS = REPO / "fixtures" / "vendor-outputs" / "nvidia"
SHARED = SAMPLES / "nvidia"
#: a boot before every recording's own wall stamp (2023-11-14): none is of an earlier boot
BTIME = 1_700_000_000

RECORDINGS = {
    "journalctl-short": (
        OURS / "journalctl-k-short_rm-init-adapter-failed_repeated_595.71.05.txt",
        1,
    ),
    "kernel-tag": (OURS / "kernel-tag_xid-45-after-149-145_no-stamp_590.48.01.txt", 4),
    "journalctl-b": (OURS / "journalctl-b-short_xid-120_gsp-task-exception_continuation.txt", 1),
    "dmesg-secs": (SHARED / "dmesg_xid-32-31_2015.txt", 2),
    "syslog-secs": (SHARED / "syslog_xid-48-dbe_xid-64_rminitadapter-failed.txt", 4),
    "dmesg-T": (SHARED / "dmesg_xid-13-109_H100.txt", 2),
    "dmesg-multiline": (SHARED / "dmesg_fallen-off-bus_multiline_no-xid.txt", 1),
}


def text_daemon(tmp_path: Path, replay: Path, log: Path, burst: float = 5.0):
    """xid-79's node (job 4242 on GPU 6) reading the text kernel log ``log``."""
    d = daemon(tmp_path, replay, "4242")
    rules = d.config.top["kernel_events"]
    d.patroller.config = replace(
        d.patroller.config,
        top={**d.patroller.config.top, "kernel_events": replace(rules, burst_seconds=burst)},
    )
    d.patroller.kernel_log = KernelLog(TextLogReader(log))
    return d


def patrol_lines(tmp_path: Path) -> list[dict]:
    lines = (tmp_path / "state" / "patrol.jsonl").read_text().splitlines()
    return [d for d in map(json.loads, lines) if d.get("kind") == "patrol"]


def escalation_events(tmp_path: Path) -> dict:
    """card identity -> escalation key -> the times counted (the state file's)."""
    cards = state(tmp_path)["escalation"]["cards"]
    return {card: c["events"] for card, c in cards.items() if c["events"]}


def ledger_counts(tmp_path: Path, capsys) -> dict:
    files = [str(tmp_path / "state" / n) for n in ("patrol.jsonl", "state.json")]
    main(["ledger", "faults", *files, "--format", "json"])
    return json.loads(capsys.readouterr().out)["counts"]


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_a_restarted_daemon_keeps_a_text_logs_faults_once(tmp_path, capsys, name):
    """One daemon reads the recording (two patrols), is stopped, and a daemon restarted
    from its state file reads the same file again: the kept events, the JSONL event
    lines and ``ledger faults`` count each fault once (before: twice each)."""
    source, faults = RECORDINGS[name]
    log = tmp_path / "kern.log"
    shutil.copyfile(source, log)
    replay = booted_replay(tmp_path, BTIME)
    d = text_daemon(tmp_path, replay, log)
    try:
        d.patrol_once()
        d.patrol_once()
    finally:
        d.shutdown()
    kept = state(tmp_path)["fault_events"]
    assert len(kept) == faults and len(jsonl_events(tmp_path)) == faults
    assert all(e["log_record"] for e in jsonl_events(tmp_path))
    counted = escalation_events(tmp_path)

    d = text_daemon(tmp_path, replay, log)  # restarted: a new reader, the state file read
    try:
        d.patrol_once()
    finally:
        d.shutdown()
    assert state(tmp_path)["fault_events"] == kept
    assert len(jsonl_events(tmp_path)) == faults  # no second line of a record
    restart = patrol_lines(tmp_path)[-1]["kernel_log"]
    assert (restart["new_events"], restart["reread_events"]) == (0, faults)
    counts = ledger_counts(tmp_path, capsys)
    assert (counts["events"], counts["without_jobs"]) == (faults, faults)  # their time: unknown
    assert escalation_events(tmp_path) == counted  # nor counted again (see below)
    import jsonschema

    from hetpatrol.schema import event_json_schema, fault_event_json_schema, patrol_json_schema

    for e in jsonl_events(tmp_path):
        jsonschema.validate(e, event_json_schema())
    for e in kept:
        jsonschema.validate(e, fault_event_json_schema())
    jsonschema.validate(patrol_lines(tmp_path)[-1], patrol_json_schema())
    assert not any(c["escalated"] for c in state(tmp_path)["escalation"]["cards"].values())


@pytest.mark.parametrize(
    ("name", "card", "key"),
    [
        ("journalctl-b", "bus:0000:23:00.0", "xid:120"),
        ("syslog-secs", "bus:0000:07:00.0", "xid:48"),
    ],
)
def test_a_restart_does_not_escalate_a_card_on_a_fault_read_again(tmp_path, name, card, key):
    """One Xid 120 (journalctl-b) or Xid 48 (syslog-secs) in the log; the rules are "2
    in 24 h" (isolate_card, replace_card). A daemon restarted more than a second later
    (the escalation's own re-read rule: within a second of a counted time) read it again
    and counted it a second time, timed when read: the card was escalated by one fault
    (before: xid_reset_repeat isolate_card, xid48_repeat replace_card). The record is
    written after the first daemon's first read (one already in the log then is of
    unknown age and feeds no escalation at all: see the tests below)."""
    log = tmp_path / "kern.log"
    log.write_text("")
    replay = booted_replay(tmp_path, BTIME)
    d = text_daemon(tmp_path, replay, log)
    try:
        d.patrol_once()
        log.write_text(RECORDINGS[name][0].read_text())  # written after the first read
        d.patrol_once()
    finally:
        d.shutdown()
    time.sleep(1.1)
    esc = state(tmp_path)["escalation"]["cards"][card]
    assert (len(esc["events"][key]), esc["escalated"]) == (1, {})
    d = text_daemon(tmp_path, replay, log)
    try:
        d.patrol_once()
    finally:
        d.shutdown()
    esc = state(tmp_path)["escalation"]["cards"][card]
    assert (len(esc["events"][key]), esc["escalated"]) == (1, {})


def names(path: Path) -> list[tuple[str, str, int]]:
    """(file, digest, place among equal records) of each record a new reader reads."""
    out = []
    for ev, _when in TextLogReader(path).read().events:
        file_id, digest, n = ev.record.split(":")
        out.append((file_id, digest, int(n)))
    return out


def test_each_recordings_records_have_names_that_a_second_read_gives_again(tmp_path):
    """Read off the files: equal lines are told apart by their place, and the same file
    read by a new reader (a restarted daemon) gives the same names."""
    for source, _faults in RECORDINGS.values():
        first, again = names(source), names(source)
        assert first == again and len(set(first)) == len(first)
    # journalctl short, one second: lines 1, 5, 9 are the same text, lines 4 and 8 too
    rm = names(RECORDINGS["journalctl-short"][0])
    assert len(rm) == 5
    assert [n for _f, _d, n in rm] == [0, 0, 1, 1, 2]
    assert rm[0][1] == rm[2][1] == rm[4][1] != rm[1][1] == rm[3][1]
    # dmesg: the same Xid 32 text at 24128.828315 and .828608: two records, both first
    xid32 = names(RECORDINGS["dmesg-secs"][0])
    assert len(xid32) == 3 and xid32[0][1] != xid32[1][1] and xid32[0][2] == xid32[1][2] == 0
    # the bare kernel: tag: no time at all, seven different lines
    tag = names(RECORDINGS["kernel-tag"][0])
    assert len({d for _f, d, _n in tag}) == 7 and {n for _f, _d, n in tag} == {0}
    # another file (a copy: another inode) is another name, the rest the same
    copy = tmp_path / "copy.log"
    shutil.copyfile(RECORDINGS["kernel-tag"][0], copy)
    other = names(copy)
    assert [x[1:] for x in other] == [x[1:] for x in tag] and other[0][0] != tag[0][0]


def test_a_fault_with_the_same_text_later_is_kept_too_and_a_restart_adds_none(tmp_path, capsys):
    """The bare ``kernel:`` tag line of #1150 (no time stamp) is written, then written
    again a patrol later (a second fault, the same text): two events, names ``:0`` and
    ``:1``. A restarted daemon reads both lines again at once (folded into one episode,
    its first record ``:0``): nothing new is kept or written, the ledger counts two."""
    line = RECORDINGS["kernel-tag"][0].read_text().splitlines()[0] + "\n"
    log = tmp_path / "kern.log"
    log.write_text(line)
    replay = booted_replay(tmp_path, BTIME)
    d = text_daemon(tmp_path, replay, log, burst=0.0)  # patrols apart are two episodes
    try:
        d.patrol_once()
        with log.open("a") as f:
            f.write(line)
        d.patrol_once()
    finally:
        d.shutdown()
    events = jsonl_events(tmp_path)
    assert [(e["xid"], e["bus_id"], e["log_record"].rsplit(":", 1)[1]) for e in events] == [
        (45, "0000:dc:00.0", "0"),
        (45, "0000:dc:00.0", "1"),
    ]
    assert events[0]["log_record"].rsplit(":", 1)[0] == events[1]["log_record"].rsplit(":", 1)[0]
    kept = state(tmp_path)["fault_events"]
    assert [e["log_record"] for e in kept] == [e["log_record"] for e in events]

    d = text_daemon(tmp_path, replay, log, burst=0.0)
    try:
        d.patrol_once()
    finally:
        d.shutdown()
    assert state(tmp_path)["fault_events"] == kept and len(jsonl_events(tmp_path)) == 2
    assert ledger_counts(tmp_path, capsys)["events"] == 2

    # the ledger's rule is the daemon's: a line of the same record by another run (an
    # older daemon that wrote it again) counts once; another place is another fault
    again = {**events[0], "run_id": "r-older", "seq": 9, "ts": "2026-12-01T00:00:00.000Z"}
    other = {**again, "log_record": events[0]["log_record"][:-1] + "7"}
    with (tmp_path / "state" / "patrol.jsonl").open("a") as f:
        f.write(json.dumps(again) + "\n")
    assert ledger_counts(tmp_path, capsys)["events"] == 2
    with (tmp_path / "state" / "patrol.jsonl").open("a") as f:
        f.write(json.dumps(other) + "\n")
    assert ledger_counts(tmp_path, capsys)["events"] == 3


def test_a_rotated_log_is_read_from_its_start_and_its_records_are_new(tmp_path):
    """logrotate's ``create``: the file is renamed and a new one written, which may have
    grown past the old read offset before the next read: it is read from its start (not
    from the old offset), and its records are named by the new file."""
    lines = RECORDINGS["kernel-tag"][0].read_text().splitlines(keepends=True)
    log = tmp_path / "kern.log"
    log.write_text("".join(lines[:1]))
    reader = TextLogReader(log)
    first = reader.read().events
    assert [ev.bus_id for ev, _ in first] == ["0000:dc:00.0"]
    log.rename(tmp_path / "kern.log.1")
    log.write_text("".join(lines[1:4]))  # longer than the first file
    read = reader.read().events
    assert [ev.bus_id for ev, _ in read] == ["0000:ed:00.0", "0000:ba:00.0", "0000:97:00.0"]
    assert read[0][0].record.split(":")[0] != first[0][0].record.split(":")[0]


def test_record_key_of_a_text_record_is_its_name_bus_and_fault_not_the_boot():
    """Kept events of the same text record read in two boots (a text log keeps the
    records of earlier boots), one with its card listed (UUID) and one without (gone
    after an XID 79): one key. Another place among equal records: another key."""
    base = {
        "event": "xid",
        "ts": "2026-12-01T10:00:00.000Z",
        "severity": "critical",
        "xid": 79,
        "bus_id": "0000:dc:00.0",
        "log_record": "803.2a1:0f4c2b8e9d7a6b5c:0",
        "jobs": None,
    }
    a = kept_event({**base, "uuid": "GPU-d7051dd7-616a-cb6a-4aaf-7901dc199334"}, "boot-a")
    b = kept_event(base, "boot-b")
    c = kept_event({**base, "log_record": "803.2a1:0f4c2b8e9d7a6b5c:1"}, "boot-b")
    assert record_key(a) == record_key(b) != record_key(c)
    log = FaultLog()
    assert log.observe([dict(a)], "boot-a", 1.7649e9) == []
    assert log.observe([dict(b), dict(c)], "boot-b", 1.7649e9) == [b]
    assert len(log.events) == 2


def test_record_key_of_a_kmsg_record_is_its_boot_seq_bus_and_fault():
    """The same /dev/kmsg record (xid-79's record 2103) kept with its card's UUID and,
    read again after a restart that no longer lists the card, without it: one key. The
    same number in another boot is another record."""
    base = {
        "event": "xid",
        "ts": "2026-12-01T10:00:00.000Z",
        "severity": "critical",
        "xid": 79,
        "bus_id": "0000:cb:00.0",
        "kmsg_seq": 2103,
        "jobs": ["4242"],
    }
    listed = kept_event({**base, "uuid": "GPU-d7051dd7-616a-cb6a-4aaf-7901dc199334"}, "boot-a")
    unlisted = kept_event(base, "boot-a")
    later = kept_event(base, "boot-b")
    assert record_key(listed) == record_key(unlisted) != record_key(later)


# --------------------------------------------- records in a text log before its first read
#: xid-79's XID 79 on GPU 6 (cb:00), as a forwarded syslog writes it: "Mon DD HH:MM:SS" has
#: no year, so the line cannot say which boot, nor how long ago (fixtures/nodes/xid-79)
OLD_XID79 = (
    "Dec  2 11:38:27 gpu-a07 kernel: NVRM: Xid (PCI:0000:cb:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.\n"
)


def kernel_findings(report) -> list:
    """The kernel log's findings of a patrol: its cards' and the node's."""
    checks = ("xid", "kernel_fault", "kernel_log_earlier")
    found = [f for c in report.cards for f in c.findings] + list(report.node_findings)
    return [f for f in found if f.check in checks]


def test_an_old_xid_79_in_a_text_log_at_start_is_kept_and_said_but_not_critical(tmp_path):
    """An XID 79 already in a forwarded kern.log when the daemon first reads it (age
    unknown: perhaps days and boots old): the event is kept, with ``jobs_unknown``, one
    info finding says so, no card finding, no escalation; before, a critical xid finding
    (reboot_node) at every start. A line appended after the first read is critical as
    before; a restarted daemon on the same file is not critical again."""
    log = tmp_path / "kern.log"
    log.write_text(OLD_XID79)
    replay = booted_replay(tmp_path, BTIME)
    d = text_daemon(tmp_path, replay, log)
    try:
        first = d.patrol_once()
        found = kernel_findings(first)
        assert [(f.check, f.severity) for f in found] == [("kernel_log_earlier", "info")]
        assert found[0].value == {"records": 1, "episodes": 1}
        assert "before hetpatrol first read it, their age unknown" in found[0].message
        (kept,) = state(tmp_path)["fault_events"]
        assert (kept["xid"], kept["bus_id"], kept["jobs"]) == (79, "0000:cb:00.0", None)
        assert kept["jobs_unknown"].startswith("in the kernel log before this daemon")
        assert escalation_events(tmp_path) == {}
        # the same fault written after the first read: now, critical, job 4242's
        with log.open("a") as f:
            f.write(OLD_XID79.replace("11:38:27", "11:40:02"))
        second = d.patrol_once()
        sev = {(f.check, f.severity) for f in kernel_findings(second)}
        assert ("xid", "critical") in sev and ("kernel_log_earlier", "info") in sev
        assert len(state(tmp_path)["fault_events"]) == 2
        assert state(tmp_path)["fault_events"][-1]["jobs"] == ["4242"]
        assert list(escalation_events(tmp_path)) == ["bus:0000:cb:00.0"]
    finally:
        d.shutdown()
    counted = escalation_events(tmp_path)
    time.sleep(1.1)
    d = text_daemon(tmp_path, replay, log)  # restarted on the same file: all of it earlier
    try:
        again = d.patrol_once()
    finally:
        d.shutdown()
    found = kernel_findings(again)
    assert [(f.check, f.severity) for f in found] == [("kernel_log_earlier", "info")]
    assert found[0].value == {"records": 2, "episodes": 2}
    assert len(state(tmp_path)["fault_events"]) == 2
    assert escalation_events(tmp_path) == counted


def test_a_zoned_stamp_after_this_boot_counts_as_now_at_the_first_read(tmp_path):
    """journalctl ``-o short-iso`` / rsyslog's RFC 3339 stamp says when: a record stamped
    after this boot's start (``btime``) is this boot's and counts at the first read; one
    with a zone-less or yearless stamp does not (it is said, not judged)."""
    log = tmp_path / "kern.log"
    line = OLD_XID79.replace("Dec  2 11:38:27", "2023-11-20T11:38:27+0000")
    log.write_text(line)
    d = text_daemon(tmp_path, booted_replay(tmp_path, BTIME), log)
    try:
        report = d.patrol_once()
    finally:
        d.shutdown()
    assert ("xid", "critical") in {(f.check, f.severity) for f in kernel_findings(report)}
    assert state(tmp_path)["fault_events"][0]["jobs"] == ["4242"]
    # no zone: local time of an unknown zone, not read as a time
    (tmp_path / "state").rename(tmp_path / "state-1")
    log2 = tmp_path / "kern2.log"
    log2.write_text(line.replace("+0000", ""))
    d = text_daemon(tmp_path, booted_replay(tmp_path / "b", BTIME), log2)
    try:
        report = d.patrol_once()
    finally:
        d.shutdown()
    found = kernel_findings(report)
    assert [(f.check, f.severity) for f in found] == [("kernel_log_earlier", "info")]
