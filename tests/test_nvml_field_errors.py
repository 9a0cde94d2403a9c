"""NVML on real drivers and bindings: Unknown on a field read, the GPU recovery action,
calls missing from nvidia-ml-py or the driver, and replay values that must stay apart.

Values are read off the recorded dumps by hand: the composed healthy-mixed H100 dump
(GPU 0 ``GPU-e94fa8ce-...``, 29 C, PCIe gen 5, enforced limit 700 W), the Tesla T4 v11
dump (40 C; compute process pid 5762 ``python`` 1005 MiB, Xorg is graphics only), the
Quadro P400 418 dump (33 C; ``clocks_throttle_reasons`` with only ``gpu_idle`` Active) and
the RTX 3080 v13 dump (``<gpu_recovery_action>None</gpu_recovery_action>``).
"""

from __future__ import annotations

import ctypes
import subprocess
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest
import yaml
from conftest import HETPATROL, samples_dir

from hetpatrol.collector import STATE_OK
from hetpatrol.collectors.nvidia import (
    NOT_IN_BINDING,
    RECOVERY_ACTION_SOURCE,
    VH_UNKNOWN_ERROR,
    NvidiaCollector,
)
from hetpatrol.collectors.nvml_replay import ReplayFormatError, load_replay_nvml
from hetpatrol.config import ConfigError, load_config
from hetpatrol.logs import capture_logs
from hetpatrol.patrol import Patroller

REPO = Path(__file__).resolve().parents[1]
HEALTHY_XML = REPO / "fixtures" / "nodes" / "healthy-mixed" / "nvidia-smi-q.xml"
MIB = 1024 * 1024
GPU0_UUID = "GPU-e94fa8ce-6e04-a49e-f637-ba3a7dc7019a"
GPU1_UUID = "GPU-d1cbca50-0692-eeff-2277-001bf1d24e30"


def replay_dir(tmp_path: Path, nvml: dict, xml: Path = HEALTHY_XML) -> Path:
    (tmp_path / "nvidia-smi-q.xml").write_bytes(xml.read_bytes())
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump({"node": "n1", "nvml": nvml}))
    return tmp_path


def patrol(directory: Path, patrols: int = 1, **collector_options):
    cfg = load_config()
    if collector_options:
        cfg = replace(
            cfg,
            collectors=tuple(
                replace(c, options={**c.options, **collector_options}) if c.name == "nvidia" else c
                for c in cfg.collectors
            ),
        )
    p = Patroller(replace(cfg, node="n1"), replay_dir=directory)
    try:
        return [p.run() for _ in range(patrols)]
    finally:
        p.close()


def nvidia(report) -> dict[int, object]:
    return {c.index: c for c in report.cards if c.vendor == "nvidia"}


def checks(card) -> dict[str, str]:
    """Findings above info (the recorded H100s carry an info clock_event_reasons)."""
    return {f.check: f.severity for f in card.findings if f.severity != "info"}


def field_error(card):
    (finding,) = [f for f in card.findings if f.check == "nvml_field_error"]
    return finding


# ---------------------------------------------------------------------------------------
# item 2: one Unknown on a field read is a warning; core calls and persistence are critical


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ("nvmlDeviceGetCurrPcieLinkGeneration", "pcie_link_gen"),
        ("nvmlDeviceGetEnforcedPowerLimit", "power_limit_watts"),
    ],
)
def test_one_unknown_on_a_field_read_is_a_warning_with_the_field_null(tmp_path, call, field):
    directory = replay_dir(tmp_path, {"gpus": {2: {"errors": {call: "Unknown"}}}})
    (report,) = patrol(directory)
    card = nvidia(report)[2]
    assert getattr(card, field) is None
    assert {"source": call, "error": "Unknown"} in card.errors
    assert card.vendor_health is None
    assert card.health == "warning" and checks(card) == {"nvml_field_error": "warning"}
    finding = field_error(card)
    assert call in finding.message and "(1 patrol in a row)" in finding.message
    assert (finding.value, finding.threshold) == (1, 3)
    assert card.temperature_celsius == 30 and card.power_watts == pytest.approx(70.55)
    assert report.health == "warning"


