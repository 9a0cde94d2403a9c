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
  state file, the HTTP server up; ``rss_growth_mb``: RSS at the end of the window - that.
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
import threading
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


def in_step(port: int, clients: int, seconds: float, gz: bool) -> dict:
    """``clients`` threads scrape together every 40 ms for ``seconds``; latencies in ms."""
    rounds = max(1, int(seconds / 0.04))
    barrier = threading.Barrier(clients)
    lat: list[float] = []
    sizes: list[int] = []
    lock = threading.Lock()

    def run() -> None:
        conn = None
        start = time.monotonic()
        for r in range(rounds):
            barrier.wait()
            t = time.perf_counter()
            conn, body = scrape(port, conn, gz)
            dt = (time.perf_counter() - t) * 1000
            with lock:
                lat.append(dt)
                sizes.append(len(body))
            pause = start + (r + 1) * 0.04 - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        conn.close()

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat.sort()
    return {
        "p50_ms": round(statistics.median(lat), 3),
        "p99_ms": round(lat[int(len(lat) * 0.99) - 1], 3),
        "bytes": int(statistics.median(sizes)),
        "scrapes": len(lat),
    }


def patrols_total(port: int) -> int:
    _, body = scrape(port, None, False)
    m = re.search(rb"^hetpatrol_patrols_total (\S+)$", body, re.M)
    return int(float(m[1])) if m else 0


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def run_daemon(npus: int, seconds: float, tmp: Path, scrapes: bool) -> dict:
    tool = tmp / f"npu-smi-{npus}"
    table = tmp / f"table-{npus}.txt"
    table.write_text(npu_table(npus))
    tool.write_text(f"#!/bin/sh\nexec cat {table}\n")
    tool.chmod(0o755)
    state = tmp / f"state-{npus}.json"
    config = tmp / f"bench-{npus}.yaml"
    config.write_text(
        f"node: bench\ninterval_seconds: 0.05\nstate_path: {state}\n"
        f"jsonl: {{path: {tmp}/patrol-{npus}.jsonl, max_bytes: 0}}\n"
        "kernel_log: {enabled: false}\nenvironment: {enabled: false}\n"
        f"collectors:\n  nvidia: {{enabled: false}}\n"
        f'  ascend: {{command: ["{tool}", "info"], detail: false}}\n'
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetpatrol.cli", "run", "--config", str(config)]
        + ["--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not state.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(proc.stderr.read().decode()[-2000:])
            time.sleep(0.02)
        ps = psutil.Process(proc.pid)
        rss_first = ps.memory_info().rss / 2**20
        time.sleep(1.0)  # past the first patrols
        p0, c0 = patrols_total(port), cpu_seconds(ps)
        time.sleep(seconds)
        p1, c1 = patrols_total(port), cpu_seconds(ps)
        out = {
            "cards": npus,
            "patrols": p1 - p0,
            "cpu_ms_per_card_per_patrol": round((c1 - c0) * 1000 / max(1, p1 - p0) / npus, 4),
            "rss_after_first_patrol_mb": round(rss_first, 1),
            "rss_growth_mb": round(ps.memory_info().rss / 2**20 - rss_first, 2),
        }
        if scrapes:
            out["scrape_plain"] = in_step(port, 20, 3.0, gz=False)
            out["scrape_gzip"] = in_step(port, 20, 3.0, gz=True)
            out["check_wall_ms"], out["python_start_ms"] = check_wall(state)
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def check_wall(state: Path, runs: int = 20) -> tuple[float, float]:
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

    argv = [exe, "check", "--state-path", str(state), "--max-age", "1e8"]
    return median_ms(argv), median_ms([sys.executable, "-c", "pass"])


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
        return {
            "scrape_plain": in_step(port, 20, seconds, gz=False),
            "scrape_gzip": in_step(port, 20, seconds, gz=True),
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cards", default="8,16,32,64", help="NPU counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=6.0, help="CPU window per count")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.cards.split(",")]
    with tempfile.TemporaryDirectory(prefix="hetpatrol-bench-") as tmp:
        runs = [run_daemon(n, args.seconds, Path(tmp), scrapes=(n == 16)) for n in counts]
    ne = node_exporter(3.0)
    by = {r["cards"]: r for r in runs}
    headline = {}
    if 16 in by:
        r16 = by[16]
        headline = {
            "cpu_ms_per_card_per_patrol_16": r16["cpu_ms_per_card_per_patrol"],
            "rss_after_first_patrol_mb": r16["rss_after_first_patrol_mb"],
            "scrape_p99_ms_gzip": r16["scrape_gzip"]["p99_ms"],
            "bytes_per_scrape_gzip_16": r16["scrape_gzip"]["bytes"],
            "check_wall_ms": r16["check_wall_ms"],
        }
    out = {"headline": headline, "runs": runs, "node_exporter": ne}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print("real daemon (hetpatrol run, stand-in npu-smi spawned every patrol, interval 0.05 s)")
    print(f"{'cards':>5} {'patrols':>7} {'cpu ms/card/patrol':>19} {'rss MB':>7} {'growth':>7}")
    for r in runs:
        print(
            f"{r['cards']:>5} {r['patrols']:>7} {r['cpu_ms_per_card_per_patrol']:>19} "
            f"{r['rss_after_first_patrol_mb']:>7} {r['rss_growth_mb']:>7}"
        )
    if 16 in by:
        r16 = by[16]
        for kind in ("plain", "gzip"):
            s = r16[f"scrape_{kind}"]
            line = f"scrape {kind:>5} (16 cards, 20 clients in step, 500/s): p50 {s['p50_ms']} ms"
            line += f", p99 {s['p99_ms']} ms, {s['bytes']} bytes"
            if ne:
                n = ne[f"scrape_{kind}"]
                line += f"   node_exporter: p99 {n['p99_ms']} ms, {n['bytes']} bytes"
            print(line)
        print(
            f"hetpatrol check: {r16['check_wall_ms']} ms exec to exit "
            f"(python -c pass: {r16['python_start_ms']} ms)"
        )
    for key, (op, goal) in GOALS.items():
        value = headline.get(key)
        met = value is not None and (value <= goal if op == "<=" else value >= goal)
        print(f"  {key:32} {value!s:>10}  goal {op} {goal:<8} {'met' if met else 'MISSED'}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
