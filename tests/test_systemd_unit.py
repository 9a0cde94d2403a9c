"""The systemd unit passes the real `systemd-analyze verify`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, require_program

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
    # one capability: CAP_SYSLOG, to open /dev/kmsg under kernel.dmesg_restrict=1
    assert d["NoNewPrivileges"] == "yes" and d["CapabilityBoundingSet"] == "CAP_SYSLOG"


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
    groups = {g.split(":")[0]: g for g in (root / "etc" / "group").read_text().splitlines()}
    assert "hetpatrol" in groups
    # the unit's SupplementaryGroups= exist on a node without the Ascend driver: systemd
    # refuses a unit whose group is missing (216/GROUP)
    supplementary = dict(_directives(UNIT))["SupplementaryGroups"].split()
    for name in supplementary:
        assert name in groups, f"sysusers does not create {name}, the unit needs it"
        assert int(groups[name].split(":")[2]) < 1000, groups[name]


def test_sysusers_leaves_an_existing_ascend_group_alone(tmp_path):
    """On an Ascend node the driver's HwHiAiUser group (its GID, its members) stays."""
    sysusers = require_program("systemd-sysusers", package="systemd")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    driver_group = "HwHiAiUser:x:1000:HwHiAiUser,alice\n"
    (root / "etc" / "group").write_text(driver_group)
    res = subprocess.run(
        [sysusers, f"--root={root}", str(SYSTEMD / "hetpatrol.sysusers")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    lines = (root / "etc" / "group").read_text().splitlines()
    assert [x for x in lines if x.startswith("HwHiAiUser:")] == [driver_group.strip()]


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


# ------------------------------------------- the sandbox against what the daemon reads
# What the daemon reads comes from the code (hetpatrol.kernel_log, hetpatrol.host_access)
# and the shipped config, never from a list copied here: a hardening change that hides
# one of them (ProtectKernelLogs=yes hid /dev/kmsg: XIDs were never seen) fails here.

# systemd.exec(5), "Environment variables in spawned processes": $PATH of the system
# manager when the unit sets none (":/sbin:/bin" appended on unmerged-/usr builds).
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# ProtectHome=yes makes these inaccessible.
PROTECT_HOME_DIRS = ("/home", "/root", "/run/user")


def _all(pairs: list[tuple[str, str]], key: str) -> list[str]:
    """Every value of a directive, split on blanks (systemd merges repeated ones)."""
    out: list[str] = []
    for k, v in pairs:
        if k == key:
            out = [] if v == "" else out + v.split()
    return out


def _under(path: str, dirs: list[str]) -> bool:
    return any(
        path == d.lstrip("-") or path.startswith(d.lstrip("-").rstrip("/") + "/") for d in dirs
    )


def _device_allowed(pairs: list[tuple[str, str]], node) -> list[str]:
    """The concrete paths of ``node`` the unit's device ACL does not let it use."""
    from hetpatrol.host_access import device_paths

    acl: dict[str, str] = {}
    for k, v in pairs:
        if k == "DeviceAllow" and v:
            spec, _, access = v.partition(" ")
            acl[spec] = acl.get(spec, "") + access.strip()
    missing = []
    for path in device_paths(node):
        granted = acl.get(path, "") + (acl.get(f"char-{node.group}", "") if node.group else "")
        if not set(node.access) <= set(granted):
            missing.append(f"{path} ({node.access}, for {node.user})")
    return missing


def _tools_the_daemon_runs() -> set[str]:
    """Program names the Ascend collector runs, with the shipped config and with none."""
    from collectors.ascend import AscendCollector
    from hetpatrol.config import load_config

    config = load_config(Path(__file__).resolve().parents[1] / "config" / "hetpatrol.yaml")
    options = [c.options for c in config.collectors if c.name == "ascend"] + [{}]
    names = set()
    for opts in options:
        collector = AscendCollector(opts)
        names |= {collector.command[0], collector.detail.hccn[0]}
    return names


def _device_acl(pairs: list[tuple[str, str]]) -> dict[str, str]:
    return {v.split()[0]: v.split()[1] for k, v in pairs if k == "DeviceAllow" and v}


def test_sandbox_keeps_the_kernel_log_readable():
    """ProtectKernelLogs=yes put a 0:0 placeholder over /dev/kmsg, DevicePolicy=closed
    had no /dev/kmsg and the bounding set no CAP_SYSLOG: XIDs were never seen."""
    from hetpatrol.checks.kernel_events import KernelLogRules
    from hetpatrol.host_access import device_nodes
    from hetpatrol.kernel_log import KMSG_PATH

    pairs = _directives(UNIT)
    d = dict(pairs)
    assert KernelLogRules().path == KMSG_PATH  # what the daemon opens by default
    (kmsg,) = [n for n in device_nodes() if n.path == KMSG_PATH]
    assert d.get("ProtectKernelLogs", "no") == "no"
    assert d.get("PrivateDevices", "no") == "no"  # a private /dev has no /dev/kmsg
    assert _device_allowed(pairs, kmsg) == []
    assert not _under(KMSG_PATH, _all(pairs, "InaccessiblePaths"))
    # kernel.dmesg_restrict=1 (Debian, Ubuntu) lets only CAP_SYSLOG open it
    for key in ("CapabilityBoundingSet", "AmbientCapabilities"):
        assert "CAP_SYSLOG" in _all(pairs, key), key
    # ...and CAP_SYSLOG buys nothing else: /proc/kmsg (a consuming reader) stays hidden,
    # the device ACL is read only, and syslog(2) is outside the syscall allow-list
    assert _under("/proc/kmsg", _all(pairs, "InaccessiblePaths"))
    assert _device_acl(pairs)[KMSG_PATH] == "r"
    allow = [v for k, v in pairs if k == "SystemCallFilter" and not v.startswith("~")]
    assert allow == ["@system-service"]
    allowed = _syscall_group("@system-service")
    assert "read" in allowed and "openat" in allowed and "syslog" not in allowed


def _syscall_group(name: str) -> set[str]:
    """The system calls of a systemd syscall group, nested groups expanded, as the
    installed systemd defines them (`systemd-analyze syscall-filter`)."""
    text = subprocess.run(
        [_analyze(), "syscall-filter", "--no-pager"], capture_output=True, text=True
    ).stdout
    groups: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.split()[0], [])
        elif current is not None and line.strip() and not line.strip().startswith("#"):
            current.append(line.split()[0])

    def expand(group: str) -> set[str]:
        out: set[str] = set()
        for item in groups.get(group, []):
            out |= expand(item) if item.startswith("@") else {item}
        return out

    return expand(name)


def test_sandbox_keeps_every_vendor_device_node_reachable():
    from hetpatrol.host_access import device_nodes

    pairs = _directives(UNIT)
    hidden = _all(pairs, "InaccessiblePaths")
    missing = [m for node in device_nodes() for m in _device_allowed(pairs, node)]
    assert missing == []
    assert [n.path for n in device_nodes() if _under(n.path.split("{")[0], hidden)] == []


def test_sandbox_lets_the_vendor_tools_run():
    """npu-smi and hccn_tool are found on the unit's PATH and may be executed there
    (hccn_tool lives in /usr/local/Ascend/driver/tools, off systemd's default PATH)."""
    import shlex

    from hetpatrol.host_access import tool_dirs

    pairs = _directives(UNIT)
    env = dict(
        item.split("=", 1) for k, v in pairs if k == "Environment" for item in shlex.split(v)
    )
    path = env.get("PATH", SYSTEMD_DEFAULT_PATH).split(":")
    blocked = _all(pairs, "InaccessiblePaths") + _all(pairs, "NoExecPaths")
    if dict(pairs).get("ProtectHome", "no") in ("yes", "tmpfs"):
        blocked += list(PROTECT_HOME_DIRS)
    exec_only = _all(pairs, "ExecPaths")
    tools = _tools_the_daemon_runs()
    assert {"npu-smi", "hccn_tool"} <= tools
    for tool in sorted(tools):
        if tool.startswith("/"):  # an absolute argv[0] in the config: its own directory
            dirs = [str(Path(tool).parent)]
        else:
            assert tool in tool_dirs(), f"{tool}: declare its install directory in host_access"
            dirs = [x for x in tool_dirs()[tool] if x in path]
            assert dirs, f"{tool}: none of {tool_dirs()[tool]} is on the unit's PATH {path}"
        usable = [
            x for x in dirs if not _under(x, blocked) and (not exec_only or _under(x, exec_only))
        ]
        assert usable, f"{tool}: {dirs} hidden or not executable under the unit"


def _unit_credentials_argv() -> list[str]:
    """setpriv(1) arguments giving a process the unit's privileges, as user nobody
    (the unit's User= does not exist here): its capability sets and NoNewPrivileges."""
    pairs = _directives(UNIT)
    caps = {
        key: ",".join(["-all", *(f"+{c.lower().removeprefix('cap_')}" for c in _all(pairs, key))])
        for key in ("CapabilityBoundingSet", "AmbientCapabilities")
    }
    argv = [
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        f"--bounding-set={caps['CapabilityBoundingSet']}",
        f"--inh-caps={caps['AmbientCapabilities']}",
        f"--ambient-caps={caps['AmbientCapabilities']}",
    ]
    if dict(pairs).get("NoNewPrivileges") == "yes":
        argv.append("--no-new-privs")
    return argv


READ_KMSG = (
    "import json, sys; sys.path.insert(0, sys.argv[1]);"
    "from hetpatrol.kernel_log import KmsgReader;"
    "r = KmsgReader().read(); print(json.dumps([r.state, r.error]))"
)


def _read_kmsg_as(argv: list[str]) -> tuple[str, str | None]:
    res = subprocess.run(
        [shutil.which("setpriv"), *argv, "/usr/bin/python3", "-I", "-c", READ_KMSG, str(REPO)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    state, error = json.loads(res.stdout)
    return state, error


def _require_restricted_kmsg():
    if os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root, setpriv (util-linux) and /usr/bin/python3")
    st = os.stat("/dev/kmsg")
    if (os.major(st.st_rdev), os.minor(st.st_rdev)) != (1, 11):
        pytest.skip("no kernel log device here")
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        pytest.skip("kernel.dmesg_restrict is 0 here: any user may read the kernel log")


def test_the_units_privileges_open_the_real_kernel_log():
    """The real kernel decides: an unprivileged process with exactly the unit's
    capabilities and NoNewPrivileges reads /dev/kmsg under kernel.dmesg_restrict=1."""
    _require_restricted_kmsg()
    state, error = _read_kmsg_as(_unit_credentials_argv())
    assert (state, error) == ("ok", None)


def test_without_cap_syslog_the_kernel_log_is_refused_and_says_why():
    _require_restricted_kmsg()
    bare = ["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--bounding-set=-all"]
    state, error = _read_kmsg_as([*bare, "--no-new-privs"])
    assert state == "absent"
    assert error.startswith("cannot read /dev/kmsg: Operation not permitted (")
    assert "kernel.dmesg_restrict=1 and this process lacks CAP_SYSLOG" in error
