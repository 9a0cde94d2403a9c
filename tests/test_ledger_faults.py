"""Fault to job: every card fault event carries the jobs on its card, and ``hetpatrol
ledger faults`` lists the jobs that ran on a card that faulted, from the JSONL and from
the state files (one node's, or a directory an operator gathered), an event seen in both
counted once; files in a shared directory are read without following another user's
symlinks (root: the links are made another user's with ``os.lchown``).

Replay: fixtures/nodes/xid-79 (its kmsg.txt: XID 79 "GPU has fallen off the bus" on one
H100). The card's jobs come from a stand-in for ``squeue --json`` (the mapping itself is
tested on the recorded 22.05 output in tests/test_stray_process.py).
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
from conftest import HETPATROL

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
            stray_jobs_of=lambda card: None,
            stray_note=None,
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
        # looked up, no job on the card (the xid-79 replay's lines: `"jobs": []`)
        json.dumps({"kind": "event", "event": "xid", "xid": 79, "jobs": [], "ts": "t3"}),
    ]
    jobs, counts = faults_by_job(lines)
    assert sorted(jobs) == ["7", "8"]
    assert jobs["7"][0]["card"] == "0000:17:00.0" and jobs["7"][0]["what"] == "fallen_off_bus"
    assert counts == {"events": 3, "without_jobs": 2, "skipped": 1, "state_files": 0}


def test_unreadable_files_exit_65(tmp_path, capsys):
    assert main(["ledger", "faults", str(tmp_path / "missing.jsonl")]) == 65
    assert "missing.jsonl" in capsys.readouterr().err
    # files that are not the daemon's (the wrong directory: a README, an .xz archive) are
    # no file read: 65, not "0 fault events" and exit 0
    import lzma

    (tmp_path / "README.md").write_text("# notes\n")
    (tmp_path / "patrol.jsonl.2.xz").write_bytes(lzma.compress(b'{"kind": "event"}\n'))
    assert main(["ledger", "faults", str(tmp_path)]) == 65
    err = capsys.readouterr().err
    assert "README.md: not a JSONL log or state file (left out)" in err
    assert "patrol.jsonl.2.xz: not a JSONL log or state file (left out)" in err
    (tmp_path / "patrol.jsonl").write_text("")  # a log just rotated: read, nothing in it
    assert main(["ledger", "faults", str(tmp_path)]) == 0


# ------------------------------------------------------------------ state files
def _patrol_state(tmp_path: Path, node: str, job: str) -> tuple[Path, Path]:
    """One patrol of the xid-79 replay as node ``node`` with ``job`` on GPU 6: its state
    file and its JSONL, in ``tmp_path/<node>/``."""
    from hetpatrol.exporters.state import write_state

    p = Patroller(replace(load_config(), node=node), replay_dir=XID79)
    try:
        p.card_jobs = SimpleNamespace(
            refresh=lambda cards: None,
            error=None,
            jobs_of=lambda card: frozenset({job}) if card.index == 6 else frozenset(),
            stray_jobs_of=lambda card: None,
            stray_note=None,
        )
        report = p.run()
    finally:
        p.close()
    where = tmp_path / node
    where.mkdir()
    write_state(where / "state.json", report, 10.0)
    (where / "patrol.jsonl").write_text(
        "".join([report.patrol_line, *report.card_lines, *report.event_lines])
    )
    return where / "state.json", where / "patrol.jsonl"


def test_state_files_and_the_jsonl_count_an_event_once(tmp_path, capsys):
    state, jsonl = _patrol_state(tmp_path, "xid79-01", "4242")
    code = main(["ledger", "faults", str(state), str(jsonl), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert doc["counts"] == {
        "events": 2,
        "without_jobs": 0,
        "skipped": 0,
        "state_files": 1,
        "untrusted_files": 0,
        "foreign_files": 0,
    }
    faults = doc["jobs"]["4242"]
    assert [(f["node"], f["card"], f["what"], f["severity"]) for f in faults] == [
        ("xid79-01", "nvidia/6", "xid 79", "critical"),
        ("xid79-01", "nvidia/6", "fallen_off_bus", "critical"),
    ]
    # the state file alone says the same
    assert main(["ledger", "faults", str(state), "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["jobs"] == doc["jobs"]


def test_a_directory_of_collected_state_files(tmp_path, capsys):
    collected = tmp_path / "collected"
    collected.mkdir()
    for node, job in (("gpu-a01", "101"), ("gpu-a02", "202")):
        state, _ = _patrol_state(tmp_path, node, job)
        state.rename(collected / f"{node}.json")
    # a writer's temporary file, an indented copy (`status --json > x`), a subdirectory
    (collected / ".state.json.k2j3.tmp").write_text('{"schema": "hetpatrol.state/1", "fau')
    (collected / "sub").mkdir()
    indented = json.loads((collected / "gpu-a02.json").read_text())
    indented["node"] = "gpu-a03"
    for e in indented["fault_events"]:
        e["run_id"] = "ffffffffffff"
    (collected / "gpu-a03.json").write_text(json.dumps(indented, indent=2) + "\n")
    code = main(["ledger", "faults", str(collected)])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out[0] == "job 101" and out[3] == "job 202"
    assert [line.split()[1:4] for line in out[1:3]] == [
        ["gpu-a01", "nvidia/6", "xid"],
        ["gpu-a01", "nvidia/6", "fallen_off_bus"],
    ]
    assert {line.split()[1] for line in out[4:8]} == {"gpu-a02", "gpu-a03"}
    assert out[-1] == (
        "2 job(s) on faulted cards; 6 fault event(s), 0 without jobs, 0 line(s) skipped, "
        "3 state file(s)"
    )


def test_a_file_not_the_daemons_is_a_file_left_out_not_a_line_skipped(tmp_path, capsys):
    """The new-user trial's ``ledger faults DIR`` of a node's state directory: the
    daemon's ``daemon.log`` (no JSON) was said on stderr as left out and counted once
    more as "1 line(s) skipped", as if a line of the daemon's had been lost. A file left
    out whole is counted as one not the daemon's; "skipped" counts lines of the daemon's
    files (here its JSONL's one damaged line)."""
    state, jsonl = _patrol_state(tmp_path, "xid79-01", "4242")
    d = state.parent
    (d / "daemon.log").write_text("2026-12-01T10:00:00Z [info] patrol seq=1 cards=8\n")
    with jsonl.open("a") as fh:
        fh.write('{"kind": "event", "event": "xid", "ts": \n')  # a line cut short
    assert main(["ledger", "faults", str(d)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == (
        "1 job(s) on faulted cards; 2 fault event(s), 0 without jobs, 1 line(s) skipped, "
        "1 state file(s), 1 file(s) not the daemon's (left out)"
    )
    assert f"{d / 'daemon.log'}: not a JSONL log or state file (left out)" in err
    assert main(["ledger", "faults", str(d), "--format", "json"]) == 1
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert (counts["skipped"], counts["foreign_files"], counts["untrusted_files"]) == (1, 1, 0)


def test_damaged_and_hostile_state_files_are_refused_or_counted(tmp_path, capfd):
    state, _ = _patrol_state(tmp_path, "xid79-01", "4242")
    doc = json.loads(state.read_text())
    d = tmp_path / "shared"
    d.mkdir()
    good = doc["fault_events"][0]
    doc["node"] = "evil\x1b[2J\u202enode"
    doc["fault_events"] = [
        good,
        {**good, "jobs": "4242"},
        {**good, "kmsg_seq": "2103"},
        {**good, "ts": 7},
        "x",
    ]
    (d / "a.json").write_text(json.dumps(doc))
    (d / "b.json").write_text(json.dumps({"schema": "hetpatrol.state/1", "fault_events": 5}))
    (d / "c.json").write_text("[" * 100_000)  # nested too deep
    os.mkfifo(d / "d\x1b[2J.fifo")  # never waited on; its name printed escaped
    assert main(["ledger", "faults", str(d)]) == 1
    out, err = capfd.readouterr()
    assert "job 4242" in out and "evil\\x1b[2J\\u202enode" in out and "\x1b" not in out
    assert out.splitlines()[-1] == (
        "1 job(s) on faulted cards; 1 fault event(s), 0 without jobs, 5 line(s) skipped, "
        "2 state file(s), 1 file(s) not the daemon's (left out)"
    )
    assert "d\\x1b[2J.fifo: not a regular file" in err and "\x1b" not in err
    assert "c.json: not a JSONL log or state file (left out)" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="os.lchown to another uid needs root")
def test_another_users_symlink_is_not_followed(tmp_path, capsys):
    state, _ = _patrol_state(tmp_path, "xid79-01", "4242")
    d = tmp_path / "shared"
    d.mkdir()
    (d / "mine.json").symlink_to(state)  # root's own link: followed
    theirs = d / "theirs.json"
    theirs.symlink_to(state)
    os.lchown(theirs, 65534, 65534)
    linked_dir = tmp_path / "via"
    linked_dir.symlink_to(d)
    os.lchown(linked_dir, 65534, 65534)
    assert main(["ledger", "faults", str(d)]) == 1
    captured = capsys.readouterr()
    assert "1 state file(s)" in captured.out
    assert (
        f"refusing to read {theirs}: {theirs} is a symbolic link owned by uid 65534" in captured.err
    )
    # a directory reached through their link: none of it is read
    assert main(["ledger", "faults", str(linked_dir / "mine.json")]) == 65
    assert "is a symbolic link owned by uid 65534" in capsys.readouterr().err


def test_a_line_longer_than_the_bound_is_skipped_not_parsed(tmp_path, capsys):
    _, jsonl = _patrol_state(tmp_path, "xid79-01", "4242")
    first, rest = jsonl.read_text().split("\n", 1)
    # past the first line (which may be a state file's), a line is read up to 1 MiB
    jsonl.write_text(first + '\n{"kind": "event", "pad": "' + "x" * (2 << 20) + '"}\n' + rest)
    assert main(["ledger", "faults", str(jsonl)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == (
        "1 job(s) on faulted cards; 2 fault event(s), 0 without jobs, 1 line(s) skipped"
    )


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
    """A JSONL file with a 40 MiB line (or a device such as ``/dev/zero``) is never
    held whole: the line is skipped as too long and the next one is read; a file that
    is not a regular file is refused by name. (A file's first line may be a state
    file, read up to ``STATE_READ_MAX``; the long line here follows a JSONL line.)"""
    import tracemalloc

    path = tmp_path / "huge.jsonl"
    first = {"kind": "event", "event": "xid", "xid": 79, "jobs": ["4"], "ts": "s", "seq": 0}
    good = {"kind": "event", "event": "xid", "xid": 79, "jobs": ["5"], "ts": "t", "seq": 1}
    with path.open("w") as f:
        f.write(json.dumps(first) + "\n")
        f.write('{"kind": "event", "pad": "' + "x" * (40 << 20) + '"}\n')
        f.write(json.dumps(good) + "\n")
    tracemalloc.start()
    try:
        code = main(["ledger", "faults", str(path)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    out = capsys.readouterr().out
    assert code == 1 and out.splitlines()[0] == "job 4" and out.splitlines()[2] == "job 5"
    assert "1 line(s) skipped" in out
    assert peak < 16 << 20, peak  # the line is 40 MiB
    assert main(["ledger", "faults", "/dev/zero"]) == 65
    assert "/dev/zero: not a regular file" in capsys.readouterr().err


def test_a_state_file_of_two_million_tiny_values_is_refused_before_it_is_decoded(tmp_path, capsys):
    """A state file in a gathered directory may be anyone's: a 7 MB first line of
    ``{},{},...`` (2.1 million objects, some 150 MB once decoded; 64 MiB of them took
    1.7 GB and 26 s) is left out by its count of values, said by name, and the node's
    real state file beside it is still read."""
    import tracemalloc

    state, _ = _patrol_state(tmp_path, "xid79-01", "4242")
    d = tmp_path / "shared"
    d.mkdir()
    state.rename(d / "xid79-01.json")
    bomb = d / "a-bomb.json"
    bomb.write_text(
        '{"schema": "hetpatrol.state/1", "fault_events": [' + ",".join(["{}"] * 2_100_000) + "]}\n"
    )
    tracemalloc.start()
    try:
        code = main(["ledger", "faults", str(d)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    out, err = capsys.readouterr()
    assert code == 1 and out.splitlines()[0] == "job 4242"
    assert out.splitlines()[-1] == (
        "1 job(s) on faulted cards; 2 fault event(s), 0 without jobs, 0 line(s) skipped, "
        "1 state file(s), 1 file(s) not the daemon's (left out)"
    )
    said = [line for line in err.splitlines() if line.startswith("hetpatrol ledger faults:")]
    assert said == [
        f"hetpatrol ledger faults: {bomb}: more than 2000000 JSON values in one document "
        "(no state file the daemon writes): left out"
    ]
    assert peak < 40 << 20, peak  # the file is 6.3 MB, its bytes read twice at most


def test_a_directory_past_the_file_bound_says_so(tmp_path, capsys, monkeypatch):
    """A directory of more entries than ``MAX_DIR_FILES`` (100,000) is read up to the
    bound and says that it was cut (its other files were left out without a word)."""
    from hetpatrol.ledger import faults

    monkeypatch.setattr(faults, "MAX_DIR_FILES", 3)
    state, _ = _patrol_state(tmp_path, "xid79-01", "4242")
    d = tmp_path / "shared"
    d.mkdir()
    for i in range(5):
        (d / f"n{i}.json").write_bytes(state.read_bytes())
    assert main(["ledger", "faults", str(d)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].endswith(", 3 state file(s)")
    said = [line for line in err.splitlines() if line.startswith("hetpatrol ledger faults:")]
    assert said == [
        f"hetpatrol ledger faults: {d}: more than 3 entries: only the first 3 the "
        "directory lists are read"
    ]


def test_a_state_file_over_a_mebibyte_is_read_a_jsonl_line_is_not(tmp_path, capsys):
    """Only a first line that starts as the daemon's state file (``{"schema":
    "hetpatrol.state/...``, its first key) is read past 1 MiB: a big node's state file
    of 2 MiB is read; the same document with its keys sorted (no daemon's) is a line
    too long, skipped."""
    state, _ = _patrol_state(tmp_path, "xid79-01", "4242")
    doc = json.loads(state.read_text())
    doc["pad"] = "x" * (2 << 20)
    state.write_text(json.dumps(doc) + "\n")
    assert main(["ledger", "faults", str(state)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "job 4242" and out.endswith(", 1 state file(s)\n")
    state.write_text(json.dumps(doc, sort_keys=True) + "\n")
    assert main(["ledger", "faults", str(state)]) == 0
    assert capsys.readouterr().out == (
        "0 job(s) on faulted cards; 0 fault event(s), 0 without jobs, 1 line(s) skipped\n"
    )


def test_a_sparse_file_without_an_end_is_read_in_bounded_time(tmp_path, capsys):
    """A line longer than 1 MiB was read to its end to find the next: a sparse file of
    a terabyte after one good line (anyone can make one in a shared directory:
    ``truncate -s 1T``), or ``/proc/self/pagemap`` (a regular file of /proc, 256 GB of
    it), was read for hours. Past 64 MiB of one line the rest of the file is left out,
    said by name; what came before counts."""
    good = {"kind": "event", "event": "xid", "xid": 79, "jobs": ["5"], "ts": "t", "seq": 1}
    path = tmp_path / "sparse.jsonl"
    with path.open("w") as f:
        f.write(json.dumps(good) + "\n")
        f.truncate(1 << 40)
    start = time.monotonic()
    code = main(["ledger", "faults", str(path), "/proc/self/pagemap"])
    took = time.monotonic() - start
    out, err = capsys.readouterr()
    assert code == 1 and out.splitlines()[0] == "job 5"
    assert out.splitlines()[-1] == (
        "1 job(s) on faulted cards; 1 fault event(s), 0 without jobs, 2 line(s) skipped"
    )
    assert err == (
        f"hetpatrol ledger faults: {path}: a line over 67108864 bytes: the rest of the file "
        "left out\n"
        "hetpatrol ledger faults: /proc/self/pagemap: a line over 67108864 bytes: the rest "
        "of the file left out\n"
    )
    assert took < 30, took


def test_a_file_that_fails_to_read_is_said_by_name_and_the_others_are_read(tmp_path, capsys):
    """A read that fails (EIO: a failing disk; ``/proc/self/mem`` answers it at offset 0)
    ended the command with 'hetpatrol: Input/output error' and exit 1, no file named,
    nothing else read."""
    _, jsonl = _patrol_state(tmp_path, "xid79-01", "4242")
    assert main(["ledger", "faults", "/proc/self/mem", str(jsonl)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "job 4242"
    said = [line for line in err.splitlines() if line.startswith("hetpatrol ledger faults:")]
    assert said == [
        "hetpatrol ledger faults: /proc/self/mem: Input/output error: the rest of the file left out"
    ]


# ------------------------------------------------------------------ stdin, gzip copies
def test_stdin_and_logrotates_gzip_copies_are_read(tmp_path):
    """``zcat patrol.jsonl.1.gz | hetpatrol ledger faults -`` (or ``/dev/stdin``) said
    "No such file or directory", exit 65, and logrotate's ``.gz`` copies in a directory
    were left out. ``-`` and ``/dev/stdin`` are standard input; a gzip file is read
    through the stdlib's gzip, by itself or in a directory (job 4242 on GPU 6's XID 79)."""
    import gzip
    import subprocess

    path, _ = _patrol_jsonl(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "patrol.jsonl.2.gz").write_bytes(gzip.compress(path.read_bytes()))
    for args, stdin in (
        (["-"], path.read_bytes()),
        (["/dev/stdin"], path.read_bytes()),
        (["-"], gzip.compress(path.read_bytes())),  # `cat x.gz |`: gzip on stdin too
        ([str(logs / "patrol.jsonl.2.gz")], b""),
        ([str(logs)], b""),
    ):
        run = subprocess.run(
            [*HETPATROL, "ledger", "faults", *args],
            input=stdin,
            capture_output=True,
            timeout=120,
        )
        out = run.stdout.decode()
        assert run.returncode == 1, (args, run.stderr.decode())
        assert out.splitlines()[0] == "job 4242" and " xid 79 " in out.splitlines()[1], out
        assert "0 line(s) skipped" in out, out


def test_a_gzip_bomb_is_cut_at_the_decompressed_bound(tmp_path, capsys, monkeypatch):
    """The bound is on the DECOMPRESSED bytes: a 64 KB gzip file of one fault line, then
    64 MiB of blanks (about 1,000:1), then a second fault line is read to the bound
    (here 1 MiB) and no further: the first job counted, the second never reached, said on
    stderr. A gzip copy cut short is said, its lines before the cut read."""
    import gzip
    import time as _time
    import zlib

    from hetpatrol.ledger import faults

    monkeypatch.setattr(faults, "MAX_GZIP_BYTES", 1 << 20)
    one = {"kind": "event", "event": "xid", "xid": 79, "jobs": ["4"], "ts": "s", "seq": 0}
    two = {"kind": "event", "event": "xid", "xid": 79, "jobs": ["5"], "ts": "t", "seq": 1}
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header and trailer
    data = [packer.compress((json.dumps(one) + "\n").encode())]
    block = b" " * (8 << 20) + b"\n"  # blank lines of 8 MiB: each skipped as too long
    data += [packer.compress(block) for _ in range(8)]
    data += [packer.compress((json.dumps(two) + "\n").encode()), packer.flush()]
    bomb = tmp_path / "patrol.jsonl.3.gz"
    bomb.write_bytes(b"".join(data))
    assert bomb.stat().st_size < 200_000
    started = _time.monotonic()
    code = main(["ledger", "faults", str(bomb)])
    assert _time.monotonic() - started < 20
    out, err = capsys.readouterr()
    assert code == 1 and out.splitlines()[0] == "job 4" and "job 5" not in out, out
    assert f"more than {1 << 20} bytes decompressed" in err, err
    # without the bounds both are read: the test sees the cut, not an unreadable file
    monkeypatch.setattr(faults, "MAX_GZIP_BYTES", 1 << 30)
    monkeypatch.setattr(faults, "MAX_GZIP_RATIO", 10_000)
    assert main(["ledger", "faults", str(bomb)]) == 1
    out = capsys.readouterr().out
    assert "job 5" in out and "8 line(s) skipped" in out, out
    # cut short (a copy taken while logrotate compressed): the lines before, and said
    whole = gzip.compress((json.dumps(one) + "\n").encode() + b"x" * 5000)
    cut = tmp_path / "patrol.jsonl.4.gz"
    cut.write_bytes(whole[: len(whole) - 12])
    assert main(["ledger", "faults", str(cut)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "job 4" and "damaged gzip file" in err, err


def _replayed_day_log(tmp_path: Path, patrols: int) -> bytes:
    """The most compressible log the daemon writes: one patrol of the 16-card
    healthy-mixed replay written ``patrols`` times with its own time and seq each (a
    replay: the same values every patrol), with xid-79's fault line (job 4242) last."""
    p = Patroller(
        replace(load_config(), node="mixed-01"),
        replay_dir=REPO / "fixtures" / "nodes" / "healthy-mixed",
    )
    try:
        report = p.run()
    finally:
        p.close()
    one = "".join([report.patrol_line, *report.card_lines])
    ts = json.loads(report.patrol_line)["ts"]
    out = []
    for n in range(patrols):
        stamp = f"2026-12-01T{n // 360 % 24:02d}:{n // 6 % 60:02d}:{n % 6 * 10:02d}.{n % 1000:03d}Z"
        out.append(one.replace(ts, stamp).replace('"seq":1,', f'"seq":{n + 1},'))
    _, events = _patrol_jsonl(tmp_path)
    out.append(json.dumps(events[0]) + "\n")
    return "".join(out).encode()


def test_a_gzip_bomb_is_cut_by_its_ratio_a_real_log_is_not(tmp_path, capsys, monkeypatch):
    """Deflate packs up to 1032:1; the daemon's lines 74:1 at most (the identical
    patrols of a replay), a log of one patrol repeated byte for byte but its time and
    seq ~110:1. Past the floor (here 1 MiB instead of 16 MiB, so that a few
    MB show it), a file giving more than 250 bytes per compressed byte is cut, said
    with both sizes, in a fraction of the time the whole bomb would take; the replayed
    log, the most compressible the daemon writes, is read to its end."""
    import gzip
    import time as _time
    import zlib

    from hetpatrol.ledger import faults

    monkeypatch.setattr(faults, "GZIP_RATIO_FLOOR", 1 << 20)
    log = _replayed_day_log(tmp_path, 300)
    real = tmp_path / "patrol.jsonl.2.gz"
    real.write_bytes(gzip.compress(log, 6))  # logrotate's compress: gzip -6
    # ~110:1: more than the daemon's own replayed log (74:1), whose durations vary
    assert 80 < len(log) / real.stat().st_size < 150
    assert main(["ledger", "faults", str(real)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "job 4242" and "decompressed" not in err, err
    assert "0 line(s) skipped" in out

    one = {"kind": "event", "event": "xid", "xid": 79, "jobs": ["4"], "ts": "s", "seq": 0}
    two = {"kind": "event", "event": "xid", "xid": 79, "jobs": ["5"], "ts": "t", "seq": 1}
    bomb = tmp_path / "patrol.jsonl.3.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header and trailer
    data = [packer.compress((json.dumps(one) + "\n").encode())]
    block = b" " * (8 << 20) + b"\n"  # 64 MiB of blank lines, each skipped as too long
    data += [packer.compress(block) for _ in range(8)]
    data += [packer.compress((json.dumps(two) + "\n").encode()), packer.flush()]
    bomb.write_bytes(b"".join(data))
    body = 8 * len(block)
    assert body / bomb.stat().st_size > 900  # deflate's most, about 1000:1
    started = _time.monotonic()
    code = main(["ledger", "faults", str(bomb)])
    assert _time.monotonic() - started < 20
    out, err = capsys.readouterr()
    assert code == 1 and out.splitlines()[0] == "job 4" and "job 5" not in out, out
    assert f"{bomb}: " in err and "more than 250 times as many" in err, err
    assert "a gzip bomb, no log the daemon wrote" in err
    cut = re.search(r"(\d+) bytes decompressed from (\d+)", err)
    assert cut and int(cut[1]) <= (1 << 20) + 250 * int(cut[2]) + (1 << 20) + 1, err
    assert int(cut[1]) < body // 2  # cut early, not at the end
