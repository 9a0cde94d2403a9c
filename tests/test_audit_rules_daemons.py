"""What the audit says Slurm does, shown on the real Debian slurmctld/slurmd 22.05.

Each test starts the test cluster (tests/slurm_cluster.py) with one config, reads what
the daemons made of it (node state and reason, ``scontrol show node``, ``sbatch
--test-only``, the daemons' logs) and runs the audit rule on the same files: the
finding's severity and claim match what the daemon did.
"""

from __future__ import annotations

import os
import shutil

import pytest
from slurm_cluster import BINARIES, NODE_NAME, SlurmCluster, start_cluster

from hetpatrol.cluster.audit import AuditInput, audit
from hetpatrol.cluster.slurm_conf import parse_slurm_conf
from hetpatrol.config import load_config
from hetpatrol.slurm.gres import parse_gres_conf

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _needs_slurm():
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing or os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Slurm daemons needed: missing {missing}, uid {os.geteuid()}")
        pytest.skip("needs munge/slurmctld/slurmd and root")


def _audit(c: SlurmCluster, check: str):
    report = audit(
        AuditInput(
            conf=parse_slurm_conf(c.conf),
            gres_conf=parse_gres_conf(c.gres_conf.read_text()),
            gres_conf_path=str(c.gres_conf),
            profiles=load_config().profiles,
        )
    )
    return [f for f in report.findings if f.check == check]


def _with(gres: str, gres_conf: str):
    """A running one-node cluster (GresTypes=gpu), stopped and removed afterwards."""
    c = start_cluster(
        overrides={"GresTypes": "gpu"},
        node_gres=gres,
        gres_conf_text=gres_conf,
        wait_idle=False,
    )
    return c


def _stop(c: SlurmCluster) -> None:
    c.stop()
    shutil.rmtree(c.root, ignore_errors=True)


def _wait_state(c: SlurmCluster, timeout: float = 15.0) -> str:
    """``State=`` once slurmctld has judged the registration (not UNKNOWN alone)."""
    import time

    deadline = time.monotonic() + timeout
    state = c.node_state()
    while time.monotonic() < deadline:
        state = c.node_state()
        if state != "UNKNOWN" and not state.endswith("*"):
            return state
        time.sleep(0.2)
    return state


def _log(c: SlurmCluster, name: str) -> str:
    return (c.root / "log" / f"{name}.log").read_text(errors="replace")


def test_partition_with_undefined_nodes_is_fatal():
    with pytest.raises(RuntimeError) as exc:
        start_cluster(extra_conf="PartitionName=hetero Nodes=hp-gpu01,node[31-40] State=UP\n")
    assert "slurmctld exited with 1" in str(exc.value)
    assert "fatal: Invalid node names in partition hetero" in str(exc.value)


def test_untyped_gres_drops_the_gres_conf_types():
    c = _with(
        "gpu:8",
        "".join(f"NodeName={{node}} Name=gpu Type=a100 File={{dev}}/nvidia{i}\n" for i in range(8)),
    )
    try:
        with c.explain():
            assert _wait_state(c) == "IDLE"
            node = c.scontrol("show", "node", "-o", NODE_NAME)
            assert " Gres=gpu:8 " in node
            assert "Ignoring extra GRES" in _log(c, "slurmd")
            asked = c.run(
                "sbatch", "--test-only", "--gres=gpu:a100:1", "--wrap", "true", check=False
            )
            assert asked.returncode != 0
            assert "Requested node configuration is not available" in asked.stderr
            plain = c.run("sbatch", "--test-only", "--gres=gpu:1", "--wrap", "true", check=False)
            assert plain.returncode == 0, plain.stderr
            (f,) = _audit(c, "untyped_gres")
            assert f.severity == "warning"
            assert "--gres=gpu:a100:1 cannot be asked" in f.message
            assert not _audit(c, "gres_conf_count")  # 8 files, 8 configured: registers 8
    finally:
        _stop(c)


