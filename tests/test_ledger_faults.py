"""Fault to job: every card fault event carries the jobs on its card, and ``hetpatrol
ledger faults`` lists the jobs that ran on a card that faulted, from the JSONL.

Replay: fixtures/nodes/xid-79 (its kmsg.txt: XID 79 "GPU has fallen off the bus" on one
H100). The card's jobs come from a stand-in for ``squeue --json`` (the mapping itself is
tested on the recorded 22.05 output in tests/test_stray_process.py).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from hetpatrol.cli import main
from hetpatrol.config import load_config
from hetpatrol.ledger.faults import faults_by_job
from hetpatrol.patrol import Patroller

REPO = Path(__file__).resolve().parent.parent
XID79 = REPO / "fixtures" / "nodes" / "xid-79"


def _patrol_jsonl(tmp_path: Path) -> tuple[Path, list[dict]]:
    p = Patroller(replace(load_config(), node="xid-79"), replay_dir=XID79)
    try:
        p.card_jobs = SimpleNamespace(
            refresh=lambda cards: None,
            error=None,
            # GPU 6 fell off the bus: NVML no longer gives its UUID or bus id
            jobs_of=lambda card: frozenset({"4242"}) if card.index == 6 else frozenset(),
        )
        report = p.run()
    finally:
        p.close()
    path = tmp_path / "patrol.jsonl"
    path.write_text("".join([report.patrol_line, *report.card_lines, *report.event_lines]))
    events = [json.loads(x) for x in report.event_lines]
    return path, events


def test_fault_events_carry_the_jobs_and_the_ledger_lists_them(tmp_path, capsys):
    path, events = _patrol_jsonl(tmp_path)
    xids = [e for e in events if e.get("event") == "xid"]
    assert xids and all(e["xid"] == 79 for e in xids)
    matched = [e for e in xids if e["jobs"] is not None]
    assert matched and all(e["jobs"] == ["4242"] for e in matched)
    import jsonschema

    from hetpatrol.schema import jsonl_json_schema

    validator = jsonschema.Draft202012Validator(jsonl_json_schema())
    for e in events:
        validator.validate(e)
    # a torn line and another run's copy of the same file change nothing
    with path.open("a") as f:
        f.write('{"kind": "event", "event": "xid", "jobs": [\n')
    code = main(["ledger", "faults", str(path), str(path)])
    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines()[0] == "job 4242"
    assert " xid 79 " in out.splitlines()[1]
    assert (
        "1 job(s) on faulted cards" in out and "2 line(s) skipped" in out
    )  # the torn line, in each copy


def test_events_without_jobs_are_counted_not_credited():
    lines = [
        json.dumps({"kind": "event", "event": "xid", "xid": 13, "jobs": None, "ts": "t1"}),
        json.dumps(
            {
                "kind": "event",
                "event": "kernel",
                "reason": "fallen_off_bus",
                "jobs": ["7", "8"],
                "ts": "t2",
                "bus_id": "0000:17:00.0",
            }
        ),
        json.dumps({"kind": "event", "event": "drain", "jobs": ["9"]}),  # not a fault
        "not json",
    ]
    jobs, counts = faults_by_job(lines)
    assert sorted(jobs) == ["7", "8"]
    assert jobs["7"][0]["card"] == "0000:17:00.0" and jobs["7"][0]["what"] == "fallen_off_bus"
    assert counts == {"events": 2, "without_jobs": 1, "skipped": 1}


def test_unreadable_files_exit_65(tmp_path, capsys):
    assert main(["ledger", "faults", str(tmp_path / "missing.jsonl")]) == 65
    assert "missing.jsonl" in capsys.readouterr().err


def test_forged_lines_with_unhashable_keys_are_skipped_not_a_traceback(tmp_path, capsys):
    """A JSONL file handed to ``ledger faults`` may be anyone's: a fault event whose
    ``seq``, ``ts`` or ``run_id`` is a list or an object (wrong types) is one line
    skipped, never a TypeError out of the command."""
    path = tmp_path / "forged.jsonl"
    good = {"kind": "event", "event": "xid", "xid": 79, "jobs": ["5"], "ts": "t", "seq": 1}
    path.write_text(
        "\n".join(
            [
                json.dumps({**good, "seq": [1]}),
                json.dumps({**good, "ts": {"a": 1}}),
                json.dumps({**good, "run_id": [["x"]]}),
                json.dumps({**good, "uuid": ["GPU-1"], "xid": [79]}),
                json.dumps(good),
            ]
        )
        + "\n"
    )
    assert main(["ledger", "faults", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "job 5"
    assert "1 fault event(s), 0 without jobs, 4 line(s) skipped" in out


def test_an_endless_line_is_read_in_bounded_memory(tmp_path, capsys):
    """A file of one 40 MiB line without a newline (or a device such as ``/dev/zero``)
    is never held whole: the line is skipped as too long and the next one is read;
    a file that is not a regular file is refused by name."""
    import tracemalloc

    path = tmp_path / "huge.jsonl"
    good = {"kind": "event", "event": "xid", "xid": 79, "jobs": ["5"], "ts": "t", "seq": 1}
    with path.open("w") as f:
        f.write('{"kind": "event", "pad": "' + "x" * (40 << 20) + '"}\n')
        f.write(json.dumps(good) + "\n")
    tracemalloc.start()
    try:
        code = main(["ledger", "faults", str(path)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    out = capsys.readouterr().out
    assert code == 1 and out.splitlines()[0] == "job 5"
    assert "1 line(s) skipped" in out
    assert peak < 16 << 20, peak  # the line is 40 MiB
    assert main(["ledger", "faults", "/dev/zero"]) == 65
    assert "/dev/zero: not a regular file" in capsys.readouterr().err
