"""End to end: `hetpatrol run` as a subprocess on a bundled scenario, read over HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest
from conftest import HETPATROL, NODES, replay_run_argv
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def wait_for(predicate, timeout=20.0, step=0.1, proc: subprocess.Popen | None = None):
    """Poll ``predicate`` every ``step`` s until it returns a true value (returned), for at
    most ``timeout`` s (a ceiling for a loaded machine, never a wait): AssertionError then.

    ``proc``: the daemon the test waits on. Its exit fails the wait at once, and either
    failure shows its exit code and the end of its own output (stderr, or stdout where
    stderr is not a pipe): a daemon that died or never got ready says why. A daemon
    still running at the timeout is killed for that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the daemon exited before the condition: {daemon_said(proc)}")
        if time.monotonic() >= deadline:
            said = f": {daemon_said(proc)}" if proc is not None else ""
            raise AssertionError(f"condition not met in {timeout:g} s{said}")
        time.sleep(step)


def daemon_said(proc: subprocess.Popen, tail: int = 4000) -> str:
    """``proc``'s exit code and the last ``tail`` characters of its output (killed first
    if it still runs). A later ``communicate()`` returns the same output again."""
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate(timeout=30)
    text = err if proc.stderr is not None else out
    return f"exit code {proc.returncode}, its output ends:\n{(text or '')[-tail:]}"


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e["XDG_STATE_HOME"] = str(tmp_path / "state")  # the bundled config writes here
    e["PYTHONUNBUFFERED"] = "1"
    return e


def test_run_serves_metrics_writes_jsonl_and_stops_cleanly(tmp_path, env):
    port = free_port()
    jsonl = tmp_path / "patrol.jsonl"
    proc = subprocess.Popen(
        replay_run_argv("healthy-mixed", port, jsonl, 0.5),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:

        def ready():
            try:
                found = scrape(port)
            except OSError:
                return None
            return found if found["hetpatrol_patrol_ready"][0].value == 1 else None

        found = wait_for(ready, proc=proc)
        temps = {
            (s.labels["vendor"], s.labels["index"]): s.value
            for s in found["hetpatrol_card_temperature_celsius"]
        }
        assert len(temps) == 16
        # values read off the recordings: 910B4 NPU 4 is at 39 C (npu-smi Temp(C) column),
        # H100 GPU 0 (19:00.0) at 29 C (nvidia-smi -q "GPU Current Temp")
        assert temps[("ascend", "4")] == 39.0
        assert temps[("nvidia", "0")] == 29.0
        ups = {s.labels["collector"]: s.value for s in found["hetpatrol_collector_up"]}
        # every shipped plugin is enabled in the bundled config; the others are absent (up)
        assert ups["nvidia"] == 1.0 and ups["ascend"] == 1.0 and ups["hygon"] == 1.0
        assert found["hetpatrol_node_health_code"][0].value == 0
        wait_for(
            lambda: jsonl.exists() and jsonl.read_text().count('"kind":"patrol"') >= 2, proc=proc
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "stopped" in err

    schema = json.loads(
        subprocess.run(
            [*HETPATROL, "schema"], capture_output=True, text=True, env=env, check=True
        ).stdout
    )
    raw = jsonl.read_text()
    assert raw.endswith("\n")  # no torn line after SIGTERM
    lines = [json.loads(line) for line in raw.splitlines()]
    for doc in lines:
        jsonschema.validate(doc, schema)
    patrols = [d for d in lines if d["kind"] == "patrol"]
    cards = [d for d in lines if d["kind"] == "card"]
    assert len(cards) == 16 * len(patrols)
    assert [p["seq"] for p in patrols] == list(range(1, len(patrols) + 1))
    assert {c["node"] for c in cards} == {"mixed-ok-01"}
    npu0 = next(c for c in cards if c["vendor"] == "ascend" and c["index"] == 0)
    assert npu0["bus_id"] == "0000:c1:00.0"
    assert npu0["memory_used_bytes"] == 2654 * 2**20
    assert npu0["memory_total_bytes"] == 32768 * 2**20
    # the bundled default config wrote its state file under XDG_STATE_HOME
    state = json.loads((Path(env["XDG_STATE_HOME"]) / "hetpatrol" / "state.json").read_text())
    assert state["health"] == "ok" and len(state["cards"]) == 16


@pytest.mark.parametrize(
    ("scenario", "code", "health"),
    [
        ("healthy-mixed", 0, "ok"),
        ("sick-mixed", 2, "critical"),
        ("ascend-a3-only", 0, "ok"),
        ("ascend-dcmi-error", 3, "unknown"),
    ],
)
def test_once_exit_codes(env, scenario, code, health):
    res = subprocess.run(
        [*HETPATROL, "once", "--replay", str(NODES / scenario), "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == code, res.stderr
    doc = json.loads(res.stdout)
    assert doc["patrol"]["health"] == health


def test_once_sick_node_names_each_fault(env):
    res = subprocess.run(
        [*HETPATROL, "once", "--replay", str(NODES / "sick-mixed"), "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
    )
    cards = {(c["vendor"], c["index"]): c for c in json.loads(res.stdout)["cards"]}
    assert len(cards) == 4 + 8
    lost = cards[("nvidia", 3)]
    assert lost["health"] == "critical"
    assert lost["vendor_health"] == "gpu_is_lost"
    # read off nvidia-smi-q_A100-SXM4-80GBx4_555.42.02.txt: GPU 9E:00.0 Remapped Rows
    # Pending: Yes, GPU Current Temp 22 C
    pending = cards[("nvidia", 1)]
    assert pending["bus_id"] == "0000:9e:00.0"
    assert pending["temperature_celsius"] == 22.0
    assert pending["remapped_rows_pending"] is True
    assert [f["check"] for f in pending["findings"]] == ["remapped_rows_pending"]
    npu5 = cards[("ascend", 5)]
    assert (npu5["vendor_health"], npu5["health"]) == ("Alarm", "critical")
    assert [c for c, v in cards.items() if v["health"] == "ok"] == [
        ("nvidia", 0),
        ("nvidia", 2),
        *[("ascend", i) for i in (0, 1, 2, 3, 4, 6, 7)],
    ]
    # the NPU whose process name is empty (container PID namespace) keeps its pid
    assert cards[("ascend", 2)]["processes"] == [
        {
            "pid": 1333928,
            "name": None,
            "memory_bytes": 37709 * 2**20,
            "user": None,
            "job_id": None,
            "pid_in_container": None,
            "partition": None,
        }
    ]


def test_once_jsonl_prints_what_the_sink_writes(env):
    res = subprocess.run(
        [*HETPATROL, "once", "--replay", str(NODES / "ascend-dcmi-error"), "--format", "jsonl"],
        capture_output=True,
        text=True,
        env=env,
    )
    (line,) = res.stdout.splitlines()
    doc = json.loads(line)
    assert doc["kind"] == "patrol"
    ascend = doc["collectors"]["ascend"]
    assert ascend["state"] == "failed" and ascend["up"] is False
    assert "-8005" in ascend["error"]
    assert "dcmi module initialize failed. ret is -8005" in ascend["raw"]


def test_run_with_bad_config_exits_78(tmp_path, env):
    bad = tmp_path / "bad.yaml"
    bad.write_text("interval_seconds: 10\nprofiles:\n  - name: x\n    vendr: nvidia\n")
    res = subprocess.run(
        [*HETPATROL, "run", "--config", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert res.returncode == 78
    assert f"{bad}:4: profiles[0].vendr: unknown key" in res.stderr
