#!/usr/bin/env python3
"""What hetpatrol costs on a node, beside the baselines operators use today (issue #7).

Run from the repository root::

    python tests/bench/run.py            # table
    python tests/bench/run.py --json     # one JSON object
    python tests/bench/run.py --real-nvml   # on a GPU node: real NVML, nothing else

Everything runs on the bundled replay scenarios (no accelerator needed). CPU figures are
process CPU time (user + sys, every thread: ``time.process_time``; children through
``RUSAGE_CHILDREN``), repeated ``--repeats`` times; the headline is the median, the
spread (min/median/max) is printed beside it. Not a pytest module (pytest collects only
``test_*.py``): no timed assertion lives in the test suite.

Figures (goal in brackets):

- ``patrol_cpu_ms_per_card`` [<= 1.0]: a whole daemon cycle (``Daemon.patrol_once``:
  both collectors in their worker threads, thresholds, JSONL lines, JSONL sink, state
  file, Prometheus rendering) on ``fixtures/nodes/healthy-mixed`` (8 x H100 + 8 x 910B4),
  CPU / (patrols x cards).
- ``ascend_parse_us_per_chip`` [<= 50]: ``parse_npu_smi_info`` over every recorded
  ``npu-smi info`` table (``../shared/vendor-samples/ascend/npu-smi-info_*.txt``, else the
  fixtures), CPU / chips read.
- ``hygon_parse_us_per_card``, ``amd_parse_us_per_card``, ``cambricon_parse_us_per_card``,
  ``gaudi_parse_us_per_card``, ``iluvatar_parse_us_per_card``,
  ``kunlunxin_parse_us_per_card``, ``enflame_parse_us_per_card`` [<= 50 each]: the
  plugins' parsers (``parse_rocm_smi``; ``parse_amd_smi_tree`` + ``amd_smi_cards`` and
  ``parse_rocm_smi``; ``parse_cnmon`` + ``records_from``; ``parse_hl_smi_csv``;
  ``parse_ixsmi``; ``parse_xpu_smi``; ``parse_efsmi``) over every
  recorded output of that vendor (``../shared/vendor-samples/other-vendors/``), CPU /
  cards read. ``--parsers-only`` prints these (and the Ascend figure) alone.
- ``nvidia_collect_us_per_gpu`` [<= 300]: ``NvidiaCollector.collect`` over the replayed
  NVML (steady state: handles and identity cached), CPU / GPUs. The replay answers each
  call from the XML dump in Python, so this is an upper bound of the collector's cost.
- ``scrape_p50_ms``, ``scrape_p99_ms`` [p99 <= 2], ``scrape_rate_per_s`` [>= 500]: the
  real daemon (``hetpatrol run``, replay, default 10 s interval) in its own process, 20
  concurrent keep-alive clients on loopback (in this process, raw sockets). Latency:
  each client scrapes every 40 ms (500/s offered, never two requests in flight on one
  connection, a late answer delays the next scrape); rate: the same 20 clients scrape
  back to back (the server's capacity; the latency under that load is an extra).
- ``jsonl_lines_per_s`` [>= 50,000]: ``JsonlSink.write_lines`` of a patrol's lines into a
  file in the temp directory (a disk; rotation as configured), wall time.
- ``rss_start_mb`` [<= 40], ``rss_after_10k_patrols_mb`` [growth <= 1]: a fresh
  ``python -c`` process (none of this script's imports) that imports what
  ``hetpatrol run`` imports, loads the bundled config and builds the ``Daemon``
  (collectors loaded: the start figure), then runs 10,000 ``patrol_once`` (sinks on
  ``/dev/shm`` when present). RSS after patrols 1, 100 and 1,000 is printed too.
- ``vs_nvidia_smi_xml_cpu_ratio`` [>= 10]: CPU per patrol of spawning
  ``nvidia-smi -q -x`` and parsing its XML (telegraf's and netdata's way; here a ``sh``
  stand-in that ``exec``s ``cat`` of the same dump, the cheapest possible tool: a real
  nvidia-smi does every NVML query itself on top), child CPU included, / hetpatrol's
  NVML path on the same 8 GPUs. Extra: the same ratio with NVML taken out of both sides
  (the collector answered from a dict of the recorded answers).
- ``vs_collect_on_scrape_p99_ratio`` [report]: scrape p99 when every scrape runs a patrol
  and renders it (same HTTP server code, same load) / the cached p99.
- ``fleet_10k_wall_s`` [<= 3], ``fleet_10k_rss_mb`` [<= 200], ``audit_10k_wall_s`` [<= 3],
  ``audit_10k_rss_mb`` [<= 200]: ``hetpatrol fleet`` (Slurm 22.05 text path; the
  ``scontrol --json`` path in the details) and ``hetpatrol audit-slurm`` on a synthetic
  10,000-node mixed cluster, wall time and peak RSS of the real command
  (``tests/bench/fleet.py``; ``run.py --fleet`` runs only these).
- ``vs_per_card_npu_smi_calls`` [report]: processes spawned per patrol for 8 NPUs by a
  per-card ``npu-smi info -t {health,common,usages,proc-mem} -i N`` sweep / by hetpatrol's
  Ascend collector as the bundled config sets it up (one ``npu-smi info`` a patrol, plus
  its detail sweep amortised over the patrols between two sweeps), counted on stand-in
  tools.

- The real daemon measured from outside, spawning a stand-in ``npu-smi`` every patrol
  (issue 17's table, printed last with met/missed and the reason beside each miss: CPU
  per card per patrol at 8-64 NPUs split into the daemon's and the tool's, RSS after the
  first patrol and its growth to patrol ``--growth-patrols``, scrape latency of 20
  clients in step, paced and saturated, with and without gzip, beside node_exporter's,
  ``hetpatrol check`` wall beside the interpreter's start): ``tests/bench/daemon.py``
  (``--daemon`` runs only that). Run it with the interpreter the README installs
  (``.venv/bin/python``): the figures are of that interpreter's start and site hooks.
- ``ledger_seconds`` [< 10], ``ledger_peak_rss_mb`` [< 100]: ``hetpatrol ledger usage``
  over 1,000,000 generated sacct records streamed through a pipe (``tests/bench/ledger.py``,
  also alone: ``--ledger-only``, size with ``--ledger-jobs``).

``--real-nvml`` (needs a GPU; not run where none is): per patrol time of
``NvidiaCollector`` on the real ``pynvml``, and of the same NVML calls replayed raw (the
floor: no record is built), with their ratio; with ``nvidia-smi`` on the PATH, also the
CPU of the real ``nvidia-smi -q -x`` + parse and the real ratio to the collector.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "fixtures" / "nodes" / "healthy-mixed"
SAMPLES = ROOT.parent / "shared" / "vendor-samples"

KEYS = (
    "patrol_cpu_ms_per_card",
    "ascend_parse_us_per_chip",
    "hygon_parse_us_per_card",
    "amd_parse_us_per_card",
    "cambricon_parse_us_per_card",
    "gaudi_parse_us_per_card",
    "iluvatar_parse_us_per_card",
    "kunlunxin_parse_us_per_card",
    "enflame_parse_us_per_card",
    "nvidia_collect_us_per_gpu",
    "scrape_p50_ms",
    "scrape_p99_ms",
    "scrape_rate_per_s",
    "jsonl_lines_per_s",
    "rss_start_mb",
    "rss_after_10k_patrols_mb",
    "vs_nvidia_smi_xml_cpu_ratio",
    "vs_collect_on_scrape_p99_ratio",
    "vs_per_card_npu_smi_calls",
    "fleet_10k_wall_s",
    "fleet_10k_rss_mb",
    "audit_10k_wall_s",
    "audit_10k_rss_mb",
)

#: key -> (comparison, goal, goal text); "report" keys have none.
GOALS: dict[str, tuple[str, float, str]] = {
    "patrol_cpu_ms_per_card": ("<=", 1.0, "<= 1.0"),
    "ascend_parse_us_per_chip": ("<=", 50.0, "<= 50"),
    "hygon_parse_us_per_card": ("<=", 50.0, "<= 50"),
    "amd_parse_us_per_card": ("<=", 50.0, "<= 50"),
    "cambricon_parse_us_per_card": ("<=", 50.0, "<= 50"),
    "gaudi_parse_us_per_card": ("<=", 50.0, "<= 50"),
    "iluvatar_parse_us_per_card": ("<=", 50.0, "<= 50"),
    "kunlunxin_parse_us_per_card": ("<=", 50.0, "<= 50"),
    "enflame_parse_us_per_card": ("<=", 50.0, "<= 50"),
    "nvidia_collect_us_per_gpu": ("<=", 300.0, "<= 300"),
    "scrape_p99_ms": ("<=", 2.0, "<= 2"),
    "scrape_rate_per_s": (">=", 500.0, ">= 500"),
    "jsonl_lines_per_s": (">=", 50_000.0, ">= 50,000"),
    "rss_start_mb": ("<=", 40.0, "<= 40"),
    "vs_nvidia_smi_xml_cpu_ratio": (">=", 10.0, ">= 10"),
    "fleet_10k_wall_s": ("<=", 3.0, "<= 3"),
    "fleet_10k_rss_mb": ("<=", 200.0, "<= 200"),
    "audit_10k_wall_s": ("<=", 3.0, "<= 3"),
    "audit_10k_rss_mb": ("<=", 200.0, "<= 200"),
}
RSS_GROWTH_GOAL_MB = 1.0

SCRAPE_CLIENTS = 20
SCRAPE_OFFERED_PER_S = 500.0


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def quiet_logging() -> None:
    """Events at warning and above to stderr: the benchmark's stdout is the table or the JSON."""
    from hetpatrol import logs

    logs.configure("warning", "console")


