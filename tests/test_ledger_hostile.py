"""``hetpatrol ledger`` against hostile input: unreadable TRES counts, a stuck or chatty
sacct, FIFOs and devices as --sacct-file, YAML bombs and wrong types in a quota file,
non-UTF-8 text, a Prometheus that answers NaN, the wrong JSON shape, too slowly or too
much (a stub HTTP server on 127.0.0.1, bounded: it serves this module's tests only and
is shut down after each).

Commands that could hang or eat memory on a regression run in a child process with a
wall-clock timeout and an address-space limit, so a failure is a failed test, not a stuck
suite.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hetpatrol.cli import main
from hetpatrol.ledger import efficiency as eff_mod
from hetpatrol.ledger import quotas
from hetpatrol.ledger.sacct_stream import SacctError, stream_sacct
from hetpatrol.ledger.tres import MAX_CARDS_PER_JOB, gres_tres

# one valid record: account phys, 1 h on 2026-12-01, two A100
START, END = "2026-12-01T10:00:00", "2026-12-01T11:00:00"
WINDOW = ["--start", "2026-12-01", "--end", "2026-12-02"]


def record(tres: str = "gres/gpu:a100=2", job: str = "7", account: str = "phys") -> str:
    return "|".join([job, job, "alice", account, "gpu", "normal", "n1", START, START, END,
                     "3600", "COMPLETED", tres])  # fmt: skip


@pytest.fixture
def good(tmp_path) -> Path:
    f = tmp_path / "good.sacct"
    f.write_text(record() + "\n")
    return f


def run_cli(args: list[str], timeout: float = 60, cwd: Path | None = None):
    """``hetpatrol <args>`` in a child process: at most ``timeout`` s, 2 GiB of memory."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    code = "import sys; from hetpatrol.cli import main; sys.exit(main(sys.argv[1:]))"
    try:
        return subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True,
            timeout=timeout, preexec_fn=limit, cwd=cwd, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"hetpatrol {' '.join(args)} still running after {timeout} s")


def stand_in(tmp_path: Path, name: str, script: str) -> Path:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(0o755)
    return p


# ------------------------------------------------------------ 4: unreadable TRES
@pytest.mark.parametrize(
    "tres",
    ["gres/gpu:a100=-5", "gres/gpu=1e309", "gres/gpu:a100=" + "9" * 38, "gres/gpu:a100=2M"],
)
def test_quota_with_unreadable_tres_is_not_ok(tmp_path, capsys, tres):
    sacct = tmp_path / "s"
    sacct.write_text(record(tres) + "\n")
    qf = tmp_path / "q.yaml"
    qf.write_text("quotas: [{account: phys, gres: gpu:a100, card_hours: 1}]\n")
    prom = tmp_path / "q.prom"
    rc = main(["ledger", "quota", "--sacct-file", str(sacct), "--quota-file", str(qf),
               "--no-node-types", "--textfile", str(prom), *WINDOW])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == quotas.EXIT_UNKNOWN == 3
    assert f"note: 1 TRES item(s) unreadable, left out: {tres}" in err
    assert "USED" in out and " 0.00 " in out  # what could be read is still shown
    assert "hetpatrol_ledger_unreadable_tres_items 1.0" in prom.read_text()


def test_absurd_card_counts_are_unreadable():
    assert MAX_CARDS_PER_JOB == 1_000_000
    assert gres_tres("gres/gpu:a100=1000000") == ({("gpu", "a100"): 1_000_000}, [])
    assert gres_tres("gres/gpu:a100=1000001,gres/npu=4G") == (
        {},
        ["gres/gpu:a100=1000001", "gres/npu=4G"],
    )


