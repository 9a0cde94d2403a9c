"""Durable JSONL: real SIGKILLs of a fast-patrolling daemon, rotation under load, and an
external logrotate (the real ``logrotate`` binary when installed).

The crash test starts ONE helper interpreter that imports hetpatrol and then forks a
fresh daemon per round (a new :class:`~hetpatrol.daemon.Daemon` exactly as ``hetpatrol
run`` builds it, serving ``/metrics`` on an ephemeral port, patrolling every 10 ms); the
test SIGKILLs each one at a random moment. Every restart goes through the sink's normal
open path, which cuts a torn tail. A crash inside one ``write()`` to a local file cannot
tear a line, so the test also appends half a line after some kills, as a power loss
would leave it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import HETPATROL, NODES

from hetpatrol.config import load_config
from hetpatrol.daemon import Daemon

HEALTHY = NODES / "healthy-mixed"
#: (vendor, index, chip) of the 16 cards of the healthy-mixed scenario
CARDS = {("nvidia", i, None) for i in range(8)} | {("ascend", i, 0) for i in range(8)}

HELPER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from hetpatrol.cli import setup_logging
    from hetpatrol.collector import load_collector
    from hetpatrol.config import load_config
    from hetpatrol.daemon import Daemon

    config_path, replay, log_path = sys.argv[1:4]
    load_collector("nvidia"), load_collector("ascend")  # imported once, before forking
    import jsonschema  # noqa: F401 - the config check imports it on first use: here, once
    for line in sys.stdin:
        cmd, *arg = line.split()
        if cmd == "fork":
            pid = os.fork()
            if pid == 0:  # a fresh daemon, as `hetpatrol run --config ... --replay ...`
                try:
                    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                    os.dup2(fd, 2)
                    setup_logging("json", "info")
                    daemon = Daemon(load_config(config_path), config_path=Path(config_path),
                                    replay_dir=Path(replay))
                    daemon.install_signals()
                    code = daemon.run()
                finally:
                    os._exit(locals().get("code", 70))
            print(pid, flush=True)
        elif cmd == "reap":
            print(os.waitpid(int(arg[0]), 0)[1], flush=True)
    """
)


def check_patrols(lines: list[str]) -> list[int]:
    """Every line parses; every patrol line has all of its card lines just before it
    (only the patrol's own event lines may sit between).

    Returns the patrol seqs in file order.
    """
    docs = []
    for no, line in enumerate(lines, 1):
        assert line.endswith("\n"), f"line {no} has no newline: {line[:80]!r}"
        docs.append(json.loads(line))
    seqs = []
    for i, doc in enumerate(docs):
        if doc["kind"] != "patrol":
            continue
        total = sum(doc["cards"].values())
        assert total == 16
        j = i
        while j > 0 and docs[j - 1]["kind"] not in ("card", "patrol"):
            j -= 1  # event lines (kernel log, Slurm) of the patrol sit between
        cards = docs[max(0, j - total) : j]
        assert len(cards) == total and all(c["kind"] == "card" for c in cards), doc["seq"]
        assert {(c["vendor"], c["index"], c["chip"]) for c in cards} == CARDS
        assert len({c["ts"] for c in cards}) == 1  # one patrol's cards, not a mix
        assert Counter(c["health"] for c in cards) == +Counter(doc["cards"])
        seqs.append(doc["seq"])
    return seqs


def write_config(path: Path, jsonl: Path, state: Path | None = None, **jsonl_opts) -> None:
    opts = "".join(f", {k}: {v}" for k, v in jsonl_opts.items())
    path.write_text(
        f"""node: crash-node
interval_seconds: 0.01
listen: "127.0.0.1:0"
jsonl: {{path: "{jsonl}"{opts}}}
state_path: {json.dumps(str(state)) if state else "null"}
collectors: {{nvidia: {{}}, ascend: {{}}}}
"""
    )


