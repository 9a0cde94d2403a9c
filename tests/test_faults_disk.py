"""A full disk and unwritable paths under a running daemon, for real.

- ENOSPC: a size-limited tmpfs (``mount -t tmpfs -o size=...``) that the daemon's own
  patrol log fills up; space returns when an operator deletes old logs.
- EROFS: a read-only tmpfs mounted over the daemon's directories, then unmounted. (A
  ``mount -o remount,ro`` is refused while the daemon holds its log open for writing.)
- EACCES: directories the daemon may not write to (mode 0555). Tests run as root, whom
  permission bits do not stop, so the daemon runs without ``CAP_DAC_OVERRIDE`` (dropped
  from its capability bounding set with ``setpriv``): still uid 0, but the kernel answers
  EACCES like it would to the ``hetpatrol`` service user.

Each time the daemon must log ONE error per sink (JSONL, state file, node_exporter
textfile) for the whole episode, count every failure in ``hetpatrol_*_write_errors_total``,
keep serving ``/metrics``, keep patrolling, and resume by itself when the cause is gone.
Without the privilege to mount, these tests skip (and fail under ``CI=true``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import HETPATROL, NODES
from prometheus_client.parser import text_string_to_metric_families
from test_end_to_end import free_port, scrape

HEALTHY = NODES / "healthy-mixed"
SINKS = ("jsonl", "state", "textfile")


def _skip_or_fail(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI=true: these tests must run)")
    pytest.skip(why)


def umount(where: Path) -> None:
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def tmpfs():
    """``mount(size)`` -> a fresh tmpfs directory; ``mount(size, over=d, ro=True)`` mounts
    one over ``d``. Everything is unmounted (and the directories removed) in teardown."""
    mounts: list[tuple[Path, bool]] = []

    def mount(size: str, over: Path | None = None, ro: bool = False) -> Path:
        where = over or Path(tempfile.mkdtemp(prefix="hetpatrol-tmpfs-", dir="/tmp"))
        opts = f"size={size},mode=0755" + (",ro" if ro else "")
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            if over is None:
                where.rmdir()
            _skip_or_fail(f"cannot mount a tmpfs: {res.stderr.strip() or res.returncode}")
        mounts.append((where, over is None))
        return where

    mount.umount = lambda where: (umount(where), mounts.remove((where, False)))
    yield mount
    for where, made in reversed(mounts):
        umount(where)
        if made:
            where.rmdir()


class RunningDaemon:
    """``hetpatrol run`` on the healthy replay, JSON logs to a file, metrics on a port."""

    def __init__(self, root: Path, work: Path, interval: float, prefix: list[str]):
        self.port = free_port()
        self.jsonl = root / "log" / "patrol.jsonl"
        self.state = root / "state" / "state.json"
        self.textfile = root / "textfile" / "hetpatrol.prom"
        self.log = work / "daemon.log"
        config = work / "hetpatrol.yaml"
        config.write_text(
            f"""node: disk-node