def test_a_count_in_other_scripts_digits_is_no_count():
    # Slurm reads counts with strtol/strtoull: ASCII digits only. Python's \d took
    # "١" (Arabic-Indic one) and "８" (fullwidth eight) as 1 and 8: in a TRES string, a
    # gres.conf Count= or a Gres= that slurmd refuses
    from hetpatrol.slurm.gres import parse_count

    assert gres_tres("gres/gpu=\u0661,gres/npu:910b=\uff18") == (
        {},
        ["gres/gpu=\u0661", "gres/npu:910b=\uff18"],
    )
    assert [parse_count(t) for t in ("\u0661", "\uff18G", "8", "4G")] == [None, None, 8, 4 << 30]


def test_quota_reached_stays_reached_with_unreadable_items(tmp_path, capsys):
    sacct = tmp_path / "s"
    sacct.write_text(record() + "\n" + record("gres/gpu:a100=x", job="8") + "\n")
    qf = tmp_path / "q.yaml"
    qf.write_text("quotas: [{account: phys, gres: gpu:a100, card_hours: 1}]\n")
    args = ["ledger", "quota", "--sacct-file", str(sacct), "--quota-file", str(qf),
            "--no-node-types", *WINDOW]  # fmt: skip
    assert main(args) == 2  # 2 card-hours of 1: reached whatever the unreadable item adds
    assert "unreadable" in capsys.readouterr().err


# ------------------------------------------------------ 7: stuck or chatty sacct
@pytest.mark.parametrize(
    "script", ["exec sleep 100000\n", "sleep 100000 &\necho $! > {pidfile}\nwait\n"]
)
def test_stuck_sacct_is_killed_with_its_group(tmp_path, script):
    pidfile = tmp_path / "child.pid"
    sleeper = stand_in(tmp_path, "sacct_sleep", script.format(pidfile=pidfile))
    r = run_cli(["ledger", "usage", "--sacct", str(sleeper), "--no-node-types",
                 "--timeout", "2"])  # fmt: skip
    assert r.returncode == 69, r.stderr
    assert "did not finish within 2 s (--timeout): killed" in r.stderr
    if not pidfile.exists():  # exec sleep: sacct itself, killed and reaped
        return
    child = int(pidfile.read_text())
    for _ in range(50):  # reaped by init: give it a moment
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"sacct's child {child} survived")


def test_chatty_stderr_does_not_deadlock(tmp_path, good):
    chatty = stand_in(
        tmp_path, "sacct_chatty",
        f"head -c 1048576 /dev/zero | tr '\\000' x >&2\ncat {good}\n",
    )  # fmt: skip
    r = run_cli(["ledger", "usage", "--sacct", str(chatty), "--no-node-types", "--format",
                 "json", *WINDOW])  # fmt: skip
    assert r.returncode == 0, r.stderr[-500:]
    rows = json.loads(r.stdout)["rows"]
    assert [(x["account"], x["gres"], x["card_hours"]) for x in rows] == [("phys", "gpu:a100", 2.0)]


def test_failing_sacct_keeps_the_end_of_a_long_stderr(tmp_path):
    script = "head -c 1048576 /dev/zero | tr '\\000' x >&2\necho ' no slurmdbd' >&2\nexit 1\n"
    caught: list[BaseException] = []

    def consume() -> None:
        try:
            list(stream_sacct([str(stand_in(tmp_path, "sacct_err", script))], timeout=60))
        except SacctError as exc:
            caught.append(exc)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    t.join(90)
    assert not t.is_alive(), "stream_sacct deadlocked on a full stderr pipe"
    assert len(caught) == 1
    assert re.search(r"exited with 1: x+ no slurmdbd$", str(caught[0]))
    assert len(str(caught[0])) < 2100


def test_timeout_must_be_positive(good, capsys):
    with pytest.raises(SystemExit):
        main(["ledger", "usage", "--sacct-file", str(good), "--timeout", "nan"])
    assert "not a number of seconds > 0" in capsys.readouterr().err


# ---------------------------------------------------- 10: FIFO, device, long line
def test_fifo_and_device_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        r = run_cli(["ledger", "usage", "--sacct-file", str(path), "--no-node-types"], 30)
        assert r.returncode == 64, r.stderr
        assert f"--sacct-file {path}: not a regular file" in r.stderr


