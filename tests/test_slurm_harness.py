"""The harness of the real-daemon tests (tests/slurm_cluster.py): a failed command says
why, in its own words and the daemons' logs. No daemon is started here."""

from __future__ import annotations

import subprocess
import sys

import pytest
from slurm_cluster import CommandFailed, CommandTimedOut, SlurmCluster


@pytest.fixture
def cluster(tmp_path):
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "slurmctld.log").write_text(
        "[2026-12-01T10:00:00.000] error: _slurm_rpc_submit_batch_job: Invalid account\n"
    )
    return SlurmCluster(tmp_path, tmp_path / "slurm.conf", tmp_path / "gres.conf", "hp-gpu01")


def test_a_failed_command_shows_its_stderr_and_the_daemon_logs(cluster):
    """sbatch exiting 1 under load failed a test with "returned non-zero exit status 1"
    and nothing else: not sbatch's error, not slurmctld's."""
    script = "echo 'sbatch: error: Batch job submission failed: Invalid account' >&2; exit 1"
    with pytest.raises(CommandFailed) as info:
        cluster.run("sh", "-c", script)
    text = str(info.value)
    assert "exited with 1" in text
    assert "sbatch: error: Batch job submission failed: Invalid account" in text
    assert "----- slurmctld.log" in text
    assert "_slurm_rpc_submit_batch_job: Invalid account" in text
    # still what callers catch
    assert isinstance(info.value, subprocess.CalledProcessError)
    assert cluster.run("sh", "-c", "exit 3", check=False).returncode == 3


def test_a_command_past_its_timeout_shows_the_daemon_logs(cluster):
    with pytest.raises(CommandTimedOut) as info:
        cluster.run(sys.executable, "-c", "import time; time.sleep(10)", timeout=0.5)
    assert "_slurm_rpc_submit_batch_job" in str(info.value)
    assert isinstance(info.value, subprocess.TimeoutExpired)
