"""Environment crosstalk: global library paths that mix vendor stacks, in a fake root."""

from __future__ import annotations

from dataclasses import replace

import yaml
from conftest import NODES

from hetpatrol.checks.environment import EnvironmentCheck, EnvironmentSettings, judge, scan
from hetpatrol.config import load_config
from hetpatrol.patrol import Patroller

CUDA = "/usr/local/cuda-12.4/targets/x86_64-linux/lib\n"
CANN = (
    "# CANN driver\n/usr/local/Ascend/driver/lib64/driver\n/usr/local/Ascend/driver/lib64/common\n"
)


def make_root(tmp_path, files: dict[str, str]):
    root = tmp_path / "root"
    for rel, body in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    (root / "etc").mkdir(parents=True, exist_ok=True)
    return root


def findings(root, **kw):
    return {f.check: f for f in judge(scan(root), EnvironmentSettings(**kw))}


def test_clean_root_and_single_vendor_are_fine(tmp_path):
    assert findings(make_root(tmp_path, {})) == {}
    root = make_root(
        tmp_path,
        {
            "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n",
            "etc/ld.so.conf.d/cuda.conf": CUDA,
            "etc/ld.so.conf.d/x86_64-linux-gnu.conf": "/usr/local/lib\n/usr/lib/x86_64-linux-gnu\n",
            "etc/environment": 'PATH="/usr/local/sbin:/usr/bin"\n',
            "etc/profile.d/local.sh": "export LD_LIBRARY_PATH=/opt/site/lib:$LD_LIBRARY_PATH\n",
        },
    )
    assert findings(root) == {}


def test_cuda_and_cann_in_ld_so_conf_d(tmp_path):
    root = make_root(
        tmp_path,
        {"etc/ld.so.conf.d/cuda-12-4.conf": CUDA, "etc/ld.so.conf.d/Ascend.conf": CANN},
    )
    f = findings(root)["library_path_mix"]
    assert f.severity == "warning"
    assert f.value == ["/etc/ld.so.conf.d/Ascend.conf", "/etc/ld.so.conf.d/cuda-12-4.conf"]
    assert "/usr/local/Ascend/driver/lib64/driver" in f.message
    assert "/usr/local/cuda-12.4/targets/x86_64-linux/lib" in f.message
    assert findings(root, severity=None) == {}


def test_global_ld_library_path_with_vendor_libraries(tmp_path):
    root = make_root(
        tmp_path,
        {
            "etc/environment": "LD_LIBRARY_PATH=/usr/local/cuda/lib64\n",
            "etc/profile.d/ascend.sh": "source /usr/local/Ascend/ascend-toolkit/set_env.sh\n",
            "etc/profile.d/other.sh": "# export LD_LIBRARY_PATH=/usr/local/cuda/lib64\n",
        },
    )
    f = findings(root)["global_ld_library_path"]
    assert f.value == ["/etc/environment", "/etc/profile.d/ascend.sh"]
    assert "set_env.sh" in f.message
    assert "library_path_mix" not in findings(root)


def test_patrol_reads_the_replay_root_and_caches(tmp_path):
    node = tmp_path / "node"
    node.mkdir()
    (node / "nvidia-smi-q.xml").write_bytes(
        (NODES / "healthy-mixed" / "nvidia-smi-q.xml").read_bytes()
    )
    (node / "scenario.yaml").write_text(yaml.safe_dump({"node": "env-01"}))
    conf = node / "root" / "etc" / "ld.so.conf.d"
    conf.mkdir(parents=True)
    (conf / "cuda.conf").write_text(CUDA)
    (conf / "ascend.conf").write_text(CANN)
    p = Patroller(replace(load_config(), node="env-01"), replay_dir=node)
    try:
        report = p.run()
        assert report.exit_code == 1
        # (and pci_census at info: this replay records no PCI bus)
        checks = [f.check for f in report.node_findings if f.check != "pci_census"]
        assert checks == ["library_path_mix"]
        data = report.node_checks["environment"]
        assert data["state"] == "ok"
        assert data["ld_paths"]["/etc/ld.so.conf.d/cuda.conf"] == [CUDA.strip()]
        (conf / "ascend.conf").unlink()  # read again only after interval_seconds
        checks = [f.check for f in p.run().node_findings if f.check != "pci_census"]
        assert checks == ["library_path_mix"]
    finally:
        p.close()
    check = EnvironmentCheck(node, clock=lambda: 1e9)
    check._cached = (0.0, str(node / "root"), scan(node / "root"))
    result = check.run([], [], replace(load_config(), node="x"))
    assert result.findings == ()