def cpu() -> float:
    return time.process_time()


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def rss_mb() -> float:
    """Resident set size now (VmRSS), MiB."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak, not now


def spread(values: list[float]) -> list[float]:
    return [min(values), statistics.median(values), max(values)]


def repeat(measure: Callable[[], float], repeats: int) -> list[float]:
    """``measure()`` ``repeats`` times with the cyclic GC collected before each run."""
    out = []
    for _ in range(repeats):
        gc.collect()
        out.append(measure())
    return out


def scratch_dir() -> Path:
    """A temporary directory on tmpfs when there is one (fsync of the state file is then
    not a disk wait), else the system temp directory."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="hetpatrol-bench-", dir=base))


def make_daemon(tmp: Path, **overrides: Any):
    from hetpatrol.config import load_config
    from hetpatrol.daemon import Daemon
    from hetpatrol.replay import load_scenario

    node = load_scenario(NODE).get("node") or "bench"
    over = {
        "node": node,
        "jsonl_path": tmp / "patrol.jsonl",
        "state_path": tmp / "state.json",
        **overrides,
    }
    return Daemon(load_config(None), replay_dir=NODE, overrides=over)


# --------------------------------------------------------------------------- patrol CPU


def bench_patrol(repeats: int, patrols: int) -> dict[str, Any]:
    tmp = scratch_dir()
    try:
        daemon = make_daemon(tmp)
        for _ in range(3):  # warm: NVML replay loaded, handles and identity cached
            report = daemon.patrol_once()
        cards = len(report.cards)
        collect_parts: list[float] = []
        publish_parts: list[float] = []

        def one() -> float:
            c_run = c_pub = 0.0
            for _ in range(patrols):
                t0 = cpu()
                rep = daemon.patroller.run()
                t1 = cpu()
                daemon.publish(rep)
                t2 = cpu()
                c_run += t1 - t0
                c_pub += t2 - t1
            collect_parts.append(c_run / patrols / cards * 1e3)
            publish_parts.append(c_pub / patrols / cards * 1e3)
            return (c_run + c_pub) / patrols / cards * 1e3

        values = repeat(one, repeats)
        daemon.shutdown()
        return {
            "cards": cards,
            "patrols_per_repeat": patrols,
            "ms_per_card": values,
            "collect_ms_per_card": collect_parts,
            "publish_ms_per_card": publish_parts,
            "exposition_bytes": len(daemon.exposition.body),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------ Ascend parser


def ascend_tables() -> tuple[str, list[str]]:
    recorded = sorted((SAMPLES / "ascend").glob("npu-smi-info_*.txt"))
    if recorded:
        return "../shared/vendor-samples/ascend/npu-smi-info_*.txt", [
            p.read_bytes().decode("utf-8", errors="replace") for p in recorded
        ]
    fixtures = sorted((ROOT / "fixtures" / "nodes").glob("*/npu-smi-info.txt"))
    return "fixtures/nodes/*/npu-smi-info.txt", [
        p.read_bytes().decode("utf-8", errors="replace") for p in fixtures
    ]


def bench_ascend(repeats: int) -> dict[str, Any]:
    from hetpatrol.collector import CollectorError
    from hetpatrol.collectors.ascend import parse_npu_smi_info

    source, texts = ascend_tables()
    chips = failures = 0
    for text in texts:
        try:
            chips += len(parse_npu_smi_info(text).chips)
        except CollectorError:
            failures += 1  # DCMI error outputs: parsed (and refused) in the loop too

    def one_pass() -> None:
        for text in texts:
            try:
                parse_npu_smi_info(text)
            except CollectorError:
                pass

    t0 = cpu()
    one_pass()
    passes = max(5, int(0.4 / max(cpu() - t0, 1e-4)))

    def one() -> float:
        t = cpu()
        for _ in range(passes):
            one_pass()
        return (cpu() - t) / (passes * chips) * 1e6

    return {
        "source": source,
        "tables": len(texts),
        "error_outputs": failures,
        "chips": chips,
        "us_per_chip": repeat(one, repeats),
    }


def vendor_parsers() -> dict[str, tuple[list[str], Callable[[str], int]]]:
    """vendor -> (recorded outputs, parse one and return its card count)."""
    from hetpatrol.collectors.amd_smi import amd_smi_cards, parse_amd_smi_tree
    from hetpatrol.collectors.cambricon import parse_cnmon, records_from
    from hetpatrol.collectors.enflame import parse_efsmi
    from hetpatrol.collectors.gaudi import parse_hl_smi_csv
    from hetpatrol.collectors.iluvatar import parse_ixsmi
    from hetpatrol.collectors.kunlunxin import parse_xpu_smi
    from hetpatrol.collectors.rocm_family import parse_rocm_smi

    other = SAMPLES / "other-vendors"

    def read(pattern: str) -> list[str]:
        return [
            p.read_text(encoding="utf-8", errors="replace") for p in sorted(other.glob(pattern))
        ]

    def amd(text: str) -> int:
        if text.lstrip().startswith("{"):
            return len(parse_rocm_smi(text).cards)
        return len(amd_smi_cards(parse_amd_smi_tree(text), None))

    return {
        "hygon": (read("hygon-*"), lambda t: len(parse_rocm_smi(t).cards)),
        "amd": (read("amd-*"), amd),
        "cambricon": (read("cambricon-cnmon-*"), lambda t: len(records_from(parse_cnmon(t)))),
        "gaudi": (read("habana-hl-smi-csv-*"), lambda t: len(parse_hl_smi_csv(t)[0])),
        "iluvatar": (read("iluvatar-ixsmi-*"), lambda t: len(parse_ixsmi(t)[1])),
        "kunlunxin": (read("kunlunxin-xpu_smi-*"), lambda t: len(parse_xpu_smi(t)[0])),
        "enflame": (read("enflame-efsmi-*"), lambda t: len(parse_efsmi(t)[0])),
    }


def bench_vendor_parsers(repeats: int) -> dict[str, dict[str, Any]]:
    """Per vendor: outputs, cards and CPU microseconds per card of its parser."""
    out: dict[str, dict[str, Any]] = {}
    for vendor, (texts, parse) in vendor_parsers().items():
        if not texts:
            continue
        cards = sum(parse(t) for t in texts)

        def one_pass(texts=texts, parse=parse) -> None:
            for text in texts:
                parse(text)

        t0 = cpu()
        one_pass()
        passes = max(5, int(0.3 / max(cpu() - t0, 1e-4)))

        def one(one_pass=one_pass, passes=passes, cards=cards) -> float:
            t = cpu()
            for _ in range(passes):
                one_pass()
            return (cpu() - t) / (passes * cards) * 1e6

        out[vendor] = {"outputs": len(texts), "cards": cards, "us_per_card": repeat(one, repeats)}
    return out


# ------------------------------------------------------------------------ NVIDIA collector


class _RecordingNvml:
    """Forwards to an NVML module and logs every ``nvml*`` call: (name, function, args,
    kwargs, outcome), the outcome being ``("ok", value)`` or ``("raise", exception)``."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.log: list[tuple[str, Callable[..., Any], tuple, dict, tuple[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not (name.startswith("nvml") and callable(value)):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            entry = (name, value, args, dict(kwargs))
            try:
                result = value(*args, **kwargs)
            except Exception as exc:
                self.log.append((*entry, ("raise", exc)))
                raise
            self.log.append((*entry, ("ok", result)))
            return result

        return call


def record_nvml_calls(collector: Any) -> list[tuple[str, Callable[..., Any], tuple, dict, Any]]:
    """The exact NVML calls one steady-state ``collect()`` makes (collector warmed)."""
    inner = collector.nvml
    recorder = _RecordingNvml(inner)
    collector.nvml = recorder
    try:
        collector.collect()
    finally:
        collector.nvml = inner
    return recorder.log


def replay_raw(calls: list[tuple[str, Callable[..., Any], tuple, dict, Any]]) -> None:
    """The floor: the same NVML calls with nothing built from their answers."""
    for _name, fn, args, kwargs, _outcome in calls:
        try:
            fn(*args, **kwargs)
        except Exception:  # noqa: BLE001, S112 - NotSupported costs the same call
            pass


class _CannedNvml:
    """NVML at zero cost: each recorded call answers its recorded value (or raises its
    recorded error) from a dict; anything else goes to the real module. Run under it,
    the collector's time is hetpatrol's own work, with no NVML work in it."""

    def __init__(self, inner: Any, calls: list[tuple[str, Callable[..., Any], tuple, dict, Any]]):
        self._inner = inner
        self._answers: dict[str, dict[tuple, tuple[str, Any]]] = {}
        for name, _fn, args, kwargs, outcome in calls:
            key = (args, tuple(sorted(kwargs.items())))
            self._answers.setdefault(name, {})[key] = outcome

    def __getattr__(self, name: str) -> Any:
        answers = self._answers.get(name)
        if answers is None:
            return getattr(self._inner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            kind, value = answers[(args, tuple(sorted(kwargs.items())))]
            if kind == "raise":
                raise value
            return value

        return call


def bench_nvidia(repeats: int) -> dict[str, Any]:
    from hetpatrol.collectors.nvidia import NvidiaCollector

    collector = NvidiaCollector({}, replay_dir=NODE)
    first = collector.collect()
    assert first.state == "ok", first.error
    gpus = len(first.records)
    collector.collect()
    calls = record_nvml_calls(collector)

    t0 = cpu()
    collector.collect()
    loops = max(20, int(0.4 / max(cpu() - t0, 1e-4)))

    def one() -> float:
        t = cpu()
        for _ in range(loops):
            collector.collect()
        return (cpu() - t) / (loops * gpus) * 1e6

    def raw() -> float:
        t = cpu()
        for _ in range(loops):
            replay_raw(calls)
        return (cpu() - t) / (loops * gpus) * 1e6

    canned = NvidiaCollector({}, nvml=_CannedNvml(collector.nvml, calls))
    canned.collect()
    assert len(canned.collect().records) == gpus

    def own() -> float:
        t = cpu()
        for _ in range(loops):
            canned.collect()
        return (cpu() - t) / (loops * gpus) * 1e6

    values = repeat(one, repeats)
    raw_values = repeat(raw, repeats)
    own_values = repeat(own, repeats)
    collector.close()
    return {
        "gpus": gpus,
        "nvml_calls_per_patrol": len(calls),
        "us_per_gpu": values,
        "raw_replay_calls_us_per_gpu": raw_values,
        "zero_cost_nvml_us_per_gpu": own_values,
    }


# ------------------------------------------------------------------------------- JSONL


def bench_jsonl(repeats: int) -> dict[str, Any]:
    from hetpatrol.config import load_config
    from hetpatrol.exporters.jsonl import JsonlSink
    from hetpatrol.patrol import Patroller

    config = load_config(None)
    patroller = Patroller(config, replay_dir=NODE)
    lines = patroller.run().jsonl_lines()
    patroller.close()
    tmp = Path(tempfile.mkdtemp(prefix="hetpatrol-bench-jsonl-"))  # a disk, not tmpfs
    try:
        sink = JsonlSink(tmp / "patrol.jsonl", config.jsonl_max_bytes, config.jsonl_backups)
        batches = 2000
        cpu_rates: list[float] = []

        def one() -> float:
            w, c = time.perf_counter(), cpu()
            for _ in range(batches):
                sink.write_lines(lines)
            wall, used = time.perf_counter() - w, cpu() - c
            cpu_rates.append(batches * len(lines) / used)
            return batches * len(lines) / wall

        values = repeat(one, repeats)
        sink.close()
        assert sink.write_errors == 0
        return {
            "lines_per_patrol": len(lines),
            "bytes_per_patrol": sum(len(x.encode()) for x in lines),
            "lines_per_s": values,
            "lines_per_cpu_s": cpu_rates,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------- RSS


#: Run with ``python -c`` so that the process holds exactly what ``hetpatrol run`` holds
#: (the benchmark's own imports stay out): imports, config, Daemon (collectors loaded),
#: then patrols. argv: replay dir, scratch dir, patrols.
RSS_CHILD = """
import gc, json, sys, time
from pathlib import Path

def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

from hetpatrol import cli
from hetpatrol.config import load_config
from hetpatrol.daemon import Daemon
from hetpatrol.replay import load_scenario

cli.setup_logging("console", "warning")
node_dir, tmp, patrols = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
over = {
    "node": load_scenario(node_dir).get("node") or "bench",
    "jsonl_path": tmp / "patrol.jsonl",
    "state_path": tmp / "state.json",
    "jsonl_max_bytes": 4 * 1024 * 1024,
    "jsonl_backups": 1,
}
daemon = Daemon(load_config(None), replay_dir=node_dir, overrides=over)
gc.collect()
out = {"rss_start_mb": rss(), "modules": len(sys.modules)}
marks = {1, 100, 1000, patrols}
t, w = time.process_time(), time.perf_counter()
for i in range(1, patrols + 1):
    daemon.patrol_once()
    if i in marks:
        out[f"rss_after_{i}_mb"] = rss()
out["cpu_s"] = time.process_time() - t
out["wall_s"] = time.perf_counter() - w
out["patrols"] = patrols
daemon.shutdown()
print(json.dumps(out))
"""


def bench_rss(patrols: int) -> dict[str, Any]:
    tmp = scratch_dir()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", RSS_CHILD, str(NODE), str(tmp), str(patrols)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"RSS child failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_import_rss() -> dict[str, float]:
    """RSS added by each import a daemon makes, each in a fresh interpreter (in order)."""
    mods = [
        "hetpatrol.logs",
        "yaml",
        "psutil",
        "prometheus_client",
        "pynvml",
        "jsonschema",
        "hetpatrol.cli",
        "hetpatrol.daemon",
        "hetpatrol.collectors.nvidia",
        "hetpatrol.collectors.ascend",
    ]
    code = (
        "import importlib, json, sys\n"
        "def rss():\n"
        "    for l in open('/proc/self/status'):\n"
        "        if l.startswith('VmRSS:'): return int(l.split()[1]) / 1024\n"
        "out = {'python': rss()}\n"
        "for m in sys.argv[1:]:\n"
        "    importlib.import_module(m); out[m] = rss()\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *mods], cwd=ROOT, capture_output=True, text=True, check=True
    )
    cumulative = json.loads(proc.stdout)
    out, prev = {}, 0.0
    for name, value in cumulative.items():
        out[name] = round(value - prev, 1)
        prev = value
    out["total"] = round(prev, 1)
    return out


# ------------------------------------------------------------------------------ scrapes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n"
_CLEN = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


def _scrape(sock: socket.socket) -> int:
    """One keep-alive GET /metrics; returns the body length."""
    sock.sendall(_REQUEST)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(262144)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(head[:80].decode(errors="replace"))
    m = _CLEN.search(head)
    if m is None:
        raise ConnectionError("no Content-Length")
    need = int(m.group(1))
    parts = [body]
    got = len(body)
    while got < need:
        chunk = sock.recv(262144)
        if not chunk:
            raise ConnectionError("short body")
        parts.append(chunk)
        got += len(chunk)
    return need


def wait_ready(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(_REQUEST)
                data = b""
                while b"hetpatrol_patrol_ready" not in data:
                    chunk = s.recv(262144)
                    if not chunk:
                        break
                    data += chunk
                if b"hetpatrol_patrol_ready 1.0" in data:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"metrics server on port {port} not ready after {timeout:g} s")


def scrape_load(
    port: int, clients: int, per_client_per_s: float | None, duration: float
) -> dict[str, Any]:
    """``clients`` threads on their own keep-alive connection; each scrapes every
    ``1/per_client_per_s`` s (None: back to back), never with two requests in flight.
    A late response pushes the next scrape back, it does not cause a burst."""
    period = 0.0 if not per_client_per_s else 1.0 / per_client_per_s
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    barrier = threading.Barrier(clients + 1)
    start_at = [0.0]

    def client(i: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rng = random.Random(i)
        lat = latencies[i]
        try:
            barrier.wait()
            due = start_at[0] + rng.uniform(0, period)
            end = start_at[0] + duration
            while True:
                now = time.perf_counter()
                if due > now:
                    time.sleep(due - now)
                t0 = time.perf_counter()
                if t0 >= end:
                    break
                _scrape(sock)
                t1 = time.perf_counter()
                lat.append(t1 - t0)
                due = max(due + period, t1) if period else t1
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            sock.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    start_at[0] = time.perf_counter() + 0.05
    barrier.wait()
    for t in threads:
        t.join(duration + 60)
    wall = time.perf_counter() - start_at[0]
    every = sorted(x for lat in latencies for x in lat)
    if errors:
        raise RuntimeError(f"{len(errors)} scrape clients failed: {errors[:3]}")

    def pct(p: float) -> float:
        return every[min(len(every) - 1, int(round(p / 100 * (len(every) - 1))))] * 1e3

    return {
        "scrapes": len(every),
        "wall_s": wall,
        "rate_per_s": len(every) / wall,
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "max_ms": every[-1] * 1e3,
    }


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_collect_child(port: int) -> None:
    """The baseline server: every scrape runs a patrol and renders it (same HTTP code)."""
    quiet_logging()
    from hetpatrol.config import load_config
    from hetpatrol.exporters.http_server import MetricsServer
    from hetpatrol.exporters.prometheus import Exposition
    from hetpatrol.patrol import Patroller

    config = load_config(None)
    patroller = Patroller(config, replay_dir=NODE)

    class CollectOnScrape(Exposition):
        patrols = 0

        @property
        def body(self) -> bytes:  # type: ignore[override]
            report = patroller.run()  # the patroller serialises concurrent scrapes
            with self._lock:
                self.patrols += 1
                n = self.patrols
            return self.update(report, n)

    exposition = CollectOnScrape([c.name for c in config.collectors])
    exposition.update(patroller.run(), 1)
    server = MetricsServer("127.0.0.1", port, exposition)
    server.start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def bench_scrapes(windows: int, window_s: float, saturation_s: float) -> dict[str, Any]:
    tmp = scratch_dir()
    out: dict[str, Any] = {"clients": SCRAPE_CLIENTS, "offered_per_s": SCRAPE_OFFERED_PER_S}
    per_client = SCRAPE_OFFERED_PER_S / SCRAPE_CLIENTS
    try:
        port = free_port()
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hetpatrol.cli",
                "--log-level",
                "warning",
                "run",
                "--replay",
                str(NODE),
                "--listen",
                f"127.0.0.1:{port}",
                "--jsonl-path",
                str(tmp / "patrol.jsonl"),
                "--state-path",
                str(tmp / "state.json"),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_ready(port)
            scrape_load(port, SCRAPE_CLIENTS, per_client, 0.5)  # connections, threads warm
            cached = [
                scrape_load(port, SCRAPE_CLIENTS, per_client, window_s) for _ in range(windows)
            ]
            out["cached_windows"] = cached
            out["cached_saturated"] = [
                scrape_load(port, SCRAPE_CLIENTS, None, saturation_s) for _ in range(windows)
            ]
        finally:
            _stop(daemon)
        port = free_port()
        baseline = subprocess.Popen(
            [sys.executable, __file__, "--_serve-collect", str(port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_ready(port)
            scrape_load(port, SCRAPE_CLIENTS, per_client, 0.5)
            out["collect_on_scrape"] = scrape_load(port, SCRAPE_CLIENTS, per_client, window_s)
        finally:
            _stop(baseline)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def merge_windows(windows: list[dict[str, Any]]) -> dict[str, Any]:
    scrapes = sum(w["scrapes"] for w in windows)
    wall = sum(w["wall_s"] for w in windows)
    return {
        "p50_ms": statistics.median(w["p50_ms"] for w in windows),
        "p99_ms": statistics.median(w["p99_ms"] for w in windows),
        "rate_per_s": scrapes / wall,
        "p50_spread": spread([w["p50_ms"] for w in windows]),
        "p99_spread": spread([w["p99_ms"] for w in windows]),
        "rate_spread": spread([w["rate_per_s"] for w in windows]),
    }


# ---------------------------------------------------------------- nvidia-smi -q -x baseline

#: what telegraf's nvidia_smi input reads per GPU from ``nvidia-smi -q -x`` (XPath, kind)
_TELEGRAF_FIELDS = (
    ("product_name", "s"),
    ("uuid", "s"),
    ("pci/pci_bus_id", "s"),
    ("driver_model/current_dm", "s"),
    ("fan_speed", "n"),
    ("performance_state", "s"),
    ("fb_memory_usage/total", "n"),
    ("fb_memory_usage/reserved", "n"),
    ("fb_memory_usage/used", "n"),
    ("fb_memory_usage/free", "n"),
    ("temperature/gpu_temp", "n"),
    ("utilization/gpu_util", "n"),
    ("utilization/memory_util", "n"),
    ("utilization/encoder_util", "n"),
    ("utilization/decoder_util", "n"),
    ("pci/pci_gpu_link_info/pcie_gen/current_link_gen", "n"),
    ("pci/pci_gpu_link_info/link_widths/current_link_width", "n"),
    ("gpu_power_readings/power_draw", "n"),
    ("gpu_power_readings/current_power_limit", "n"),
    ("clocks/graphics_clock", "n"),
    ("clocks/sm_clock", "n"),
    ("clocks/mem_clock", "n"),
    ("clocks/video_clock", "n"),
    ("ecc_errors/volatile/dram_correctable", "n"),
    ("ecc_errors/volatile/dram_uncorrectable", "n"),
    ("remapped_rows/remapped_row_pending", "s"),
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_smi_xml(data: bytes) -> list[dict[str, Any]]:
    """The XML-scraping exporters' parse: every field of every GPU, numbers as floats."""
    root = ET.fromstring(data)
    gpus = []
    for gpu in root.iter("gpu"):
        row: dict[str, Any] = {"id": gpu.get("id")}
        for path, kind in _TELEGRAF_FIELDS:
            text = gpu.findtext(path)
            if text is None:
                continue
            text = text.strip()
            if kind == "n":
                m = _NUMBER.search(text)
                row[path] = float(m.group()) if m else None
            else:
                row[path] = text
        gpus.append(row)
    return gpus


def write_standin(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def smi_xml_cpu_ms(smi: str, gpus: int | None, repeats: int, patrols: int) -> tuple[list, list]:
    """CPU per patrol (ms) of spawning ``smi -q -x`` and parsing the XML, child included;
    and of the child alone. ``repeats`` values each."""

    def one() -> float:
        t, c = cpu(), children_cpu()
        for _ in range(patrols):
            out = subprocess.run([smi, "-q", "-x"], capture_output=True, check=True)
            rows = parse_smi_xml(out.stdout)
        assert gpus is None or len(rows) == gpus, (len(rows), gpus)
        return ((cpu() - t) + (children_cpu() - c)) / patrols * 1e3

    def child_only() -> float:
        c = children_cpu()
        for _ in range(patrols):
            subprocess.run([smi, "-q", "-x"], capture_output=True, check=True)
        return (children_cpu() - c) / patrols * 1e3

    return repeat(one, repeats), repeat(child_only, repeats)


def bench_vs_nvidia_smi(
    repeats: int, hetpatrol_us_per_gpu: float, own_us_per_gpu: float, gpus: int
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="hetpatrol-bench-smi-"))
    try:
        dump = NODE / "nvidia-smi-q.xml"
        smi = write_standin(tmp / "nvidia-smi", f'exec cat "{dump}"\n')
        values, child = smi_xml_cpu_ms(str(smi), gpus, repeats, 20)
        hetpatrol_ms = hetpatrol_us_per_gpu * gpus / 1e3
        own_ms = own_us_per_gpu * gpus / 1e3
        return {
            "standin": "sh script: exec cat <the recorded dump> (no NVML work at all)",
            "cpu_ms_per_patrol": values,
            "child_cpu_ms_per_patrol": child,
            "hetpatrol_nvml_cpu_ms_per_patrol": hetpatrol_ms,
            "hetpatrol_zero_cost_nvml_cpu_ms_per_patrol": own_ms,
            "ratio": [v / hetpatrol_ms for v in values],
            "ratio_nvml_excluded": [v / own_ms for v in values],
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------- per-card npu-smi sweep

#: per-card outputs of the stand-in npu-smi for the sweep (shapes of the recorded samples)
_PER_CARD = {
    "health": "\tHealth Status                  : OK\n"
    "\tError Code                     : NA\n"
    "\tError Information              : NA\n",
    "common": "\tNPU ID                         : 0\n\tChip Count                     : 1\n\n"
    "\tChip ID                        : 0\n\tMemory Usage Rate(%)           : 0\n"
    "\tHBM Usage Rate(%)              : 8\n\tAicore Usage Rate(%)           : 0\n"
    "\tAicore Freq(MHZ)               : 1800\n\tAicore curFreq(MHZ)            : 800\n"
    "\tAicore Count                   : 20\n\tTemperature(C)                 : 33\n"
    "\tNPU Real-time Power(W)         : 87.2\n",
    "usages": "\tNPU ID                         : 0\n\tChip Count                     : 1\n\n"
    "\tDDR Capacity(MB)               : 0\n\tDDR Usage Rate(%)              : 0\n"
    "\tDDR Hugepages Total(page)      : 0\n\tDDR Hugepages Usage Rate(%)    : 0\n"
    "\tHBM Capacity(MB)               : 32768\n\tHBM Usage Rate(%)              : 8\n"
    "\tAicore Usage Rate(%)           : 0\n\tAivector Usage Rate(%)         : 0\n"
    "\tAicpu Usage Rate(%)            : 0\n\tCtrlcpu Usage Rate(%)          : 7\n"
    "\tChip ID                        : 0\n",
    "proc-mem": "\tNPU ID                         : 0\n\tChip Count                     : 1\n\n"
    "\tChip ID                        : 0\n",
}
SWEEP_TYPES = ("health", "common", "usages", "proc-mem")
#: recordings of hetpatrol's own detail commands (npu-smi info -m / -t health, hccn_tool)
DETAIL_NODE = ROOT / "fixtures" / "nodes" / "ascend-roce-alarm"

#: A stand-in vendor tool: prints the recording named like ReplayTool names it
#: (``npu-smi_info_-t_health_-i_0_-c_0.txt``), looked up in $1 then $2 of the template.
_TOOL_STANDIN = """name=$(basename "$0")
for a in "$@"; do name="${{name}}_$a"; done
[ -f "{first}/$name.txt" ] && exec cat "{first}/$name.txt"
exec cat "{second}/$name.txt"
"""


def _kv(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def bench_vs_npu_smi(repeats: int) -> dict[str, Any]:
    """Processes spawned (and CPU, children included) per patrol: hetpatrol's Ascend
    collector as configured in the bundled config (one ``npu-smi info`` a patrol, plus
    its detail sweep every ``detail_interval_seconds``) vs a per-card sweep."""
    from hetpatrol.collectors.ascend import AscendCollector
    from hetpatrol.config import load_config
    from hetpatrol.tool import run_tool

    config = load_config(None)
    options = dict(next(c for c in config.collectors if c.name == "ascend").options)
    tmp = Path(tempfile.mkdtemp(prefix="hetpatrol-bench-npu-"))
    try:
        shutil.copyfile(NODE / "npu-smi-info.txt", tmp / "npu-smi_info.txt")
        body = _TOOL_STANDIN.format(first=tmp, second=DETAIL_NODE)
        npu = write_standin(tmp / "npu-smi", body)
        hccn = write_standin(tmp / "hccn_tool", body)
        spawned = [0]

        def counting_runner(argv, timeout):
            out = run_tool(argv, timeout)  # raises before spawning when no program
            spawned[0] += 1
            return out

        options.update(command=[str(npu), "info"], hccn_tool=[str(hccn)])
        collector = AscendCollector(options)
        collector.runner = counting_runner
        result = collector.collect()  # the first patrol runs the detail sweep too
        assert result.state == "ok", result.error
        first_patrol = spawned[0]
        npu_ids = sorted({r.index for r in result.records})
        for kind, text in _PER_CARD.items():
            for i in npu_ids:
                (tmp / f"npu-smi_info_-t_{kind}_-i_{i}.txt").write_text(text)

        def sweep_patrol() -> None:
            for i in npu_ids:
                for kind in SWEEP_TYPES:
                    argv = [str(npu), "info", "-t", kind, "-i", str(i)]
                    _kv(counting_runner(argv, 10).stdout)

        def per_patrol(fn: Callable[[], Any], patrols: int) -> tuple[float, float]:
            spawned[0] = 0
            t, c = cpu(), children_cpu()
            for _ in range(patrols):
                fn()
            used = (cpu() - t) + (children_cpu() - c)
            return spawned[0] / patrols, used / patrols * 1e3

        het = [per_patrol(collector.collect, 10) for _ in range(repeats)]
        sweep = [per_patrol(sweep_patrol, 2) for _ in range(repeats)]
        steady = het[0][0]
        detail_every = 0.0
        if options.get("detail"):
            interval = float(options.get("detail_interval_seconds", 300))
            detail_every = max(1.0, interval / config.interval_seconds)  # patrols per sweep
        detail_spawns = first_patrol - steady
        amortized = steady + (detail_spawns / detail_every if detail_every else 0.0)
        return {
            "npus": len(npu_ids),
            "hetpatrol_spawns_per_patrol": steady,
            "hetpatrol_detail_sweep_spawns": detail_spawns if detail_every else 0,
            "hetpatrol_patrols_per_detail_sweep": detail_every,
            "hetpatrol_spawns_per_patrol_amortized": amortized,
            "sweep_spawns_per_patrol": sweep[0][0],
            "sweep_commands_per_npu": [f"npu-smi info -t {k} -i N" for k in SWEEP_TYPES],
            "hetpatrol_cpu_ms_per_patrol": [x[1] for x in het],
            "sweep_cpu_ms_per_patrol": [x[1] for x in sweep],
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------ calibration


def bench_reference(repeats: int) -> list[float]:
    """A fixed pure-Python workload (JSON round trip of the H100 dump's text, split in
    lines), to compare machines: the other CPU figures scale roughly with it."""
    lines = (NODE / "nvidia-smi-q.xml").read_text().splitlines()

    def one() -> float:
        t = cpu()
        for _ in range(50):
            json.loads(json.dumps({str(i): line.split() for i, line in enumerate(lines)}))
        return (cpu() - t) / 50 * 1e6

    return repeat(one, repeats)


# --------------------------------------------------------------------------------- output


def meets(key: str, value: float) -> str:
    goal = GOALS.get(key)
    if goal is None:
        return "report"
    op, limit, _ = goal
    ok = value <= limit if op == "<=" else value >= limit
    return "met" if ok else "MISSED"


def machine() -> dict[str, Any]:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": model,
    }


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    quiet_logging()
    r = args.repeats
    extra: dict[str, Any] = {}
    spreads: dict[str, list[float]] = {}
    result: dict[str, Any] = {}

    progress("reference workload")
    ref = bench_reference(r)
    extra["reference_json_us"] = spread(ref)

    progress(f"patrol CPU: {r} x {args.patrols} daemon patrols, 16 cards")
    p = bench_patrol(r, args.patrols)
    result["patrol_cpu_ms_per_card"] = statistics.median(p["ms_per_card"])
    spreads["patrol_cpu_ms_per_card"] = spread(p["ms_per_card"])
    extra["patrol_collect_judge_encode_ms_per_card"] = spread(p["collect_ms_per_card"])
    extra["patrol_publish_ms_per_card"] = spread(p["publish_ms_per_card"])
    extra["patrol_cards"] = p["cards"]
    extra["exposition_bytes"] = p["exposition_bytes"]

    progress("Ascend parser")
    a = bench_ascend(r)
    result["ascend_parse_us_per_chip"] = statistics.median(a["us_per_chip"])
    spreads["ascend_parse_us_per_chip"] = spread(a["us_per_chip"])
    extra["ascend_tables"] = {k: a[k] for k in ("source", "tables", "error_outputs", "chips")}

    progress("new vendors' parsers")
    for vendor, v in bench_vendor_parsers(r).items():
        result[f"{vendor}_parse_us_per_card"] = statistics.median(v["us_per_card"])
        spreads[f"{vendor}_parse_us_per_card"] = spread(v["us_per_card"])
        extra[f"{vendor}_outputs"] = {k: v[k] for k in ("outputs", "cards")}

    progress("NVIDIA collector over the replayed NVML")
    n = bench_nvidia(r)
    result["nvidia_collect_us_per_gpu"] = statistics.median(n["us_per_gpu"])
    spreads["nvidia_collect_us_per_gpu"] = spread(n["us_per_gpu"])
    extra["nvidia_gpus"] = n["gpus"]
    extra["nvidia_nvml_calls_per_patrol"] = n["nvml_calls_per_patrol"]
    extra["nvidia_raw_replay_calls_us_per_gpu"] = spread(n["raw_replay_calls_us_per_gpu"])
    extra["nvidia_collector_over_raw_calls"] = result["nvidia_collect_us_per_gpu"] / (
        statistics.median(n["raw_replay_calls_us_per_gpu"])
    )
    extra["nvidia_zero_cost_nvml_us_per_gpu"] = spread(n["zero_cost_nvml_us_per_gpu"])

    progress("JSONL sink")
    j = bench_jsonl(r)
    result["jsonl_lines_per_s"] = statistics.median(j["lines_per_s"])
    spreads["jsonl_lines_per_s"] = spread(j["lines_per_s"])
    extra["jsonl_lines_per_cpu_s"] = spread(j["lines_per_cpu_s"])
    extra["jsonl_lines_per_patrol"] = j["lines_per_patrol"]
    extra["jsonl_bytes_per_patrol"] = j["bytes_per_patrol"]

    progress("nvidia-smi -q -x baseline")
    own = statistics.median(n["zero_cost_nvml_us_per_gpu"])
    s = bench_vs_nvidia_smi(r, result["nvidia_collect_us_per_gpu"], own, n["gpus"])
    result["vs_nvidia_smi_xml_cpu_ratio"] = statistics.median(s["ratio"])
    spreads["vs_nvidia_smi_xml_cpu_ratio"] = spread(s["ratio"])
    extra["nvidia_smi_xml_cpu_ms_per_patrol"] = spread(s["cpu_ms_per_patrol"])
    extra["nvidia_smi_xml_child_cpu_ms_per_patrol"] = spread(s["child_cpu_ms_per_patrol"])
    extra["hetpatrol_nvml_cpu_ms_per_patrol"] = s["hetpatrol_nvml_cpu_ms_per_patrol"]
    extra["vs_nvidia_smi_xml_cpu_ratio_nvml_excluded"] = spread(s["ratio_nvml_excluded"])
    extra["nvidia_smi_standin"] = s["standin"]

    progress("per-card npu-smi sweep baseline")
    v = bench_vs_npu_smi(r)
    result["vs_per_card_npu_smi_calls"] = (
        v["sweep_spawns_per_patrol"] / v["hetpatrol_spawns_per_patrol_amortized"]
    )
    extra["npu_smi_spawns_per_patrol"] = {
        "npus": v["npus"],
        "hetpatrol": v["hetpatrol_spawns_per_patrol"],
        "hetpatrol_detail_sweep": v["hetpatrol_detail_sweep_spawns"],
        "hetpatrol_patrols_per_detail_sweep": v["hetpatrol_patrols_per_detail_sweep"],
        "hetpatrol_amortized": round(v["hetpatrol_spawns_per_patrol_amortized"], 3),
        "per_card_sweep": v["sweep_spawns_per_patrol"],
        "sweep_commands_per_npu": v["sweep_commands_per_npu"],
    }
    extra["npu_smi_hetpatrol_cpu_ms_per_patrol"] = spread(v["hetpatrol_cpu_ms_per_patrol"])
    extra["npu_smi_sweep_cpu_ms_per_patrol"] = spread(v["sweep_cpu_ms_per_patrol"])

    progress(f"RSS: fresh daemon process, {args.rss_patrols} patrols")
    m = bench_rss(args.rss_patrols)
    result["rss_start_mb"] = m["rss_start_mb"]
    result["rss_after_10k_patrols_mb"] = m[f"rss_after_{args.rss_patrols}_mb"]
    extra["rss_patrols"] = args.rss_patrols
    extra["rss_growth_mb"] = m[f"rss_after_{args.rss_patrols}_mb"] - m["rss_start_mb"]
    extra["rss_marks_mb"] = {k: round(v, 2) for k, v in m.items() if k.startswith("rss_after")}
    extra["rss_loop_wall_s"] = m["wall_s"]
    extra["rss_loop_cpu_ms_per_patrol"] = m["cpu_s"] / m["patrols"] * 1e3
    extra["rss_by_import_mb"] = bench_import_rss()

    progress(f"scrapes: {SCRAPE_CLIENTS} clients, {SCRAPE_OFFERED_PER_S:g}/s offered")
    load_before = os.getloadavg()[0]
    sc = bench_scrapes(args.scrape_windows, args.scrape_seconds, args.scrape_seconds)
    # wall-clock latency: other processes on the machine show up in it (CPU figures less)
    extra["scrape_loadavg_1min_before_after"] = [load_before, os.getloadavg()[0]]
    cached = merge_windows(sc["cached_windows"])
    result["scrape_p50_ms"] = cached["p50_ms"]
    result["scrape_p99_ms"] = cached["p99_ms"]
    spreads["scrape_p50_ms"] = cached["p50_spread"]
    spreads["scrape_p99_ms"] = cached["p99_spread"]
    sat = merge_windows(sc["cached_saturated"])
    result["scrape_rate_per_s"] = sat["rate_per_s"]
    spreads["scrape_rate_per_s"] = sat["rate_spread"]
    extra["scrape_paced_served_per_s"] = cached["rate_per_s"]
    extra["scrape_saturated_p50_p99_ms"] = [sat["p50_ms"], sat["p99_ms"]]
    cos = sc["collect_on_scrape"]
    extra["collect_on_scrape"] = {
        k: cos[k] for k in ("rate_per_s", "p50_ms", "p99_ms", "max_ms", "scrapes")
    }
    result["vs_collect_on_scrape_p99_ratio"] = cos["p99_ms"] / cached["p99_ms"]

    # the cluster-wide commands on 10,000 nodes (tests/bench/fleet.py)
    progress("fleet / audit-slurm on a synthetic 10,000-node cluster")
    from fleet import bench as bench_fleet

    fl = bench_fleet(10_000, r)
    for key, src in (("fleet_10k", "fleet_text"), ("audit_10k", "audit")):
        result[f"{key}_wall_s"] = fl[src]["wall_s"]
        spreads[f"{key}_wall_s"] = fl[src]["wall_spread_s"]
        result[f"{key}_rss_mb"] = fl[src]["peak_rss_mb"]
    extra["fleet_10k_scontrol_json_wall_s_rss_mb"] = [
        fl["fleet_json"]["wall_s"],
        fl["fleet_json"]["peak_rss_mb"],
    ]

    # the real daemon from outside, its tool spawned every patrol (tests/bench/daemon.py)
    progress("the real daemon from outside: 8/16/32/64 NPUs, scrapes, check, 10,000 patrols")
    from daemon import bench as bench_daemon

    daemon_figures = bench_daemon([8, 16, 32, 64], 6.0, 3.0, args.growth_patrols)

    extra["bench_wall_s"] = time.perf_counter() - started
    meta = machine()
    meta.update(
        loadavg_1min_start_end=[load_start, os.getloadavg()[0]],
        repeats=r,
        patrols_per_repeat=args.patrols,
        scrape_windows=args.scrape_windows,
        scrape_window_s=args.scrape_seconds,
        scrape_clients=SCRAPE_CLIENTS,
        scrape_offered_per_s=SCRAPE_OFFERED_PER_S,
    )
    out = {k: round(result[k], 4) for k in KEYS}
    out["spread"] = {k: [round(x, 4) for x in v] for k, v in spreads.items()}
    out["extra"] = extra
    out["meta"] = meta
    out["daemon"] = daemon_figures
    return out


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.1f}"
    return f"{value:.3g}" if value < 1 else f"{value:.2f}"


def print_table(out: dict[str, Any]) -> None:
    meta, extra, spreads = out["meta"], out["extra"], out["spread"]
    print(
        f"hetpatrol benchmark {meta['date']}  Python {meta['python']}  "
        f"{meta['cpus']} CPUs ({meta['cpu_model']})  repeats={meta['repeats']}  "
        f"load avg {meta['loadavg_1min_start_end'][0]:.1f} -> "
        f"{meta['loadavg_1min_start_end'][1]:.1f}"
    )
    print(f"{'figure':34} {'value':>12} {'goal':>12} {'':8} spread min / median / max")
    growth = extra["rss_growth_mb"]
    for key in KEYS:
        value = out[key]
        if key == "rss_after_10k_patrols_mb":
            goal = f"+<= {RSS_GROWTH_GOAL_MB:g}"
            verdict = "met" if growth <= RSS_GROWTH_GOAL_MB else "MISSED"
            marks = extra["rss_marks_mb"]
            first = marks["rss_after_1_mb"] - out["rss_start_mb"]
            note = (
                f"growth {growth:+.2f} MB: {first:+.2f} on patrol 1, "
                f"{growth - first:+.2f} over patrols 2..{extra['rss_patrols']}"
            )
        else:
            goal = GOALS[key][2] if key in GOALS else "report"
            verdict = meets(key, value)
            sp = spreads.get(key)
            note = " / ".join(_fmt(x) for x in sp) if sp else ""
        if key == "vs_per_card_npu_smi_calls":
            c = extra["npu_smi_spawns_per_patrol"]
            note = (
                f"{c['per_card_sweep']:g} vs {c['hetpatrol_amortized']:g} spawns/patrol "
                f"({c['hetpatrol']:g} + {c['hetpatrol_detail_sweep']:g} detail every "
                f"{c['hetpatrol_patrols_per_detail_sweep']:g}), {c['npus']} NPUs"
            )
        print(f"{key:34} {_fmt(value):>12} {goal:>12} {verdict:8} {note}")
    print()
    print("details:")
    width = max(len(k) for k in extra)
    for key, value in extra.items():
        if isinstance(value, list):
            text = " / ".join(_fmt(x) if isinstance(x, (int, float)) else str(x) for x in value)
        elif isinstance(value, float):
            text = _fmt(value)
        else:
            text = json.dumps(value)
        print(f"  {key:{width}}  {text}")
    if out.get("daemon"):
        from daemon import report as daemon_report

        print()
        print(daemon_report(out["daemon"]))


# ------------------------------------------------------------------------------ real NVML


def run_real_nvml(args: argparse.Namespace) -> int:
    """Per patrol time of NvidiaCollector on the real pynvml, and the raw-call floor."""
    quiet_logging()
    from hetpatrol.collectors.nvidia import NvidiaCollector

    collector = NvidiaCollector({})
    first = collector.collect()
    if first.state != "ok" or not first.records:
        print(f"real NVML not usable here: state={first.state} error={first.error}")
        return 2
    collector.collect()
    calls = record_nvml_calls(collector)
    gpus = len(first.records)
    patrols = args.patrols

    def timed(fn: Callable[[], Any]) -> tuple[float, float]:
        w, c = time.perf_counter(), cpu()
        for _ in range(patrols):
            fn()
        return (time.perf_counter() - w) / patrols * 1e3, (cpu() - c) / patrols * 1e3

    coll = [timed(collector.collect) for _ in range(args.repeats)]
    raw = [timed(lambda: replay_raw(calls)) for _ in range(args.repeats)]
    smi = shutil.which("nvidia-smi")
    smi_cpu = None
    if smi is not None:  # the real alternative: spawn nvidia-smi -q -x and parse it
        smi_cpu = statistics.median(smi_xml_cpu_ms(smi, None, min(args.repeats, 3), 3)[0])
    collector.close()
    cw = statistics.median(x[0] for x in coll)
    cc = statistics.median(x[1] for x in coll)
    rw = statistics.median(x[0] for x in raw)
    rc = statistics.median(x[1] for x in raw)
    out = {
        "gpus": gpus,
        "models": sorted({r.model or "?" for r in first.records}),
        "driver": first.records[0].driver_version,
        "nvml_calls_per_patrol": len(calls),
        "collector_wall_ms_per_patrol": cw,
        "collector_cpu_ms_per_patrol": cc,
        "raw_calls_wall_ms_per_patrol": rw,
        "raw_calls_cpu_ms_per_patrol": rc,
        "collector_over_raw_wall": cw / rw if rw else None,
        "collector_cpu_us_per_gpu": cc * 1e3 / gpus,
        "nvidia_smi_xml_cpu_ms_per_patrol": smi_cpu,
        "vs_nvidia_smi_xml_cpu_ratio": smi_cpu / cc if smi_cpu and cc else None,
        "collector_wall_spread_ms": spread([x[0] for x in coll]),
        "raw_wall_spread_ms": spread([x[0] for x in raw]),
        "meta": machine() | {"repeats": args.repeats, "patrols_per_repeat": patrols},
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for key, value in out.items():
            print(f"{key:32} {value}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--real-nvml", action="store_true", help="real NVML figures only")
    parser.add_argument("--parsers-only", action="store_true", help="vendor parser figures only")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--patrols", type=int, default=50, help="patrols per repeat")
    parser.add_argument("--rss-patrols", type=int, default=10_000)
    parser.add_argument(
        "--growth-patrols", type=int, default=10_000, help="the real daemon's RSS growth window"
    )
    parser.add_argument("--scrape-windows", type=int, default=3)
    parser.add_argument("--scrape-seconds", type=float, default=2.0)
    parser.add_argument(
        "--fleet", action="store_true", help="only fleet / audit-slurm on 10,000 nodes"
    )
    parser.add_argument("--_serve-collect", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--ledger-jobs", type=int, default=1_000_000, help="sacct records for tests/bench/ledger.py"
    )
    parser.add_argument("--ledger-only", action="store_true", help="the ledger figures only")
    parser.add_argument(
        "--daemon", action="store_true", help="only the real daemon from outside (daemon.py)"
    )
    args = parser.parse_args(argv)
    if args.daemon:
        from daemon import main as daemon_main  # tests/bench/daemon.py

        return daemon_main(["--json"] if args.json else [])
    if args.fleet:
        from fleet import main as fleet_main

        return fleet_main(["--repeats", str(args.repeats), *(["--json"] if args.json else [])])
    if args._serve_collect is not None:
        serve_collect_child(args._serve_collect)
        return 0
    if args.real_nvml:
        return run_real_nvml(args)
    if args.parsers_only:
        figures = {"ascend_parse_us_per_chip": statistics.median(bench_ascend(3)["us_per_chip"])}
        for vendor, v in bench_vendor_parsers(3).items():
            figures[f"{vendor}_parse_us_per_card"] = statistics.median(v["us_per_card"])
            figures[f"{vendor}_cards"] = v["cards"]
        print(json.dumps(figures, indent=2))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ledger as bench_ledger  # tests/bench/ledger.py: the 1M-record sacct stream

    out = {} if args.ledger_only else run_all(args)
    out["ledger"] = bench_ledger.run(args.ledger_jobs)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        if not args.ledger_only:
            print_table(out)
            print()
        bench_ledger.print_table(out["ledger"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