interval_seconds: {interval}
listen: "127.0.0.1:{self.port}"
jsonl: {{path: "{self.jsonl}", max_bytes: 0}}
state_path: "{self.state}"
textfile_path: "{self.textfile}"
collectors: {{nvidia: {{}}, ascend: {{}}}}
"""
        )
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    *prefix,
                    *HETPATROL,
                    "--log-format",
                    "json",
                    "run",
                    "--config",
                    str(config),
                    "--replay",
                    str(HEALTHY),
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=Path(__file__).resolve().parents[1],
            )

    def metrics(self) -> dict[str, float]:
        """Unlabelled samples of one scrape (raises if the scrape fails)."""
        return {name: s[0].value for name, s in scrape(self.port).items() if not s[0].labels}

    def wait(self, predicate, timeout: float = 30.0, what: str = "") -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                found = self.metrics()
            except OSError:
                found = None  # not listening yet
            if found is not None and predicate(found):
                return found
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def events(self) -> list[dict]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


@pytest.fixture
def daemons(tmp_path, tmpfs):
    """Starts daemons; every one is stopped in teardown (before the tmpfs goes)."""
    started: list[RunningDaemon] = []

    def start(root: Path, interval: float = 0.1, prefix: list[str] | None = None):
        d = RunningDaemon(root, tmp_path, interval, prefix or [])
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def errors_of(found: dict[str, float]) -> dict[str, float]:
    return {s: found[f"hetpatrol_{s}_write_errors_total"] for s in SINKS}


def assert_one_episode(daemon: RunningDaemon, sinks=SINKS, code: str | None = None):
    """Each sink logged one ``*_write_failed`` before its first ``*_write_resumed``."""
    events = daemon.events()
    for sink in sinks:
        names = [e["event"] for e in events if e["event"].startswith(f"{sink}_write_")]
        assert f"{sink}_write_resumed" in names, (sink, names)
        before = names[: names.index(f"{sink}_write_resumed")]
        assert before == [f"{sink}_write_failed"], (sink, names)
        (first,) = [e for e in events if e["event"] == f"{sink}_write_failed"][:1]
        assert first["level"] == "error"
        if code:
            assert first["error"].startswith(code), first


def assert_whole_lines(jsonl: Path) -> list[dict]:
    raw = jsonl.read_bytes()
    assert raw.endswith(b"\n")
    return [json.loads(line) for line in raw.decode().splitlines()]


def assert_whole_files(daemon: RunningDaemon) -> None:
    """The state file and the textfile are whole, recent, and alone in their directory."""
    state = json.loads(daemon.state.read_text())
    assert state["schema"] == "hetpatrol.state/1" and state["seq"] > 1
    text = daemon.textfile.read_text()
    families = {f.name for f in text_string_to_metric_families(text)}
    assert "hetpatrol_patrols" in families and "hetpatrol_card_health" in families
    for path in (daemon.state, daemon.textfile):
        names = {p.name for p in path.parent.iterdir()} - {f".{path.name}.lock"}  # the claim
        assert names == {path.name}  # no temp file left


def fill(path: Path) -> int:
    """Write zeros to ``path`` until the file system is full. Returns the bytes written."""
    written = 0
    with open(path, "ab", buffering=0) as fh:
        while True:
            try:
                written += fh.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return written


def test_disk_full_one_error_per_sink_keeps_serving_and_resumes(tmpfs, daemons):
    root = tmpfs("300k")
    old_logs = root / "log" / "patrol.jsonl.1"  # what the operator will delete
    old_logs.parent.mkdir()
    old_logs.write_bytes(b"{}\n" * (140 * 1024 // 3))
    daemon = daemons(root, interval=0.1)
    # the daemon's own log fills the disk: every sink fails, again and again
    found = daemon.wait(
        lambda m: min(errors_of(m).values()) >= 3 and m["hetpatrol_jsonl_write_errors_total"] >= 50,
        what="the disk to fill up",
    )
    patrols_when_full = found["hetpatrol_patrols_total"]
    lines_when_full = found["hetpatrol_jsonl_lines_total"]
    assert shutil.disk_usage(root).free < 8192
    # still patrolling and serving while full: the counters keep climbing
    found = daemon.wait(
        lambda m: m["hetpatrol_patrols_total"] >= patrols_when_full + 10, what="more patrols"
    )
    assert found["hetpatrol_patrol_ready"] == 1.0
    assert found["hetpatrol_jsonl_write_errors_total"] >= 50 + 10 * 17 - 17
    assert found["hetpatrol_jsonl_lines_total"] - lines_when_full < 2 * 17  # page slack only

    old_logs.unlink()  # space returns
    found = daemon.wait(
        lambda m: m["hetpatrol_jsonl_lines_total"] >= lines_when_full + 3 * 17,
        what="writing to resume",
    )
    daemon.stop()
    assert daemon.proc.returncode == 0
    assert_one_episode(daemon, code="ENOSPC")
    lines = assert_whole_lines(daemon.jsonl)
    assert lines[-1]["kind"] == "patrol"
    assert_whole_files(daemon)


def test_read_only_file_system_one_error_per_sink_and_resumes(tmpfs, daemons):
    root = tmpfs("4m")
    daemon = daemons(root, interval=0.05)
    found = daemon.wait(lambda m: m["hetpatrol_jsonl_lines_total"] >= 2 * 17, what="a start")
    tmpfs("16k", over=root, ro=True)  # every path of the daemon is now on a read-only fs
    found = daemon.wait(
        lambda m: min(errors_of(m).values()) >= 5, what="writes to fail on a read-only fs"
    )
    patrols = found["hetpatrol_patrols_total"]
    found = daemon.wait(lambda m: m["hetpatrol_patrols_total"] >= patrols + 5, what="patrols")
    tmpfs.umount(root)  # the writable file system is back
    lines = found["hetpatrol_jsonl_lines_total"]
    daemon.wait(lambda m: m["hetpatrol_jsonl_lines_total"] >= lines + 3 * 17, what="resume")
    daemon.stop()
    assert daemon.proc.returncode == 0
    assert_one_episode(daemon, code="EROFS")
    assert assert_whole_lines(daemon.jsonl)[-1]["kind"] == "patrol"


def test_permission_denied_one_error_per_sink_and_resumes(tmpfs, daemons):
    if shutil.which("setpriv") is None and os.geteuid() == 0:
        _skip_or_fail("setpriv (util-linux) is needed to drop CAP_DAC_OVERRIDE")
    root = tmpfs("4m")
    dirs = [root / "log", root / "state", root / "textfile"]
    for d in dirs:
        d.mkdir()
        d.chmod(0o555)  # nobody may create files here, not even uid 0 without the cap
    prefix = []
    if os.geteuid() == 0:
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    daemon = daemons(root, interval=0.05, prefix=prefix)
    found = daemon.wait(
        lambda m: min(errors_of(m).values()) >= 5 and m["hetpatrol_patrols_total"] >= 5,
        what="writes to be refused",
    )
    assert found["hetpatrol_jsonl_lines_total"] == 0
    assert found["hetpatrol_patrol_ready"] == 1.0
    for d in dirs:
        d.chmod(0o755)  # the operator fixes the permissions
    daemon.wait(lambda m: m["hetpatrol_jsonl_lines_total"] >= 3 * 17, what="writing to resume")
    daemon.stop()
    assert daemon.proc.returncode == 0
    assert_one_episode(daemon, code="EACCES")
    assert assert_whole_lines(daemon.jsonl)[-1]["kind"] == "patrol"
    assert_whole_files(daemon)
