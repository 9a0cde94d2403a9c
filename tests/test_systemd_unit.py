"""The systemd unit passes the real `systemd-analyze verify`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[1] / "systemd" / "hetpatrol.service"


def test_unit_runs_the_daemon_with_the_etc_config():
    text = UNIT.read_text()
    assert "ExecStart=/usr/local/bin/hetpatrol run --config /etc/hetpatrol/hetpatrol.yaml" in text
    assert "RestartPreventExitStatus=78" in text


def test_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: .ci/run installs it")
    # verify checks that ExecStart exists: point it at this checkout's entry point.
    exe = shutil.which("hetpatrol") or str(Path(sys.executable).with_name("hetpatrol"))
    unit = tmp_path / "hetpatrol.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/hetpatrol", exe))
    res = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == "", res.stderr
