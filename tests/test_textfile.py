"""node_exporter textfile output, read by the real prometheus-node-exporter."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request

import pytest
from conftest import NODES, require_program
from prometheus_client.parser import text_string_to_metric_families
from test_end_to_end import HETPATROL, free_port, wait_for
from test_prometheus_real import sick_config

from hetpatrol.config import ConfigError, load_config
from hetpatrol.daemon import Daemon


def families(text: str) -> dict:
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def make_daemon(tmp_path, textfile, scenario="healthy-mixed"):
    return Daemon(
        load_config(),
        replay_dir=NODES / scenario,
        overrides={
            "listen": "127.0.0.1:0",
            "jsonl_path": tmp_path / "patrol.jsonl",
            "state_path": tmp_path / "state.json",
            "textfile_path": textfile,
        },
    )


def test_textfile_holds_the_exposition_bytes(tmp_path):
    textfile = tmp_path / "textfile" / "hetpatrol.prom"
    daemon = make_daemon(tmp_path, textfile)
    try:
        daemon.patrol_once()
        assert textfile.read_bytes() == daemon.exposition.body
        daemon.patrol_once()
        assert textfile.read_bytes() == daemon.exposition.body
        assert b"hetpatrol_patrols_total 2.0" in textfile.read_bytes()
        # only the .prom file stays behind: the temporary file was renamed over it
        assert sorted(p.name for p in textfile.parent.iterdir()) == ["hetpatrol.prom"]
        assert oct(textfile.stat().st_mode & 0o777) == "0o644"  # node_exporter can read it
    finally:
        daemon.shutdown()


def test_textfile_write_errors_are_counted_not_fatal(tmp_path):
    (tmp_path / "not-a-dir").write_text("")
    daemon = make_daemon(tmp_path, tmp_path / "not-a-dir" / "hetpatrol.prom")
    try:
        daemon.patrol_once()
        daemon.patrol_once()
        found = families(daemon.exposition.body.decode())
        assert found["hetpatrol_textfile_write_errors_total"][0].value == 1  # as of render
        assert daemon.stats.textfile_write_errors == 2
        assert found["hetpatrol_patrol_ready"][0].value == 1
    finally:
        daemon.shutdown()


def test_config_key_and_its_checks(tmp_path):
    assert load_config().textfile_path is None  # off by default
    good = load_config(text="textfile_path: /var/lib/node_exporter/textfile/hetpatrol.prom\n")
    assert str(good.textfile_path) == "/var/lib/node_exporter/textfile/hetpatrol.prom"
    with pytest.raises(ConfigError) as exc:
        load_config(text="node: x\ntextfile_path: /tmp/hetpatrol.txt\n")
    assert str(exc.value).startswith("<config>:2: textfile_path: ")


@pytest.fixture
def node_exporter(tmp_path):
    exe = require_program(
        "prometheus-node-exporter", "node_exporter", package="prometheus-node-exporter"
    )
    directory = tmp_path / "textfile"
    directory.mkdir()
    port = free_port()
    log = open(tmp_path / "node_exporter.log", "w+")  # noqa: SIM115 - closed in teardown
    proc = subprocess.Popen(
        [
            exe,
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={directory}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield directory, port, tmp_path / "node_exporter.log"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_node_exporter_serves_the_textfile(tmp_path, node_exporter):
    directory, port, log = node_exporter
    textfile = directory / "hetpatrol.prom"
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), PYTHONUNBUFFERED="1")
    # with the Slurm GRES check on (gres.conf fallback): two gres_mismatch findings,
    # which must still render as one series (node_exporter refuses duplicates)
    config = sick_config(tmp_path)
    proc = subprocess.Popen(
        [
            *HETPATROL,
            "run",
            *(["--config", str(config)] if config else []),
            "--replay",
            str(NODES / "sick-mixed"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--jsonl-path",
            str(tmp_path / "patrol.jsonl"),
            "--textfile-path",
            str(textfile),
            "--interval",
            "0.5",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(textfile.exists, proc=proc)

        def scrape():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    found = families(r.read().decode())
            except OSError:
                return None
            return found if "hetpatrol_card_temperature_celsius" in found else None

        found = wait_for(scrape, proc=proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err

    assert found["node_textfile_scrape_error"][0].value == 0
    mtimes = {s.labels["file"] for s in found["node_textfile_mtime_seconds"]}
    assert mtimes == {str(textfile)}
    temps = {
        (s.labels["vendor"], s.labels["index"]): s.value
        for s in found["hetpatrol_card_temperature_celsius"]
    }
    # values read off fixtures/nodes/sick-mixed/npu-smi-info.txt (910B3, Temp(C) column)
    assert temps[("ascend", "0")] == 34.0 and temps[("ascend", "5")] == 38.0
    health = {
        (s.labels["vendor"], s.labels["index"]): s.value
        for s in found["hetpatrol_card_health"]
        if s.labels["hetpatrol_card_health"] == "critical"
    }
    assert health[("nvidia", "1")] == 1 and health[("ascend", "5")] == 1
    assert found["hetpatrol_up"][0].value == 1
    assert found["hetpatrol_patrol_ready"][0].value == 1
    # per-card series keep exactly hetpatrol's label set through node_exporter
    for s in found["hetpatrol_card_temperature_celsius"]:
        assert set(s.labels) == {"vendor", "card_type", "index", "chip", "uuid"}
    text = log.read_text()
    assert "level=error" not in text and "textfile" not in text.replace("collector=textfile", "")
    # no temporary file is left in the textfile directory after a clean stop
    assert sorted(p.name for p in directory.iterdir()) == ["hetpatrol.prom"]
