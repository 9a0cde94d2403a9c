#!/usr/bin/env python3
"""The real daemon, measured from outside (issue 17): ``hetpatrol run`` in its own
process, its Ascend collector spawning a stand-in ``npu-smi`` that is a real executable
(``/bin/sh`` printing a recorded table), so every patrol pays a fork and exec.

Figures (goal in brackets), for 8, 16, 32 and 64 NPUs (tables made from the recorded
910B4 table of ``fixtures/nodes/healthy-mixed``: its NPU block repeated with new NPU ids
and bus ids):

- ``cpu_ms_per_card_per_patrol`` [<= 0.2 at 16 cards]: CPU time (user + sys) of the
  daemon and its children (``psutil``) over a window of patrols at a 0.05 s interval,
  divided by patrols x cards. The window starts after the first patrols (imports, first
  parse) and counts patrols from ``hetpatrol_patrols_total`` scraped at both ends.
- ``rss_after_first_patrol_mb`` [<= 30]: the daemon's RSS once it has written its first
  state file, the HTTP server up; ``rss_growth_mb``: RSS at the end of the window - that
  (beside it the second half's growth, RSS at the end - RSS half-way: the per-patrol
  slope, without the first sample's timing and the allocator's warm-up in it).
- ``scrape_p50_ms`` / ``scrape_p99_ms`` [p99 <= 2 with gzip]: 20 clients (threads, one
  keep-alive connection each) sending in step, every 40 ms (500 scrapes/s offered), with
  and without ``Accept-Encoding: gzip``; ``bytes_per_scrape`` plain and gzip [gzip <= 6 KB].
- ``check_wall_ms`` [<= 50]: ``hetpatrol check --state-path P`` from exec to exit
  (median of 20), beside a bare ``python -c pass`` (the interpreter's floor).
- With ``prometheus-node-exporter`` installed, the same in-step client scrapes it
  (``--collector.disable-defaults --collector.cpu --collector.meminfo``, a typical small
  set) in the same run, and its p99 and bytes are printed beside hetpatrol's.

    python tests/bench/daemon.py [--cards 8,16,32,64] [--seconds 6] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "fixtures" / "nodes" / "healthy-mixed" / "npu-smi-info.txt"
GOALS = {
    "cpu_ms_per_card_per_patrol_16": ("<=", 0.2),
    "rss_after_first_patrol_mb": ("<=", 30.0),
    "scrape_p99_ms_gzip": ("<=", 2.0),
    "bytes_per_scrape_gzip_16": ("<=", 6144),
    "check_wall_ms": ("<=", 50.0),
    "rss_growth_mb": ("<=", 0.5),
}


def npu_table(npus: int) -> str:
    """A ``npu-smi info`` table of ``npus`` 910B4 NPUs from the recorded 8-NPU one."""
    lines = TABLE.read_text().splitlines()
    head = lines[:6]
    block = lines[6:9]  # NPU row, chip row, the ===== border
    rows = []
    for i in range(npus):
        npu = re.sub(r"^\| 0 ", f"| {i:<2d}", block[0], count=1)
        chip = block[1].replace("0000:C1:00.0", f"0000:{(i // 32) + 1:02X}:{i % 32:02X}.0")
        rows += [npu, chip, block[2]]
    procs = lines[30:33]
    for i in range(npus):
        procs.append(f"| No running processes found in NPU {i:<63d}|")
        procs.append(lines[34])
    return "\n".join(head + rows + procs) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, conn: http.client.HTTPConnection | None, gz: bool):
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"} if gz else {})
    resp = conn.getresponse()
    return conn, resp.read()


class _Conn:
    """One keep-alive client connection driven by :func:`scrape_load`'s event loop."""

    def __init__(self, port: int, request: bytes):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.request = request
        self.buf = b""
        self.sent_at: float | None = None
        self.due = 0.0

    def send(self, now: float) -> None:
        self.sock.sendall(self.request)  # a few dozen bytes: fits the socket buffer
        self.sent_at, self.buf = now, b""

    def receive(self) -> int | None:
        """Read what is there; the body size once the whole response is in (a
        ``Content-Length`` body, or a chunked one as node_exporter sends)."""
        self.buf += self.sock.recv(1 << 20)
        head, sep, body = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return None
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        if length:
            return int(length[1]) if len(body) >= int(length[1]) else None
        if not body.endswith(b"0\r\n\r\n"):
            return None
        size, pos = 0, 0
        while True:  # chunked: <hex size>\r\n<data>\r\n ... 0\r\n\r\n
            end = body.index(b"\r\n", pos)
            n = int(body[pos:end].split(b";")[0], 16)
            if n == 0:
                return size
            size, pos = size + n, end + 2 + n + 2