def test_a_line_without_end_is_refused(tmp_path):
    f = tmp_path / "s"
    f.write_bytes(b"x" * (2 << 20))
    r = run_cli(["ledger", "usage", "--sacct-file", str(f), "--no-node-types", *WINDOW])
    assert r.returncode == 65
    assert "sacct line 1: longer than 1048576 bytes" in r.stderr


# ------------------------------------------------------- 11, 16, 22: quota files
BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]"
       for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    + ["quotas: [{account: *i, gres: gpu, card_hours: 1}]"]
)  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BOMB, "expands to more than 100000 values"),
        ("quotas:\n  - " + "[" * 5000 + "]" * 5000 + "\n", "line 2: nested deeper than 32"),
        (
            "quotas:\n  - account: phys\n    gres: gpu:a100\n    card_hours: .inf\n",
            "line 4: quotas[0].card_hours: quota 1: card_hours must be a finite number > 0",
        ),
        (
            "quotas:\n  - {account: phys, gres: gpu, card_hours: .nan}\n",
            "line 2: quotas[0].card_hours: quota 1: card_hours must be a finite",
        ),
        (
            "quotas:\n  - account: [phys]\n    gres: gpu:a100\n    card_hours: 1\n",
            "line 2: quotas[0].account: account must be a string, not list",
        ),
        (
            "quotas:\n  - account: phys\n    gres: {gpu: a100}\n    card_hours: 1\n",
            "line 3: quotas[0].gres: gres must be a string, not dict",
        ),
        (
            "quotas:\n  - {account: phys, gres: gpu, card_hours: 1}\n"
            "  - {account: chem, user: 42, gres: gpu, card_hours: 1}\n",
            "line 3: quotas[1].user: user must be a string, not int",
        ),
        (
            "quotas:\n  - {account: phys, gres: gpu, card_hour: 1}\n",
            "line 2: quotas[0].card_hour: unknown key 'card_hour'",
        ),
        ("quotas:\n  - {account: phys, account: chem, gres: gpu, card_hours: 1}\n",
         "duplicate key"),
    ],
)  # fmt: skip
def test_bad_quota_files_refused_with_their_line(tmp_path, text, message):
    qf = tmp_path / "q.yaml"
    qf.write_text(text)
    r = run_cli(["ledger", "quota", "--sacct-file", str(tmp_path / "none"), "--quota-file",
                 str(qf), "--no-node-types", *WINDOW], 60)  # fmt: skip
    assert r.returncode == 65, r.stderr[-1000:]
    assert f"hetpatrol ledger: {qf}: " in r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


# --------------------------------------------------------- 17: out-of-range times
@pytest.mark.parametrize("when", ["now-99999999999999weeks", "now-9999999999999days"])
def test_window_out_of_range_is_a_usage_error(good, capsys, when):
    rc = main(["ledger", "usage", "--sacct-file", str(good), "--no-node-types",
               "--start", when])  # fmt: skip
    assert rc == 64
    assert f"{when!r}: out of the range of dates" in capsys.readouterr().err


# ------------------------------------------------ 21: non-UTF-8, escaped stderr
def test_non_utf8_sacct_output_is_a_data_error(tmp_path, capsys):
    f = tmp_path / "s"
    f.write_bytes(record().encode() + b"\n" + record(job="8", account="ph\xffs").encode("latin-1")
                  + b"\n")  # fmt: skip
    assert main(["ledger", "usage", "--sacct-file", str(f), "--no-node-types", *WINDOW]) == 65
    assert "sacct line 2: not UTF-8 (invalid start byte at byte 12)" in capsys.readouterr().err
    sacct = stand_in(tmp_path, "sacct_latin1", f"cat {f}\n")
    assert main(["ledger", "usage", "--sacct", str(sacct), "--no-node-types", *WINDOW]) == 65
    assert "sacct line 2: not UTF-8" in capsys.readouterr().err


