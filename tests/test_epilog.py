"""`hetpatrol epilog`: after a job, one quick patrol of the cards it held.

The daemon's state is the healthy H100 node (fixtures/nodes/healthy-mixed); the epilog's
patrol reads fixtures/nodes/xid-79, the same GPUs after GPU 6 (0000:cb:00.0) fell off
the bus during the job: XID 79 and "fallen off the bus" in the kernel log, NVML GpuIsLost.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace

import pytest
from conftest import HETPATROL, NODES

from hetpatrol.config import load_config
from hetpatrol.exporters.state import write_state
from hetpatrol.patrol import Patroller
from hetpatrol.slurm.epilog import run_epilog


def _patrol(scenario: str):
    patroller = Patroller(replace(load_config(), node="n1"), replay_dir=NODES / scenario)
    try:
        return patroller.run()
    finally:
        patroller.close()


@pytest.fixture
def state(tmp_path):
    path = tmp_path / "state.json"
    write_state(path, _patrol("healthy-mixed"), 10.0)
    return path


def _env(gpus: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "42",
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_GPUS": gpus,
        "ASCEND_VISIBLE_DEVICES": "",
    }


def test_a_card_the_job_broke_drains_the_node_with_hetpatrols_reason(state):
    calls = []

    def scontrol(argv, timeout):
        calls.append(list(argv))
        return ""

    code, line = run_epilog(
        _env("6"), state, lambda: _patrol("xid-79").cards, runner=scontrol, scontrol="sc"
    )
    assert code == 1
    assert line.startswith("hetpatrol: ") and " nvidia/6 " in f"{line} "
    assert calls == [["sc", "update", "NodeName=n1", "State=DRAIN", f"Reason={line}"]]


def test_healthy_cards_of_the_job_pass(state):
    def scontrol(argv, timeout):  # never called: the environment names the GPUs
        raise AssertionError(argv)

    code, line = run_epilog(_env("0,1"), state, lambda: _patrol("xid-79").cards, runner=scontrol)
    assert (code, line) == (0, "hetpatrol epilog: nvidia/0, nvidia/1 fine after the job")


def test_no_state_file_or_no_card_is_no_drain(tmp_path, state):
    code, line = run_epilog(_env("6"), tmp_path / "none.json", lambda: [])
    assert code == 0 and "no state file" in line
    env = {
        "SLURM_JOB_ID": "42",
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_GPUS": "",
        "ASCEND_VISIBLE_DEVICES": "",
    }
    code, line = run_epilog(env, state, lambda: _patrol("xid-79").cards, runner=lambda a, t: "")
    assert code == 0


def test_the_command_with_a_stand_in_scontrol(tmp_path, state):
    log = tmp_path / "scontrol.log"
    tool = tmp_path / "scontrol"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    tool.chmod(0o755)
    env = {**os.environ, **_env("6")}
    argv = [*HETPATROL, "epilog", "--replay", str(NODES / "xid-79"), "--state-path", str(state)]
    run = subprocess.run(
        [*argv, "--scontrol", str(tool)], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1, run.stderr
    assert run.stdout.startswith("hetpatrol: ") and "nvidia/6" in run.stdout
    assert log.read_text().startswith("update NodeName=n1 State=DRAIN Reason=hetpatrol: ")
    env = {**os.environ, **_env("3")}
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout) == (0, "hetpatrol epilog: nvidia/3 fine after the job\n")


def test_a_usage_error_of_the_prolog_lets_the_job_through():
    run = subprocess.run(
        [*HETPATROL[:2], "hetpatrol.entry", "prolog", "--bogus"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0
    assert "unrecognized arguments: --bogus: job let through" in run.stderr