def test_fewer_gres_conf_entries_drain_the_node():
    c = _with("gpu:a100:8", "NodeName={node} Name=gpu Type=a100 File={dev}/nvidia[0-3]\n")
    try:
        with c.explain():
            state = _wait_state(c)
            assert "DRAIN" in state and "INVALID_REG" in state, state
            assert "gres/gpu count reported lower than configured (4 < 8)" in _log(c, "slurmctld")
            (f,) = _audit(c, "gres_conf_count")
            assert f.severity == "error"
            assert "(gres/gpu count reported lower than configured (4 < 8))" in f.message
    finally:
        _stop(c)


def test_untyped_gres_conf_for_a_typed_node_drains_it():
    """Typed Gres=gpu:a100:8, untyped gres.conf lines and no AutoDetect: slurmd takes
    none of them (0 < 8)."""
    c = _with("gpu:a100:8", "NodeName={node} Name=gpu File={dev}/nvidia[0-7]\n")
    try:
        with c.explain():
            assert "DRAIN" in _wait_state(c)
            assert "count reported lower than configured (0 < 8)" in _log(c, "slurmctld")
            (f,) = _audit(c, "gres_conf_count")
            assert (f.severity, "(0 < 8)" in f.message) == ("error", True)
    finally:
        _stop(c)


def test_extra_gres_conf_entries_are_ignored():
    c = _with("gpu:a100:4", "NodeName={node} Name=gpu Type=a100 File={dev}/nvidia[0-7]\n")
    try:
        with c.explain():
            assert _wait_state(c) == "IDLE"
            assert " Gres=gpu:a100:4 " in c.scontrol("show", "node", "-o", NODE_NAME)
            assert (
                "A line in gres.conf for GRES gpu:a100 has 4 more configured than expected "
                "in slurm.conf. Ignoring extra GRES." in _log(c, "slurmd")
            )
            (f,) = _audit(c, "gres_conf_count")
            assert f.severity == "warning"
            assert "gres.conf gives 4 gpu more than the 4 slurm.conf configures" in f.message
    finally:
        _stop(c)


def test_multiple_files_is_one_card():
    c = _with(
        "gpu:a100:2",
        "NodeName={node} Name=gpu Type=a100 MultipleFiles={dev}/nvidia[0-3]\n"
        "NodeName={node} Name=gpu Type=a100 MultipleFiles={dev}/nvidia[4-7]\n",
    )
    try:
        with c.explain():
            assert _wait_state(c) == "IDLE"
            assert " Gres=gpu:a100:2 " in c.scontrol("show", "node", "-o", NODE_NAME)
            assert not _audit(c, "gres_conf_count")
    finally:
        _stop(c)


def test_cores_beyond_the_node_lose_their_binding():
    """Cores= are logical cores, not CPUs: a node of 2 CPUs on 1 core (ThreadsPerCore=2)
    has core 0 only. Both daemons refuse Cores=1 (and the old name CPUs=), and the node
    still registers idle with its 8 GPUs."""
    c = _with(
        "gpu:a100:8 CPUs=2 Sockets=1 CoresPerSocket=1 ThreadsPerCore=2",
        "NodeName={node} Name=gpu Type=a100 File={dev}/nvidia[0-3] Cores=0\n"
        "NodeName={node} Name=gpu Type=a100 File={dev}/nvidia[4-7] CPUs=1\n",
    )
    try:
        with c.explain():
            assert _wait_state(c) == "IDLE"
            assert " Gres=gpu:a100:8" in c.scontrol("show", "node", "-o", NODE_NAME)
            assert "Invalid GRES data for gpu, CPUs=1" in _log(c, "slurmd")
            assert "invalid GRES core specification (1)" in _log(c, "slurmctld")
            (f,) = _audit(c, "gres_conf_cores")
            assert (f.severity, f.where) == ("warning", f"{c.gres_conf}:2")
            assert f.message.startswith(f"Cores=1 names core 1, but {NODE_NAME} has 1 core (0-0)")
    finally:
        _stop(c)