def test_non_utf8_quota_file_is_a_data_error(tmp_path, good, capsys):
    qf = tmp_path / "q.yaml"
    qf.write_bytes(b"quotas:\n  - {account: ph\xe9s, gres: gpu, card_hours: 1}\n")
    args = ["ledger", "quota", "--sacct-file", str(good), "--quota-file", str(qf),
            "--no-node-types", *WINDOW]  # fmt: skip
    assert main(args) == 65
    assert f"{qf}: line 2: not UTF-8" in capsys.readouterr().err


def test_sacct_stderr_is_escaped(tmp_path, capsys):
    sacct = stand_in(tmp_path, "sacct_esc", "printf '\\033]0;owned\\007\\033[2J' >&2\nexit 1\n")
    assert main(["ledger", "usage", "--sacct", str(sacct), "--no-node-types"]) == 69
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err
    assert "\\x1b]0;owned\\x07\\x1b[2J" in err


# ------------------------------------------------------------- stub Prometheus
class StubPrometheus:
    """``/api/v1/query_range`` on 127.0.0.1: ``answer(kind, start, end, step)`` gives the
    body (bytes) or None for the series below; ``kind`` is util, mem or count by the
    query. ``util`` / ``mem`` are the sample texts of one card, step by step."""

    def __init__(self):
        self.util: list[str] | str = "0.5"
        self.mem = "1073741824"
        self.raw: bytes | None = None
        self.drip: tuple[int, float] | None = None  # (Content-Length, seconds per byte)
        self.no_length = False  # HTTP/1.0: the body ends when the connection closes
        self.stop = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 30

            def log_message(self, *args):
                pass

            def do_GET(self):
                q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                body = stub.body(q["query"][0], *(float(q[k][0]) for k in ("start", "end", "step")))
                if stub.drip is not None:
                    length, pause = stub.drip
                    self.send_response(200)
                    self.send_header("Content-Length", str(length))
                    self.end_headers()
                    for _ in range(min(length, 60)):  # bounded: 60 bytes at most
                        if stub.stop.wait(pause):
                            return
                        try:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                        except OSError:
                            return
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if not stub.no_length:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def body(self, query: str, start: float, end: float, step: float) -> bytes:
        if self.raw is not None:
            return self.raw
        n = int((end - start) // step) + 1
        labels = {"instance": "n1:9400", "uuid": "GPU-1", "vendor": "nvidia",
                  "card_type": "A100"}  # fmt: skip
        if query.startswith("hetpatrol_card_utilization_ratio"):
            texts = self.util if isinstance(self.util, list) else [self.util] * n
        elif query.startswith("sum by"):
            texts = [self.mem] * n
        else:
            texts = ["1"] * n
        values = [[start + i * step, texts[i]] for i in range(n)]
        result = [{"metric": labels, "values": values}]
        data = {"resultType": "matrix", "result": result}
        return json.dumps({"status": "success", "data": data}).encode()

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def stub():
    s = StubPrometheus()
    try:
        yield s
    finally:
        s.close()


def efficiency(stub, good, *extra):
    return ["ledger", "efficiency", "--prometheus", stub.url, "--sacct-file", str(good),
            "--no-node-types", *WINDOW, *extra]  # fmt: skip


def strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------- 5: NaN and friends
@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "1e308", "-5", "1.5"])
def test_unreadable_utilization_makes_the_job_unknown(stub, good, capsys, bad):
    stub.util = bad
    assert main(efficiency(stub, good, "--format", "json")) == 0
    doc = strict_json(capsys.readouterr().out)
    job = doc["jobs"][0]
    # 1 h at ceil(3600 / 1000) = 4 s steps: 901 samples, all dropped
    assert (job["status"], job["efficiency"], job["dropped_samples"]) == ("unknown", None, 901)
    assert "every utilization sample unreadable (901 dropped" in job["reason"]
    assert doc["idle"] == []
    assert main(efficiency(stub, good)) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower() and "unknown" in out
    assert "note: job 7 unknown: every utilization sample unreadable" in out


