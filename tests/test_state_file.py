"""The state file (and the baseline file) against hostile paths and contents: FIFOs and
devices where a file should be, missing directories, forged times and verdicts.
``check`` and ``status`` read the same file the same way and agree on every case."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
from conftest import HETPATROL, NODES
from fakes import Scripted, make_patroller

from hetpatrol.cli import main
from hetpatrol.config import load_config
from hetpatrol.daemon import Daemon
from hetpatrol.exporters import state
from hetpatrol.exporters.state import read_state, write_atomic, write_state
from hetpatrol.healthcheck import check
from hetpatrol.patrol import Patroller

REFUSED = "not a regular file: refusing to replace it"


def run(*args: str) -> subprocess.CompletedProcess:
    # the timeout only turns a hang into a failure; nothing here measures time
    return subprocess.run([*HETPATROL, *args], capture_output=True, text=True, timeout=60)


def good_state(path: Path) -> dict:
    write_state(path, make_patroller(load_config(), {"ascend": Scripted()}).run(), 10)
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------ writes


def test_write_atomic_leaves_a_fifo_and_a_symlink_to_it_alone(tmp_path):
    fifo, link = tmp_path / "fifo", tmp_path / "link"
    os.mkfifo(fifo)
    link.symlink_to(fifo)
    with pytest.raises(OSError) as caught:
        write_atomic(fifo, b"{}\n")
    assert (caught.value.errno, caught.value.strerror) == (errno.EEXIST, REFUSED)
    assert caught.value.filename == str(fifo)
    with pytest.raises(OSError) as caught:  # a link is refused as a link, never followed
        write_atomic(link, b"{}\n")
    assert (caught.value.errno, caught.value.strerror) == (errno.EPERM, "it is a symbolic link")
    assert caught.value.filename == str(link)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.readlink(link) == str(fifo)
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link"]  # no temporary file left


def test_write_atomic_makes_parent_directories_only_when_asked(tmp_path):
    target = tmp_path / "a" / "b" / "x.yaml"
    with pytest.raises(FileNotFoundError):
        write_atomic(target, b"x\n")
    assert not (tmp_path / "a").exists()
    write_atomic(target, b"x\n", make_parents=True)  # the daemon's own directories
    assert target.read_bytes() == b"x\n"


def test_baseline_write_to_a_fifo_or_a_missing_directory_exits_73(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    res = run("baseline", "--replay", str(NODES / "healthy-mixed"), "--write", str(fifo))
    assert res.returncode == 73
    assert res.stderr == f"hetpatrol baseline: cannot write {fifo}: {REFUSED}\n"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    missing = tmp_path / "missing" / "dir" / "x.yaml"
    res = run("baseline", "--replay", str(NODES / "healthy-mixed"), "--write", str(missing))
    assert res.returncode == 73
    assert res.stderr == f"hetpatrol baseline: cannot write {missing}: No such file or directory\n"
    assert sorted(os.listdir(tmp_path)) == ["fifo"]


def _daemon(state_path: Path) -> Daemon:
    return Daemon(
        load_config(),
        replay_dir=NODES / "healthy-mixed",
        overrides={
            "listen": "127.0.0.1:0",
            "jsonl_path": state_path.parent / "patrol.jsonl",
            "state_path": state_path,
        },
    )


def test_daemon_counts_a_fifo_state_path_as_a_write_error_and_keeps_patrolling(tmp_path):
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    daemon = _daemon(fifo)
    try:
        daemon.patrol_once()
        daemon.patrol_once()
        assert (daemon.patrols, daemon.stats.state_write_errors) == (2, 2)
    finally:
        daemon.shutdown()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    fresh = tmp_path / "new" / "state" / "state.json"  # its own directory: still made
    daemon = _daemon(fresh)
    try:
        daemon.patrol_once()
    finally:
        daemon.shutdown()
    assert read_state(fresh)["seq"] == 1


def test_state_file_and_jsonl_log_have_one_mode_the_textfile_stays_world_readable(tmp_path):
    """Both name the user and Slurm job of each process on a card: 0640, whatever the
    umask (a permissive 0000 included). The node_exporter textfile is read by another
    user: 0644 (what it carries is governed by ``metrics_user_labels``)."""
    state_path = tmp_path / "state" / "state.json"
    daemon = Daemon(
        load_config(),
        replay_dir=NODES / "healthy-mixed",
        overrides={
            "listen": "127.0.0.1:0",
            "jsonl_path": tmp_path / "log" / "patrol.jsonl",
            "state_path": state_path,
            "textfile_path": tmp_path / "textfile" / "hetpatrol.prom",
        },
    )
    old = os.umask(0)
    try:
        daemon.patrol_once()
    finally:
        os.umask(old)
        daemon.shutdown()
    modes = {
        name: stat.S_IMODE(os.stat(path).st_mode)
        for name, path in (
            ("state", state_path),
            ("jsonl", tmp_path / "log" / "patrol.jsonl"),
            ("textfile", tmp_path / "textfile" / "hetpatrol.prom"),
        )
    }
    assert modes == {"state": 0o640, "jsonl": 0o640, "textfile": 0o644}


# ------------------------------------------------------------------------------- reads


def test_check_and_status_refuse_a_fifo_at_once(tmp_path):
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    res = run("check", "--state-path", str(fifo))
    assert (res.returncode, res.stdout) == (
        3,
        f"HETPATROL UNKNOWN - cannot read state file {fifo}: not a regular file\n",
    )
    res = run("status", "--state-path", str(fifo))
    assert (res.returncode, res.stdout) == (3, "")
    assert res.stderr.splitlines()[0] == (
        f"hetpatrol status: cannot read the state file {fifo}: "
        f"[Errno 22] not a regular file: '{fifo}'"
    )


def test_check_refuses_a_character_device():
    assert check(Path("/dev/null")) == (
        3,
        "HETPATROL UNKNOWN - cannot read state file /dev/null: not a regular file",
    )


def test_read_state_reads_a_bounded_size(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    doc = good_state(path)
    text = json.dumps(doc)
    monkeypatch.setattr(state, "STATE_READ_MAX", len(text) + 10)
    path.write_text(text + " " * 10)  # at the bound: read
    assert read_state(path) == doc
    path.write_text(text + " " * 11)  # one byte over
    with pytest.raises(ValueError) as caught:
        read_state(path)
    assert str(caught.value) == f"{path} is larger than {len(text) + 10} bytes"


# ------------------------------------------------------------- status agrees with check


STALE = "  STALE: is the daemon running?"


def _status(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()  # what came before (a patrol's log lines) is not status's
    code = main(["status", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("case", "expected", "when"),
    [
        ("interval nan, old", 3, "OK   patrol 1, verdict 60 min old" + STALE),
        ("interval inf, old", 3, "OK   patrol 1, verdict 60 min old" + STALE),
        # an interval no daemon can run keeps no verdict fresh (the 60 s default applies)
        ("interval 1e300, old", 3, "OK   patrol 1, verdict 60 min old (every 1e+300 s)" + STALE),
        ("interval 2 days, old", 3, "OK   patrol 1, verdict 60 min old (every 172800 s)" + STALE),
        ("interval true, old", 3, "OK   patrol 1, verdict 60 min old" + STALE),
        ("finished nan", 3, "OK   patrol 1, verdict time unknown (every 10 s)" + STALE),
        ("finished missing", 3, "OK   patrol 1, verdict time unknown (every 10 s)" + STALE),
        ("finished in a day", 3, "OK   patrol 1, verdict time unknown (every 10 s)" + STALE),
        ("exit_code true", 3, "OK   patrol 1, verdict 0 s old (every 10 s)"),
        ("exit_code lies", 2, "CRITICAL   patrol 1, verdict 0 s old (every 10 s)"),
    ],
)
def test_status_and_check_agree_on_a_forged_state_file(tmp_path, capsys, case, expected, when):
    path = tmp_path / "state.json"
    doc = good_state(path)
    del doc["boot_id"], doc["finished_boot"]  # the wall clock's rules (another boot's file)
    now = time.time()
    doc.update(
        {
            "interval nan, old": {"interval_seconds": float("nan"), "finished": now - 3600},
            "interval inf, old": {"interval_seconds": float("inf"), "finished": now - 3600},
            "interval 1e300, old": {"interval_seconds": 1e300, "finished": now - 3600},
            "interval 2 days, old": {"interval_seconds": 172800, "finished": now - 3600},
            "interval true, old": {"interval_seconds": True, "finished": now - 3600},
            "finished nan": {"finished": float("nan")},
            "finished missing": {},
            "finished in a day": {"finished": now + 86400},
            "exit_code true": {"exit_code": True, "finished": now},
            "exit_code lies": {"exit_code": 0, "health": "critical", "finished": now},
        }[case]
    )
    if case == "finished missing":
        del doc["finished"]
    path.write_text(json.dumps(doc))
    assert check(path)[0] == expected
    code, out, _ = _status(capsys, "--state-path", str(path), "--color", "never")
    assert code == expected
    assert out.splitlines()[0] == f"node n1  {when}"
    code, out, _ = _status(capsys, "--state-path", str(path), "--json")
    assert code == expected
    shown = json.loads(out)
    assert shown["stale"] is (case not in ("exit_code true", "exit_code lies"))
    if "finished" in case:
        assert shown["age_seconds"] is None


def test_a_state_file_nested_too_deep_is_damaged_in_one_line(tmp_path, capsys):
    path = tmp_path / "state.json"
    path.write_text("[" * 200000 + "]" * 200000)
    why = f"{path} is nested too deep to be a state file"
    assert check(path) == (3, f"HETPATROL UNKNOWN - cannot read state file {path}: {why}")
    code, out, err = _status(capsys, "--state-path", str(path))
    assert (code, out, err) == (
        3,
        "",
        f"hetpatrol status: the state file {path} is damaged: {why}\n",
    )


def test_state_bytes_are_the_state_document_without_decoding_the_card_lines():
    from hetpatrol.exporters.state import state_bytes, state_document

    for scenario in ("sick-mixed", "ascend-a3-only", "ascend-dcmi-error"):
        patroller = Patroller(load_config(), replay_dir=NODES / scenario)
        try:
            report = patroller.run()
        finally:
            patroller.close()
        data = state_bytes(report, 10.0)
        assert data.endswith(b"}\n") and data.count(b"\n") == 1
        assert json.loads(data) == state_document(report, 10.0)


def test_a_world_readable_state_file_from_before_becomes_private(tmp_path):
    # an older hetpatrol wrote 0644: the next write must not keep that mode
    path = tmp_path / "state.json"
    path.write_text("{}")
    path.chmod(0o644)
    patroller = Patroller(load_config(), replay_dir=NODES / "healthy-mixed")
    try:
        write_state(path, patroller.run(), 10.0)
    finally:
        patroller.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_huge_raw_output_is_kept_as_a_bounded_excerpt_size_and_hash(base_config, tmp_path):
    """A tool that printed 14 MB of garbage had all of it copied into every patrol line and
    the state file (15 MB per patrol). Kept now: its first 3072 and last 1024 characters,
    its size and its SHA-256 (docs/record.md)."""
    import hashlib

    import jsonschema

    from hetpatrol.collector import CollectorError
    from hetpatrol.schema import patrol_json_schema

    garbage = "dcmi module initialize failed. ret is -8005\n" + "x" * 14_000_000 + "\nEND"
    sick = Scripted()
    sick.mode = "fail"
    real = sick.collect

    def collect():
        try:
            return real()
        except CollectorError as exc:
            raise CollectorError(str(exc), raw=garbage) from None

    sick.collect = collect
    p = make_patroller(base_config, {"scripted": sick}, timeout=5)
    try:
        report = p.run()
    finally:
        p.close()
    line = json.loads(report.patrol_line)
    status = line["collectors"]["scripted"]
    assert len(report.patrol_line) < 10_000
    assert status["raw"].startswith("dcmi module initialize failed. ret is -8005\nxxx")
    assert status["raw"].endswith("xxx\nEND")
    assert f"[... {len(garbage) - 4096} bytes left out ...]" in status["raw"]
    assert status["raw_bytes"] == len(garbage)
    assert status["raw_sha256"] == hashlib.sha256(garbage.encode()).hexdigest()
    jsonschema.validate(line, patrol_json_schema())
    path = tmp_path / "state.json"
    write_state(path, report, 10.0)
    assert path.stat().st_size < 20_000
    assert read_state(path)["collectors"]["scripted"]["raw_bytes"] == len(garbage)
