"""A collector that raises, and the start/recovery rules, through the real collectors,
the real daemon and the JSONL it writes.

The exceptions are real: the configured ``npu-smi`` is a file the kernel refuses to
execute (``ENOEXEC`` out of ``subprocess.Popen``), and a replay ``scenario.yaml`` with a
malformed NVML fault makes the NVIDIA collector raise ``ValueError``. Neither is a
``CollectorError``: the patrol must contain them anyway.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from conftest import NODES
from prometheus_client.parser import text_string_to_metric_families
from test_faults_hung import real_patroller

from hetpatrol.config import load_config
from hetpatrol.daemon import Daemon
from hetpatrol.exporters.jsonl import JsonlSink
from hetpatrol.exporters.prometheus import ExporterStats, Exposition

HEALTHY = NODES / "healthy-mixed"
TABLE = HEALTHY / "npu-smi-info.txt"
DCMI = "dcmi module initialize failed. ret is -8005"


def write_tool(path: Path, mode: str) -> None:
    if mode == "ok":
        data = f"#!/bin/sh\ncat '{TABLE}'\n".encode()
    elif mode == "dcmi":
        data = f"#!/bin/sh\necho '{DCMI}'\nexit 1\n".encode()
    else:  # "noexec": executable bit, but neither ELF nor #!: execve() fails ENOEXEC
        data = b"\x7fEL? this is not a program\n"
    tmp = path.with_suffix(".new")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    os.replace(tmp, path)


def samples(body: bytes) -> dict:
    out: dict = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_raising_ascend_collector_marks_only_its_cards_unknown(tmp_path):
    tool = tmp_path / "npu-smi"
    write_tool(tool, "ok")
    config = load_config(
        text=f'node: raise-node\ncollectors:\n  ascend: {{command: ["{tool}", "info"]}}\n'
    )
    patroller = real_patroller(config, config.collectors[0].options)
    sink = JsonlSink(tmp_path / "patrol.jsonl")
    exposition = Exposition(["nvidia", "ascend"], ExporterStats())
    try:
        for mode in ("ok", "noexec"):
            write_tool(tool, mode)
            report = patroller.run()
            sink.write_lines(report.jsonl_lines())
            body = exposition.update(report, report.seq)
    finally:
        patroller.close()
        sink.close()
    status = {s.name: s for s in report.collectors}
    assert status["ascend"].state == "failed"
    assert status["ascend"].error.startswith("OSError: [Errno 8] Exec format error")
    npus = [c for c in report.cards if c.vendor == "ascend"]
    assert [c.health for c in npus] == ["unknown"] * 8
    for card in npus:
        assert [f.check for f in card.findings] == ["collector_failed"]
        assert "Exec format error" in card.findings[0].message
        assert card.errors == [{"source": "ascend", "error": status["ascend"].error}]
    # the NVIDIA cards are read and exported as usual
    assert status["nvidia"].state == "ok"
    assert [c.health for c in report.cards if c.vendor == "nvidia"] == ["ok"] * 8

    lines = read_jsonl(tmp_path / "patrol.jsonl")
    assert len(lines) == 2 * 17
    last_cards, last_patrol = lines[17:-1], lines[-1]
    assert last_patrol["collectors"]["ascend"]["state"] == "failed"
    assert last_patrol["collectors"]["nvidia"]["state"] == "ok"
    assert last_patrol["cards"] == {"ok": 8, "warning": 0, "critical": 0, "unknown": 8}
    gpu_lines = [c for c in last_cards if c["vendor"] == "nvidia"]
    assert [c["health"] for c in gpu_lines] == ["ok"] * 8
    assert all(c["temperature_celsius"] is not None for c in gpu_lines)

    found = samples(body)
    up = {s.labels["collector"]: s.value for s in found["hetpatrol_collector_up"]}
    assert up == {"ascend": 0.0, "nvidia": 1.0}
    temps = {s.labels["vendor"] for s in found["hetpatrol_card_temperature_celsius"]}
    assert temps == {"nvidia"}  # an unread NPU has no temperature series, not a stale one


def test_raising_nvidia_collector_through_the_daemon(tmp_path):
    replay = tmp_path / "replay"
    replay.mkdir()
    shutil.copy(HEALTHY / "nvidia-smi-q.xml", replay)
    shutil.copy(TABLE, replay)
    (replay / "scenario.yaml").write_text("nvml:\n  gpus:\n    0: {hang_seconds: soon}\n")
    jsonl = tmp_path / "patrol.jsonl"
    config = load_config(
        text=f'node: raise-node\nlisten: null\njsonl: {{path: "{jsonl}"}}\nstate_path: null\n'
        "collectors: {nvidia: {}, ascend: {}}\n"
    )
    daemon = Daemon(config, replay_dir=replay)
    try:
        report = daemon.patrol_once()
    finally:
        daemon.shutdown()
    status = {s.name: s for s in report.collectors}
    assert status["nvidia"].state == "failed"
    assert "gpu 0: hang_seconds must be 0..3600" in status["nvidia"].error
    assert [c.vendor for c in report.cards] == ["ascend"] * 8
    assert [c.health for c in report.cards] == ["ok"] * 8
    (finding,) = [f for f in report.node_findings if f.check != "pci_census"]
    assert (finding.check, finding.severity) == ("collector_failed", "unknown")
    assert "hang_seconds must be 0..3600" in finding.message
    *cards, patrol = read_jsonl(jsonl)
    assert [c["vendor"] for c in cards] == ["ascend"] * 8
    assert patrol["collectors"]["nvidia"]["error"] == status["nvidia"].error
    assert patrol["health"] == "unknown" and patrol["exit_code"] == 3


def test_patrol_changes_record_failure_and_recovery_in_the_jsonl(tmp_path):
    tool = tmp_path / "npu-smi"
    jsonl = tmp_path / "patrol.jsonl"
    config = load_config(
        text=f"""node: changes-node