def scrape_load(port: int, mode: str, gz: bool, seconds: float, clients: int = 20) -> dict:
    """``clients`` keep-alive connections driven by one thread (``selectors``: the client
    adds no lock or GIL wait of its own to the latency), never two requests in flight on
    one connection. ``mode``: ``step``, all send together every 40 ms (500/s offered, the
    worst case of scrapers sharing a schedule); ``paced``, each every 40 ms at its own
    random phase; ``saturated``, each sends again as soon as its answer is in (capacity).
    Latency is from the send to the last byte of the answer, in ms."""
    import random
    import selectors

    period = 0.04
    request = b"GET /metrics HTTP/1.1\r\nHost: bench\r\n"
    request += b"Accept-Encoding: gzip\r\n\r\n" if gz else b"\r\n"
    conns = [_Conn(port, request) for _ in range(clients)]
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    rng = random.Random(17)
    start = time.perf_counter() + 0.02
    for c in conns:
        c.due = start + (rng.uniform(0, period) if mode == "paced" else 0.0)
    end = start + seconds
    lat: list[float] = []
    sizes: list[int] = []
    while True:
        now = time.perf_counter()
        for c in conns:
            if c.sent_at is None and c.due <= now and now < end:
                c.send(now)
        if now >= end and all(c.sent_at is None for c in conns):
            break
        waiting = [c.due for c in conns if c.sent_at is None and c.due < end]
        timeout = max(0.0, min(waiting, default=end) - now)
        if any(c.sent_at is not None for c in conns) or timeout > 0:
            for key, _ in sel.select(timeout):
                c = key.data
                size = c.receive()
                if size is None:
                    continue
                done = time.perf_counter()
                lat.append((done - c.sent_at) * 1000)
                sizes.append(size)
                c.sent_at = None
                if mode == "saturated":
                    c.due = done
                elif mode == "step":
                    c.due = start + (int((done - start) / period) + 1) * period
                else:
                    c.due = max(c.due + period, done)
    wall = time.perf_counter() - start
    for c in conns:
        sel.unregister(c.sock)
        c.sock.close()
    lat.sort()
    return {
        "p50_ms": round(statistics.median(lat), 3),
        "p99_ms": round(lat[max(0, int(len(lat) * 0.99) - 1)], 3),
        "bytes": int(statistics.median(sizes)),
        "scrapes": len(lat),
        "rate_per_s": round(len(lat) / wall),
    }


def patrols_total(port: int) -> int:
    _, body = scrape(port, None, False)
    m = re.search(rb"^hetpatrol_patrols_total (\S+)$", body, re.M)
    return int(float(m[1])) if m else 0


