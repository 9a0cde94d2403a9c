"""The JSONL sink: whole lines, torn-tail repair, rotation, following an external rotation."""

from __future__ import annotations

import json
import os

from hetpatrol.exporters.jsonl import JsonlSink, repair_torn_tail


def lines(n, start=0):
    return [json.dumps({"seq": i, "pad": "x" * 40}) + "\n" for i in range(start, start + n)]


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_append_whole_lines(tmp_path):
    path = tmp_path / "sub" / "patrol.jsonl"
    sink = JsonlSink(path)
    assert sink.write_lines(lines(3)) == 3
    assert sink.write_lines(lines(2, 3)) == 2
    sink.close()
    assert [d["seq"] for d in read(path)] == [0, 1, 2, 3, 4]
    assert sink.lines_written == 5 and sink.write_errors == 0


def test_torn_tail_is_repaired_on_open(tmp_path):
    path = tmp_path / "patrol.jsonl"
    path.write_text("".join(lines(2)) + '{"seq": 2, "pad": "xx')
    sink = JsonlSink(path)
    sink.write_lines(lines(1, 3))
    sink.close()
    assert [d["seq"] for d in read(path)] == [0, 1, 3]
    assert sink.repaired_bytes == len('{"seq": 2, "pad": "xx')


def test_repair_of_a_file_with_only_a_torn_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"x" * 100_000)  # longer than one read-back chunk
    assert repair_torn_tail(path) == 100_000
    assert path.read_bytes() == b""
    assert repair_torn_tail(tmp_path / "missing") == 0


def test_size_rotation_keeps_every_line(tmp_path):
    path = tmp_path / "patrol.jsonl"
    sink = JsonlSink(path, max_bytes=500, backups=20)
    for batch in range(10):
        sink.write_lines(lines(3, batch * 3))
    sink.close()
    files = sorted(
        tmp_path.iterdir(), key=lambda p: -int(p.suffix[1:]) if p.suffix != ".jsonl" else 0
    )
    seqs = [d["seq"] for f in files for d in read(f)]
    assert sorted(seqs) == list(range(30))
    for f in files:
        assert f.stat().st_size <= 500
        # a patrol's lines stay together in one file
        got = [d["seq"] for d in read(f)]
        assert len(got) % 3 == 0


def test_rotation_drops_only_beyond_backups(tmp_path):
    path = tmp_path / "patrol.jsonl"
    sink = JsonlSink(path, max_bytes=200, backups=2)
    for batch in range(6):
        sink.write_lines(lines(2, batch * 2))
    sink.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "patrol.jsonl",
        "patrol.jsonl.1",
        "patrol.jsonl.2",
    ]


def test_external_rename_is_followed(tmp_path):
    path = tmp_path / "patrol.jsonl"
    sink = JsonlSink(path)
    sink.write_lines(lines(2))
    os.rename(path, tmp_path / "patrol.jsonl.1")  # logrotate without copytruncate
    sink.write_lines(lines(2, 2))
    sink.close()
    assert [d["seq"] for d in read(tmp_path / "patrol.jsonl.1")] == [0, 1]
    assert [d["seq"] for d in read(path)] == [2, 3]


def test_unwritable_directory_counts_errors_and_resumes(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    sink = JsonlSink(blocker / "patrol.jsonl")
    assert sink.write_lines(lines(2)) == 0
    assert sink.write_lines(lines(2)) == 0
    assert sink.write_errors == 4
    blocker.unlink()
    blocker.mkdir()
    assert sink.write_lines(lines(1)) == 1
    sink.close()
    assert [d["seq"] for d in read(blocker / "patrol.jsonl")] == [0]


def test_a_fifo_at_the_path_is_refused_without_blocking(tmp_path):
    import signal

    fifo = tmp_path / "patrol.jsonl"
    os.mkfifo(fifo)
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError()))
    signal.alarm(10)  # a blocking open would hang the test: fail it instead
    try:
        sink = JsonlSink(fifo)
        assert sink.write_lines(lines(2)) == 0
        assert sink.write_errors == 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
