"""A kernel log hetpatrol cannot read: why, the node finding, the metric.

On a node with NVIDIA cards an unreadable kernel log blinds the XID checks (79, 48, 95,
119) and "fallen off the bus": a `kernel_log_unreadable` warning naming why, and
`hetpatrol_kernel_log_up` 0. An Ascend-only node reads no fault from the kernel log
(no finding there), nor does a replay directory without a recorded `kmsg.txt`.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import replace

import pytest
from conftest import NODES

import hetpatrol.kernel_log as kl
from hetpatrol.config import load_config
from hetpatrol.kernel_log import KernelLog, KmsgReader, kmsg_denied_why
from hetpatrol.patrol import Patroller

# CapEff of a process with every capability but CAP_SYSLOG (bit 34), and with it.
CAPS_WITHOUT_SYSLOG = f"{0x1FFFFFFFFFF & ~(1 << 34):016x}"
CAPS_WITH_SYSLOG = f"{1 << 34:016x}"


def _proc(tmp_path, restrict: str, cap_eff: str):
    sysctl = tmp_path / "dmesg_restrict"
    sysctl.write_text(restrict + "\n")
    status = tmp_path / "status"
    status.write_text(f"Name:\tpython3\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff}\n")
    return {"dmesg_restrict_path": str(sysctl), "status_path": str(status)}


def test_denied_under_dmesg_restrict_without_cap_syslog_names_the_capability(tmp_path):
    why = kmsg_denied_why(errno.EPERM, **_proc(tmp_path, "1", CAPS_WITHOUT_SYSLOG))
    assert why.startswith("kernel.dmesg_restrict=1 and this process lacks CAP_SYSLOG")
    assert why.endswith("the shipped unit grants it with AmbientCapabilities=CAP_SYSLOG")


@pytest.mark.parametrize(
    ("restrict", "cap_eff"), [("1", CAPS_WITH_SYSLOG), ("0", "0000000000000000")]
)
def test_denied_with_the_capability_or_unrestricted_names_the_device_acl(
    tmp_path, restrict, cap_eff
):
    why = kmsg_denied_why(errno.EPERM, **_proc(tmp_path, restrict, cap_eff))
    assert why.startswith("the device cgroup or a security module refuses it")
    assert why.endswith("the shipped unit allows it with DeviceAllow=/dev/kmsg r")
    assert kmsg_denied_why(errno.EACCES, **_proc(tmp_path, restrict, cap_eff)) == (
        "its file mode refuses this user"
    )


def test_systemd_placeholder_over_dev_kmsg_is_named(tmp_path):
    """ProtectKernelLogs=yes mounts systemd's inaccessible character device (0:0) over
    /dev/kmsg: made here for real with mknod(2)."""
    node = tmp_path / "kmsg"
    try:
        os.mknod(node, 0o600 | 0o020000, os.makedev(0, 0))
    except PermissionError:
        pytest.skip("mknod of a character device needs CAP_MKNOD")
    result = KmsgReader(str(node)).read()
    assert result.state == "failed"
    assert result.error == (
        f"{node} is systemd's inaccessible placeholder (character device 0:0), not the "
        "kernel log: the unit hides it (ProtectKernelLogs=yes or InaccessiblePaths=)"
    )


# ------------------------------------------------------------------ through a patrol
def _patrol_with(node_dir, kernel_log):
    config = replace(load_config(), node="n1")
    patroller = Patroller(config, replay_dir=NODES / node_dir)
    patroller.kernel_log.close()
    patroller.kernel_log = kernel_log
    try:
        return patroller.run()
    finally:
        patroller.close()


def _denied_kmsg(monkeypatch, tmp_path):
    """/dev/kmsg as the shipped unit of before saw it: EPERM, dmesg_restrict=1, no
    CAP_SYSLOG (os.open refuses; the sysctl and CapEff are files here)."""
    paths = _proc(tmp_path, "1", CAPS_WITHOUT_SYSLOG)
    monkeypatch.setattr(kl, "DMESG_RESTRICT_PATH", paths["dmesg_restrict_path"])
    monkeypatch.setattr(kl, "PROC_STATUS_PATH", paths["status_path"])
    real_open = os.open

    def refuse(path, flags, *args, **kwargs):
        if str(path) == "/dev/kmsg":
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(kl.os, "open", refuse)
    if not os.path.exists("/dev/kmsg"):
        pytest.skip("no /dev/kmsg here")
    return KernelLog(KmsgReader("/dev/kmsg"))


def test_unreadable_kernel_log_on_an_nvidia_node_is_a_warning_naming_why(monkeypatch, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from hetpatrol.exporters.prometheus import Exposition

    # healthy-mixed: 8 x H100 and 8 x 910B4, every card ok; only the kernel log is blind
    report = _patrol_with("healthy-mixed", _denied_kmsg(monkeypatch, tmp_path))
    assert sum(c.vendor == "nvidia" for c in report.cards) == 8
    assert all(c.health == "ok" for c in report.cards)
    (finding,) = [f for f in report.node_findings if f.check == "kernel_log_unreadable"]
    assert (finding.severity, finding.value) == ("warning", "absent")
    assert finding.message == (
        "cannot read /dev/kmsg: Operation not permitted (kernel.dmesg_restrict=1 and this "
        "process lacks CAP_SYSLOG; the shipped unit grants it with "
        "AmbientCapabilities=CAP_SYSLOG); XIDs and GPUs fallen off the bus are not seen on "
        "this node's 8 NVIDIA GPU(s)"
    )
    assert report.health == "warning" and report.exit_code == 1
    line = json.loads(report.patrol_line)
    assert line["kernel_log"]["state"] == "absent"
    assert "lacks CAP_SYSLOG" in line["kernel_log"]["error"]
    assert [f["check"] for f in line["findings"]] == ["kernel_log_unreadable"]

    text = Exposition(["nvidia", "ascend"]).update(report, 1).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("hetpatrol_kernel_log_up", ())] == 0
    key = ("hetpatrol_node_finding", (("check", "kernel_log_unreadable"), ("severity", "warning")))
    assert samples[key] == 1


def test_a_node_without_dev_kmsg_says_so(tmp_path):
    missing = tmp_path / "kmsg"  # no such device: a container without /dev/kmsg
    report = _patrol_with("xid-79", KernelLog(KmsgReader(str(missing))))
    (finding,) = [f for f in report.node_findings if f.check == "kernel_log_unreadable"]
    assert finding.message == (
        f"cannot read {missing}: No such file or directory; XIDs and GPUs fallen off the "
        "bus are not seen on this node's 8 NVIDIA GPU(s)"
    )


def test_unreadable_kernel_log_on_an_ascend_only_node_is_no_finding(monkeypatch, tmp_path):
    report = _patrol_with("ascend-a3-only", _denied_kmsg(monkeypatch, tmp_path))
    assert report.cards and {c.vendor for c in report.cards} == {"ascend"}
    # (pci_census at info: this replay records no PCI bus)
    assert [f.check for f in report.node_findings if f.check != "pci_census"] == []
    assert json.loads(report.patrol_line)["kernel_log"]["state"] == "absent"


def test_replay_without_recorded_kernel_log_and_switched_off_log_are_no_finding():
    config = replace(load_config(), node="n1")
    patroller = Patroller(config, replay_dir=NODES / "healthy-mixed")  # no kmsg.txt
    try:
        report = patroller.run()
    finally:
        patroller.close()
    assert json.loads(report.patrol_line)["kernel_log"]["state"] == "absent"
    assert report.node_findings == () and report.exit_code == 0
    rules = replace(config.top["kernel_events"], enabled=False)
    off = replace(config, top={**config.top, "kernel_events": rules})
    patroller = Patroller(off, replay_dir=NODES / "xid-79")
    try:
        report = patroller.run()
    finally:
        patroller.close()
    assert json.loads(report.patrol_line)["kernel_log"] == {"state": "disabled"}
    assert not [f for f in report.node_findings if f.check == "kernel_log_unreadable"]
