"""Hung vendor tools and hung NVML, injected for real.

- ``npu-smi`` is a real executable that hangs, ignores SIGTERM/SIGHUP/SIGINT and leaves
  a grandchild behind; it runs through the real :class:`AscendCollector` and
  :class:`Patroller` (``hetpatrol.tool.run_tool`` kills the whole process group).
- NVML blocks for real: the replay's ``hang_seconds`` fault (``scenario.yaml``) makes every
  call on one GPU sleep inside the real :class:`NvidiaCollector`.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import NODES
from fakes import waited_out

from hetpatrol.collectors.ascend import AscendCollector
from hetpatrol.collectors.nvidia import NvidiaCollector
from hetpatrol.config import load_config
from hetpatrol.patrol import HANG_MARGIN_SECONDS, Patroller

HEALTHY = NODES / "healthy-mixed"
TABLE = HEALTHY / "npu-smi-info.txt"
#: a sleep length no other process on the machine uses: finds our leftovers by cmdline
#: (this run's pid in it: a second suite running at once has live hung tools of its own)
MARKER_SLEEP = f"3017.{os.getpid()}"
#: what a hung patrol may take beyond the tool's timeout (fork, kill, reap, judging)
SMALL_MARGIN = 0.5


class FakeNpuSmi:
    """A real ``npu-smi`` executable whose behaviour the test switches atomically."""

    def __init__(self, directory: Path):
        self.path = directory / "npu-smi"
        self.set("ok")

    def set(self, mode: str) -> None:
        body = {
            "ok": f"cat '{TABLE}'\n",
            # ignores the polite signals, leaves a grandchild, prints half a line, hangs
            "hang": "trap '' TERM HUP INT\n"
            f"sleep {MARKER_SLEEP} &\n"
            "printf 'partial'\n"
            f"sleep {MARKER_SLEEP}\n",
        }[mode]
        tmp = self.path.with_suffix(".new")
        tmp.write_text("#!/bin/sh\n" + body)
        tmp.chmod(0o755)
        os.replace(tmp, self.path)


def leftover_tool_processes(wait: float = 5.0) -> list[psutil.Process]:
    """Live (non-zombie) processes of the fake tool anywhere on the machine, once those
    killed have had up to ``wait`` s to die (a SIGKILLed process on a loaded machine
    ends when it is next scheduled, not at the kill)."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            cmd = proc.info["cmdline"] or []
            if MARKER_SLEEP in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def ascend_config(tool: Path, timeout: float, recovery: int = 1):
    return load_config(
        text=f"""node: hung-node
recovery_patrols: {recovery}
collectors:
  nvidia: {{timeout_seconds: 5}}
  ascend:
    command: ["{tool}", "info"]
    timeout_seconds: {timeout}
"""
    )


def real_patroller(config, tool_options: dict, replay: Path = HEALTHY) -> Patroller:
    """The real collectors: Ascend runs the tool, NVIDIA reads the NVML replay."""
    return Patroller(
        config,
        collectors={
            "nvidia": NvidiaCollector({}, replay_dir=replay),
            "ascend": AscendCollector(tool_options),
        },
        enrich_processes=False,
    )


def by_vendor(report, vendor):
    return [c for c in report.cards if c.vendor == vendor]


def test_hung_npu_smi_is_bounded_named_and_killed(tmp_path):
    tool = FakeNpuSmi(tmp_path)
    timeout = 0.3
    config = ascend_config(tool.path, timeout)
    # children of this process from before (a session's Slurm cluster: munged, slurmd...)
    before = set(psutil.Process().children(recursive=True))
    patroller = real_patroller(config, config.collectors[1].options)
    try:
        first = patroller.run()
        assert [c.health for c in first.cards] == ["ok"] * 16

        tool.set("hang")
        t0 = time.monotonic()
        report = patroller.run()
        elapsed = time.monotonic() - t0
        # bounded by the tool's timeout, not by the tool (nor by the patrol's hang margin)
        assert elapsed < waited_out(timeout), elapsed
        assert report.duration_seconds < waited_out(timeout)
        status = {s.name: s for s in report.collectors}
        assert (status["ascend"].state, status["ascend"].up) == ("hung", False)
        assert status["ascend"].error == f"npu-smi info hung: killed after {timeout:g}s"
        assert status["ascend"].raw == "partial"  # what it printed before it hung is kept
        npus = by_vendor(report, "ascend")
        assert [(c.index, c.health) for c in npus] == [(i, "unknown") for i in range(8)]
        for card in npus:
            (finding,) = card.findings
            assert finding.check == "collector_hung"
            assert finding.message == f"ascend: npu-smi info hung: killed after {timeout:g}s"
            assert card.temperature_celsius is None  # nothing carried over as if read
        # the other collector is not affected
        assert status["nvidia"].state == "ok"
        assert [c.health for c in by_vendor(report, "nvidia")] == ["ok"] * 8
        assert report.health == "unknown" and report.exit_code == 3
        # the tool ignored SIGTERM and had a child: both are gone, nothing is left to reap
        assert set(psutil.Process().children(recursive=True)) - before == set()
        assert leftover_tool_processes() == []

        tool.set("ok")
        report = patroller.run()
        assert [c.health for c in report.cards] == ["ok"] * 16
    finally:
        patroller.close()