def test_once_exits_1_not_2_for_one_unknown_field(tmp_path):
    directory = replay_dir(
        tmp_path, {"gpus": {5: {"errors": {"nvmlDeviceGetCurrPcieLinkGeneration": "Unknown"}}}}
    )
    run = subprocess.run(
        [*HETPATROL, "once", "--replay", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr


def test_unknown_on_a_core_call_is_critical_at_once(tmp_path):
    directory = replay_dir(
        tmp_path,
        {
            "gpus": {
                0: {"errors": {"nvmlDeviceGetMemoryInfo": "Unknown"}},
                1: {"errors": {"nvmlDeviceGetHandleByIndex": "Unknown"}},
                # nothing says which card this is: it cannot be followed across patrols
                2: {
                    "errors": {
                        "nvmlDeviceGetUUID": "Unknown",
                        "nvmlDeviceGetSerial": "Unknown",
                        "nvmlDeviceGetPciInfo": "Unknown",
                    }
                },
            }
        },
    )
    (report,) = patrol(directory)
    cards = nvidia(report)
    for i in (0, 1, 2):
        assert cards[i].vendor_health == VH_UNKNOWN_ERROR
        assert cards[i].health == "critical" and checks(cards[i]) == {"vendor_health": "critical"}
    assert cards[0].memory_total_bytes is None and cards[0].temperature_celsius == 29
    assert cards[2].uuid is None and cards[2].temperature_celsius == 30
    assert all(cards[i].health == "ok" for i in range(3, 8))


def test_unknown_persisting_field_error_patrols_is_critical(tmp_path):
    directory = replay_dir(
        tmp_path, {"gpus": {3: {"errors": {"nvmlDeviceGetEnforcedPowerLimit": "Unknown"}}}}
    )
    reports = patrol(directory, patrols=4, field_error_patrols=3)
    got = [(nvidia(r)[3].health, field_error(nvidia(r)[3]).value) for r in reports]
    assert got == [("warning", 1), ("warning", 2), ("critical", 3), ("critical", 4)]
    final = field_error(nvidia(reports[2])[3])
    assert final.check == "nvml_field_error" and final.threshold == 3
    assert "3 consecutive patrols" in final.message
    assert "nvmlDeviceGetEnforcedPowerLimit" in final.message
    assert [r.health for r in reports] == ["warning", "warning", "critical", "critical"]
    # the option is read: with 2 the second patrol is already critical
    reports = patrol(directory, patrols=2, field_error_patrols=2)
    assert [nvidia(r)[3].health for r in reports] == ["warning", "critical"]


class _Shuffled:
    """A replay seen through another NVML order (``order[i]`` is the recorded GPU at NVML
    index i, as after a GPU dropped out and the driver re-enumerated), where ``call``
    answers Unknown on the GPU whose UUID is in ``failing``."""

    def __init__(self, inner, call: str):
        self.inner = inner
        self.call = call
        self.order = list(range(8))
        self.failing: set[str] = set()

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.inner.nvmlDeviceGetHandleByIndex(self.order[index])

    def __getattr__(self, name):
        fn = getattr(self.inner, name)
        if name != self.call:
            return fn

        def call(handle, *args):
            if self.inner.nvmlDeviceGetUUID(handle) in self.failing:
                raise pynvml.NVMLError_Unknown()
            return fn(handle, *args)

        return call


def test_the_streak_follows_the_card_identity_not_its_index():
    nvml = _Shuffled(load_replay_nvml(HEALTHY_XML), "nvmlDeviceGetCurrPcieLinkGeneration")
    nvml.failing.add(GPU1_UUID)
    collector = NvidiaCollector({"field_error_patrols": 3}, nvml=nvml)
    for _ in range(2):
        rec = collector.collect().records[1]
        assert rec.uuid == GPU1_UUID and rec.findings[0].severity == "warning"
    collector.close()  # new NVML session: GPUs 0 and 1 swap indices
    nvml.order[0], nvml.order[1] = 1, 0
    records = collector.collect().records
    assert records[0].uuid == GPU1_UUID
    assert [(f.check, f.severity, f.value) for f in records[0].findings] == [
        ("nvml_field_error", "critical", 3)
    ]
    assert records[1].uuid == GPU0_UUID and records[1].findings == []
    # a good read ends the streak
    nvml.failing.clear()
    assert collector.collect().records[0].findings == []
    nvml.failing.add(GPU1_UUID)
    assert collector.collect().records[0].findings[0].value == 1


def test_a_read_done_every_n_patrols_keeps_its_streak_in_between():
    """NVLink is read every nvlink_interval_seconds: patrols that do not ask it neither
    end nor extend its streak, and the finding stays on the card."""
    nvml = _Shuffled(
        load_replay_nvml(HEALTHY_XML, {"nvlink": {"links": 2}}), "nvmlDeviceGetNvLinkState"
    )
    nvml.failing.add(GPU0_UUID)
    collector = NvidiaCollector({"nvlink_interval_seconds": 3600}, nvml=nvml)
    first = collector.collect().records[0]
    second = collector.collect().records[0]
    assert first.findings[0].value == second.findings[0].value == 1
    assert "nvmlDeviceGetNvLinkState (1 patrol in a row)" in second.findings[0].message


@pytest.mark.parametrize("bad", ["0", "-1", "three", "true", "1.5"])
def test_field_error_patrols_is_validated(bad):
    text = f"collectors:\n  nvidia:\n    field_error_patrols: {bad}\n"
    with pytest.raises(ConfigError) as info:
        load_config("x.yaml", text=text)
    assert "collectors.nvidia.field_error_patrols" in str(info.value)
    assert "x.yaml:3" in str(info.value)
    with pytest.raises(ValueError, match="field_error_patrols"):
        NvidiaCollector({"field_error_patrols": yaml.safe_load(bad)})


def test_field_error_patrols_default_is_3():
    cfg = load_config("x.yaml", text="collectors:\n  nvidia:\n    field_error_patrols: 5\n")
    (nv,) = [c for c in cfg.collectors if c.name == "nvidia"]
    assert nv.options["field_error_patrols"] == 5
    assert NvidiaCollector({})._field_error_patrols == 3


# ---------------------------------------------------------------------------------------
# item 5: the GPU recovery action


def test_recovery_action_becomes_a_finding_that_names_the_action(tmp_path):
    actions = {0: "reset", 1: "reboot", 2: "drain_p2p", 3: "drain_and_reset", 4: "none", 5: 9}
    directory = replay_dir(
        tmp_path, {"gpus": {i: {"recovery_action": a} for i, a in actions.items()}}
    )
    (report,) = patrol(directory)
    cards = nvidia(report)
    want = {
        0: ("critical", 1, "GPU reset"),
        1: ("critical", 2, "node reboot"),
        2: ("warning", 3, "drain P2P"),
        3: ("critical", 4, "drain and reset"),
        5: ("warning", 9, "unknown"),
    }
    for i, (severity, value, name) in want.items():
        (finding,) = [f for f in cards[i].findings if f.check == "gpu_recovery_action"]
        assert (finding.severity, finding.value) == (severity, value)
        assert finding.message.startswith(f"NVML recovery action: {name} ({value})")
        assert cards[i].health == severity
        assert cards[i].counters["gpu_recovery_action"] == value
    assert cards[4].counters["gpu_recovery_action"] == 0 and cards[4].health == "ok"
    # the recorded H100 dump has no recovery action: absent, never an error
    for i in (6, 7):
        assert "gpu_recovery_action" not in cards[i].counters
        assert cards[i].errors == [] and cards[i].health == "ok"
    assert "reset it (nvidia-smi -r)" in cards[0].findings[0].message
    assert report.health == "critical"


def test_recovery_action_none_read_from_a_v13_dump():
    nvml = load_replay_nvml(samples_dir("nvidia") / "nvidia-smi-q-x_RTX-3080_v13.xml")
    result = NvidiaCollector({}, nvml=nvml).collect()
    assert result.records[0].counters["gpu_recovery_action"] == 0
    assert not any(e["source"] == RECOVERY_ACTION_SOURCE for e in result.records[0].errors)


def test_recovery_action_not_supported_is_asked_once_per_session():
    nvml = load_replay_nvml(HEALTHY_XML)
    collector = NvidiaCollector({}, nvml=nvml)
    for _ in range(3):
        result = collector.collect()
    assert nvml.calls["nvmlDeviceGetFieldValues"] == 8
    assert all(r.errors == [] for r in result.records)
    # no nvmlDeviceGetFieldValues in the binding (older nvidia-ml-py): absent, no error
    nvml = load_replay_nvml(HEALTHY_XML, {"binding_lacks": ["nvmlDeviceGetFieldValues"]})
    result = NvidiaCollector({}, nvml=nvml).collect()
    assert result.state == STATE_OK and all(r.errors == [] for r in result.records)


class _RealFieldValues:
    """Answers the recovery-action field with pynvml's own ctypes structure, as the real
    binding returns it (``c_nvmlFieldValue_t`` array), with ``ret`` per field."""

    def __init__(self, inner, action: int, ret: int = pynvml.NVML_SUCCESS):
        self.inner, self.action, self.ret = inner, action, ret

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def nvmlDeviceGetFieldValues(self, handle, field_ids):
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, field_id in enumerate(field_ids):
            values[i].fieldId = field_id
            values[i].nvmlReturn = self.ret
            values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            values[i].value.uiVal = ctypes.c_uint(self.action).value
        return values


def test_recovery_action_from_pynvml_ctypes_structures():
    assert pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION == 230
    assert pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET == 1
    nvml = _RealFieldValues(
        load_replay_nvml(HEALTHY_XML), pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    )
    rec = NvidiaCollector({}, nvml=nvml).collect().records[0]
    assert rec.counters["gpu_recovery_action"] == 1
    # a per-field Unknown is a field error like any other (warning, value absent)
    nvml = _RealFieldValues(load_replay_nvml(HEALTHY_XML), 0, pynvml.NVML_ERROR_UNKNOWN)
    rec = NvidiaCollector({}, nvml=nvml).collect().records[0]
    assert "gpu_recovery_action" not in rec.counters
    assert {"source": RECOVERY_ACTION_SOURCE, "error": "Unknown"} in rec.errors
    assert [(f.check, f.severity) for f in rec.findings] == [("nvml_field_error", "warning")]


def test_bad_recovery_action_in_a_scenario_is_refused():
    with pytest.raises(ReplayFormatError, match="recovery action 'reboot now'"):
        load_replay_nvml(HEALTHY_XML, {"gpus": {0: {"recovery_action": "reboot now"}}})


# ---------------------------------------------------------------------------------------
# item 9: functions missing from nvidia-ml-py or from the driver


def test_a_binding_without_the_deprecated_calls_still_reads_every_gpu():
    """nvidia-ml-py 13 marks nvmlDeviceGetTemperature deprecated ("will be removed in
    CUDA 14.0") and the ...ThrottleReasons names are the deprecated spelling."""
    lacks = ["nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksThrottleReasons"]
    nvml = load_replay_nvml(HEALTHY_XML, {"binding_lacks": lacks})
    result = NvidiaCollector({}, nvml=nvml).collect()
    assert result.state == STATE_OK
    assert [r.temperature_celsius for r in result.records] == [29, 29, 30, 30, 31, 32, 32, 31]
    assert {r.counters["clocks_event_reasons"] for r in result.records} == {0x08 | 0x80}
    assert all(r.errors == [] for r in result.records)


def test_an_old_binding_without_the_new_calls_falls_back():
    """nvidia-ml-py before 12.535 has neither nvmlDeviceGetTemperatureV nor
    nvmlDeviceGetCurrentClocksEventReasons: the old calls answer."""
    lacks = ["nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons"]
    nvml = load_replay_nvml(HEALTHY_XML, {"binding_lacks": lacks})
    with capture_logs() as logs:
        collector = NvidiaCollector({}, nvml=nvml)
        result = collector.collect()
        collector.collect()
    assert [r.temperature_celsius for r in result.records] == [29, 29, 30, 30, 31, 32, 32, 31]
    assert {r.counters["clocks_event_reasons"] for r in result.records} == {0x08 | 0x80}
    said = [e["call"] for e in logs if e["event"] == "nvml_fallback"]
    assert said == ["nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons"]


def test_a_call_in_neither_binding_nor_driver_is_an_error_entry_not_a_failed_collector():
    # the P400 dump predates clocks_event_reasons: the driver answers FunctionNotFound
    # for the new call, and this binding has no old one
    xml = samples_dir("nvidia") / "nvidia-smi-q-x_Quadro-P400_418_noDTD.xml"
    lacks = [
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ]
    nvml = load_replay_nvml(xml, {"binding_lacks": lacks})
    result = NvidiaCollector({}, nvml=nvml).collect()
    assert result.state == STATE_OK
    rec = result.records[0]
    assert rec.temperature_celsius is None and "clocks_event_reasons" not in rec.counters
    assert {"source": "nvmlDeviceGetTemperature", "error": NOT_IN_BINDING} in rec.errors
    assert {
        "source": "nvmlDeviceGetCurrentClocksThrottleReasons",
        "error": NOT_IN_BINDING,
    } in rec.errors
    assert rec.memory_total_bytes is not None and rec.uuid is not None
    # with the old binding calls present the same dump reads 33 C and gpu_idle (0x1)
    rec = NvidiaCollector({}, nvml=load_replay_nvml(xml)).collect().records[0]
    assert rec.temperature_celsius == 33 and rec.counters["clocks_event_reasons"] == 0x1


def test_driver_without_the_versioned_temperature_call_falls_back():
    nvml = load_replay_nvml(HEALTHY_XML, {"driver_lacks": ["nvmlDeviceGetTemperatureV"]})
    collector = NvidiaCollector({}, nvml=nvml)
    collector.collect()
    result = collector.collect()
    assert [r.temperature_celsius for r in result.records] == [29, 29, 30, 30, 31, 32, 32, 31]
    assert nvml.calls["nvmlDeviceGetTemperatureV"] == 1  # learnt once per NVML session
    assert all(r.errors == [] for r in result.records)


def test_processes_on_a_driver_before_r510_fall_back_to_v2_and_say_so():
    """nvidia-ml-py's nvmlDeviceGetComputeRunningProcesses calls the _v3 symbol and raises
    NVMLLibraryMismatchError (not an NVMLError) where the driver lacks it."""
    xml = samples_dir("nvidia") / "nvidia-smi-q-x_Tesla-T4_v11.xml"
    faults = {"driver_lacks": ["nvmlDeviceGetComputeRunningProcesses_v3"]}
    nvml = load_replay_nvml(xml, faults)
    with capture_logs() as logs:
        collector = NvidiaCollector({}, nvml=nvml)
        rec = collector.collect().records[0]
        collector.collect()
    assert [(p.pid, p.name, p.memory_bytes) for p in rec.processes] == [
        (5762, "python", 1005 * MIB)
    ]
    assert not any("Processes" in e["source"] for e in rec.errors)
    (said,) = [
        e
        for e in logs
        if e["event"] == "nvml_fallback" and e["call"] == "nvmlDeviceGetComputeRunningProcesses"
    ]  # once per NVML session, not per patrol
    assert said["used"] == "nvmlDeviceGetComputeRunningProcesses_v2"
    assert "NVMLLibraryMismatchError" in said["reason"]
    # neither call: no processes, and the record says why (never an empty list alone)
    faults["driver_lacks"].append("nvmlDeviceGetComputeRunningProcesses_v2")
    rec = NvidiaCollector({}, nvml=load_replay_nvml(xml, faults)).collect().records[0]
    assert rec.processes == []
    (err,) = [e for e in rec.errors if e["source"] == "nvmlDeviceGetComputeRunningProcesses"]
    assert "NVMLLibraryMismatchError" in err["error"] and "FunctionNotFound" in err["error"]


# ---------------------------------------------------------------------------------------
# item 10: the replay keeps values apart that NVML keeps apart


def test_replay_power_limits_are_distinct_and_the_collector_reads_the_enforced_one():
    # v12+ layout: current_power_limit is the enforced limit, requested_power_limit the
    # software limit (nvidia-smi --help-query-gpu: gpu.power.current_limit /
    # gpu.power.requested_limit)
    overrides = {
        "gpu_power_readings/current_power_limit": "350.00 W",
        "gpu_power_readings/requested_power_limit": "700.00 W",
    }
    nvml = load_replay_nvml(HEALTHY_XML, {"gpus": {0: {"xml_overrides": overrides}}})
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 350_000
    assert nvml.nvmlDeviceGetPowerManagementLimit(handle) == 700_000
    nvml.nvmlShutdown()
    rec = NvidiaCollector({}, nvml=nvml).collect().records[0]
    assert rec.power_limit_watts == 350.0
    # the composed H100 dump records only the current (enforced) limit
    nvml = load_replay_nvml(HEALTHY_XML)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700_000
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerManagementLimit(handle)


def test_replay_old_layout_power_limits_are_distinct():
    xml = samples_dir("nvidia") / "nvidia-smi-q-x_Tesla-T4_v11.xml"
    overrides = {"power_readings/power_limit": "60.00 W"}
    nvml = load_replay_nvml(xml, {"gpus": {0: {"xml_overrides": overrides}}})
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetPowerManagementLimit(handle) == 60_000
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 70_000  # as recorded


def test_replay_ecc_pending_is_its_own_value_and_the_collector_reads_current():
    pending_off = {"ecc_mode/pending_ecc": "Disabled"}
    current_off = {"ecc_mode/current_ecc": "Disabled"}
    no_pending = {"ecc_mode/pending_ecc": None}
    nvml = load_replay_nvml(
        HEALTHY_XML,
        {
            "gpus": {
                0: {"xml_overrides": pending_off},
                1: {"xml_overrides": current_off},
                2: {"xml_overrides": no_pending},
            }
        },
    )
    nvml.nvmlInit()
    h = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(3)]
    assert nvml.nvmlDeviceGetEccMode(h[0]) == [1, 0]
    assert nvml.nvmlDeviceGetEccMode(h[1]) == [0, 1]
    with pytest.raises(pynvml.NVMLError_NotSupported):  # never copied from current
        nvml.nvmlDeviceGetEccMode(h[2])
    nvml.nvmlShutdown()
    records = NvidiaCollector({}, nvml=nvml).collect().records
    # ECC is on until the reboot that applies the pending mode: counters are read
    assert (records[0].ecc_corrected_total, records[0].ecc_uncorrected_total) == (0, 0)
    assert records[1].ecc_corrected_total is None
    assert {"source": "nvmlDeviceGetEccMode", "error": "EccDisabled"} in records[1].errors


class _Binding:
    """Any NVML module seen through a binding that lacks ``hidden`` (plain attribute
    lookup, as a newer nvidia-ml-py without the deprecated names), where the unversioned
    processes call raises NVMLLibraryMismatchError like pynvml on a driver before R510
    and ``nvmlDeviceGetComputeRunningProcesses_v2`` answers."""

    def __init__(self, inner, hidden: set[str], mismatch: bool = False):
        self.inner, self.hidden, self.mismatch = inner, hidden, mismatch

    def __getattr__(self, name):
        if name in self.hidden:
            raise AttributeError(name)
        return getattr(self.inner, name)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if self.mismatch:
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called")
        return self.inner.nvmlDeviceGetComputeRunningProcesses(handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle):
        return self.inner.nvmlDeviceGetComputeRunningProcesses(handle)


def test_any_nvml_module_without_the_deprecated_names_is_read_whole():
    hidden = {"nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksThrottleReasons"}
    nvml = _Binding(load_replay_nvml(HEALTHY_XML), hidden)
    result = NvidiaCollector({}, nvml=nvml).collect()  # raised AttributeError before
    assert result.state == STATE_OK
    assert [r.temperature_celsius for r in result.records] == [29, 29, 30, 30, 31, 32, 32, 31]
    assert all(r.errors == [] for r in result.records)


def test_library_mismatch_on_processes_falls_back_to_v2():
    xml = samples_dir("nvidia") / "nvidia-smi-q-x_Tesla-T4_v11.xml"
    nvml = _Binding(load_replay_nvml(xml), set(), mismatch=True)
    rec = NvidiaCollector({}, nvml=nvml, process_namer=lambda pid: None).collect().records[0]
    assert [(p.pid, p.memory_bytes) for p in rec.processes] == [(5762, 1005 * MIB)]
    assert not any("Processes" in e["source"] for e in rec.errors)


def test_recovery_action_fixture_through_the_cli():
    """fixtures/nodes/nvml-recovery-action: GPU 4 needs a reset, GPU 2 answers Unknown
    for its PCIe link generation; nothing in a kernel log."""
    import json

    run = subprocess.run(
        [*HETPATROL, "once", "--replay", str(REPO / "fixtures/nodes/nvml-recovery-action")]
        + ["--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    cards = {c["index"]: c for c in json.loads(run.stdout)["cards"] if c["vendor"] == "nvidia"}
    found = {
        i: {f["check"]: f["severity"] for f in c["findings"] if f["severity"] != "info"}
        for i, c in cards.items()
    }
    assert found[4] == {"gpu_recovery_action": "critical"}
    assert cards[4]["counters"]["gpu_recovery_action"] == 1
    assert cards[4]["bus_id"] == "0000:9b:00.0"
    assert found[2] == {"nvml_field_error": "warning"} and cards[2]["pcie_link_gen"] is None
    assert all(found[i] == {} for i in (0, 1, 3, 5, 6, 7))


def test_a_fallback_that_works_is_info_one_that_fails_a_warning():
    """``once --replay fixtures/nodes/mig-a100`` printed two ``[warning] nvml_fallback``
    for a fallback that worked: the A100's driver lacks nvmlDeviceGetGpuFabricInfoV (v3
    and v2 structs), the deprecated nvmlDeviceGetGpuFabricInfo answers. The fallback was
    said as a warning when the new call failed, before the older one was tried. Now it
    is said once the older call's outcome is known: info when it is there (nothing lost;
    in the daemon's log and at --log-level info), a warning when it is missing too."""
    mig = REPO / "fixtures" / "nodes" / "mig-a100" / "nvidia-smi-q.xml"
    with capture_logs() as logs:
        NvidiaCollector({}, nvml=load_replay_nvml(mig, {})).collect()
    said = [(e["call"], e["level"]) for e in logs if e["event"] == "nvml_fallback"]
    assert said == [
        ("nvmlDeviceGetGpuFabricInfoV v3", "info"),
        ("nvmlDeviceGetGpuFabricInfoV v2", "info"),
    ]
    # the binding lacks the new temperature call: the old one answers, info; it lacks
    # the new clocks call and the old one too: nothing read, a warning
    lacks = [
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ]
    with capture_logs() as logs:
        NvidiaCollector({}, nvml=load_replay_nvml(HEALTHY_XML, {"binding_lacks": lacks})).collect()
    said = {e["call"]: (e["level"], e["worked"]) for e in logs if e["event"] == "nvml_fallback"}
    assert said["nvmlDeviceGetTemperatureV"] == ("info", True)
    assert said["nvmlDeviceGetCurrentClocksEventReasons"] == ("warning", False)
    # a driver with no fabric call at all: the chain's end is a warning
    no_fabric = ["nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"]
    with capture_logs() as logs:
        NvidiaCollector({}, nvml=load_replay_nvml(mig, {"binding_lacks": no_fabric})).collect()
    said = [(e["used"], e["level"]) for e in logs if e["event"] == "nvml_fallback"]
    assert said[-1] == ("none", "warning"), said
