"""``hetpatrol ledger faults`` believes only files nobody else could have forged: owned
by root, the user running it or the daemon's user (or a ``--trust-owner``), not
writable by their group or others, reached through no other user's symbolic link. Each
file left out is said on stderr with why, and counted in the output.

The hostile files are made in ``tmp_path``; as root they are made another user's with
``os.chown``/``os.lchown`` (uid 65534, ``nobody``); the mode rules need no root. The
real state file is one patrol of the xid-79 replay (GPU 6's XID 79, job 4242); the
forged one is a JSONL line crediting XID 79 to job 666.
"""

from __future__ import annotations

import json
import os
import pwd

import pytest
from test_ledger_faults import _patrol_state

from hetpatrol.cli import main

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="os.chown to another uid needs root")
NOBODY = 65534

#: a fault line as the daemon writes one, crediting XID 79 on GPU 6 to job 666
FORGED = {
    "kind": "event",
    "schema": "hetpatrol.event/1",
    "run_id": "f0f0f0f0f0f0",
    "ts": "2026-12-01T23:00:00.000Z",
    "node": "gpu-a01",
    "seq": 1,
    "event": "xid",
    "severity": "critical",
    "xid": 79,
    "vendor": "nvidia",
    "index": 6,
    "jobs": ["666"],
}


def _forged(path) -> None:
    path.write_text(json.dumps(FORGED) + "\n")


@as_root
def test_another_users_file_is_left_out_said_and_counted(tmp_path, capsys):
    state, _ = _patrol_state(tmp_path, "xid79-01", "4242")
    d = tmp_path / "gathered"
    d.mkdir()
    (d / "a01.json").write_bytes(state.read_bytes())
    forged = d / "a02.jsonl"
    _forged(forged)
    os.chown(forged, NOBODY, NOBODY)
    assert main(["ledger", "faults", str(d)]) == 1
    out, err = capsys.readouterr()
    assert "job 4242" in out and "job 666" not in out, out
    assert out.splitlines()[-1].endswith("1 state file(s), 1 file(s) not trusted (left out)")
    assert (
        f"refusing to read {forged}: the file is owned by uid 65534 (nobody), not a trusted "
        "owner (left out: only files of root, this user and the daemon's user are read; "
        "--trust-owner adds one)" in err
    ), err
    # in JSON too
    assert main(["ledger", "faults", str(d), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["counts"]["untrusted_files"] == 1 and "666" not in doc["jobs"]
    # a link of root's own to their file: the file is still theirs
    link = tmp_path / "mine.jsonl"
    link.symlink_to(forged)
    assert main(["ledger", "faults", str(link)]) == 65
    assert "the file is owned by uid 65534 (nobody)" in capsys.readouterr().err


@as_root
@pytest.mark.parametrize("owner", ["nobody", "65534"])
def test_trust_owner_reads_a_service_users_files_and_links(tmp_path, capsys, owner):
    d = tmp_path / "gathered"
    d.mkdir()
    forged = d / "a02.jsonl"
    _forged(forged)
    os.chown(forged, NOBODY, NOBODY)
    theirs = tmp_path / "via-their-link.jsonl"
    theirs.symlink_to(forged)
    os.lchown(theirs, NOBODY, NOBODY)
    assert main(["ledger", "faults", str(d), str(theirs), "--trust-owner", owner]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "job 666" and "not trusted" not in out, out
    assert err == ""


def test_an_unknown_trust_owner_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["ledger", "faults", "-", "--trust-owner", "no-such-user-\x1b[2J"])
    assert exit_.value.code == 64  # EX_USAGE, as every usage error of the CLI
    err = capsys.readouterr().err
    assert "no user named no-such-user-\\x1b[2J" in err and "\x1b" not in err


@as_root
def test_the_daemons_user_is_trusted_by_default(tmp_path, capsys):
    try:
        uid = pwd.getpwnam("hetpatrol").pw_uid
    except KeyError:
        pytest.skip("no hetpatrol user on this host (the Debian package makes it)")
    state, jsonl = _patrol_state(tmp_path, "xid79-01", "4242")
    os.chown(jsonl, uid, uid)  # the daemon writes its log as its own user (0640)
    os.chmod(jsonl, 0o640)
    assert main(["ledger", "faults", str(jsonl)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "job 4242" and "refusing" not in err, err


@pytest.mark.parametrize(
    ("mode", "who"),
    [(0o664, "its group gid"), (0o646, "others"), (0o666, "others")],
)
def test_a_file_others_may_write_is_left_out(tmp_path, capsys, mode, who):
    """Owned by this user, but writable by a group or everyone: anyone there could have
    written the fault lines."""
    d = tmp_path / "gathered"
    d.mkdir()
    forged = d / "a02.jsonl"
    _forged(forged)
    os.chmod(forged, mode)
    assert main(["ledger", "faults", str(d)]) == 65  # nothing else to read
    out, err = capsys.readouterr()
    assert f"refusing to read {forged}: the file is writable by {who}" in err, err
    assert f"(mode {mode:04o})" in err
    os.chmod(forged, 0o644)
    assert main(["ledger", "faults", str(d)]) == 1
    assert capsys.readouterr().out.splitlines()[0] == "job 666"


@as_root
def test_this_user_is_the_one_running_the_command(tmp_path, capsys, monkeypatch):
    """Run as ``nobody`` (its effective uid: the rule is the reader's, not root's): its
    own file is read, root's too, a third user's is not."""
    d = tmp_path / "gathered"
    d.mkdir()
    own, roots, third = d / "own.jsonl", d / "root.jsonl", d / "third.jsonl"
    for path, job in ((own, "1"), (roots, "2"), (third, "3")):
        path.write_text(json.dumps({**FORGED, "jobs": [job], "seq": int(job)}) + "\n")
    os.chown(own, NOBODY, NOBODY)
    os.chown(third, 4321, 4321)
    monkeypatch.setattr(os, "geteuid", lambda: NOBODY)
    assert main(["ledger", "faults", str(d)]) == 1
    out, err = capsys.readouterr()
    assert [line for line in out.splitlines() if line.startswith("job ")] == ["job 1", "job 2"]
    assert f"refusing to read {third}: the file is owned by uid 4321, not a trusted" in err
    assert "1 file(s) not trusted" in out
