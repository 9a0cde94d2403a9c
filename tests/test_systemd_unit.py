"""The systemd unit passes the real `systemd-analyze verify`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_program

UNIT = Path(__file__).resolve().parents[1] / "systemd" / "hetpatrol.service"


def test_unit_runs_the_daemon_with_the_etc_config():
    text = UNIT.read_text()
    assert "ExecStart=/usr/local/bin/hetpatrol run --config /etc/hetpatrol/hetpatrol.yaml" in text
    assert "RestartPreventExitStatus=78" in text


def test_systemd_analyze_verify(tmp_path):
    analyze = require_program("systemd-analyze", package="systemd")
    # verify checks that ExecStart exists: point it at this checkout's entry point.
    exe = shutil.which("hetpatrol") or str(Path(sys.executable).with_name("hetpatrol"))
    unit = tmp_path / "hetpatrol.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/hetpatrol", exe))
    res = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == "", res.stderr


# ------------------------------------------------------------ hardening, notify, helper
SYSTEMD = UNIT.parent
HELPER_SOCKET = SYSTEMD / "hetpatrol-scontrol.socket"
HELPER_SERVICE = SYSTEMD / "hetpatrol-scontrol@.service"


def _analyze() -> str:
    analyze = require_program("systemd-analyze", package="systemd")
    return analyze


def _directives(path: Path) -> list[tuple[str, str]]:
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.append((key, value))
    return out


def _installed_copies(tmp_path: Path) -> Path:
    """The three units with /usr/local/bin pointed at this checkout's entry points;
    the helper template also as instance @0 (verify cannot load a bare template)."""
    bindir = Path(shutil.which("hetpatrol") or Path(sys.executable).with_name("hetpatrol")).parent
    out = tmp_path / "units"
    out.mkdir()
    for src in (UNIT, HELPER_SOCKET, HELPER_SERVICE):
        text = src.read_text().replace("/usr/local/bin/", f"{bindir}/")
        (out / src.name).write_text(text)
    (out / "hetpatrol-scontrol@0.service").write_text((out / HELPER_SERVICE.name).read_text())
    return out


def test_unit_is_notify_with_watchdog_as_a_dedicated_user():
    d = dict(_directives(UNIT))
    assert d["Type"] == "notify" and d["NotifyAccess"] == "main"
    assert d["WatchdogSec"] == "30s"
    assert d["User"] == "hetpatrol" and d["SupplementaryGroups"] == "HwHiAiUser"
    assert d["NoNewPrivileges"] == "yes" and d["CapabilityBoundingSet"] == ""


def test_vendor_device_nodes_stay_reachable():
    pairs = _directives(UNIT)
    d = dict(pairs)
    assert d["PrivateDevices"] == "no"  # yes would hide /dev/nvidia* and /dev/davinci*
    assert d["DevicePolicy"] == "closed"
    allowed = {v.split()[0]: v.split()[1] for k, v in pairs if k == "DeviceAllow"}
    # /dev/nvidia0..N, /dev/nvidiactl and /dev/nvidia-modeset share major "nvidia-frontend"
    for cls in ("char-nvidia-frontend", "char-nvidia-uvm"):
        assert allowed[cls] == "rw"
    for path in ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"):
        assert allowed[path] == "rw"
    assert all(allowed[f"/dev/davinci{i}"] == "rw" for i in range(16))  # A3: 16 chips
    # NVML reads /proc/driver/nvidia; the process -> job lookup reads other users' /proc
    assert d["ProcSubset"] == "all" and d["ProtectProc"] == "default"


def test_all_units_verify_clean(tmp_path):
    units = _installed_copies(tmp_path)
    for name in ("hetpatrol.service", "hetpatrol-scontrol.socket", "hetpatrol-scontrol@0.service"):
        res = subprocess.run(
            [_analyze(), "verify", name], capture_output=True, text=True, cwd=units
        )
        assert res.returncode == 0, (name, res.stderr)
        assert res.stderr.strip() == "", (name, res.stderr)


def exposure(unit: Path) -> float:
    res = subprocess.run(
        [_analyze(), "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
    )
    lines = [x for x in res.stdout.splitlines() if "Overall exposure level" in x]
    assert len(lines) == 1, res.stdout + res.stderr
    return float(lines[0].split(":", 1)[1].split()[0])


@pytest.mark.parametrize("unit", [UNIT, HELPER_SERVICE], ids=lambda p: p.name)
def test_security_exposure_is_2_or_lower(unit):
    assert exposure(unit) <= 2.0


def test_sysusers_creates_the_user(tmp_path):
    sysusers = require_program("systemd-sysusers", package="systemd")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    res = subprocess.run(
        [sysusers, f"--root={root}", str(SYSTEMD / "hetpatrol.sysusers")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    user = next(
        x for x in (root / "etc" / "passwd").read_text().splitlines() if x.startswith("hetpatrol:")
    )
    name, _, uid, gid, _, home, shell = user.split(":")
    assert int(uid) < 1000 and home == "/var/lib/hetpatrol" and shell.endswith("nologin")
    assert any(
        g.startswith("hetpatrol:") for g in (root / "etc" / "group").read_text().splitlines()
    )


def test_helper_socket_is_for_the_hetpatrol_group_only():
    d = dict(_directives(HELPER_SOCKET))
    assert d["Accept"] == "yes" and d["SocketMode"] == "0660"
    assert d["SocketGroup"] == "hetpatrol"
    svc = dict(_directives(HELPER_SERVICE))
    assert "--serve" in svc["ExecStart"] and svc["StandardInput"] == "socket"
    assert "User" not in svc  # root: slurmctld lets only root/SlurmUser drain
    assert svc["CapabilityBoundingSet"] == ""


def test_exec_start_argv_is_accepted_by_the_cli():
    """The unit's command line parses: a typo there would restart-loop the service."""
    import shlex

    from hetpatrol.cli import build_parser

    line = next(x for x in UNIT.read_text().splitlines() if x.startswith("ExecStart="))
    argv = shlex.split(line.split("=", 1)[1])
    assert argv[0] == "/usr/local/bin/hetpatrol"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "run"
    assert str(args.config) == "/etc/hetpatrol/hetpatrol.yaml"
    assert args.log_format == "json"