@pytest.mark.slow
def test_1000_hung_patrols_leave_no_process_zombie_fd_or_thread(tmp_path, record_property):
    tool = FakeNpuSmi(tmp_path)
    tool.set("hang")
    timeout = 0.01
    config = load_config(
        text=f"""node: hung-node
collectors:
  nvidia: {{enabled: false}}
  ascend: {{command: ["{tool.path}", "info"], timeout_seconds: {timeout}}}
"""
    )
    patroller = Patroller(config, enrich_processes=False)  # the real plugin loading path
    me = psutil.Process()
    before = set(me.children(recursive=True))  # a session's Slurm cluster, if one runs
    patroller.run()  # warm-up: imports, first thread
    time.sleep(0.05)
    fds, threads = me.num_fds(), threading.active_count()
    slowest = 0.0
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            report = patroller.run()
            (status,) = [s for s in report.collectors if s.name == "ascend"]
            assert status.state == "hung", status
            slowest = max(slowest, report.duration_seconds)
        total = time.monotonic() - t0
        assert slowest < waited_out(timeout), slowest  # each killed at 10 ms, not waited out
        # no child of its own, hence no zombie child
        assert set(me.children(recursive=True)) - before == set()
        deadline = time.monotonic() + 5
        while threading.active_count() > threads and time.monotonic() < deadline:
            time.sleep(0.01)  # the last collect thread is finishing its bookkeeping
        assert threading.active_count() == threads
        assert me.num_fds() == fds
        assert leftover_tool_processes() == []
        record_property("hung_patrols_seconds", round(total, 2))
        record_property("slowest_hung_patrol_seconds", round(slowest, 4))
        print(f"\n1000 hung patrols: {total:.1f} s, slowest {slowest * 1000:.0f} ms")
    finally:
        patroller.close()


# ---------------------------------------------------------------------------------- NVML


def nvml_replay_dir(tmp_path: Path, hang_gpu: int, hang_seconds: float) -> Path:
    replay = tmp_path / "replay"
    replay.mkdir()
    shutil.copy(HEALTHY / "nvidia-smi-q.xml", replay)
    shutil.copy(HEALTHY / "npu-smi-info.txt", replay)
    (replay / "scenario.yaml").write_text(
        f"node: nvml-hang\nnvml:\n  gpus:\n    {hang_gpu}: {{hang_seconds: {hang_seconds}}}\n"
    )
    return replay


def set_hang(collector: NvidiaCollector, gpu: int, seconds: float) -> None:
    """The dying GPU gets better (0) or worse: the replay's per-GPU fault, live."""
    collector.nvml._faults[gpu].hang_seconds = seconds


def test_blocking_nvml_is_hung_never_called_twice_and_recovers(tmp_path):
    replay = nvml_replay_dir(tmp_path, hang_gpu=2, hang_seconds=0.4)
    config = load_config(
        text="node: nvml-hang\nrecovery_patrols: 1\n"
        "collectors:\n  nvidia: {timeout_seconds: 0.2}\n  ascend: {timeout_seconds: 5}\n"
    )
    nvidia = NvidiaCollector({}, replay_dir=replay)
    ascend = AscendCollector({}, replay_dir=replay)
    patroller = Patroller(
        config, collectors={"nvidia": nvidia, "ascend": ascend}, enrich_processes=False
    )
    bound = 0.2 + HANG_MARGIN_SECONDS + SMALL_MARGIN

    def status(report):
        return {s.name: s for s in report.collectors}

    def until_nvidia_answers():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            report = patroller.run()
            if status(report)["nvidia"].state == "ok":
                return report
            # still stuck: reported hung at once, without a second call into NVML
            assert "still stuck" in status(report)["nvidia"].error
            assert report.duration_seconds < waited_out(0.2)
            time.sleep(0.05)
        raise AssertionError("the NVIDIA collector never came back")

    try:
        # 1: GPU 2 blocks from the very first read: hung, and no GPU is reported healthy
        report = patroller.run()
        assert report.duration_seconds < bound
        assert status(report)["nvidia"].state == "hung"
        assert status(report)["nvidia"].error == "nvidia collector did not return within 0.2 s"
        assert by_vendor(report, "nvidia") == []
        assert [f.check for f in report.node_findings] == ["collector_hung"]
        assert [c.health for c in by_vendor(report, "ascend")] == ["ok"] * 8
        assert report.health == "unknown"
        calls = nvidia.nvml.calls["nvmlDeviceGetCount"]
        assert calls == 1

        # 2: still stuck: hung at once, and no second call is started into NVML
        report = patroller.run()
        assert status(report)["nvidia"].state == "hung"
        assert "still stuck in its previous call" in status(report)["nvidia"].error
        assert report.duration_seconds < waited_out(0.2)
        assert nvidia.nvml.calls["nvmlDeviceGetCount"] == calls

        # 3: the call returns (the GPU answers again): the next patrol reads all 8 GPUs
        set_hang(nvidia, 2, 0)
        report = until_nvidia_answers()
        assert nvidia.nvml.calls["nvmlDeviceGetCount"] == calls + 1  # exactly one new call
        assert [c.health for c in by_vendor(report, "nvidia")] == ["ok"] * 8

        # 4: it blocks again after a good read: the 8 GPUs are kept, as unknown, saying why
        set_hang(nvidia, 2, 0.4)
        report = patroller.run()
        assert report.duration_seconds < bound
        gpus = by_vendor(report, "nvidia")
        assert [(c.index, c.health) for c in gpus] == [(i, "unknown") for i in range(8)]
        assert {f.check for c in gpus for f in c.findings} == {"collector_hung"}
        assert all("did not return within 0.2 s" in c.findings[0].message for c in gpus)
        assert [c.health for c in by_vendor(report, "ascend")] == ["ok"] * 8

        set_hang(nvidia, 2, 0)
        report = until_nvidia_answers()
        assert [c.health for c in report.cards] == ["ok"] * 16
    finally:
        set_hang(nvidia, 2, 0)
        patroller.close()
