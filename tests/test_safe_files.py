"""Writing files where another user could plant links (issue 21, item 2).

The trial: another user makes the directory first (``/tmp/hetpatrol``, as an old README
said) and puts symlinks there to a victim's files. The daemon must not truncate the
victim's file to its pid (the lock), append patrol lines to it (the JSONL log) or
replace it (state file, textfile, baseline, ledger textfile). These tests run as root:
"another user" is uid 65534 (``nobody``), made with ``os.chown`` / ``os.lchown``, and the
links are real symlinks. Each victim file is checked byte for byte afterwards.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import HETPATROL, NODES

from hetpatrol import safe_files
from hetpatrol.daemon import claim_path
from hetpatrol.exporters.jsonl import JsonlSink, repair_torn_tail
from hetpatrol.exporters.state import write_atomic
from hetpatrol.safe_files import UnsafePath, check_directory, make_directories

NOBODY = 65534
VICTIM = b"the victim's own data\nsecond line, no newline at the end"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="os.chown to another uid needs root")


def victim(tmp_path: Path, name: str = "victim") -> Path:
    home = tmp_path / "home-of-victim"
    home.mkdir(exist_ok=True)
    path = home / name
    path.write_bytes(VICTIM)
    return path


def others_dir(tmp_path: Path, name: str = "hetpatrol", mode: int = 0o755) -> Path:
    """A directory another user made first (``/tmp/hetpatrol``), with links of theirs."""
    d = tmp_path / name
    d.mkdir()
    os.chmod(d, mode)
    os.chown(d, NOBODY, NOBODY)
    return d


def plant(link: Path, target: Path) -> None:
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)


def sticky_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tmp"
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


# --------------------------------------------------------------------------- the rules


def test_directories_owned_or_writable_by_others_are_refused_and_say_why(tmp_path, monkeypatch):
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o755)
    assert check_directory(ours) is False
    theirs = others_dir(tmp_path)
    with pytest.raises(UnsafePath) as caught:
        check_directory(theirs, theirs / "patrol.jsonl")
    assert caught.value.errno == errno.EPERM
    assert str(caught.value) == (
        f"refusing to write {theirs / 'patrol.jsonl'}: directory {theirs} is owned by "
        "uid 65534 (nobody), not root or this user"
    )
    group = tmp_path / "group-writable"
    group.mkdir()
    os.chmod(group, 0o775)
    os.chown(group, 0, 54329)  # a group nobody can look up
    with pytest.raises(UnsafePath, match="writable by its group gid 54329 .mode 0775, no sti"):
        check_directory(group)
    os.chown(group, 0, 0)  # root's group, no login user in it
    assert check_directory(group) is True  # Ubuntu's /var/log (root:syslog 0775): fine
    safe_files._group_answers.clear()
    monkeypatch.setattr(safe_files, "group_members", lambda gid: {0, 104, 1001})
    with pytest.raises(UnsafePath, match=r"writable by its group gid 0 \(root\) .mode 0775"):
        check_directory(group)  # a login user (uid 1001) in the group
    safe_files._group_answers.clear()
    world = tmp_path / "world-writable"
    world.mkdir()
    os.chmod(world, 0o777)
    with pytest.raises(UnsafePath, match="writable by others .mode 0777"):
        check_directory(world)
    assert check_directory(sticky_dir(tmp_path)) is True  # /tmp: shared, files must be ours


def test_an_ancestor_or_a_link_of_another_user_on_the_way_is_refused(tmp_path):
    theirs = others_dir(tmp_path)
    inner = theirs / "inner"
    inner.mkdir()  # root's, but inside nobody's directory: nobody can rename it away
    with pytest.raises(UnsafePath, match=f"directory {theirs} is owned by uid 65534"):
        check_directory(inner)
    ours = tmp_path / "ours"
    ours.mkdir()
    tmp = sticky_dir(tmp_path)
    plant(tmp / "hetpatrol", ours)  # nobody's link in /tmp to a directory that is fine
    with pytest.raises(UnsafePath, match="is a symbolic link owned by uid 65534"):
        check_directory(tmp / "hetpatrol")
    (tmp / "mine").symlink_to(theirs)  # our own link, but to nobody's directory
    with pytest.raises(UnsafePath, match=f"directory {theirs} is owned"):
        check_directory(tmp / "mine")
    (tmp / "fine").symlink_to(ours)  # our link to our directory
    assert check_directory(tmp / "fine") is False


def test_no_directory_is_made_inside_another_users_directory(tmp_path):
    theirs = others_dir(tmp_path)
    with pytest.raises(UnsafePath):
        make_directories(theirs / "a" / "b")
    assert list(theirs.iterdir()) == []
    assert make_directories(tmp_path / "x" / "y") is False
    assert (tmp_path / "x" / "y").is_dir()


# ------------------------------------------------------------------------ the JSONL log


def test_jsonl_sink_never_appends_through_another_users_link(tmp_path, capsys):
    target = victim(tmp_path)
    theirs = others_dir(tmp_path)
    plant(theirs / "patrol.jsonl", target)
    sink = JsonlSink(theirs / "patrol.jsonl")
    assert sink.write_lines(['{"kind":"patrol"}\n', '{"kind":"card"}\n']) == 0
    assert sink.write_errors == 2
    sink.close()
    assert target.read_bytes() == VICTIM  # not appended to, torn tail not cut
    err = capsys.readouterr().err
    assert "jsonl_write_failed" in err and "owned by uid 65534" in err


def test_jsonl_sink_refuses_a_link_even_in_its_own_directory(tmp_path):
    target = victim(tmp_path)
    d = tmp_path / "log"
    d.mkdir()
    (d / "patrol.jsonl").symlink_to(target)
    sink = JsonlSink(d / "patrol.jsonl")
    assert sink.write_lines(['{"kind":"patrol"}\n']) == 0
    assert sink.failures.errors == 1
    assert target.read_bytes() == VICTIM
    with pytest.raises(OSError) as caught:  # the torn-tail repair does not follow it either
        repair_torn_tail(d / "patrol.jsonl")
    assert caught.value.errno == errno.ELOOP
    assert target.read_bytes() == VICTIM


def test_jsonl_sink_in_a_sticky_directory_writes_only_its_own_file(tmp_path):
    tmp = sticky_dir(tmp_path)
    planted = tmp / "patrol.jsonl"
    planted.write_bytes(b"")
    os.chown(planted, NOBODY, NOBODY)  # nobody's file, made first
    sink = JsonlSink(planted)
    assert sink.write_lines(['{"kind":"patrol"}\n']) == 0
    assert planted.read_bytes() == b""
    # a hard link to the victim's (root's) file, made in the shared directory
    target = victim(tmp_path)
    os.link(target, tmp / "hard.jsonl")
    sink = JsonlSink(tmp / "hard.jsonl")
    assert sink.write_lines(['{"kind":"patrol"}\n']) == 0
    assert target.read_bytes() == VICTIM
    # a file of its own there is fine (as in /tmp)
    sink = JsonlSink(tmp / "mine.jsonl")
    assert sink.write_lines(['{"kind":"patrol"}\n']) == 1
    sink.close()
    assert (tmp / "mine.jsonl").read_bytes() == b'{"kind":"patrol"}\n'


def test_jsonl_sink_refuses_a_link_put_at_the_path_while_it_runs(tmp_path):
    """A path swapped for a link between patrols (after a rotation, say): the sink sees
    another inode, reopens, refuses, and the lines are counted lost, not appended."""
    target = victim(tmp_path)
    d = tmp_path / "log"
    d.mkdir()
    sink = JsonlSink(d / "patrol.jsonl")
    assert sink.write_lines(['{"seq":1}\n']) == 1
    (d / "patrol.jsonl").rename(d / "patrol.jsonl.1")
    (d / "patrol.jsonl").symlink_to(target)
    assert sink.write_lines(['{"seq":2}\n']) == 0
    sink.close()
    assert target.read_bytes() == VICTIM
    assert (d / "patrol.jsonl.1").read_bytes() == b'{"seq":1}\n'


def test_jsonl_rotation_without_backups_truncates_its_own_file_not_a_link(tmp_path):
    d = tmp_path / "log"
    d.mkdir()
    sink = JsonlSink(d / "patrol.jsonl", max_bytes=30, backups=0)
    assert sink.write_lines(['{"seq":1,"pad":"xxxxxxxx"}\n']) == 1
    assert sink.write_lines(['{"seq":2,"pad":"xxxxxxxx"}\n']) == 1
    sink.close()
    assert (d / "patrol.jsonl").read_bytes() == b'{"seq":2,"pad":"xxxxxxxx"}\n'


# ------------------------------------------------------------ short writes (mutation audit)


def short_writes(monkeypatch, sink: JsonlSink, keep: int) -> list[int]:
    """``os.write`` on the sink's descriptor takes only ``keep`` bytes (a disk that
    fills mid-line); other descriptors write normally. Returns the short counts seen."""
    real = os.write
    seen: list[int] = []

    def write(fd, data):
        if fd == sink._fd and len(data) > keep:
            seen.append(real(fd, bytes(data[:keep])))
            return seen[-1]
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    return seen


def test_a_short_write_leaves_no_partial_line(tmp_path, monkeypatch):
    path = tmp_path / "patrol.jsonl"
    sink = JsonlSink(path)
    assert sink.write_lines(['{"seq":0}\n', '{"seq":1}\n']) == 2
    seen = short_writes(monkeypatch, sink, keep=4)
    assert sink.write_lines(['{"seq":2,"pad":"xxxx"}\n', '{"seq":3}\n']) == 0
    assert seen == [4]  # four bytes of the line did reach the file, and were cut again
    assert path.read_bytes() == b'{"seq":0}\n{"seq":1}\n'  # the line is absent, not torn
    assert sink.write_errors == 2
    monkeypatch.undo()
    assert sink.write_lines(['{"seq":4}\n']) == 1
    sink.close()
    assert path.read_bytes() == b'{"seq":0}\n{"seq":1}\n{"seq":4}\n'


def test_a_short_write_after_copytruncate_cuts_at_the_files_real_end(tmp_path, monkeypatch):
    """logrotate's ``copytruncate`` empties the file under the open descriptor (same
    inode: no reopen). A short write then must cut back to where its line began in the
    file as it is now, not to the size the sink saw before: that pads the file with NUL
    bytes and leaves the torn line in it."""
    path = tmp_path / "patrol.jsonl"
    sink = JsonlSink(path)
    assert sink.write_lines(['{"seq":0,"pad":"' + "x" * 200 + '"}\n']) == 1
    os.truncate(path, 0)  # copytruncate
    assert sink.write_lines(['{"seq":1}\n']) == 1
    short_writes(monkeypatch, sink, keep=5)
    assert sink.write_lines(['{"seq":2,"pad":"xxxx"}\n']) == 0
    monkeypatch.undo()
    assert path.read_bytes() == b'{"seq":1}\n'
    sink.close()


# ------------------------------------------------------------------ the daemon's lock


def test_the_lock_never_truncates_a_victims_file_to_the_daemons_pid(tmp_path):
    target = victim(tmp_path)
    theirs = others_dir(tmp_path)
    plant(theirs / ".patrol.jsonl.lock", target)
    with pytest.raises(UnsafePath, match="its lock .*owned by uid 65534"):
        claim_path(theirs / "patrol.jsonl")
    assert target.read_bytes() == VICTIM
    d = tmp_path / "ours"
    d.mkdir()
    (d / ".state.json.lock").symlink_to(target)  # a link in its own directory too
    with pytest.raises(UnsafePath, match="it is a symbolic link"):
        claim_path(d / "state.json")
    assert target.read_bytes() == VICTIM
    fd = claim_path(d / "patrol.jsonl")  # a lock of its own: made, holds the pid
    try:
        assert (d / ".patrol.jsonl.lock").read_text() == f"{os.getpid()}\n"
    finally:
        os.close(fd)


def test_the_daemon_refuses_to_start_on_another_users_directory(tmp_path):
    """The README's old quick start, after someone else made ``/tmp/hetpatrol``: the
    daemon exits 73 at once, saying which directory and why; no victim file changes."""
    targets = [victim(tmp_path, f"v{i}") for i in range(3)]
    theirs = others_dir(tmp_path)
    plant(theirs / "patrol.jsonl", targets[0])
    plant(theirs / ".patrol.jsonl.lock", targets[1])
    plant(theirs / "state.json", targets[2])
    for extra in (
        ["--state-path", str(theirs / "state.json")],
        ["--state-path", str(tmp_path / "own" / "state.json")],
    ):
        run = subprocess.run(
            [
                *HETPATROL,
                "run",
                "--replay",
                str(NODES / "healthy-mixed"),
                "--listen",
                "127.0.0.1:0",
                "--jsonl-path",
                str(theirs / "patrol.jsonl"),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 73, run.stderr
        assert run.stderr.strip().splitlines()[-1] == (
            f"hetpatrol: refusing to write {theirs / 'patrol.jsonl'}: its lock "
            f"{theirs / '.patrol.jsonl.lock'}: directory {theirs} is owned by uid 65534 "
            "(nobody), not root or this user"
        )
    for t in targets:
        assert t.read_bytes() == VICTIM
    # the textfile's directory is checked at start too
    run = subprocess.run(
        [
            *HETPATROL,
            "run",
            "--replay",
            str(NODES / "healthy-mixed"),
            "--listen",
            "127.0.0.1:0",
            "--jsonl-path",
            str(tmp_path / "own" / "patrol.jsonl"),
            "--state-path",
            str(tmp_path / "own" / "state.json"),
            "--textfile-path",
            str(theirs / "hetpatrol.prom"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 73, run.stderr
    assert f"refusing to write {theirs / 'hetpatrol.prom'}: directory {theirs}" in run.stderr


# ------------------------------------------- state file, textfile, baseline, ledger textfile


def test_atomic_writes_refuse_other_users_directories_files_and_links(tmp_path):
    target = victim(tmp_path)
    theirs = others_dir(tmp_path)
    with pytest.raises(UnsafePath, match="owned by uid 65534"):
        write_atomic(theirs / "state.json", b"{}\n")
    with pytest.raises(UnsafePath, match="owned by uid 65534"):
        write_atomic(theirs / "sub" / "state.json", b"{}\n", make_parents=True)
    assert list(theirs.iterdir()) == []  # no temporary file, no directory made
    tmp = sticky_dir(tmp_path)
    plant(tmp / "hetpatrol.prom", target)
    with pytest.raises(UnsafePath, match="it is a symbolic link"):
        write_atomic(tmp / "hetpatrol.prom", b"x 1\n")
    assert os.readlink(tmp / "hetpatrol.prom") == str(target)  # left, not replaced
    (tmp / "state.json").write_bytes(b"theirs\n")
    os.chown(tmp / "state.json", NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match="the file is owned by uid 65534"):
        write_atomic(tmp / "state.json", b"{}\n")
    assert (tmp / "state.json").read_bytes() == b"theirs\n"
    assert target.read_bytes() == VICTIM
    write_atomic(tmp / "mine.json", b"{}\n", mode=0o640)  # its own file in /tmp is fine
    assert (tmp / "mine.json").read_bytes() == b"{}\n"
    assert stat.S_IMODE((tmp / "mine.json").stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp.iterdir()) == ["hetpatrol.prom", "mine.json", "state.json"]


def test_baseline_write_into_another_users_directory_exits_73(tmp_path):
    target = victim(tmp_path)
    theirs = others_dir(tmp_path)
    plant(theirs / "baseline.yaml", target)
    run = subprocess.run(
        [
            *HETPATROL,
            "baseline",
            "--replay",
            str(NODES / "healthy-mixed"),
            "--write",
            str(theirs / "baseline.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 73
    assert run.stderr == (
        f"hetpatrol baseline: cannot write {theirs / 'baseline.yaml'}: directory {theirs} is "
        "owned by uid 65534 (nobody), not root or this user\n"
    )
    assert target.read_bytes() == VICTIM


def test_ledger_textfile_is_written_safely(tmp_path):
    from hetpatrol.ledger import quotas
    from hetpatrol.ledger.usage import Ledger

    target = victim(tmp_path)
    d = tmp_path / "textfile"
    d.mkdir()
    (d / "ledger.prom").symlink_to(target)
    with pytest.raises(UnsafePath, match="it is a symbolic link"):
        quotas.write_textfile([], Ledger(by=("account",), window=(0.0, 60.0)), d / "ledger.prom")
    assert target.read_bytes() == VICTIM
    (d / "ledger.prom").unlink()
    quotas.write_textfile([], Ledger(by=("account",), window=(0.0, 60.0)), d / "ledger.prom")
    assert b"hetpatrol_ledger_unreadable_tres_items 0.0\n" in (d / "ledger.prom").read_bytes()
    assert stat.S_IMODE((d / "ledger.prom").stat().st_mode) == 0o644
    assert sorted(p.name for p in d.iterdir()) == ["ledger.prom"]


def test_a_running_daemon_counts_and_logs_a_path_that_turned_unsafe(tmp_path, capsys):
    """At run time (a directory handed to another user, a link put in place of the
    state file): each write is refused, counted and logged once, the victim's file is
    untouched, and writing resumes when the path is safe again."""
    from hetpatrol.config import load_config
    from hetpatrol.daemon import Daemon

    out = tmp_path / "out"
    out.mkdir()
    config = tmp_path / "hetpatrol.yaml"
    config.write_text(
        f"node: n1\nlisten: null\njsonl: {{path: {out / 'patrol.jsonl'}}}\n"
        f"state_path: {out / 'state.json'}\ntextfile_path: {out / 'hetpatrol.prom'}\n"
    )
    daemon = Daemon(load_config(config), config_path=config, replay_dir=NODES / "healthy-mixed")
    target = victim(tmp_path)
    try:
        daemon.patrol_once()
        assert daemon.stats.state_write_errors == 0 and daemon.sink.write_errors == 0
        os.chown(out, NOBODY, NOBODY)  # the directory is someone else's now
        daemon.patrol_once()
        daemon.patrol_once()
        assert daemon.stats.state_write_errors == 2
        assert daemon.stats.textfile_write_errors == 2
        # the JSONL log it holds open is its own file still; once nobody swaps it for
        # a link, the sink sees another inode, reopens, and refuses
        assert daemon.sink.write_errors == 0
        (out / "patrol.jsonl").unlink()
        plant(out / "patrol.jsonl", target)
        daemon.patrol_once()
        assert daemon.sink.write_errors > 0
        err = capsys.readouterr().err
        for sink in ("jsonl", "state", "textfile"):
            assert err.count(f"{sink}_write_failed") == 1, err
        assert f"EPERM: directory {out} is owned by uid 65534 (nobody)" in err
        os.chown(out, 0, 0)
        (out / "state.json").unlink()
        (out / "state.json").symlink_to(target)  # a link in place of the state file
        daemon.patrol_once()
        assert daemon.stats.state_write_errors == 4
        assert target.read_bytes() == VICTIM
        (out / "state.json").unlink()
        daemon.patrol_once()
        assert daemon.stats.state_write_errors == 4  # safe again: written
        assert "state_write_resumed" in capsys.readouterr().err
        assert (out / "state.json").read_bytes().startswith(b'{"schema":"hetpatrol.state/1"')
    finally:
        daemon.shutdown()