recovery_patrols: 2
listen: null
jsonl: {{path: "{jsonl}"}}
state_path: "{tmp_path / "state.json"}"
collectors:
  nvidia: {{enabled: false}}
  ascend: {{command: ["{tool}", "info"], timeout_seconds: 5}}
"""
    )
    daemon = Daemon(config)
    try:
        for mode in ("ok", "dcmi", "ok", "ok", "ok"):
            write_tool(tool, mode)
            daemon.patrol_once()
        failed_metrics = None
        write_tool(tool, "dcmi")
        daemon.patrol_once()
        failed_metrics = samples(daemon.exposition.body)
    finally:
        daemon.shutdown()
    patrols = [line for line in read_jsonl(jsonl) if line["kind"] == "patrol"]
    assert [p["seq"] for p in patrols] == [1, 2, 3, 4, 5, 6]
    assert [p["health"] for p in patrols] == ["ok", "unknown", "unknown", "ok", "ok", "unknown"]
    npus = [f"ascend/{i}/0" for i in range(8)]

    def card_changes(p):
        return sorted((c["card"], c["from"], c["to"]) for c in p["changes"] if "card" in c)

    def collector_changes(p):
        return [(c["collector"], c["from"], c["to"]) for c in p["changes"] if "collector" in c]

    # never healthy before the first read: the first patrol's changes start from null
    assert collector_changes(patrols[0]) == [("ascend", None, "ok")]
    assert card_changes(patrols[0]) == [(n, None, "ok") for n in npus]
    # the tool fails: the collector and every NPU change, and the reason is in the line
    assert collector_changes(patrols[1]) == [("ascend", "ok", "failed")]
    assert card_changes(patrols[1]) == [(n, "ok", "unknown") for n in npus]
    assert "-8005" in patrols[1]["collectors"]["ascend"]["error"]
    assert patrols[1]["collectors"]["ascend"]["raw"].startswith(DCMI)
    # it answers again: the collector is ok at once, the cards only after 2 good patrols
    assert collector_changes(patrols[2]) == [("ascend", "failed", "ok")]
    assert card_changes(patrols[2]) == []
    assert card_changes(patrols[3]) == [(n, "unknown", "ok") for n in npus]
    assert patrols[4]["changes"] == []
    assert collector_changes(patrols[5]) == [("ascend", "ok", "failed")]
    held = [
        json.loads(line)
        for line in jsonl.read_text().splitlines()
        if '"recovering"' in line and '"kind":"card"' in line
    ]
    assert len(held) == 8  # patrol 3: each NPU held at unknown, saying why
    assert held[0]["findings"][0]["message"] == "good for 1 of 2 patrols needed before ok"

    up = {s.labels["collector"]: s.value for s in failed_metrics["hetpatrol_collector_up"]}
    assert up["ascend"] == 0.0
    codes = {s.value for s in failed_metrics["hetpatrol_card_health_code"]}
    assert codes == {3.0}
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["health"] == "unknown" and state["seq"] == 6
