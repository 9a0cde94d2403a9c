#!/usr/bin/env python3
"""What a SIGHUP reload costs the real daemon, measured from outside.

``hetpatrol run`` in its own process (interval 0.3 s, the bundled config laid under a
site file that runs a stand-in ``npu-smi`` printing the recorded 910B4 table, every
other plugin as bundled), as ``tests/test_daemon_faults.py`` starts it. Figures:

- ``reload_wall_ms``: from one SIGHUP to the daemon's ``config_reloaded`` log line
  (median of ``--reloads``), for an unchanged file (``unchanged``) and for a file whose
  bytes changed each time (``changed``: a comment line appended, so the check must run);
- ``storm_patrols`` / ``quiet_patrols``: patrols (``hetpatrol_patrols_total``) in a
  ``--storm-seconds`` window with a SIGHUP every 5 ms, and in the same window without
  one; ``patrols_lost`` is their difference;
- ``reloads_in_storm``: ``config_reloaded`` lines the storm caused;
- ``rss_mb_before`` / ``rss_mb_after``: the daemon's RSS after its first patrols and
  after the storm.

    python tests/bench/reload.py [--reloads 5] [--storm-seconds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "fixtures" / "nodes" / "healthy-mixed" / "npu-smi-info.txt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def patrols(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("hetpatrol_patrols_total "):
                return float(line.split()[1])
    raise RuntimeError("no hetpatrol_patrols_total")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class Daemon:
    def __init__(self, tmp: Path):
        self.port = free_port()
        tool = tmp / "npu-smi"
        tool.write_text(f"#!/bin/sh\ncat {TABLE}\n")
        tool.chmod(0o755)
        self.config = tmp / "hetpatrol.yaml"
        self.config.write_text(
            f'node: bench-node\ninterval_seconds: 0.3\nlisten: "127.0.0.1:{self.port}"\n'
            f'jsonl: {{path: "{tmp / "patrol.jsonl"}"}}\nstate_path: "{tmp / "state.json"}"\n'
            "collectors:\n  nvidia: {enabled: false}\n"
            f'  ascend: {{command: ["{tool}", "info"], timeout_seconds: 0.5}}\n'
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hetpatrol.cli", "run", "--config", str(self.config)],
            cwd=tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.set_blocking(self.proc.stderr.fileno(), False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stderr, selectors.EVENT_READ)
        self.buf = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.lines()
            try:
                if patrols(self.port) >= 2:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"daemon not up: {self.buf[-2000:].decode(errors='replace')}")

    def lines(self, timeout: float = 0.0) -> list[str]:
        out = []
        for _key, _ev in self.sel.select(timeout):
            try:
                chunk = os.read(self.proc.stderr.fileno(), 65536)
            except BlockingIOError:
                chunk = b""
            self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            out.append(line.decode(errors="replace"))
        return out

    def wait_line(self, word: str, timeout: float = 30.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines(0.01):
                if word in line:
                    return time.monotonic()
        raise RuntimeError(f"no {word!r} line in {timeout} s")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=30)


def bench(reloads: int, storm_seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="hetpatrol-reload-") as name:
        d = Daemon(Path(name))
        try:
            out: dict = {"rss_mb_before": round(rss_mb(d.proc.pid), 1)}
            for mode in ("unchanged", "changed"):
                walls = []
                for i in range(reloads):
                    if mode == "changed":
                        with d.config.open("a") as fh:
                            fh.write(f"# change {i}\n")
                    d.lines()
                    t = time.monotonic()
                    d.proc.send_signal(signal.SIGHUP)
                    walls.append((d.wait_line("config_reloaded") - t) * 1000)
                    time.sleep(0.35)
                out[f"reload_wall_ms_{mode}"] = round(statistics.median(walls), 1)
            time.sleep(0.5)
            d.lines()
            before = patrols(d.port)
            time.sleep(storm_seconds)
            out["quiet_patrols"] = patrols(d.port) - before
            d.lines()
            before = patrols(d.port)
            deadline = time.monotonic() + storm_seconds
            sent = 0
            while time.monotonic() < deadline:
                d.proc.send_signal(signal.SIGHUP)
                sent += 1
                time.sleep(0.005)
            out["storm_patrols"] = patrols(d.port) - before
            out["patrols_lost"] = out["quiet_patrols"] - out["storm_patrols"]
            out["sighups_sent"] = sent
            time.sleep(1.0)
            out["reloads_in_storm"] = sum("config_reloaded" in x for x in d.lines(0.2))
            out["rss_mb_after"] = round(rss_mb(d.proc.pid), 1)
        finally:
            d.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reloads", type=int, default=5, help="single reloads per mode")
    parser.add_argument("--storm-seconds", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = bench(args.reloads, args.storm_seconds)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for key, value in out.items():
            print(f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