def test_replay_without_root_and_switched_off(tmp_path):
    check = EnvironmentCheck(NODES / "healthy-mixed")
    assert check.run([], [], load_config()).data == {"state": "absent", "root": None}
    config = load_config()
    cfg = replace(config, top={**config.top, "environment": EnvironmentSettings(enabled=False)})
    assert check.run([], [], cfg) is None


def test_a_fifo_in_the_scanned_root_is_noted_not_waited_on(tmp_path):
    """A FIFO at /etc/environment hung the scan (a blocking open with no writer)."""
    import os

    root = make_root(tmp_path, {"etc/ld.so.conf.d/cuda.conf": CUDA})
    os.mkfifo(root / "etc" / "environment")
    facts = scan(root)
    assert facts.unreadable == {"/etc/environment": "not a regular file"}
    assert facts.ld_paths == {"/etc/ld.so.conf.d/cuda.conf": [CUDA.strip()]}


def test_exported_ld_library_path_in_the_shapes_profile_scripts_use(tmp_path):
    """``export LD_LIBRARY_PATH=...`` as NVIDIA's CUDA Installation Guide for Linux
    ("Environment Setup") writes it and /etc/profile.d/cuda.sh files copy it, inside an
    ``if`` block, on one line with ``then``, or with other names on one ``export``."""
    tail = "${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
    guide = "export LD_LIBRARY_PATH=/usr/local/cuda-12.4/lib64" + tail
    root = make_root(
        tmp_path,
        {
            "etc/profile.d/cuda.sh": "export PATH=/usr/local/cuda/bin${PATH:+:${PATH}}\n"
            + guide
            + "\n",
            "etc/profile.d/cuda-if.sh": 'if [ -d "/usr/local/cuda-10.1/bin/" ]; then\n'
            f"    export LD_LIBRARY_PATH=/usr/local/cuda-10.1/lib64{tail}\nfi\n",
            "etc/profile.d/one-line.sh": "[ -d /usr/local/Ascend ] && export "
            'LD_LIBRARY_PATH="/usr/local/Ascend/driver/lib64:$LD_LIBRARY_PATH"\n',
            "etc/profile.d/many.sh": "export PATH=/opt/x/bin "
            "LD_LIBRARY_PATH=/usr/local/cuda/lib64\n",
            "etc/profile.d/quiet.sh": "export PATH=/opt/x/bin\necho $LD_LIBRARY_PATH\n",
        },
    )
    f = findings(root)["global_ld_library_path"]
    assert f.value == [
        "/etc/profile.d/cuda-if.sh",
        "/etc/profile.d/cuda.sh",
        "/etc/profile.d/many.sh",
        "/etc/profile.d/one-line.sh",
    ]
    from hetpatrol.checks.environment import scan

    facts = scan(root)
    assert facts.ld_library_path["/etc/profile.d/cuda.sh"] == [
        "/usr/local/cuda-12.4/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
    ]
    assert facts.ld_library_path["/etc/profile.d/one-line.sh"] == [
        "/usr/local/Ascend/driver/lib64:$LD_LIBRARY_PATH"
    ]
    assert "/etc/profile.d/quiet.sh" not in facts.ld_library_path