class Daemon:
    """``hetpatrol run`` with ``npus`` stand-in NPUs at ``interval`` s, in its own process."""

    def __init__(self, npus: int, interval: float, tmp: Path):
        tool = tmp / f"npu-smi-{npus}"
        table = tmp / f"table-{npus}.txt"
        table.write_text(npu_table(npus))
        tool.write_text(f"#!/bin/sh\nexec cat {table}\n")
        tool.chmod(0o755)
        tag = f"{npus}-{interval:g}"
        self.state = tmp / f"state-{tag}.json"
        self.state.unlink(missing_ok=True)
        config = tmp / f"bench-{tag}.yaml"
        config.write_text(
            f"node: bench\ninterval_seconds: {interval}\nstate_path: {self.state}\n"
            f"jsonl: {{path: {tmp}/patrol-{tag}.jsonl, max_bytes: 1000000, backups: 1}}\n"
            "kernel_log: {enabled: false}\nenvironment: {enabled: false}\n"
            f"collectors:\n  nvidia: {{enabled: false}}\n"
            f'  ascend: {{command: ["{tool}", "info"], detail: false}}\n'
        )
        self.port = free_port()
        # the log to a file: a pipe nobody reads fills up and blocks the daemon's next
        # log line (patrol_overran, at an interval shorter than a patrol)
        self.log = tmp / f"daemon-{tag}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hetpatrol.cli", "run", "--config", str(config)]
                + ["--listen", f"127.0.0.1:{self.port}", "--log-level", "warning"],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while not self.state.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(self.log.read_text()[-2000:])
            time.sleep(0.005)
        self.ps = psutil.Process(self.proc.pid)
        #: RSS once the first patrol's state file exists (the HTTP server is up before)
        self.rss_first_mb = self.rss_mb()

    def rss_mb(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def cpu(self) -> tuple[float, float]:
        """CPU seconds (user + sys) of the daemon itself and of its reaped children."""
        t = self.ps.cpu_times()
        return t.user + t.system, t.children_user + t.children_system

    def patrols(self) -> int:
        return patrols_total(self.port)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cpu_window(npus: int, seconds: float, tmp: Path) -> dict:
    """CPU per card per patrol at a 0.05 s interval (the daemon patrols back to back)."""
    d = Daemon(npus, 0.05, tmp)
    try:
        time.sleep(1.0)  # past the first patrols
        p0, (s0, c0) = d.patrols(), d.cpu()
        time.sleep(seconds)
        p1, (s1, c1) = d.patrols(), d.cpu()
        n = max(1, p1 - p0)
        own, children = (s1 - s0) * 1000 / n, (c1 - c0) * 1000 / n
        return {
            "cards": npus,
            "patrols": p1 - p0,
            "cpu_ms_per_card_per_patrol": round((own + children) / npus, 4),
            "daemon_ms_per_patrol": round(own, 3),
            "tool_children_ms_per_patrol": round(children, 3),
            "rss_after_first_patrol_mb": round(d.rss_first_mb, 1),
        }
    finally:
        d.stop()


def scrapes(tmp: Path, seconds: float, ne_port: int | None = None) -> dict:
    """Every scrape mode with and without gzip: the 16-card daemon patrolling every 1 s
    (patrols do overlap the windows), and the same under a patrol every 0.05 s (stress)."""
    out: dict = {}
    d = Daemon(16, 1.0, tmp)
    try:
        scrape_load(d.port, "paced", True, 0.5)  # connections and server threads warm
        for mode in ("step", "paced", "saturated"):
            for gz in (False, True):
                out[f"{mode}_{'gzip' if gz else 'plain'}"] = scrape_load(d.port, mode, gz, seconds)
    finally:
        d.stop()
    d = Daemon(16, 0.05, tmp)
    try:
        scrape_load(d.port, "paced", True, 0.5)
        out["step_gzip_patrolling_every_0.05s"] = scrape_load(d.port, "step", True, seconds)
    finally:
        d.stop()
    return out


def growth(patrols: int, tmp: Path) -> dict:
    """RSS from the first patrol to ``patrols`` (16 cards, patrols back to back)."""
    d = Daemon(16, 0.001, tmp)
    try:
        points = {1: round(d.rss_first_mb, 2)}
        deadline = time.monotonic() + 1800
        # the half-way mark: the second half's growth is the per-patrol slope, apart
        # from the first sample (taken while the first state file appears) and the
        # allocator's warm-up (arenas and buffers filling over the first ~2,000 patrols)
        marks = sorted({m for m in (100, 1000, patrols // 2, patrols) if 0 < m <= patrols})
        for mark in marks:
            stalled, last = time.monotonic(), 0
            while (done := d.patrols()) < mark:
                if done != last:
                    stalled, last = time.monotonic(), done
                if time.monotonic() > deadline or time.monotonic() - stalled > 60:
                    raise RuntimeError(f"the daemon stopped patrolling at {done} of {mark}")
                time.sleep(0.5)
            points[mark] = round(d.rss_mb(), 2)
        return {
            "rss_mb_at_patrol": points,
            "rss_growth_mb": round(points[marks[-1]] - points[1], 2),
            "rss_growth_second_half_mb": round(points[marks[-1]] - points[patrols // 2], 2)
            if patrols // 2 in points
            else None,
            "patrols": marks[-1],
        }
    finally:
        d.stop()


def check_wall(state: Path, runs: int = 20) -> dict:
    """``hetpatrol check`` wall time from exec to exit (median of ``runs``), beside the
    interpreter's floor: ``python -c pass`` and ``python -S -c pass`` (no site hooks)."""
    # the script beside this interpreter (a version manager's shim on the PATH would add
    # its own start-up to every run)
    exe = str(Path(sys.executable).with_name("hetpatrol"))
    if not Path(exe).exists():
        exe = shutil.which("hetpatrol") or exe

    def median_ms(argv: list[str]) -> float:
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, check=False)
            times.append((time.perf_counter() - t) * 1000)
        return round(statistics.median(times), 1)

    # byte-compiled, as pip and the Debian package install it (an editable install or
    # PYTHONDONTWRITEBYTECODE=1 leaves no .pyc: every run would compile the sources)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "hetpatrol")], check=False)
    check = ["check", "--state-path", str(state), "--max-age", "1e8"]
    no_site = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); from hetpatrol.entry import main; "
        f"sys.exit(main({check!r}))"
    )
    return {
        "check_wall_ms": median_ms([exe, *check]),
        "python_start_ms": median_ms([sys.executable, "-c", "pass"]),
        # the same check and interpreter without site hooks (no .pth files, no editable
        # finder): what is left is the check's own imports and work
        "check_wall_no_site_ms": median_ms([sys.executable, "-S", "-c", no_site]),
        "python_start_no_site_ms": median_ms([sys.executable, "-S", "-c", "pass"]),
    }


def bare_python_rss_mb() -> float:
    """RSS of this interpreter doing nothing (with its site hooks): the floor."""
    code = "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return round(int(out.stdout) / 1024, 1)


def node_exporter(seconds: float) -> dict | None:
    exe = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if not exe:
        return None
    port = free_port()
    proc = subprocess.Popen(
        [exe, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults"]
        + ["--collector.cpu", "--collector.meminfo"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                scrape(port, None, False)
                break
            except OSError:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.1)
        scrape_load(port, "paced", True, 0.5)
        out = {}
        for mode in ("step", "saturated"):
            for gz in (False, True):
                out[f"{mode}_{'gzip' if gz else 'plain'}"] = scrape_load(port, mode, gz, seconds)
        cpu = psutil.Process(proc.pid).cpu_times()
        out["cpu_s"] = round(cpu.user + cpu.system, 3)
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def headline(out: dict) -> dict:
    """The figures of issue 17's table from a run's details."""
    by = {r["cards"]: r for r in out["cpu"]}
    h: dict = {}
    if 16 in by:
        h["cpu_ms_per_card_per_patrol_16"] = by[16]["cpu_ms_per_card_per_patrol"]
        h["rss_after_first_patrol_mb"] = by[16]["rss_after_first_patrol_mb"]
    if out.get("scrapes"):
        h["scrape_p99_ms_gzip"] = out["scrapes"]["step_gzip"]["p99_ms"]
        h["bytes_per_scrape_gzip_16"] = out["scrapes"]["step_gzip"]["bytes"]
    if out.get("check"):
        h["check_wall_ms"] = out["check"]["check_wall_ms"]
    if out.get("growth"):
        h["rss_growth_mb"] = out["growth"]["rss_growth_mb"]
    return h


def reasons(out: dict) -> dict[str, str]:
    """Why each figure is what it is, from the run's own measurements (printed beside a
    miss: what part of the figure is not hetpatrol's to cut, and what is)."""
    r: dict[str, str] = {}
    by = {c["cards"]: c for c in out["cpu"]}
    if 16 in by:
        c = by[16]
        r["cpu_ms_per_card_per_patrol_16"] = (
            f"the daemon's own work is {c['daemon_ms_per_patrol'] / 16:.3f} ms/card, the "
            f"spawned tool (sh + cat, fork and exec) {c['tool_children_ms_per_patrol'] / 16:.3f}"
            " ms/card; per patrol the daemon's part is parse, judge, JSONL, state file and "
            "/metrics in Python (~14 series a card)"
        )
        added = c["rss_after_first_patrol_mb"] - out["bare_python_rss_mb"]
        r["rss_after_first_patrol_mb"] = (
            f"a bare `python -c pass` here is {out['bare_python_rss_mb']} MB (its site hooks "
            f"included); the daemon adds {added:.1f}"
            " MB: its own modules (config, checks, actions, patrol, exporters: ~12 MB), "
            "PyYAML, psutil, importlib.metadata (plugin discovery), its threads and the "
            "first patrol's data"
        )
    if out.get("scrapes"):
        s = out["scrapes"]
        per_scrape = 1000 / max(1, s["saturated_gzip"]["rate_per_s"])
        line = (
            f"20 requests arriving together are answered one after another by one thread; "
            f"at saturation a scrape takes {per_scrape:.3f} ms of the server "
            f"({s['saturated_gzip']['rate_per_s']}/s), so the last of a round waits "
            f"~{20 * per_scrape:.1f} ms plus the scheduling of a shared machine; the same "
            f"20 at their own phases (paced): p99 {s['paced_gzip']['p99_ms']} ms"
        )
        ne = out.get("node_exporter")
        if ne:
            line += (
                f"; node_exporter under the same client: step p99 {ne['step_gzip']['p99_ms']} ms"
            )
        r["scrape_p99_ms_gzip"] = line + f"; load average {out['meta']['loadavg']}"
    if out.get("check"):
        ck = out["check"]
        r["check_wall_ms"] = (
            f"`python -c pass` alone takes {ck['python_start_ms']} ms with this "
            f"interpreter's site hooks (.pth files, an editable install's finder); without "
            f"them (`python -S`) the check takes {ck['check_wall_no_site_ms']} ms, of which "
            f"{ck['python_start_no_site_ms']} ms is the interpreter's start"
        )
    if out.get("growth"):
        g = out["growth"]["rss_mb_at_patrol"]
        r["rss_growth_mb"] = "RSS by patrol: " + ", ".join(f"{k}: {v}" for k, v in g.items())
        half = out["growth"].get("rss_growth_second_half_mb")
        if half is not None:
            r["rss_growth_mb"] += (
                f"; {half} MB of it in the second half (a structure that grows per patrol "
                "shows there; the rest is the first sample and the allocator's warm-up)"
            )
    return r


def met(key: str, value) -> bool:
    op, goal = GOALS[key]
    return value is not None and (value <= goal if op == "<=" else value >= goal)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cards", default="8,16,32,64", help="NPU counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=6.0, help="CPU window per count")
    parser.add_argument("--scrape-seconds", type=float, default=3.0, help="per scrape mode")
    parser.add_argument(
        "--growth-patrols", type=int, default=10_000, help="RSS growth up to this patrol (0: skip)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.cards.split(",")]
    out = bench(counts, args.seconds, args.scrape_seconds, args.growth_patrols)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(report(out))
    return 0


def bench(
    counts: list[int], seconds: float = 6.0, scrape_seconds: float = 3.0, growth_patrols: int = 0
) -> dict:
    """Every figure of this module as one dict (``headline``: issue 17's table;
    ``reasons``: why each is what it is; the rest: details)."""
    out: dict = {"meta": {"loadavg": [round(x, 2) for x in os.getloadavg()]}}
    # byte-compiled first, as pip and the Debian package install it: an editable install
    # under PYTHONDONTWRITEBYTECODE=1 compiles every module in every process (time, and
    # ~1.3 MB of the daemon's RSS)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "hetpatrol")], check=False)
    out["bare_python_rss_mb"] = bare_python_rss_mb()
    with tempfile.TemporaryDirectory(prefix="hetpatrol-bench-") as name:
        tmp = Path(name)
        out["cpu"] = [cpu_window(n, seconds, tmp) for n in counts]
        if 16 in counts:
            out["scrapes"] = scrapes(tmp, scrape_seconds)
            out["check"] = check_wall(next(tmp.glob("state-16-*.json")))
            if growth_patrols:
                out["growth"] = growth(growth_patrols, tmp)
    out["node_exporter"] = node_exporter(scrape_seconds)
    out["meta"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out["headline"] = headline(out)
    out["reasons"] = reasons(out)
    return out


def report(out: dict) -> str:
    """The run as a text table: per card count, the scrape modes, the goals."""
    lines = [
        "real daemon (hetpatrol run, stand-in npu-smi spawned every patrol, interval 0.05 s)",
        f"{'cards':>5} {'patrols':>7} {'cpu ms/card/patrol':>19} {'daemon ms':>10} "
        f"{'tool ms':>8} {'rss MB':>7}",
    ]
    for r in out["cpu"]:
        lines.append(
            f"{r['cards']:>5} {r['patrols']:>7} {r['cpu_ms_per_card_per_patrol']:>19} "
            f"{r['daemon_ms_per_patrol']:>10} {r['tool_children_ms_per_patrol']:>8} "
            f"{r['rss_after_first_patrol_mb']:>7}"
        )
    ne = out.get("node_exporter") or {}
    if out.get("scrapes"):
        lines.append(
            "scrapes, 16 cards, 20 keep-alive clients (patrol every 1 s unless said); step: "
            "all send together every 40 ms; paced: each every 40 ms at its own phase; "
            "saturated: each sends again as soon as answered"
        )
        for key, s in out["scrapes"].items():
            line = (
                f"  {key:34} p50 {s['p50_ms']:>7} ms  p99 {s['p99_ms']:>7} ms  "
                f"{s['bytes']:>6} B  {s['rate_per_s']:>6}/s"
            )
            if key in ne:
                n = ne[key]
                line += (
                    f"   node_exporter p99 {n['p99_ms']} ms, {n['bytes']} B, {n['rate_per_s']}/s"
                )
            lines.append(line)
    if out.get("check"):
        ck = out["check"]
        lines.append(
            f"hetpatrol check: {ck['check_wall_ms']} ms exec to exit (python -c pass: "
            f"{ck['python_start_ms']} ms); without site hooks: {ck['check_wall_no_site_ms']} ms "
            f"(python -S -c pass: {ck['python_start_no_site_ms']} ms)"
        )
    if out.get("growth"):
        g = out["growth"]
        lines.append(
            f"RSS growth, patrol 1 to {g['patrols']}: {g['rss_growth_mb']} MB"
            f" (second half: {g.get('rss_growth_second_half_mb')} MB)"
        )
    lines.append(f"load average {out['meta']['loadavg']} -> {out['meta']['loadavg_end']}")
    h, why = out["headline"], out["reasons"]
    for key, (op, goal) in GOALS.items():
        value = h.get(key)
        ok = met(key, value)
        lines.append(f"  {key:32} {value!s:>10}  goal {op} {goal:<8} {'met' if ok else 'MISSED'}")
        if not ok and key in why:
            lines.append(f"      why: {why[key]}")
    lines.append("(a benchmark: it exits 0 whether goals are met or not)")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
