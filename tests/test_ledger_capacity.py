"""``hetpatrol ledger capacity`` on the shipped sample (fixtures/ledger-sample/, recorded
from the real test stack by tests/record_ledger_sample.py), in headless Chromium, at
scale (bounded memory), and on the real slurmdbd + MariaDB stack
(tests/test_ledger_capacity_live.py).

The expected figures are read off the sample files by hand:

* nodes.txt: hp-gpu01 ``Gres=gpu:a100:8,ascend:910b:8``, hp-h100 ``Gres=gpu:h100:4``;
* window.txt: 20:01:37 .. 20:02:15 (38 s): capacity 8 x 38 = 304 card-seconds per class
  of hp-gpu01, 4 x 38 = 152 for the H100s;
* sacct.txt: A100 8 x 5 s (job 1) + 6 x 4 s (job 2, ``ReqTRES`` only ``gres/gpu=6``) +
  4 x 4 s (job 3) = 80 card-seconds; 910B 2 x 2 s + 1 x 2 s = 6; waits (Start - Submit)
  13, 18, 22 s (A100) and 25, 27 s (910B); job 6 pending on ``h100`` (``gres/gpu=2``,
  ``TimelimitRaw`` 60): 2 card-hours pending;
* events.txt: hp-gpu01 drained by hetpatrol 20:01:38..20:01:42 (4 s), by an admin
  20:02:09..20:02:12 (3 s); hp-h100 DOWN from 20:01:38, still open (37 s in the window).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import test_ledger_efficiency as eff_test
from conftest import require_program

from hetpatrol.ledger import capacity
from hetpatrol.ledger.sacct_stream import TimeParser

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "fixtures" / "ledger-sample"
START, END = (SAMPLE / "window.txt").read_text().split()
prom = eff_test.prom  # a real Prometheus scraping hetpatrol's exporter (module fixture)


def cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hetpatrol.cli", "ledger", *args],
        capture_output=True, text=True, timeout=120, env=env or dict(os.environ), **kw,
    )  # fmt: skip


def sample_args(*extra: str) -> list[str]:
    return [
        "capacity", "--sacct-file", str(SAMPLE / "sacct.txt"),
        "--nodes-file", str(SAMPLE / "nodes.txt"), "--events-file", str(SAMPLE / "events.txt"),
        "--config-file", str(SAMPLE / "config.txt"), "--start", START, "--end", END,
        "--by", "minute", *extra,
    ]  # fmt: skip


def sample_json(*extra: str) -> dict:
    res = cli(*sample_args("--format", "json", *extra))
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # no progress, no note in a pipe
    return json.loads(res.stdout)


def by_class(doc: dict) -> dict[str, dict]:
    return {c["class"]: c for c in doc["classes"]}


def test_sample_figures_per_class():
    got = by_class(sample_json())
    assert set(got) == {"gpu:a100", "ascend:910b", "gpu:h100"}
    a100, npu, h100 = got["gpu:a100"], got["ascend:910b"], got["gpu:h100"]
    assert (a100["cards"], npu["cards"], h100["cards"]) == (8, 8, 4)
    assert a100["capacity_card_hours"] == pytest.approx(304 / 3600, abs=1e-6)
    assert h100["capacity_card_hours"] == pytest.approx(152 / 3600, abs=1e-6)
    assert a100["allocated_card_hours"] == pytest.approx(80 / 3600, abs=1e-6)
    assert npu["allocated_card_hours"] == pytest.approx(6 / 3600, abs=1e-6)
    assert h100["allocated_card_hours"] == 0
    # hetpatrol's drain apart from the admin's; the H100 node down
    assert a100["drained_by_hetpatrol_card_hours"] == pytest.approx(8 * 4 / 3600, abs=1e-6)
    assert a100["drained_card_hours"] == pytest.approx(8 * 3 / 3600, abs=1e-6)
    assert a100["down_card_hours"] == 0
    assert npu["drained_by_hetpatrol_card_hours"] == a100["drained_by_hetpatrol_card_hours"]
    assert h100["down_card_hours"] == pytest.approx(4 * 37 / 3600, abs=1e-6)
    assert a100["down_share"] == pytest.approx(56 / 304, abs=1e-4)
    # demand: waits, pending, by name vs any type
    assert a100["wait_median_hours"] == pytest.approx(18 / 3600, abs=1e-6)
    assert a100["wait_p90_hours"] == pytest.approx(22 / 3600, abs=1e-6)
    assert npu["wait_median_hours"] == pytest.approx(25 / 3600, abs=1e-6)
    assert (a100["jobs_by_name"], a100["jobs_any_type"]) == (2, 1)
    assert (npu["jobs_by_name"], npu["jobs_any_type"]) == (1, 1)
    assert (h100["pending_jobs"], h100["pending_card_hours"]) == (1, 2.0)
    assert a100["pending_jobs"] == 0
    assert a100["top_accounts"] == [
        {"account": "physics", "card_hours": pytest.approx(64 / 3600, abs=1e-6)},
        {"account": "chemistry", "card_hours": pytest.approx(16 / 3600, abs=1e-6)},
    ]
    # the series add up to the totals; two minute buckets (20:01:37.., 20:02:00..)
    assert [b["start"][11:19] for b in a100["series"]] == ["20:01:37", "20:02:00"]
    for c in got.values():
        for k in ("allocated", "capacity", "down", "drained", "drained_by_hetpatrol"):
            total = sum(b[f"{k}_card_hours"] for b in c["series"])
            assert total == pytest.approx(c[f"{k}_card_hours"], abs=1e-5), (c["class"], k)
    # the default thresholds: every class more than 10 % down or drained
    assert {k: c["verdict"] for k, c in got.items()} == dict.fromkeys(got, "unhealthy")
    assert a100["why"] == "down/drained 18% of capacity > 10%"


def test_sample_allocated_agrees_with_ledger_usage(tmp_path):
    """``ledger usage`` reads the same records (the ledger's 13 fields of each line)."""
    cut = tmp_path / "sacct13.txt"
    lines = (SAMPLE / "sacct.txt").read_text().splitlines()
    cut.write_text("".join("|".join(ln.split("|")[:13]) + "\n" for ln in lines))
    res = cli("usage", "--sacct-file", str(cut), "--start", START, "--end", END, "--by", "",
              "--no-node-types", "--format", "json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    usage = {r["gres"]: r["card_hours"] for r in json.loads(res.stdout)["rows"]}
    got = by_class(sample_json())
    assert usage == {k: pytest.approx(c["allocated_card_hours"], abs=1e-6)
                     for k, c in got.items() if c["allocated_card_hours"]}  # fmt: skip


def test_sreport_notes_on_the_sample():
    got = by_class(sample_json())
    # 38 s inside one hour: no whole past hour to compare
    assert "no whole past hour" in got["gpu:a100"]["sreport_note"]
    assert got["gpu:a100"]["sreport"] is None
    assert got["gpu:h100"]["sreport_note"].startswith(
        "gres/gpu:h100 is not in AccountingStorageTRES"
    )


def test_verdicts_follow_the_config_thresholds(tmp_path):
    conf = tmp_path / "hetpatrol.yaml"
    conf.write_text(
        "ledger:\n  capacity:\n    unhealthy_down_share: 0.5\n"
        "    expand_allocated_share: 0.2\n    expand_wait_p90_hours: 0.005\n"
    )
    got = by_class(sample_json("--config", str(conf)))
    # A100: 26 % allocated > 20 %, p90 22 s = 0.0061 h > 0.005 h
    assert got["gpu:a100"]["verdict"] == "expand"
    assert got["gpu:a100"]["why"] == "allocated 26% > 20% and wait p90 0.01 h > 0.005 h"
    assert got["ascend:910b"]["verdict"] == "underused"  # 2 % allocated < 30 %
    assert got["gpu:h100"]["verdict"] == "unhealthy"  # 97 % down > 50 %
    conf.write_text("ledger:\n  capacity:\n    unhealthy_down_share: 2\n")
    res = cli(*sample_args("--config", str(conf)))
    assert res.returncode == 64
    said = "hetpatrol.yaml:3: ledger.capacity.unhealthy_down_share: must be at most 1 (got 2)"
    assert said in res.stderr


def test_table_and_csv():
    res = cli(*sample_args())
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[1].split() == ["CLASS", "CARDS", "CAP_H", "ALLOC_H", "ALLOC", "BUSY", "DOWN",
                                "WAIT_P50_H", "WAIT_P90_H", "PEND_H", "BY_NAME/ANY",
                                "VERDICT"]  # fmt: skip
    assert lines[3].split() == ["gpu:a100", "8", "0.084", "0.022", "26%", "-", "18%", "0.005",
                                "0.006", "0.000", "2/1", "unhealthy"]  # fmt: skip
    assert "gpu:h100: unhealthy: down/drained 97% of capacity > 10%" in lines
    res = cli(*sample_args("--format", "csv"))
    rows = {r["class"]: r for r in csv.DictReader(io.StringIO(res.stdout))}
    assert rows["gpu:h100"]["pending_card_hours"] == "2.0"
    assert rows["gpu:a100"]["busy_share"] == ""  # no Prometheus: unknown, not 0


def test_bucket_edges_follow_the_local_calendar():
    t0 = datetime(2026, 3, 4, 15, 30).timestamp()  # a Wednesday
    t1 = datetime(2026, 3, 18, 1, 0).timestamp()
    weeks = capacity.bucket_edges(t0, t1, "week")
    assert [datetime.fromtimestamp(t).strftime("%a %d %H:%M") for t in weeks] == [
        "Wed 04 15:30", "Mon 09 00:00", "Mon 16 00:00", "Wed 18 01:00"]  # fmt: skip
    days = capacity.bucket_edges(t0, t1, "day")
    assert len(days) == 16 and datetime.fromtimestamp(days[1]).hour == 0
    with pytest.raises(ValueError, match="more than 100,000"):
        capacity.bucket_edges(0, 365 * 86400.0, "minute")


def test_wait_quantiles_exact_below_1000_s_and_within_1_percent_above():
    h = capacity.WaitHistogram()
    for w in (13, 18, 22):
        h.add(w)
    assert (h.quantile(0.5), h.quantile(0.9)) == (18, 22)
    big = capacity.WaitHistogram()
    for i in range(1, 10001):
        big.add(i * 30.0)  # 30 s .. 300,000 s
    assert big.quantile(0.5) == pytest.approx(150_000, rel=0.011)
    assert big.quantile(0.9) == pytest.approx(270_000, rel=0.011)
    assert len(big.bins) < 1000 + 600  # bounded however many waits


def test_events_parse_kinds_and_bad_line():
    evs = capacity.parse_events((SAMPLE / "events.txt").read_text(),
                                TimeParser())  # fmt: skip
    assert [(e.node, e.kind, e.end is None) for e in evs] == [
        ("hp-gpu01", "drained_by_hetpatrol", False), ("hp-gpu01", "drained", False),
        ("hp-h100", "down", True)]  # fmt: skip
    with pytest.raises(capacity.CapacityDataError, match="line 1: 2 fields"):
        capacity.parse_events("a|b\n", TimeParser())


def test_malformed_sacct_line_is_a_data_error(tmp_path):
    bad = tmp_path / "sacct.txt"
    bad.write_text((SAMPLE / "sacct.txt").read_text() + "1|2|3\n")
    res = cli(*sample_args()[:1], "--sacct-file", str(bad), *sample_args()[3:])
    assert res.returncode == 65
    assert "sacct line 7" in res.stderr


def test_non_utf8_capacity_line_is_the_ledgers_data_error():
    """One decoder for every sacct line (sacct_stream.decode_line): a capacity line that
    is not UTF-8 names its line and byte as ``ledger usage`` does, as a CapacityDataError."""
    lines = (SAMPLE / "sacct.txt").read_bytes().splitlines(keepends=True)
    head = lines[0]
    bad = head[:10] + b"\xff" + head[11:]
    with pytest.raises(capacity.CapacityDataError) as exc:
        list(capacity.split_capacity_lines([head, bad]))
    assert str(exc.value).startswith("sacct line 2: not UTF-8 (invalid start byte at byte 10): ")


# ------------------------------------------------------------------ the page, in Chromium
def test_html_page_renders_in_headless_chromium(tmp_path):
    chromium = require_program("chromium", "chromium-browser", package="chromium")
    page = tmp_path / "capacity.html"
    res = cli(*sample_args("--html", str(page), "--format", "json"))
    assert res.returncode == 0, res.stderr
    text = page.read_text()
    # self-contained: nothing to fetch
    assert not re.search(r"""(src|href)=["'](https?:|//)""", text)
    assert "<script" not in text
    shot = tmp_path / "shot.png"
    base = [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=900,1100",
            "--enable-logging=stderr", "--v=0"]  # fmt: skip
    url = page.as_uri()
    shot_run = subprocess.run([*base, f"--screenshot={shot}", url], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    assert shot.stat().st_size > 20_000, shot_run.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert re.search(r"<title>hetpatrol capacity 2026-12-01T20:01:37Z \.\. ", html)
    charts = re.findall(r'<div class="chart"><svg', html)
    assert len(charts) == 3  # one chart per class
    assert re.findall(r'<section class="class" id="c-([^"]+)"', html) == [
        "ascend:910b", "gpu:a100", "gpu:h100"]  # fmt: skip
    # the verdicts come first, before any chart
    assert html.index('id="verdicts"') < html.index('class="chart"')
    # the browser's own console: no error, no refused load (CSP), no failed fetch
    for log in (shot_run.stderr, dom.stderr):
        console = [ln for ln in log.splitlines() if "CONSOLE" in ln or "Refused" in ln
                   or "net::ERR" in ln]  # fmt: skip
        assert console == [], console


def test_html_without_matplotlib_says_what_to_install(tmp_path):
    """The extra missing: exit 69 with the pip line (matplotlib hidden by a stub module
    that raises ImportError, as a missing package does)."""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "matplotlib.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = {**os.environ, "PYTHONPATH": f"{stub}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    res = cli(*sample_args("--html", str(tmp_path / "x.html")), env=env)
    assert res.returncode == 69
    assert "pip install 'hetpatrol[report]'" in res.stderr


def test_the_daemon_never_imports_the_report_extra():
    code = ("import sys, hetpatrol.daemon, hetpatrol.cli, hetpatrol.ledger.command;"
            "print(sorted(m for m in sys.modules if m.startswith('matplotlib')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ busy, from Prometheus
def test_busy_share_from_a_real_prometheus(prom, tmp_path):
    """The cards of tests/test_ledger_efficiency.py (a real Prometheus scraping hetpatrol's
    exporter): job 101 holds 2 A100 for 5 s, one seen 80 % busy (4 busy card-seconds of
    10); 103 holds 1 A100 with no process (0 of 5); 102 holds one 910B 50 % busy (2.5 of
    5); 104 ran before Prometheus had data (unknown: not measured)."""
    url, t0 = prom
    s = math.ceil(t0) + 1
    e = s + 5
    lines = [
        eff_test.sacct_line("101", "hpalice", s, e, "cpu=1,gres/gpu:a100=2,gres/gpu=2"),
        eff_test.sacct_line("102", "hpbob", s, e, "cpu=1,gres/ascend:910b=1,gres/ascend=1"),
        eff_test.sacct_line("103", "hpalice", s, e, "cpu=1,gres/gpu:a100=1,gres/gpu=1"),
        eff_test.sacct_line("104", "hpalice", s - 3600, s - 3000, "cpu=1,gres/gpu:a100=1"),
    ]
    saved = tmp_path / "sacct.txt"
    saved.write_text("".join(f"{ln}|cpu=1|60\n" for ln in lines))
    events = tmp_path / "events.txt"
    events.write_text("")
    res = cli("capacity", "--sacct-file", str(saved), "--nodes-file", str(SAMPLE / "nodes.txt"),
              "--events-file", str(events), "--no-sreport", "--prometheus", url,
              "--start", eff_test.local(s - 7200), "--end", eff_test.local(e + 60),
              "--by", "hour", "--format", "json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = by_class(json.loads(res.stdout))
    a100, npu = got["gpu:a100"], got["ascend:910b"]
    assert a100["busy_jobs_measured"] == 2  # 101 and 103; 104 has no data
    assert a100["busy_share"] == pytest.approx(4 / 15, abs=1e-3)
    assert npu["busy_share"] == pytest.approx(0.5, abs=1e-3)
    # busy card-hours: the measured share x every allocated card-hour (104's included)
    assert a100["allocated_card_hours"] == pytest.approx((10 + 5 + 600) / 3600, abs=1e-6)
    assert a100["busy_card_hours"] == pytest.approx(4 / 15 * 615 / 3600, abs=1e-5)
    busy = sum(b["busy_card_hours"] for b in a100["series"])
    assert busy == pytest.approx(4 / 3600, abs=1e-5)


# ------------------------------------------------------------------ at scale
def _scale_inputs(tmp: Path, jobs: int) -> tuple[Path, Path]:
    """tests/bench/ledger.py's generated sacct records (500 busy nodes, 30 days) with the
    two capacity fields added, and 10,000 nodes of three classes."""
    sys.path.insert(0, str(REPO / "tests" / "bench"))
    import ledger as bench_ledger  # tests/bench/ledger.py

    raw, data, nodes = tmp / f"raw{jobs}.txt", tmp / f"sacct{jobs}.txt", tmp / "nodes.txt"
    bench_ledger.generate(raw, jobs)
    with open(raw) as src, open(data, "w") as out:
        for ln in src:
            ln = ln.rstrip("\n")
            tres = ln.rsplit("|", 1)[1] or "cpu=1,gres/gpu=2"
            out.write(f"{ln}|{tres}|120\n")
    raw.unlink()
    with open(nodes, "w") as out:
        for i in range(10_000):
            name, gtype = bench_ledger.node_type(i)
            out.write(f"NodeName=gpu{i + 1:04d} State=IDLE Gres={name}:{gtype}:8\n")
    return data, nodes


def _peak_run(argv: list[str], stderr=subprocess.PIPE) -> tuple[float, dict]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr)
    out = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read() if proc.stderr else ""
    return usage.ru_maxrss / 1024, json.loads(out)


@pytest.mark.slow
def test_a_year_of_10000_nodes_in_bounded_memory(tmp_path):
    """Peak RSS of a year's window by day over 10,000 nodes grows by less than 12 MB from
    20,000 to 150,000 streamed sacct records (the records are never held)."""
    peaks = {}
    for jobs in (20_000, 150_000):
        data, nodes = _scale_inputs(tmp_path, jobs)
        sacct = f"sh -c {shlex.quote('exec cat ' + shlex.quote(str(data)))} sacct"
        events = tmp_path / "events.txt"
        events.write_text("")
        argv = [sys.executable, "-m", "hetpatrol.cli", "ledger", "capacity", "--sacct", sacct,
                "--nodes-file", str(nodes), "--events-file", str(events), "--no-sreport",
                "--start", "2025-02-01T00:00:00", "--end", "2026-02-01T00:00:00",
                "--by", "day", "--format", "json"]  # fmt: skip
        peak, doc = _peak_run(argv)
        assert doc["records"] == jobs
        a100 = {c["class"]: c for c in doc["classes"]}["gpu:a100"]
        assert a100["cards"] == 8 * 3334 and len(a100["series"]) == 365
        peaks[jobs] = peak
    print(f"peak RSS MB by records: {peaks}")
    assert peaks[150_000] - peaks[20_000] < 12, peaks


def test_progress_on_a_terminal_only(tmp_path):
    """stderr a TTY: ``records read`` every 10,000, the line cleared at the end; stdout
    stays the JSON document."""
    import pty

    data, nodes = _scale_inputs(tmp_path, 25_000)
    events = tmp_path / "events.txt"
    events.write_text("")
    master, slave = pty.openpty()
    argv = [sys.executable, "-m", "hetpatrol.cli", "ledger", "capacity", "--sacct-file",
            str(data), "--nodes-file", str(nodes), "--events-file", str(events),
            "--no-sreport", "--start", "2026-01-01T00:00:00", "--end", "2026-02-01T00:00:00",
            "--format", "json"]  # fmt: skip
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=slave, timeout=120)
    os.close(slave)
    seen = b""
    try:
        while chunk := os.read(master, 4096):
            seen += chunk
    except OSError:  # EIO once the pty's other end is closed
        pass
    os.close(master)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["records"] == 25_000
    assert b"\rhetpatrol ledger capacity: 10000 sacct records read" in seen
    assert b"20000 sacct records read" in seen and seen.endswith(b"\r\x1b[K")
