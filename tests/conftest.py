"""Shared test helpers: where the recorded vendor samples and the bundled scenarios are."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: ../shared/vendor-samples beside the checkout (read in place, never copied wholesale).
SAMPLES = REPO.parent / "shared" / "vendor-samples"
NODES = REPO / "fixtures" / "nodes"
#: argv prefix of the ``hetpatrol`` command, run by this interpreter
HETPATROL = [sys.executable, "-m", "hetpatrol.cli"]
# check/prolog/epilog refuse a state file group or others may write (docs/slurm.md, "Who
# may write the verdict"): files the tests write themselves get no such bit, whatever
# the umask of the shell that runs them (0002 on some CI images)
os.umask(os.umask(0o022) | 0o022)


def samples_dir(vendor: str) -> Path:
    """The recorded samples of a vendor; skip when absent, but fail under CI=true."""
    path = SAMPLES / vendor
    if not path.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{path} is missing: CI must have ../shared beside the clone")
        pytest.skip(f"{path} not found (run from a checkout with ../shared beside it)")
    return path


def require_program(*names: str, package: str) -> str:
    """Path of the first of ``names`` on PATH (or in /usr/sbin).

    A test that talks to a real program (Prometheus, node_exporter, logrotate,
    systemd-analyze...) skips when it is not installed, with the Debian package to
    install, but fails under CI=true: ``.ci/run`` installs them all.
    """
    for name in names:
        exe = shutil.which(name) or (
            f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None
        )
        if exe:
            return exe
    message = f"{names[0]} is not installed (Debian package {package}; .ci/run installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def base_config():
    from hetpatrol.config import load_config

    return load_config()


def replay_run_argv(
    scenario: str, port: int, jsonl: Path, interval: float, *extra: str
) -> list[str]:
    """argv of ``hetpatrol run`` on a bundled scenario: loopback port, given JSONL path."""
    return [
        *HETPATROL,
        "run",
        "--replay",
        str(NODES / scenario),
        "--listen",
        f"127.0.0.1:{port}",
        "--jsonl-path",
        str(jsonl),
        "--interval",
        str(interval),
        *extra,
    ]


@pytest.fixture(autouse=True)
def _log_config_restored():
    """``main()`` in a test sets the log level and format (hetpatrol.logs): every test
    starts and ends with the same logging configuration."""
    from hetpatrol import logs

    before = logs.get_config()
    yield
    logs.set_config(before)


@pytest.fixture(autouse=True)
def _state_home_in_tmp(tmp_path, monkeypatch):
    """The bundled config writes its JSONL log and state file under
    ``$XDG_STATE_HOME/hetpatrol``: a test that leaves a path at its default writes into
    its own temporary folder, never into the user's ``~/.local/state``."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