def test_a_few_bad_samples_are_dropped_and_counted(stub, good, capsys):
    stub.util = ["NaN", "+Inf", "-5"] + ["0.05"] * 898
    stub.mem = "NaN"
    assert main(efficiency(stub, good, "--format", "json")) == 0
    job = strict_json(capsys.readouterr().out)["jobs"][0]
    # 898 of 901 steps at 5 %, on one card seen of the two allocated
    assert job["status"] == "ok" and job["dropped_samples"] == 3 + 901
    assert job["busy_card_hours"] == pytest.approx(0.05 * 898 / 901, abs=1e-6)
    assert job["efficiency"] == pytest.approx(0.05 * 898 / 901 / 2, abs=1e-4)
    assert job["by_type"][0]["mean_memory_bytes"] is None
    assert main(efficiency(stub, good)) == 0
    out = capsys.readouterr().out
    assert "note: job 7: 904 sample(s) dropped" in out
    assert "held cards idle (efficiency < 0.1 or no process seen): 7" in out


# ------------------------------------------------------- 14: unexpected shapes
@pytest.mark.parametrize(
    ("raw", "what"),
    [
        (b"[]", "the answer is a JSON list, not an object"),
        (b'{"status":"success","data":{}}', "no data.result list"),
        (b'{"status":"success","data":{"result":[{"metric":null,"values":[]}]}}',
         "result[0] has no metric object and values list"),
        (b"[" * 100000 + b"]" * 100000, "JSON nested too deeply"),
        (b'{"status":"success","data":{"result":[{"metric":{},"values":[[1,"abc"]]}]}}',
         "sample value 'abc' is not a number"),
        (b'{"status":"success","data":{"result":[{"metric":{},"values":[[1,2,3]]}]}}',
         "result[0].values[0] is not [timestamp, \"value\"]: [1, 2, 3]"),
        (b"\xff\xfe",
         "not JSON: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
        (b'"ok"', "the answer is a JSON str, not an object"),
    ],
)  # fmt: skip
def test_unexpected_shape_makes_the_job_unknown(stub, good, capsys, raw, what):
    stub.raw = raw
    assert main(efficiency(stub, good, "--format", "json")) == 65
    job = strict_json(capsys.readouterr().out)["jobs"][0]
    assert job["status"] == "unknown" and job["efficiency"] is None
    assert job["reason"] == f"Prometheus answered an unexpected shape: {what}"
    assert main(efficiency(stub, good)) == 65
    assert "note: job 7 unknown: Prometheus answered an unexpected shape" in (
        capsys.readouterr().out
    )


# --------------------------------------------------- 8: slow drip, huge answers
def test_slow_drip_hits_the_overall_deadline(stub):
    stub.drip = (100000, 0.5)
    prom = eff_mod.Prometheus(stub.url, timeout=2)
    with pytest.raises(eff_mod.PrometheusError, match="no complete answer within 2 s"):
        prom.query_range("up", 0, 10, 1)


def test_answer_larger_than_the_cap_is_refused(stub, good, capsys):
    stub.drip = (2_000_000_000, 0.5)
    with pytest.raises(eff_mod.PrometheusError, match="answer of 2000000000 bytes, more than"):
        eff_mod.Prometheus(stub.url).query_range("up", 0, 10, 1)
    stub.drip = None
    stub.raw, stub.no_length = b" " * 5000, True  # no Content-Length: counted as read
    with pytest.raises(eff_mod.PrometheusError, match="answer larger than 1000 bytes"):
        eff_mod.Prometheus(stub.url, max_bytes=1000).query_range("up", 0, 10, 1)
    stub.drip = (100000, 0.5)
    assert main(efficiency(stub, good, "--prometheus-timeout", "1")) == 69
    assert "no complete answer within 1 s" in capsys.readouterr().err
