"""The fabric check (hetpatrol.checks.fabric) on replays of recorded fabric states.

Values read off the recordings (fixtures/vendor-outputs/nvidia, sources in its
SOURCES.md; ../shared/vendor-samples/nvidia):

- NVIDIA/gpu-operator #2511 (driver 580.159.04, one GPU of a node whose CUDA validator
  failed): State "In Progress", Status, CliqueId, ClusterUUID and every Health line N/A;
- Azure/azhpc-images PR #506: State "Completed", Status "Insufficient Resources",
  CliqueId 0, ClusterUUID 00000000-0000-0000-0000-000000000000;
- kubernetes-sigs/dra-driver-nvidia-gpu #626: State "Completed", Status "Success",
  CliqueId 2, ClusterUUID dc6e40c4-d722-4357-9ba6-5291dd461278, Health Summary
  "Unhealthy", Bandwidth "Full";
- leptonai/gpud PR #1108 (GB200, NVML as gpud prints it): State "Not Supported", Status
  "Success", Clique ID 0, Health Summary and Bandwidth "Not Supported";
- ../shared nvidia-smi-q_H100-80GB-HBM3_590.48.01_idle.txt: Completed, Success, CliqueId
  0, ClusterUUID all zeros, Health Summary N/A; nvidia-smi-q_L40S_595.80_idle.txt and
  nvidia-smi-q-x_RTX-A5000x2_v13.xml: State N/A (PCIe boards).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import jsonschema
import yaml
from conftest import NODES, samples_dir
from prometheus_client.parser import text_string_to_metric_families

from hetpatrol.checks.fabric import FabricSettings, FabricWatch, evaluate
from hetpatrol.checks.facts import BootFacts, CardFacts
from hetpatrol.collectors.nvidia import NvidiaCollector
from hetpatrol.collectors.nvml_replay import load_replay_nvml
from hetpatrol.config import load_config
from hetpatrol.exporters.prometheus import Exposition
from hetpatrol.judge import judge
from hetpatrol.patrol import Patroller
from hetpatrol.schema import CardRecord, jsonl_json_schema

HEALTHY_XML = NODES / "healthy-mixed" / "nvidia-smi-q.xml"
PROC = NODES / "reboot-links-late" / "boots" / "1" / "proc"

# the recordings' Fabric blocks, as <fabric> elements of nvidia-smi -q -x
IN_PROGRESS = {  # gpu-operator #2511
    "fabric/state": "In Progress",
    "fabric/status": "N/A",
    "fabric/cliqueId": "N/A",
    "fabric/clusterUuid": "N/A",
    "fabric/health/summary": "N/A",
    "fabric/health/bandwidth": "N/A",
}
INSUFFICIENT = {  # azhpc-images #506
    "fabric/state": "Completed",
    "fabric/status": "Insufficient Resources",
    "fabric/cliqueId": "0",
    "fabric/clusterUuid": "00000000-0000-0000-0000-000000000000",
}
UNHEALTHY = {  # dra-driver-nvidia-gpu #626
    "fabric/state": "Completed",
    "fabric/status": "Success",
    "fabric/cliqueId": "2",
    "fabric/clusterUuid": "dc6e40c4-d722-4357-9ba6-5291dd461278",
    "fabric/health/summary": "Unhealthy",
    "fabric/health/bandwidth": "Full",
}
H100_590 = {  # ../shared nvidia-smi-q_H100-80GB-HBM3_590.48.01_idle.txt
    "fabric/state": "Completed",
    "fabric/status": "Success",
    "fabric/cliqueId": "0",
    "fabric/clusterUuid": "00000000-0000-0000-0000-000000000000",
    "fabric/health/summary": "N/A",
    "fabric/health/bandwidth": "N/A",
}
GB200_NOT_SUPPORTED = {  # gpud #1108
    "fabric/state": "Not Supported",
    "fabric/status": "Success",
    "fabric/cliqueId": "0",
    "fabric/health/summary": "Not Supported",
    "fabric/health/bandwidth": "Not Supported",
}
PCIE_NA = {"fabric/state": "N/A", "fabric/status": "N/A"}  # L40S 595.80


def gpu0(overrides: dict) -> CardRecord:
    """GPU 0 of healthy-mixed (an H100 80GB HBM3) with the recorded <fabric>, read as
    the collector reads a real GPU."""
    nvml = load_replay_nvml(HEALTHY_XML, {"gpus": {0: {"xml_overrides": overrides}}})
    collector = NvidiaCollector({}, nvml=nvml)
    try:
        return collector.collect().records[0]
    finally:
        collector.close()


def checks(rec: CardRecord) -> dict[str, str]:
    return {f.check: f.severity for f in rec.findings if f.check.startswith("fabric")}


def _recorded(name: str, **lines: str) -> None:
    """The shared recording ``name`` has these Fabric lines (key: value)."""
    text = (samples_dir("nvidia") / name).read_text(encoding="utf-8")
    block = text[text.index("    Fabric\n") :]
    for key, value in lines.items():
        assert re.search(rf"^\s+{key}\s+: {re.escape(value)}$", block, re.M), (name, key)


def test_not_supported_and_na_never_get_a_finding():
    _recorded(
        "nvidia-smi-q_H100-80GB-HBM3_590.48.01_idle.txt",
        State="Completed",
        Status="Success",
        CliqueId="0",
        ClusterUUID="00000000-0000-0000-0000-000000000000",
        Summary="N/A",
        Bandwidth="N/A",
    )
    _recorded("nvidia-smi-q_L40S_595.80_idle.txt", State="N/A", Status="N/A")
    for overrides in (GB200_NOT_SUPPORTED, PCIE_NA, H100_590):
        rec = judge(gpu0(overrides), load_config())
        assert checks(rec) == {}, overrides
    assert gpu0(GB200_NOT_SUPPORTED).fabric["state"] == "Not Supported"
    assert gpu0(PCIE_NA).fabric is None  # N/A: NotSupported, nothing read
    # a whole recorded v13 dump of PCIe boards: no fabric, no error entry, no finding
    xml = samples_dir("nvidia") / "nvidia-smi-q-x_RTX-A5000x2_v13.xml"
    collector = NvidiaCollector({}, nvml=load_replay_nvml(xml))
    try:
        records = collector.collect().records
    finally:
        collector.close()
    assert [r.fabric for r in records] == [None, None]
    assert not any("Fabric" in e["source"] for r in records for e in r.errors)
    assert all(checks(judge(r, load_config())) == {} for r in records)


def test_one_patrol_is_at_most_a_warning():
    config = load_config()
    rec = judge(gpu0(IN_PROGRESS), config)
    assert checks(rec) == {"fabric_not_ready": "warning"}
    (f,) = [f for f in rec.findings if f.check == "fabric_not_ready"]
    assert f.value == "In Progress" and "cudaErrorSystemNotReady" in f.message
    rec = judge(gpu0(INSUFFICIENT), config)
    assert checks(rec) == {"fabric_error": "warning"}
    (f,) = [f for f in rec.findings if f.check == "fabric_error"]
    assert f.value == "InsufficientResources"
    assert "00000000-0000-0000-0000-000000000000" in f.message


def test_health_summary_unhealthy_is_a_warning_that_stays_one():
    config = load_config()
    watch = FabricWatch()
    for _ in range(5):
        rec = judge(gpu0(UNHEALTHY), config)
        watch.observe([rec], config, lambda r: 0)
    assert checks(rec) == {"fabric_health": "warning"}
    (f,) = [f for f in rec.findings if f.check == "fabric_health"]
    assert f.value == "Unhealthy" and "bandwidth Full" in f.message


def fabric_finding(rec: CardRecord):
    (f,) = [f for f in rec.findings if f.check.startswith("fabric")]
    return f


def _lasting(rec: CardRecord, boot_patrols: int, watch: FabricWatch, config) -> CardRecord:
    rec = judge(rec, config)
    watch.observe([rec], config, lambda r: boot_patrols)
    return rec


def test_critical_only_after_the_grace_and_n_patrols_by_identity():
    config = load_config()  # h100-h200: patrols 3, post_boot_grace_patrols 6 (bundled)
    settings = config.profile_for("nvidia", "h100", "NVIDIA H100 80GB HBM3").checks["fabric"]
    assert (settings.patrols, settings.post_boot_grace_patrols) == (3, 6)
    watch = FabricWatch()
    # patrols 1..6 of a boot: the grace, warning whatever the streak
    for n in range(1, 7):
        rec = _lasting(gpu0(IN_PROGRESS), n, watch, config)
        assert checks(rec) == {"fabric_not_ready": "warning"}
        assert f"post-boot grace {n} of 6" in fabric_finding(rec).message
    rec = _lasting(gpu0(IN_PROGRESS), 7, watch, config)
    assert checks(rec) == {"fabric_not_ready": "critical"} and rec.health == "critical"
    assert "for 7 patrols in a row" in fabric_finding(rec).message
    # Completed again: the streak ends; a new error starts at 1 (no grace: patrols 0)
    rec = _lasting(gpu0(H100_590), 8, watch, config)
    assert checks(rec) == {}
    for n in (1, 2):
        rec = _lasting(gpu0(INSUFFICIENT), 0, watch, config)
        assert checks(rec) == {"fabric_error": "warning"}
        assert f"{n} of 3 patrols in a row" in fabric_finding(rec).message
    rec = _lasting(gpu0(INSUFFICIENT), 0, watch, config)
    assert checks(rec) == {"fabric_error": "critical"}


def gpu0_fabric_fails(error: str = "Unknown") -> CardRecord:
    """GPU 0 of healthy-mixed whose fabric info call raises NVML ``error`` (every other
    call answers)."""
    faults = {"gpus": {0: {"errors": {"nvmlDeviceGetGpuFabricInfoV": error}}}}
    collector = NvidiaCollector({}, nvml=load_replay_nvml(HEALTHY_XML, faults))
    try:
        return collector.collect().records[0]
    finally:
        collector.close()


def test_a_fabric_flapping_between_two_failures_is_one_streak():
    """In Progress, then Completed with InsufficientResources, then In Progress again:
    in none of these patrols had the GPU a working fabric. Counted apart, each reset the
    other and the GPU was a warning for ever; one streak makes it critical on the 3rd."""
    config = load_config()  # h100-h200: patrols 3
    watch = FabricWatch()
    for n, overrides in enumerate((IN_PROGRESS, INSUFFICIENT), start=1):
        rec = _lasting(gpu0(overrides), 0, watch, config)
        assert checks(rec) in ({"fabric_not_ready": "warning"}, {"fabric_error": "warning"})
        assert f"{n} of 3 patrols in a row" in fabric_finding(rec).message
    rec = _lasting(gpu0(IN_PROGRESS), 0, watch, config)
    assert checks(rec) == {"fabric_not_ready": "critical"} and rec.health == "critical"
    assert "for 3 patrols in a row" in fabric_finding(rec).message
    rec = _lasting(gpu0(H100_590), 0, watch, config)  # registered: the streak ends
    assert checks(rec) == {}
    rec = _lasting(gpu0(INSUFFICIENT), 0, watch, config)
    assert "1 of 3 patrols in a row" in fabric_finding(rec).message


def test_a_fabric_call_that_fails_keeps_the_streak():
    """A GPU whose fabric info call raises (NVML Unknown) every other patrol has no
    reading then, which is no registration: its count is kept, so In Progress / no
    answer / In Progress / no answer / In Progress is critical on the third In Progress
    (it was reset by every failed call, a warning for ever)."""
    config = load_config()
    failed = gpu0_fabric_fails()
    assert failed.read_ok and failed.fabric is None
    assert {"source": "nvmlDeviceGetGpuFabricInfoV", "error": "Unknown"} in failed.errors
    watch = FabricWatch()
    for n in (1, 2):
        rec = _lasting(gpu0(IN_PROGRESS), 0, watch, config)
        assert f"{n} of 3 patrols in a row" in fabric_finding(rec).message
        assert checks(_lasting(gpu0_fabric_fails(), 0, watch, config)) == {}
    rec = _lasting(gpu0(IN_PROGRESS), 0, watch, config)
    assert checks(rec) == {"fabric_not_ready": "critical"}
    # a card that answers Not Supported has no fabric: nothing is kept for it
    rec = _lasting(gpu0(GB200_NOT_SUPPORTED), 0, watch, config)
    assert checks(rec) == {} and watch.seen == {}


def test_streaks_follow_the_card_not_its_position():
    settings = FabricSettings(patrols=2, post_boot_grace_patrols=0)
    config = load_config()
    watch = FabricWatch()
    base = gpu0(IN_PROGRESS)

    def card(index, uuid):
        rec = replace(base, index=index, uuid=uuid, findings=[], errors=[])
        rec.findings = evaluate(rec, settings, CardFacts(boot=BootFacts()))
        return rec

    class Profiles:
        def profile_for(self, *a):
            return replace(config.profile_for("nvidia", "h100", None), checks={"fabric": settings})

    a, b = card(0, "GPU-a"), card(1, "GPU-b")
    b.findings = []  # patrol 1: only A is not registered
    watch.observe([a, b], Profiles(), lambda r: 0)
    # patrol 2 lists them the other way round (an index moved) and B is not registered
    # now either: A goes on at 2 (critical), B starts at 1, whatever their positions
    b2, a2 = card(0, "GPU-b"), card(1, "GPU-a")
    watch.observe([b2, a2], Profiles(), lambda r: 0)
    assert checks(a2) == {"fabric_not_ready": "critical"}
    assert checks(b2) == {"fabric_not_ready": "warning"}
    a3 = card(1, "GPU-a")
    a3.findings = []  # A registered: its streak ends
    watch.observe([a3], Profiles(), lambda r: 0)
    a4 = card(1, "GPU-a")
    watch.observe([a4], Profiles(), lambda r: 0)
    assert checks(a4) == {"fabric_not_ready": "warning"}


def test_a_profile_switches_it_off(tmp_path):
    site = tmp_path / "hetpatrol.yaml"
    site.write_text(
        "profiles:\n  - name: h100-h200\n    fabric: {not_ready: null, error: warning}\n"
    )
    config = load_config(site)
    assert checks(judge(gpu0(IN_PROGRESS), config)) == {}
    watch = FabricWatch()
    for _ in range(4):
        rec = _lasting(gpu0(INSUFFICIENT), 0, watch, config)
    assert checks(rec) == {"fabric_error": "warning"}


def test_daemon_patrols_of_a_boot_drain_only_after_the_grace(tmp_path):
    """Real patrols of one boot (the replayed /proc boot id): GPU 0 stuck In Progress
    is watched through a 2-patrol grace and critical (reboot_node) at patrol 3; the
    exposition carries its fabric state; the other GPUs (no fabric read) have none."""
    node = tmp_path / "node"
    node.mkdir()
    shutil.copy(HEALTHY_XML, node / "nvidia-smi-q.xml")
    shutil.copytree(PROC, node / "proc")
    faults = {"gpus": {0: {"xml_overrides": IN_PROGRESS}}}
    (node / "scenario.yaml").write_text(yaml.safe_dump({"node": "f1", "nvml": faults}))
    site = tmp_path / "hetpatrol.yaml"
    site.write_text(
        "node: f1\nlisten: null\nkernel_log: {enabled: false}\n"
        "environment: {enabled: false}\n"
        "profiles:\n  - name: h100-h200\n    post_boot_grace_patrols: 2\n"
    )
    config = replace(load_config(site), jsonl_path=None, state_path=None)
    p = Patroller(config, replay_dir=node)
    p.post_boot_grace = True  # as the daemon's
    try:
        reports = [p.run() for _ in range(3)]
    finally:
        p.close()
    seen = []
    for report in reports:
        (gpu,) = [c for c in report.cards if c.vendor == "nvidia" and c.index == 0]
        seen.append((checks(gpu), gpu.action))
    assert seen == [
        ({"fabric_not_ready": "warning"}, "watch"),
        ({"fabric_not_ready": "warning"}, "watch"),
        ({"fabric_not_ready": "critical"}, "reboot_node"),
    ]
    assert reports[2].exit_code == 2
    others = [c for c in reports[2].cards if c.vendor == "nvidia" and c.index != 0]
    assert len(others) == 7 and all(checks(c) == {} for c in others)
    (line,) = [
        json.loads(x)
        for x in reports[2].jsonl_lines()
        if '"kind": "card"' in x or '"kind":"card"' in x
        if json.loads(x)["vendor"] == "nvidia" and json.loads(x)["index"] == 0
    ]
    assert line["fabric"] == {
        "state": "In Progress",
        "status": None,
        "clique_id": None,
        "cluster_uuid": None,
        "health_summary": None,
        "bandwidth": None,
    }
    schema = jsonl_json_schema()
    for x in reports[2].jsonl_lines():
        jsonschema.validate(json.loads(x), schema)
    body = Exposition().update(reports[2])
    states = {}
    for fam in text_string_to_metric_families(body.decode()):
        if fam.name == "hetpatrol_card_fabric_state":
            for s in fam.samples:
                states[(s.labels["index"], s.labels["hetpatrol_card_fabric_state"])] = s.value
    assert states == {
        ("0", "not_started"): 0.0,
        ("0", "in_progress"): 1.0,
        ("0", "completed"): 0.0,
    }


def test_nvml_struct_values_each_on_its_own():
    """The struct as the real binding fills it: a status NVML names (999, "Unknown
    Error" in nvidia-smi, as aws/eks-node-monitoring-agent #141 reports on P5) is its
    error name; a state NVML does not define nulls the state alone, with the reason."""
    import pynvml

    from hetpatrol.collectors.nvidia import fabric_from_info

    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    info.state, info.status, info.cliqueId = 3, pynvml.NVML_ERROR_UNKNOWN, 7
    info.healthSummary = 3  # NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
    info.healthMask = 1  # DEGRADED_BW_TRUE at shift 0
    got = fabric_from_info(info, "v3")
    assert got["status"] == "Unknown" and got["clique_id"] == 7
    assert (got["health_summary"], got["bandwidth"]) == ("Limited Capacity", "Degraded")
    rec = CardRecord(vendor="nvidia", index=0, fabric=got)
    assert checks(judge(rec, load_config())) == {
        "fabric_error": "warning",
        "fabric_health": "warning",
    }

    class Reader:
        def __init__(self):
            self.errors = []

        def error(self, source, error):
            self.errors.append((source, error))

    info.state = 9
    reader = Reader()
    got = fabric_from_info(info, "v2", reader)
    assert got["state"] is None and got["status"] is None and got["bandwidth"] == "Degraded"
    assert reader.errors == [
        ("nvmlDeviceGetGpuFabricInfoV", "fabric state 9 is not one NVML defines")
    ]
    assert checks(judge(CardRecord(vendor="nvidia", index=0, fabric=got), load_config())) == {}