@pytest.fixture
def forker(tmp_path):
    """The helper interpreter; every daemon it forked is killed and reaped in teardown."""
    script = tmp_path / "forker.py"
    script.write_text(HELPER)
    config = tmp_path / "hetpatrol.yaml"
    log = tmp_path / "daemon.log"
    helper = subprocess.Popen(
        [sys.executable, str(script), str(config), str(HEALTHY), str(log)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    live: set[int] = set()

    def fork() -> int:
        helper.stdin.write("fork\n")
        helper.stdin.flush()
        pid = int(helper.stdout.readline())
        live.add(pid)
        return pid

    def reap(pid: int) -> int:
        helper.stdin.write(f"reap {pid}\n")
        helper.stdin.flush()
        status = int(helper.stdout.readline())
        live.discard(pid)
        return status

    fork.reap = reap
    fork.config, fork.log = config, log
    try:
        yield fork
    finally:
        for pid in list(live):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            reap(pid)
        helper.stdin.close()
        helper.wait(timeout=10)


@pytest.mark.slow
def test_200_sigkills_leave_only_whole_lines_and_whole_patrols(tmp_path, forker, record_property):
    jsonl, state = tmp_path / "log" / "patrol.jsonl", tmp_path / "state" / "state.json"
    write_config(forker.config, jsonl, state, max_bytes=0)
    seed = int(os.environ.get("HETPATROL_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"\ncrash seed {seed} (HETPATROL_CRASH_SEED)")
    torn = 0
    for round_ in range(200):
        before = jsonl.stat().st_size if jsonl.exists() else 0
        pid = forker()
        time.sleep(rng.uniform(0.0, 0.2))  # before, during or after the first patrols
        if round_ % 10 == 0:
            # on a loaded machine a daemon may take longer than 0.2 s to its first line:
            # every tenth is killed only once it has written, so lines (and tears) exist
            wait_until = time.monotonic() + 10
            while time.monotonic() < wait_until and (
                not jsonl.exists() or jsonl.stat().st_size <= before
            ):
                time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        status = forker.reap(pid)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        if state.exists():  # replaced atomically: the old or the new file, never half
            assert json.loads(state.read_text())["node"] == "crash-node"
        if round_ % 4 == 1 and jsonl.exists() and jsonl.stat().st_size:
            # a power loss mid-write: half a line, no newline
            last = jsonl.read_bytes().rsplit(b"\n", 2)[-2]
            with open(jsonl, "ab") as fh:
                fh.write(last[: rng.randrange(1, len(last))])
            torn += 1
    # a last daemon starts (repairing the tail), patrols and stops cleanly
    size = jsonl.stat().st_size
    pid = forker()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and jsonl.stat().st_size < size + 16 * 1024:
        time.sleep(0.02)
    os.kill(pid, signal.SIGTERM)
    status = forker.reap(pid)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0

    lines = jsonl.read_text().splitlines(keepends=True)
    seqs = check_patrols(lines)
    # no patrol lost in a run: seqs count up by one, and restart at 1 with each daemon
    gaps = [(a, b) for a, b in zip(seqs, seqs[1:], strict=False) if b not in (a + 1, 1)]
    assert gaps == []
    runs = seqs.count(1)
    events = [json.loads(x) for x in forker.log.read_text().splitlines() if x.startswith("{")]
    repairs = [e for e in events if e.get("event") == "jsonl_torn_tail_repaired"]
    assert torn and len(repairs) >= 1
    assert not [e for e in events if e.get("event") == "jsonl_write_failed"]
    claim = ".state.json.lock"  # the daemons' claim on the state file stays, by design
    leftovers = sorted(
        p.name for p in state.parent.iterdir() if p.name not in ("state.json", claim)
    )
    assert leftovers == []  # no temporary state file left behind by a killed write
    record_property("patrols_completed", len(seqs))
    record_property("daemons_that_completed_a_patrol", runs)
    print(
        f"201 daemons, {runs} completed a patrol, {len(seqs)} patrols, {len(lines)} lines, "
        f"{torn} torn tails injected, {len(repairs)} repairs"
    )


def test_size_rotation_under_load_loses_no_line(tmp_path):
    jsonl = tmp_path / "patrol.jsonl"
    config = load_config(
        text=f"""node: rotate-node
listen: null
jsonl: {{path: "{jsonl}", max_bytes: 40000, backups: 1000}}
state_path: null
collectors: {{nvidia: {{}}, ascend: {{}}}}
"""
    )
    daemon = Daemon(config, replay_dir=HEALTHY)
    try:
        for _ in range(150):
            daemon.patrol_once()
    finally:
        daemon.shutdown()
    files = sorted(tmp_path.glob("patrol.jsonl.*"), key=lambda p: -int(p.suffix[1:]))
    files.append(jsonl)
    assert len(files) > 40  # it did rotate, a lot
    lines = []
    for f in files:
        assert f.stat().st_size <= 40000
        part = f.read_text().splitlines(keepends=True)
        assert json.loads(part[-1])["kind"] == "patrol"  # a patrol's lines stay together
        lines += part
    assert check_patrols(lines) == list(range(1, 151))
    assert daemon.stats.jsonl_lines_written == 150 * 17


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, and SIGKILL if it does not stop: no daemon outlives its test."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_external_logrotate_is_followed_with_and_without_sighup(tmp_path):
    jsonl = tmp_path / "log" / "patrol.jsonl"
    config = tmp_path / "hetpatrol.yaml"
    write_config(config, jsonl, max_bytes=0)
    config.write_text(
        config.read_text().replace("interval_seconds: 0.01", "interval_seconds: 0.02")
    )
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = open(tmp_path / "daemon.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*HETPATROL, "run", "--config", str(config), "--replay", str(HEALTHY)],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=env,
    )
    exe = shutil.which("logrotate") or next(
        (p for p in ("/usr/sbin/logrotate",) if Path(p).exists()), None
    )
    try:
        deadline = time.monotonic() + 20
        while not (jsonl.exists() and jsonl.stat().st_size > 0):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        for i in range(12):
            time.sleep(0.15)
            # the daemon has written to the file of the last rotation (a reload checks its
            # config in a child first: an interpreter start), so that logrotate's
            # missingok never skips a rotation
            while not (jsonl.exists() and jsonl.stat().st_size > 0):
                assert time.monotonic() < deadline + 60 and proc.poll() is None
                time.sleep(0.05)
            hup = i % 2 == 0
            create = i % 3 != 0
            if exe:
                conf = tmp_path / f"logrotate-{i}.conf"
                post = (
                    f"    postrotate\n        kill -HUP {proc.pid}\n    endscript\n" if hup else ""
                )
                conf.write_text(
                    f"{jsonl} {{\n    rotate 1000\n    missingok\n    nocompress\n"
                    f"    {'create 0640 root root' if create else 'nocreate'}\n{post}}}\n"
                )
                subprocess.run(
                    [exe, "-f", "-s", str(tmp_path / "logrotate.state"), str(conf)],
                    check=True,
                    timeout=30,
                )
            else:  # what logrotate does, by hand
                for n in range(i, 0, -1):
                    os.rename(f"{jsonl}.{n}", f"{jsonl}.{n + 1}")
                os.rename(jsonl, f"{jsonl}.1")
                if create:
                    jsonl.touch(mode=0o640)
                if hup:
                    os.kill(proc.pid, signal.SIGHUP)
        time.sleep(0.2)
    finally:
        stop(proc)
        log.close()
    assert proc.returncode == 0, (tmp_path / "daemon.log").read_text()[-3000:]
    rotated = sorted(jsonl.parent.glob("patrol.jsonl.*"), key=lambda p: -int(p.suffix[1:]))
    assert len(rotated) == 12
    lines = []
    for f in [*rotated, jsonl]:
        lines += f.read_text().splitlines(keepends=True)
    seqs = check_patrols(lines)
    assert seqs == list(range(1, len(seqs) + 1))  # every patrol, in order, none lost
    assert len(seqs) > 40


def test_each_daemon_log_line_leaves_in_one_write(monkeypatch):
    """A daemon killed between two writes of one log line left it without its newline,
    glued to the next daemon's line in the journal (print() writes the text and the
    newline separately)."""
    import io

    from hetpatrol.cli import setup_logging
    from hetpatrol.logs import get_logger

    class Counting(io.StringIO):
        writes: list[str] = []

        def write(self, s):
            self.writes.append(s)
            return super().write(s)

    stream = Counting()
    monkeypatch.setattr(sys, "stderr", stream)
    setup_logging("json", "info")  # conftest puts the configuration back afterwards
    get_logger("t").info("first_patrol", health="ok", cards=16)
    get_logger("t").warning("collector_state", collector="ascend", state="hung")
    assert [json.loads(w)["event"] for w in stream.writes] == ["first_patrol", "collector_state"]
    assert all(w.endswith("}\n") and w.count("\n") == 1 for w in stream.writes)