def test_gres_conf_line_for_undefined_nodes_does_nothing():
    c = _with(
        "gpu:a100:8",
        "NodeName={node} Name=gpu Type=a100 File={dev}/nvidia[0-7]\n"
        "NodeName=ghost[1-2] Name=gpu Type=a100 File={dev}/nvidia[0-7]\n",
    )
    try:
        with c.explain():
            assert _wait_state(c) == "IDLE"
            assert "ghost" not in _log(c, "slurmd") + _log(c, "slurmctld")
            (f,) = _audit(c, "gres_conf_nodes")
            assert (f.severity, f.where) == ("warning", f"{c.gres_conf}:2")
            assert f.message.startswith("NodeName=ghost[1-2] (2 nodes) is defined by no NodeName")
    finally:
        _stop(c)


def test_gres_conf_lines_for_a_node_without_gres_are_ignored():
    c = _with("", "NodeName={node} Name=gpu Type=a100 File={dev}/nvidia[0-7]\n")
    try:
        with c.explain():
            assert _wait_state(c) == "IDLE"
            assert " Gres=(null) " in c.scontrol("show", "node", "-o", NODE_NAME)
            assert "Ignoring extra GRES" in _log(c, "slurmd")
            (f,) = _audit(c, "gres_conf_count")
            assert f.severity == "warning"
            assert "gres.conf gives 8 gpu more than the 0 slurm.conf configures" in f.message
    finally:
        _stop(c)


def test_autodetect_flag_unknown_to_22_05():
    """AutoDetect=nvidia (24.11): slurmd 22.05 says it does not know it and counts the
    lines alone."""
    c = _with(
        "gpu:a100:8",
        "AutoDetect=nvidia\nNodeName={node} Name=gpu Type=a100 File={dev}/nvidia[0-7]\n",
    )
    try:
        with c.explain():
            assert _wait_state(c) == "IDLE"
            assert "error: unknown autodetect flag 'nvidia'" in _log(c, "slurmd")
            (f,) = _audit(c, "gres_conf_autodetect")
            assert (f.severity, f.where) == ("warning", f"{c.gres_conf}:1")
            assert "nvidia is Slurm 24.11 and later" in f.message
    finally:
        _stop(c)


def test_down_nodes_not_defined_are_ignored():
    c = start_cluster(extra_conf="DownNodes=ghost[1-2] State=DOWN Reason=gone\n")
    try:
        with c.explain():
            assert 'error: DownNode "ghost1" does not exist!' in _log(c, "slurmctld")
            (f,) = _audit(c, "down_nodes")
            assert (f.severity, f.where) == ("warning", f"{c.conf}:{_line_of(c, 'DownNodes=')}")
            assert f.message.startswith("DownNodes=ghost[1-2] (2 nodes) defined by no NodeName")
    finally:
        _stop(c)


def _line_of(c: SlurmCluster, start: str) -> int:
    lines = c.conf.read_text().splitlines()
    return next(i for i, ln in enumerate(lines, start=1) if ln.startswith(start))


def test_accounting_off_records_nothing():
    """The test cluster runs AccountingStorageType=accounting_storage/none: sacct has
    nothing to read, and the audit says accounting is off."""
    c = start_cluster()
    try:
        with c.explain():
            out = c.run("sacct", "-n", "-X", check=False)
            assert out.returncode != 0
            assert "Slurm accounting storage is disabled" in out.stderr
            (f,) = _audit(c, "accounting")
            assert f.message.startswith(
                "AccountingStorageType=accounting_storage/none: accounting is off"
            )
    finally:
        _stop(c)


def test_gres_conf_line_continuation():
    """slurmd reads a gres.conf line continued with a backslash as one line; so does
    the audit (no count finding, the type is taken)."""
    c = _with("gpu:a100:8", "NodeName={node} Name=gpu \\\n    Type=a100 File={dev}/nvidia[0-7]\n")
    try:
        with c.explain():
            assert _wait_state(c) == "IDLE"
            assert " Gres=gpu:a100:8 " in c.scontrol("show", "node", "-o", NODE_NAME)
            assert not _audit(c, "gres_conf_count")
            assert not _audit(c, "untyped_gres")
    finally:
        _stop(c)
