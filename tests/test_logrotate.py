"""systemd/hetpatrol.logrotate with the real logrotate, against a running daemon."""

from __future__ import annotations

import grp
import gzip
import json
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

from conftest import REPO, replay_run_argv, require_program
from test_end_to_end import free_port, wait_for

SNIPPET = REPO / "systemd" / "hetpatrol.logrotate"
INSTALLED_PATH = "/var/log/hetpatrol/patrol.jsonl"


def logrotate() -> str:
    return require_program("logrotate", package="logrotate")


def local_copy(tmp_path: Path, jsonl: Path) -> Path:
    """The snippet with its path pointed at ``jsonl`` (everything else unchanged)."""
    text = SNIPPET.read_text()
    assert text.count(INSTALLED_PATH) == 1
    conf = tmp_path / "hetpatrol.logrotate"
    # `su hetpatrol hetpatrol`: the test's files belong to the user running it
    assert text.count("    su hetpatrol hetpatrol\n") == 1
    me = f"{pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name}"
    text = text.replace("    su hetpatrol hetpatrol\n", f"    su {me}\n")
    conf.write_text(text.replace(INSTALLED_PATH, str(jsonl)))
    conf.chmod(0o644)
    return conf


def test_snippet_matches_the_sink():
    text = SNIPPET.read_text()
    body = text[text.index("{") :]
    assert "copytruncate" not in body  # the sink follows the rename itself
    assert "delaycompress" in body and "nocreate" in body
    assert "postrotate" not in body  # optional, documented in the comment only


def test_logrotate_debug_accepts_the_snippet(tmp_path):
    jsonl = tmp_path / "log" / "patrol.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_text('{"kind":"patrol"}\n')
    conf = local_copy(tmp_path, jsonl)
    res = subprocess.run(
        [logrotate(), "-d", "-s", str(tmp_path / "logrotate.status"), str(conf)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    assert "error" not in out.lower(), out
    assert f"considering log {jsonl}" in out


def read_lines(directory: Path) -> list[dict]:
    lines = []
    for path in directory.glob("patrol.jsonl*"):  # not the daemon's .patrol.jsonl.lock
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        assert raw == b"" or raw.endswith(b"\n"), path  # no torn line anywhere
        lines.extend(json.loads(x) for x in raw.decode().splitlines())
    return lines


def test_forced_rotations_under_a_running_daemon_lose_no_line(tmp_path):
    logdir = tmp_path / "log"
    jsonl = logdir / "patrol.jsonl"
    conf = local_copy(tmp_path, jsonl)
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        replay_run_argv("healthy-mixed", free_port(), jsonl, 0.1),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: jsonl.exists() and jsonl.stat().st_size > 0, proc=proc)
        for _ in range(4):
            time.sleep(0.35)
            res = subprocess.run(
                [logrotate(), "-f", "-s", str(tmp_path / "logrotate.status"), str(conf)],
                capture_output=True,
                text=True,
            )
            assert res.returncode == 0, res.stderr
        time.sleep(0.35)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err

    names = sorted(p.name for p in logdir.iterdir() if p.name != ".patrol.jsonl.lock")
    # four rotations: .1 plain (delaycompress), .2 .. .4 compressed, and the new file
    assert names == [
        "patrol.jsonl",
        "patrol.jsonl.1",
        "patrol.jsonl.2.gz",
        "patrol.jsonl.3.gz",
        "patrol.jsonl.4.gz",
    ], names
    lines = read_lines(logdir)
    seqs = sorted(d["seq"] for d in lines if d["kind"] == "patrol")
    assert seqs == list(range(1, len(seqs) + 1)), seqs  # none lost, none twice
    assert len(seqs) >= 10
    cards = [d for d in lines if d["kind"] == "card"]
    assert len(cards) == 16 * len(seqs)
    # the daemon created the new patrol.jsonl itself (nocreate), mode 0640
    assert oct(jsonl.stat().st_mode & 0o777) == "0o640"
