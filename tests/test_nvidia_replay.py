"""NVIDIA collector against the NVML replay: every recorded ``nvidia-smi -q -x`` dump,
the injected faults, and the two composed whole-node fixtures.

The expected values below were read off the XML files (and, for the fixtures, off the
``nvidia-smi -q`` text dumps they were composed from) by hand, never copied from the
collector's output. Memory "used" is the dump's ``used + reserved`` (NVML v2 ``used``
excludes ``reserved``; hetpatrol counts both, DESIGN section 4); dumps without a
``reserved`` element come from drivers before the v2 call and give ``used`` as is.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pynvml
import pytest

from hetpatrol.collector import STATE_ABSENT, STATE_FAILED, STATE_OK, CollectorError
from hetpatrol.collectors.nvidia import (
    VH_GPU_IS_LOST,
    VH_RESET_REQUIRED,
    VH_UNKNOWN_ERROR,
    NvidiaCollector,
    card_type_from_name,
    memory_kind_for,
)
from hetpatrol.collectors.nvml_replay import (
    ReplayFormatError,
    ReplayNvml,
    load_replay_nvml,
    parse_replay_nvml,
)
from hetpatrol.replay import load_scenario

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO.parent / "shared" / "vendor-samples" / "nvidia"
NODES = REPO / "fixtures" / "nodes"
HEALTHY_XML = NODES / "healthy-mixed" / "nvidia-smi-q.xml"
SICK_XML = NODES / "sick-mixed" / "nvidia-smi-q.xml"
MIB = 1024 * 1024


def samples() -> Path:
    """The recorded NVIDIA samples, read in place; skip when absent, fail under CI."""
    if not SAMPLES.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{SAMPLES} is missing: CI must have ../shared beside the clone")
        pytest.skip(f"{SAMPLES} not found (run from a checkout with ../shared beside it)")
    return SAMPLES


def collect(xml: Path, faults: dict | None = None):
    nvml = load_replay_nvml(xml, faults)
    collector = NvidiaCollector({}, nvml=nvml)
    return collector, nvml, collector.collect()


def sources(record) -> set[str]:
    return {e["source"] for e in record.errors}


# ---------------------------------------------------------------------------------------
# every recorded dump


@dataclass
class Gpu:
    model: str
    uuid: str
    bus_id: str
    temp: float | None
    power: float | None
    limit: float | None
    used_mib: int  # used + reserved as the dump says
    total_mib: int
    util: float | None
    card_type: str
    procs: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, MiB)
    ecc: tuple[int, int] | None = None  # volatile (corrected, uncorrected)


WIN_2080_PIDS = [
    7724, 10808, 11556, 12452, 12636, 13120, 14296, 16508, 16592, 20920, 21004, 21036,
    21048, 21104, 21292, 21472, 21852, 22600, 23652, 25436, 25520, 25696, 26972, 27148,
    27628, 30212,
]  # fmt: skip
GRID_P4_PIDS = [1188, 2124, 3696, 3972, 7208, 7284, 7880, 8788, 9468, 9804, 11528, 12804, 15104]

# file -> (driver version, GPUs in document order). Only compute processes (type C, C+G)
# are expected: nvmlDeviceGetComputeRunningProcesses does not list graphics-only ones.
DUMPS: dict[str, tuple[str | None, list[Gpu]]] = {
    "nvidia-smi-q-x_A100-SXM4-40GB_mig_v11.xml": ("510.47.03", [
        Gpu("NVIDIA A100-SXM4-40GB", "GPU-992a7556-e7f4-d315-ba5f-92431e39fab4",
            "0000:00:04.0", 36, 66.92, 400.0, 38 + 605, 40960, None, "a100"),
    ]),  # MIG: utilization and volatile ECC N/A
    "nvidia-smi-q-x_A100-SXM4-80GB_mig_v12.xml": ("535.54.03", [
        Gpu("NVIDIA A100-SXM4-80GB", "GPU-6d7d91bc-5ce6-2a72-9e16-f033356b54e1",
            "0000:01:00.0", 27, 67.03, 500.0, 50 + 869, 81920, None, "a100", ecc=(0, 0)),
    ]),
    "nvidia-smi-q-x_A10G_v11.xml": ("515.105.01", [
        Gpu("NVIDIA A10G", "GPU-7cd49254-63b9-dbfb-b31c-f029e1fbb8ad", "0000:00:1e.0",
            17, 25.58, 300.0, 22 + 435, 23028, 0.0, "a10g", ecc=(0, 0)),
    ]),  # only Xorg (type G) runs
    "nvidia-smi-q-x_GT-1030.xml": ("470.74", [
        Gpu("NVIDIA GeForce GT 1030", "GPU-6c6d608f-ecdf-a092-2b3d-8ec823f5bda0",
            "0000:2d:00.0", 36, None, 30.0, 875, 1998, 0.0, "gt1030"),
    ]),  # power_draw N/A; no <reserved>; 10 graphics processes, none compute
    "nvidia-smi-q-x_GTX-1660-Ti_418_noDTD.xml": ("418.43", [
        Gpu("Graphics Device", "GPU-edf8f22e-f8c5-8d0f-5c71-c45e5b7adf73", "0000:43:00.0",
            40, 8.93, 130.0, 0, 5912, 0.0, "nvidia"),
    ]),
    "nvidia-smi-q-x_Quadro-P2000_v12.xml": ("525.125.06", [
        Gpu("Quadro P2000", "GPU-44270217-e23d-922b-eac1-c2d35ee5adce", "0000:17:00.0",
            34, 4.61, 75.0, 1 + 66, 5120, 0.0, "quadrop2000"),
    ]),
    "nvidia-smi-q-x_Quadro-P400_418_noDTD.xml": ("418.43", [
        Gpu("Quadro P400", "GPU-f03b517c-e822-adf0-23c3-4e688cce1b00", "0000:43:00.0",
            33, None, None, 0, 1998, 0.0, "quadrop400"),
    ]),
    "nvidia-smi-q-x_RTX-2080_windows_v11.xml": ("516.59", [
        Gpu("NVIDIA GeForce RTX 2080", "GPU-5ac5c37e-c252-6d3f-5efc-11b96c00d832",
            "0000:0a:00.0", 29, 14.5, 275.0, 862 + 182, 8192, 0.02, "rtx2080",
            procs=[(pid, None) for pid in WIN_2080_PIDS]),
    ]),  # WDDM: per-process memory N/A
    "nvidia-smi-q-x_RTX-3060-Laptop_v11.xml": ("515.65.01", [
        Gpu("NVIDIA GeForce RTX 3060 Laptop GPU", "GPU-434baace-5927-62aa-8904-d1a6eb0bab53",
            "0000:01:00.0", 45, 8.70, None, 5 + 197, 6144, 0.0, "rtx3060laptop"),
    ]),
    "nvidia-smi-q-x_RTX-3080_v13.xml": ("595.58.03", [
        Gpu("NVIDIA GeForce RTX 3080", "GPU-6c75c408-471a-a507-6f46-e4c2eed454fb",
            "0000:0c:00.0", 27, 139.62, 320.0, 9184 + 397, 10240, 0.65, "rtx3080"),
    ]),  # v13: average_power_draw 139.62 (instant 142.33)
    "nvidia-smi-q-x_RTX-3090_v12.xml": ("525.147.05", [
        Gpu("NVIDIA GeForce RTX 3090", "GPU-da81f7a4-2ab3-c51e-ece1-47d365abdb77",
            "0000:00:10.0", 37, 27.23, 200.0, 1 + 316, 24576, 0.0, "rtx3090"),
    ]),  # enforced limit 200 W, default 350 W
    "nvidia-smi-q-x_RTX-4000-SFF-Ada_v13.xml": ("595.84", [
        Gpu("NVIDIA RTX 4000 SFF Ada Generation", "GPU-80129f3a-1795-32b8-cb39-0abdc2a0994f",
            "0000:06:00.0", 38, 8.81, 70.0, 3534 + 460, 20475, 0.0, "rtx4000sffada",
            procs=[(4937, 160), (34626, 183)]),
    ]),
    "nvidia-smi-q-x_RTX-4090_535_v12.xml": ("535.86.05", [
        Gpu("NVIDIA GeForce RTX 4090", "GPU-870cd578-f7e7-3189-3d8b-8312cf3cb641",
            "0000:84:00.0", 40, 26.84, 450.0, 2 + 346, 24564, 0.0, "rtx4090"),
    ]),
    "nvidia-smi-q-x_RTX-A5000x2_v13.xml": ("590.44.01", [
        Gpu("NVIDIA RTX A5000", "GPU-af3a0dc4-5649-e424-9a7f-2ab0c0bf6153", "0000:81:00.0",
            13, 6.41, 230.0, 22437 + 450, 24564, 0.0, "rtxa5000", procs=[(100477, 22430)]),
        Gpu("NVIDIA RTX A5000", "GPU-019c8f1b-a43f-0af8-7579-936da3be8fa3", "0000:c1:00.0",
            15, 13.60, 230.0, 17253 + 450, 24564, 0.0, "rtxa5000", procs=[(100477, 17246)]),
    ]),
    "nvidia-smi-q-x_RTX-PRO-6000-Blackwell-MaxQ_v13.xml": ("590.44.01", [
        Gpu("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
            "GPU-e6155160-c77b-9f0d-a602-dd5cb441be71", "0000:61:00.0", 24, 3.97, 300.0,
            65720 + 637, 97887, 0.0, "rtxpro6000blackwellmaxq", procs=[(116860, 65710)]),
    ]),
    "nvidia-smi-q-x_Tesla-P100-PCIE-16GB_v11.xml": ("510.47.03", [
        Gpu("Tesla P100-PCIE-16GB", "GPU-d56dda15-683e-6728-790e-78fcae08b4bf",
            "0000:00:04.0", 38, 26.16, 250.0, 0 + 103, 16384, 0.0, "p100", ecc=(0, 0)),
    ]),
    "nvidia-smi-q-x_Tesla-P4.xml": ("513.46", [
        Gpu("GRID P4-1Q", "GPU-ba1a6674-8c9b-aa4e-036d-a60c1b734cb2", "0000:00:0b.0",
            0, None, None, 807 + 110, 1024, 0.0, "p4",
            procs=[(pid, None) for pid in GRID_P4_PIDS]),
    ]),  # vGPU on Windows: the dump itself says 0 C and 0 MHz
    "nvidia-smi-q-x_Tesla-T4_v11.xml": ("515.105.01", [
        Gpu("Tesla T4", "GPU-fa369d12-f513-023b-4d16-0b11ff7e4630", "0000:00:1e.0",
            40, 26.78, 70.0, 1032 + 388, 15360, 0.0, "t4", procs=[(5762, 1005)], ecc=(0, 0)),
    ]),
}  # fmt: skip

TRIMMED = "nvidia-smi-q-x_GTX-1070-Ti_v10_TRIMMED.xml"

# A None value must come with the reason in errors: field -> calls that can explain it.
WHY_NONE = {
    "temperature_celsius": {"nvmlDeviceGetTemperature"},
    "power_watts": {"nvmlDeviceGetPowerUsage"},
    "power_limit_watts": {"nvmlDeviceGetEnforcedPowerLimit"},
    "utilization_ratio": {"nvmlDeviceGetUtilizationRates"},
    "memory_used_bytes": {"nvmlDeviceGetMemoryInfo"},
    "serial": {"nvmlDeviceGetSerial"},
    "driver_version": {"nvmlSystemGetDriverVersion"},
    "firmware_version": {"nvmlDeviceGetVbiosVersion"},
    "pcie_link_gen": {"nvmlDeviceGetCurrPcieLinkGeneration"},
    "pcie_link_gen_max": {"nvmlDeviceGetMaxPcieLinkGeneration"},
    "ecc_corrected_total": {"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetEccMode"},
    "remapped_rows_pending": {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetEccMode"},
}


def assert_none_explained(record) -> None:
    for name, why in WHY_NONE.items():
        if getattr(record, name) is None:
            assert sources(record) & why, f"{name} is None without a reason: {record.errors}"


def test_every_dump_has_expectations():
    files = sorted(p.name for p in samples().glob("nvidia-smi-q-x_*.xml"))
    assert len(files) == 19
    assert set(files) == set(DUMPS) | {TRIMMED}


@pytest.mark.parametrize("name", sorted(DUMPS))
def test_dump_values(name):
    driver, gpus = DUMPS[name]
    _, _, result = collect(samples() / name)
    assert result.state == STATE_OK
    assert len(result.records) == len(gpus)
    for index, (rec, exp) in enumerate(zip(result.records, gpus, strict=True)):
        assert rec.vendor == "nvidia" and rec.index == index
        assert rec.model == exp.model
        assert rec.card_type == exp.card_type
        assert rec.uuid == exp.uuid
        assert rec.bus_id == exp.bus_id
        assert rec.driver_version == driver
        assert rec.temperature_celsius == exp.temp
        assert rec.power_watts == (None if exp.power is None else pytest.approx(exp.power))
        assert rec.power_limit_watts == exp.limit
        assert rec.memory_used_bytes == exp.used_mib * MIB
        assert rec.memory_total_bytes == exp.total_mib * MIB
        assert rec.utilization_ratio == (pytest.approx(exp.util) if exp.util is not None else None)
        assert [(p.pid, p.memory_bytes) for p in rec.processes] == [
            (pid, None if mib is None else mib * MIB) for pid, mib in exp.procs
        ]
        if exp.ecc is None:
            assert rec.ecc_corrected_total is None and rec.ecc_uncorrected_total is None
        else:
            assert (rec.ecc_corrected_total, rec.ecc_uncorrected_total) == exp.ecc
        assert rec.vendor_health is None  # no NVML failure marker in a recorded dump
        assert_none_explained(rec)


def test_trimmed_dump_gives_absent_fields_never_zero():
    """The TRIMMED v10 dump holds name, uuid, PCIe current link, memory, utilization,
    temperature, power_draw N/A and clocks. The rest is absent -> None with an error
    entry; the bus id comes from the ``<gpu id=...>`` attribute."""
    _, nvml, result = collect(samples() / TRIMMED)
    assert result.state == STATE_OK
    (rec,) = result.records
    assert rec.model == "GeForce GTX 1070 Ti" and rec.card_type == "gtx1070ti"
    assert rec.uuid == "GPU-fc7239f4-28dd-e594-90c0-ed5988e54bab"
    assert rec.bus_id == "0000:01:00.0"
    assert rec.temperature_celsius == 39
    assert rec.utilization_ratio == 0.0
    assert (rec.memory_used_bytes, rec.memory_total_bytes) == (42 * MIB, 4096 * MIB)
    assert rec.clock_sm_hertz == 135e6
    assert (rec.pcie_link_gen, rec.pcie_link_width) == (1, 16)
    for name in (
        "driver_version", "serial", "firmware_version", "power_watts", "power_limit_watts",
        "pcie_link_gen_max", "pcie_link_width_max", "ecc_corrected_total",
        "ecc_uncorrected_total", "remapped_rows_pending", "retired_pages_pending",
    ):  # fmt: skip
        assert getattr(rec, name) is None, name
    assert rec.processes == []
    assert {
        "nvmlSystemGetDriverVersion",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetVbiosVersion",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetComputeRunningProcesses",
    } <= sources(rec)
    assert all(e["error"] == "NotSupported" for e in rec.errors)
    assert rec.vendor_health is None
    # no <reserved>: v2 memory answered FunctionNotFound and v1 was used, without error
    assert nvml.calls["nvmlDeviceGetMemoryInfo_v2"] == 1
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 1


def test_memory_error_models_by_architecture():
    # Pascal P100: no row remapping -> retired pages (No); aggregate ECC 3 corrected
    _, _, p100 = collect(samples() / "nvidia-smi-q-x_Tesla-P100-PCIE-16GB_v11.xml")
    rec = p100.records[0]
    assert rec.remapped_rows_pending is None and rec.retired_pages_pending is False
    assert rec.counters["ecc_corrected_aggregate"] == 3
    assert rec.counters["ecc_uncorrected_aggregate"] == 0
    # Ampere A10G: remapped rows 0 / No
    _, _, a10g = collect(samples() / "nvidia-smi-q-x_A10G_v11.xml")
    rec = a10g.records[0]
    assert (rec.remapped_rows_pending, rec.remapped_rows_failure) == (False, False)
    assert rec.retired_pages_pending is None
    # RTX 4090: ECC disabled; its remapped rows (0/No in the dump) are not trusted
    _, _, rtx = collect(samples() / "nvidia-smi-q-x_RTX-4090_535_v12.xml")
    rec = rtx.records[0]
    assert rec.remapped_rows_pending is None and rec.ecc_corrected_total is None
    assert {"source": "nvmlDeviceGetEccMode", "error": "EccDisabled"} in rec.errors


def test_clock_reasons_v13_rename_and_old_throttle_call():
    # v11 dump: clocks_throttle_reasons, gpu_idle Active -> old call after FunctionNotFound
    _, nvml, res = collect(samples() / "nvidia-smi-q-x_Quadro-P400_418_noDTD.xml")
    assert res.records[0].counters["clocks_event_reasons"] == 0x1
    assert nvml.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1
    # v13 dump: clocks_event_reasons, RTX 3080 under load, nothing active
    _, nvml, res = collect(samples() / "nvidia-smi-q-x_RTX-3080_v13.xml")
    assert res.records[0].counters["clocks_event_reasons"] == 0
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" not in nvml.calls


def test_replay_process_names_come_from_the_dump():
    _, _, res = collect(samples() / "nvidia-smi-q-x_Tesla-T4_v11.xml")
    assert [(p.pid, p.name) for p in res.records[0].processes] == [(5762, "python")]


# ---------------------------------------------------------------------------------------
# card types


@pytest.mark.parametrize(
    ("name", "card_type", "kind"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100", "hbm"),
        ("NVIDIA H100 80GB HBM3", "h100", "hbm"),
        ("NVIDIA H100 NVL", "h100", "hbm"),
        ("NVIDIA H200", "h200", "hbm"),
        ("NVIDIA L40S", "l40s", "gddr"),
        ("NVIDIA L4", "l4", "gddr"),
        ("Tesla T4", "t4", "gddr"),
        ("NVIDIA A10", "a10", "gddr"),
        ("NVIDIA A10G", "a10g", "gddr"),
        ("Tesla P100-PCIE-16GB", "p100", "hbm"),
        ("NVIDIA GeForce RTX 4090", "rtx4090", "gddr"),
        ("NVIDIA RTX A5000", "rtxa5000", "gddr"),
        ("Quadro P2000", "quadrop2000", "gddr"),
        ("NVIDIA TITAN V", "titanv", "hbm"),
        ("GeForce GTX 1070 Ti", "gtx1070ti", "gddr"),
        ("Graphics Device", "nvidia", None),
        ("", "nvidia", None),
    ],
)
def test_card_type(name, card_type, kind):
    assert card_type_from_name(name) == card_type
    assert memory_kind_for(card_type) == kind


# ---------------------------------------------------------------------------------------
# the composed whole-node fixtures (self-contained: no ../shared needed)

# Read off nvidia-smi-q_H100-80GB-HBM3x8_535.161.08.txt
H100_BUS = ["19", "3b", "4c", "5d", "9b", "bb", "cb", "db"]
H100_TEMPS = [29, 29, 30, 30, 31, 32, 32, 31]
H100_POWER = [67.74, 69.52, 70.55, 71.37, 70.33, 70.21, 71.05, 72.27]


def test_healthy_fixture_values():
    collector, nvml, result = collect(HEALTHY_XML)
    assert result.state == STATE_OK and len(result.records) == 8
    for i, rec in enumerate(result.records):
        assert rec.model == "NVIDIA H100 80GB HBM3" and rec.card_type == "h100"
        assert rec.memory_kind == "hbm"
        assert rec.bus_id == f"0000:{H100_BUS[i]}:00.0"
        assert rec.temperature_celsius == H100_TEMPS[i]
        assert rec.power_watts == pytest.approx(H100_POWER[i])
        assert rec.power_limit_watts == 700.0
        assert rec.driver_version == "535.161.08"
        assert rec.firmware_version == "96.00.74.00.0D"
        assert rec.memory_total_bytes == 81559 * MIB
        assert rec.memory_used_bytes == (0 + 551) * MIB
        assert rec.utilization_ratio == 0.0
        assert rec.clock_sm_hertz == 86e6
        assert (rec.ecc_corrected_total, rec.ecc_uncorrected_total) == (0, 0)
        assert (rec.remapped_rows_pending, rec.remapped_rows_failure) == (False, False)
        assert (rec.pcie_link_gen, rec.pcie_link_gen_max) == (5, 5)
        assert (rec.pcie_link_width, rec.pcie_link_width_max) == (16, 16)
        # as recorded: HW Slowdown + HW Power Brake Slowdown active on every GPU
        assert rec.counters["clocks_event_reasons"] == 0x08 | 0x80
        assert rec.processes == [] and rec.errors == [] and rec.vendor_health is None
    assert result.records[0].uuid == "GPU-e94fa8ce-6e04-a49e-f637-ba3a7dc7019a"
    assert result.records[0].serial == "3306182651308"
    assert result.records[7].uuid == "GPU-004dc5e2-7c1d-cc17-c721-e63ad8f75bae"


def test_sick_fixture_xml_values():
    """The XML as composed (no faults): GPU 0000:9e:00.0 is recorded with 353 DRAM
    correctable errors and a pending row remap."""
    _, _, result = collect(SICK_XML)
    assert [r.bus_id for r in result.records] == [
        "0000:68:00.0", "0000:9e:00.0", "0000:c2:00.0", "0000:d4:00.0",
    ]  # fmt: skip
    assert [r.temperature_celsius for r in result.records] == [25, 22, 23, 23]
    assert [r.power_watts for r in result.records] == [59.77, 60.31, 58.78, 62.21]
    assert {r.card_type for r in result.records} == {"a100"}
    assert {r.driver_version for r in result.records} == {"555.42.02"}
    assert {r.memory_used_bytes for r in result.records} == {(1 + 763) * MIB}
    assert {r.memory_total_bytes for r in result.records} == {81920 * MIB}
    gpu1 = result.records[1]
    assert gpu1.uuid == "GPU-31a005b2-0756-4b05-30d1-3494a65b19d7"
    assert (gpu1.ecc_corrected_total, gpu1.ecc_uncorrected_total) == (353, 0)
    assert gpu1.remapped_rows_pending is True and gpu1.remapped_rows_failure is False
    assert gpu1.counters["remapped_rows_correctable"] == 1
    assert [r.remapped_rows_pending for r in result.records] == [False, True, False, False]
    assert result.records[3].clock_sm_hertz == 930e6


def test_fixture_scenarios_through_replay_dir():
    """Both scenario folders replay through ``replay_dir``; faults from scenario.yaml apply."""
    for name, count in (("healthy-mixed", 8), ("sick-mixed", 4)):
        directory = NODES / name
        collector = NvidiaCollector({}, replay_dir=directory)
        result = collector.collect()
        collector.close()
        assert result.state == STATE_OK and len(result.records) == count
        gpus = (load_scenario(directory).get("nvml") or {}).get("gpus") or {}
        for index, spec in gpus.items():
            rec = result.records[int(index)]
            if spec.get("lost"):
                assert rec.vendor_health == VH_GPU_IS_LOST
            if spec.get("remapped_rows", {}).get("pending"):
                assert rec.remapped_rows_pending is True


# ---------------------------------------------------------------------------------------
# faults


def test_lost_gpu_others_still_read():
    _, nvml, result = collect(HEALTHY_XML, {"gpus": {3: {"lost": True}}})
    assert result.state == STATE_OK and len(result.records) == 8
    lost = result.records[3]
    assert lost.index == 3 and lost.vendor_health == VH_GPU_IS_LOST
    assert lost.errors == [{"source": "nvmlDeviceGetHandleByIndex", "error": "GpuIsLost"}]
    assert lost.uuid is None and lost.temperature_celsius is None and lost.card_type is None
    others = [r for r in result.records if r.index != 3]
    assert all(r.vendor_health is None and r.errors == [] for r in others)
    assert [r.temperature_celsius for r in others] == [29, 29, 30, 31, 32, 32, 31]


class _LosesGpu:
    """Delegates to a replay; once ``lost`` holds an index, every call on it raises."""

    def __init__(self, inner: ReplayNvml):
        self.inner = inner
        self.lost: set[int] = set()

    def __getattr__(self, name):
        fn = getattr(self.inner, name)
        if not callable(fn) or not name.startswith("nvmlDevice") or name == "nvmlDeviceGetCount":
            return fn

        def call(handle, *args, **kwargs):
            index = handle if isinstance(handle, int) else handle.index
            if index in self.lost:
                raise pynvml.NVMLError_GpuIsLost()
            return fn(handle, *args, **kwargs)

        return call


def test_gpu_lost_after_first_patrol_keeps_identity():
    nvml = _LosesGpu(load_replay_nvml(HEALTHY_XML))
    collector = NvidiaCollector({}, nvml=nvml)
    first = collector.collect()
    nvml.lost.add(2)
    second = collector.collect()
    rec = second.records[2]
    assert rec.vendor_health == VH_GPU_IS_LOST
    assert rec.uuid == first.records[2].uuid == "GPU-6d33bd6a-6eac-013c-9c16-a880cab1362b"
    assert rec.bus_id == "0000:4c:00.0" and rec.card_type == "h100"
    assert rec.temperature_celsius is None
    # the cached handle was used; the first state call raised and nothing more was tried
    assert [e["error"] for e in rec.errors] == ["GpuIsLost"]


def test_lost_gpu_with_handle_and_reset_required():
    faults = {"gpus": {0: {"lost": True, "handle_ok": True}, 1: {"reset_required": True}}}
    _, nvml, result = collect(HEALTHY_XML, faults)
    assert result.records[0].vendor_health == VH_GPU_IS_LOST
    assert result.records[1].vendor_health == VH_RESET_REQUIRED
    assert result.records[1].errors == [{"source": "nvmlDeviceGetName", "error": "ResetRequired"}]
    assert result.records[2].vendor_health is None


def test_unknown_error_on_a_core_call_marks_card_and_reading_goes_on():
    """Unknown on the memory read (a core call) marks the card at once; the other values
    are still read. (Unknown on a field read is a warning first: test_nvml_field_errors.)"""
    faults = {"gpus": {4: {"errors": {"nvmlDeviceGetMemoryInfo": "Unknown"}}}}
    _, _, result = collect(HEALTHY_XML, faults)
    rec = result.records[4]
    assert rec.vendor_health == VH_UNKNOWN_ERROR
    assert rec.memory_used_bytes is None and rec.memory_total_bytes is None
    assert rec.power_watts == pytest.approx(70.33) and rec.temperature_celsius == 31
    assert {"source": "nvmlDeviceGetMemoryInfo", "error": "Unknown"} in rec.errors


def test_remapped_rows_pending_fault():
    faults = {
        "gpus": {
            2: {
                "remapped_rows": {
                    "correctable": 0,
                    "uncorrectable": 2,
                    "pending": True,
                    "failure": False,
                }
            }
        }
    }
    _, _, result = collect(HEALTHY_XML, faults)
    rec = result.records[2]
    assert rec.remapped_rows_pending is True and rec.remapped_rows_failure is False
    assert rec.counters["remapped_rows_uncorrectable"] == 2
    assert result.records[1].remapped_rows_pending is False


def test_old_driver_without_remapped_rows_falls_back_to_retired_pages():
    faults = {
        "gpus": {
            5: {
                "errors": {"nvmlDeviceGetRemappedRows": "FunctionNotFound"},
                "retired_pages_pending": True,
            }
        }
    }
    _, _, result = collect(HEALTHY_XML, faults)
    rec = result.records[5]
    assert rec.retired_pages_pending is True and rec.remapped_rows_pending is None
    assert "nvmlDeviceGetRemappedRows" not in sources(rec)  # a fallback, not an error


def test_power_not_supported_is_absent_not_unhealthy():
    faults = {"gpus": {0: {"errors": {"nvmlDeviceGetPowerUsage": "NotSupported"}}}}
    _, _, result = collect(HEALTHY_XML, faults)
    rec = result.records[0]
    assert rec.power_watts is None
    assert rec.errors == [{"source": "nvmlDeviceGetPowerUsage", "error": "NotSupported"}]
    assert rec.vendor_health is None and rec.power_limit_watts == 700.0


@pytest.mark.parametrize("error", ["DriverNotLoaded", "LibRmVersionMismatch"])
def test_driver_failure_is_node_critical_and_init_is_retried(error):
    nvml = load_replay_nvml(HEALTHY_XML, {"init_error": error})
    collector = NvidiaCollector({}, nvml=nvml)
    result = collector.collect()
    assert result.state == STATE_FAILED and result.records == []
    assert error in result.error
    (finding,) = result.node_findings
    assert (finding.check, finding.severity, finding.value) == ("nvml_driver", "critical", error)
    collector.collect()
    assert nvml.calls["nvmlInit"] == 2  # a failed init is retried on the next patrol


def test_library_not_found_is_absent():
    _, _, result = collect(HEALTHY_XML, {"init_error": "LibraryNotFound"})
    assert result.state == STATE_ABSENT and result.records == []
    assert result.node_findings == []


def test_garbage_xml_is_a_collector_error_with_raw(tmp_path):
    (tmp_path / "nvidia-smi-q.xml").write_text("NVIDIA-SMI has failed because it couldn't\n")
    collector = NvidiaCollector({}, replay_dir=tmp_path)
    with pytest.raises(CollectorError) as info:
        collector.collect()
    assert "not an nvidia-smi -q -x XML dump" in str(info.value)
    assert info.value.raw.startswith("NVIDIA-SMI has failed")


def test_xml_without_gpu_is_an_error_not_a_healthy_gpu():
    data = b"<?xml version='1.0'?><nvidia_smi_log><attached_gpus>8</attached_gpus></nvidia_smi_log>"
    with pytest.raises(ReplayFormatError, match="no <gpu>") as info:
        parse_replay_nvml(data)
    assert "attached_gpus" in info.value.raw
    with pytest.raises(ReplayFormatError, match="root element"):
        parse_replay_nvml(b"<html><gpu/></html>")


def test_a_150000_deep_xml_is_refused_while_parsing_not_a_crash(tmp_path):
    """Deep-copying such a tree recursed in C and killed the process (SIGSEGV)."""
    deep = (
        b"<nvidia_smi_log><gpu>" + b"<a>" * 150_000 + b"</a>" * 150_000 + b"</gpu></nvidia_smi_log>"
    )
    (tmp_path / "nvidia-smi-q.xml").write_bytes(deep)
    with pytest.raises(CollectorError) as info:
        NvidiaCollector({}, replay_dir=tmp_path).collect()
    assert str(info.value).endswith(
        "nested deeper than 64 elements: not an nvidia-smi -q -x XML dump"
    )
    assert info.value.raw.startswith("<nvidia_smi_log><gpu><a><a>")


def test_replay_dir_without_xml_is_absent(tmp_path):
    result = NvidiaCollector({}, replay_dir=tmp_path).collect()
    assert result.state == STATE_ABSENT and result.records == []


def test_replay_dir_reads_faults_from_scenario(tmp_path):
    (tmp_path / "nvidia-smi-q.xml").write_bytes(HEALTHY_XML.read_bytes())
    (tmp_path / "scenario.yaml").write_text("node: x\nnvml:\n  gpus:\n    6: {lost: true}\n")
    result = NvidiaCollector({}, replay_dir=tmp_path).collect()
    assert [r.vendor_health for r in result.records] == [None] * 6 + [VH_GPU_IS_LOST, None]


def test_bad_faults_are_refused():
    with pytest.raises(ReplayFormatError, match="unknown fault keys"):
        load_replay_nvml(HEALTHY_XML, {"gpus": {0: {"melted": True}}})
    with pytest.raises(ValueError, match="unknown NVML error name"):
        load_replay_nvml(HEALTHY_XML, {"init_error": "Melted"})
    with pytest.raises(ReplayFormatError, match="dump has 8 GPU"):
        load_replay_nvml(HEALTHY_XML, {"gpus": {9: {"lost": True}}})
    # a negative or fractional index must not silently pick another GPU
    for key in (-1, 1.9, "1", True):
        with pytest.raises(ReplayFormatError, match="not an NVML index"):
            load_replay_nvml(HEALTHY_XML, {"gpus": {key: {"lost": True}}})
    with pytest.raises(ReplayFormatError, match="lost must be true or false"):
        load_replay_nvml(HEALTHY_XML, {"gpus": {0: {"lost": "false"}}})
    with pytest.raises(ReplayFormatError, match="hang_seconds"):
        load_replay_nvml(HEALTHY_XML, {"gpus": {0: {"hang_seconds": float("inf")}}})


def test_xml_overrides_and_hang():
    faults = {"gpus": {0: {"xml_overrides": {"temperature/gpu_temp": "91 C"}}}}
    _, _, result = collect(HEALTHY_XML, faults)
    assert result.records[0].temperature_celsius == 91
    faults = {"gpus": {7: {"hang_seconds": 0.05}}}
    nvml = load_replay_nvml(HEALTHY_XML, faults)
    nvml.nvmlInit()
    start = time.monotonic()
    nvml.nvmlDeviceGetTemperature(nvml.nvmlDeviceGetHandleByIndex(7), pynvml.NVML_TEMPERATURE_GPU)
    assert time.monotonic() - start >= 0.1


def test_non_ascii_digits_in_the_xml_are_refused_not_read_as_numbers():
    faults = {"gpus": {0: {"xml_overrides": {"temperature/gpu_temp": "\u0669\u0669 C"}}}}
    nvml = load_replay_nvml(HEALTHY_XML, faults)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(ReplayFormatError) as info:
        nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    assert str(info.value) == "cannot read temperature/gpu_temp = '\u0669\u0669 C' as C"


# ---------------------------------------------------------------------------------------
# the fake module itself, and the bounded work of a patrol


def test_replay_is_pynvml_shaped():
    nvml = load_replay_nvml(HEALTHY_XML)
    assert nvml.NVML_TEMPERATURE_GPU is pynvml.NVML_TEMPERATURE_GPU
    assert nvml.nvmlMemory_v2 == pynvml.nvmlMemory_v2
    assert nvml.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    with pytest.raises(AttributeError):
        nvml.nvmlDeviceGetFanSpeed  # noqa: B018 - not implemented, never the real library
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetPciInfo(handle).busId == "00000000:3B:00.0"
    assert nvml.nvmlDeviceGetPowerUsage(handle) == 69520  # mW
    mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert (mem.used, mem.reserved) == (0, 551 * MIB)
    assert nvml.nvmlDeviceGetMemoryInfo(handle).used == 551 * MIB  # v1: reserved + used
    assert nvml.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(8)


def test_one_init_bounded_calls_and_close():
    nvml = load_replay_nvml(HEALTHY_XML)
    collector = NvidiaCollector({}, nvml=nvml)
    collector.collect()
    first = sum(nvml.calls.values())
    collector.collect()
    steady = sum(nvml.calls.values()) - first
    assert nvml.calls["nvmlInit"] == 1
    # init, count, driver once; per GPU handle + 8 identity (the minor number among them)
    # + 16 + 1 NVLink probe (link 0 NotSupported: no NVLink, not asked again in this
    # session) + 1 recovery-action field (NotSupported in this dump: not asked again either)
    # + 1 MIG mode (Disabled here: no MIG device calls) + 1 fabric info (NotSupported
    # in this dump, no <fabric>: not asked again)
    assert first <= 3 + 8 * 29
    assert steady <= 1 + 8 * 17  # count + 17 state calls per ECC GPU; handles, identity cached
    assert nvml.calls["nvmlDeviceGetMigMode"] == 16
    assert "nvmlDeviceGetMaxMigDeviceCount" not in nvml.calls
    assert nvml.calls["nvmlDeviceGetHandleByIndex"] == 8
    collector.close()
    assert nvml.calls["nvmlShutdown"] == 1
    collector.collect()
    assert nvml.calls["nvmlInit"] == 2


def test_production_names_processes_with_psutil():
    """Outside replay the pid is a local one: its name comes from psutil (None if gone)."""
    me = os.getpid()
    overrides = {
        "processes/process_info/pid": str(me),
        "processes/process_info/type": "C",
        "processes/process_info/used_memory": "10 MiB",
    }
    nvml = _LosesGpu(load_replay_nvml(HEALTHY_XML, {"gpus": {0: {"xml_overrides": overrides}}}))
    result = NvidiaCollector({}, nvml=nvml).collect()  # not a ReplayNvml: psutil names
    (proc,) = result.records[0].processes
    assert (proc.pid, proc.memory_bytes) == (me, 10 * MIB)
    assert proc.name == psutil.Process(me).name()
    named = NvidiaCollector({}, nvml=nvml, process_namer=lambda pid: None).collect()
    assert named.records[0].processes[0].name is None


class _Blocks:
    """Delegates to a replay; nvmlDeviceGetTemperatureV waits until released."""

    def __init__(self, inner: ReplayNvml):
        self.inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def nvmlDeviceGetTemperatureV(self, handle, sensor):
        self.entered.set()
        self.release.wait(5)
        return self.inner.nvmlDeviceGetTemperatureV(handle, sensor)


def test_a_read_stuck_in_nvml_is_reported_hung_not_queued():
    nvml = _Blocks(load_replay_nvml(HEALTHY_XML))
    collector = NvidiaCollector({}, nvml=nvml)
    worker = threading.Thread(target=collector.collect)
    worker.start()
    try:
        assert nvml.entered.wait(5)
        with pytest.raises(CollectorError) as info:
            collector.collect()
        assert info.value.hung
        collector.close()  # does not wait for, nor shut NVML down under, the stuck read
        assert "nvmlShutdown" not in nvml.inner.calls
    finally:
        nvml.release.set()
        worker.join(5)
    assert collector.collect().state == STATE_OK


def _patrol(directory: Path):
    from dataclasses import replace

    from hetpatrol.config import load_config
    from hetpatrol.patrol import Patroller

    p = Patroller(replace(load_config(), node="n1"), replay_dir=directory)
    try:
        return p.run()
    finally:
        p.close()


def test_any_handle_error_makes_the_card_unreadable_never_ok(tmp_path):
    (tmp_path / "nvidia-smi-q.xml").write_bytes(HEALTHY_XML.read_bytes())
    (tmp_path / "scenario.yaml").write_text(
        "node: x\nnvml:\n  gpus:\n"
        "    0: {errors: {nvmlDeviceGetHandleByIndex: InsufficientPower}}\n"
        "    1: {errors: {nvmlDeviceGetHandleByIndex: NoPermission}}\n"
        "    2: {errors: {nvmlDeviceGetHandleByIndex: Timeout}}\n"
        "    3: {errors: {nvmlDeviceGetHandleByIndex: IrqIssue}}\n"
    )
    report = _patrol(tmp_path)
    by = {c.index: c for c in report.cards if c.vendor == "nvidia"}
    assert by[0].health == "critical" and by[0].vendor_health == "insufficient_power"
    for i, err in ((0, "InsufficientPower"), (1, "NoPermission"), (2, "Timeout"), (3, "IrqIssue")):
        assert by[i].read_ok is (i == 0)  # 0: its marker says why (critical)
        assert {"source": "nvmlDeviceGetHandleByIndex", "error": err} in by[i].errors
    assert [by[i].health for i in (1, 2, 3)] == ["unknown"] * 3
    assert all(by[i].health == "ok" for i in range(4, 8))


def test_gpu_with_no_readable_value_is_not_ok(tmp_path):
    xml = (
        "<?xml version='1.0'?><nvidia_smi_log><attached_gpus>2</attached_gpus>"
        "<gpu/><gpu/></nvidia_smi_log>"
    )
    (tmp_path / "nvidia-smi-q.xml").write_text(xml)
    report = _patrol(tmp_path)
    cards = [c for c in report.cards if c.vendor == "nvidia"]
    assert len(cards) == 2
    assert all(c.read_ok is False and c.health != "ok" for c in cards)


def test_a_hostile_scenario_file_is_a_value_error_naming_it(tmp_path):
    """scenario.yaml gets the config's YAML guards: 5,000-deep nesting was a
    RecursionError traceback, a bad date a message without the file."""
    from hetpatrol.replay import load_scenario

    path = tmp_path / "scenario.yaml"
    path.write_text("node: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ValueError) as info:
        load_scenario(tmp_path)
    assert str(info.value) == f"{path}: line 1: nested deeper than 32 levels"
    path.write_text("node: x\nrecorded: 2024-13-45\n")
    with pytest.raises(ValueError) as info:
        load_scenario(tmp_path)
    assert str(info.value) == (
        f"{path}: line 2: invalid YAML: cannot read '2024-13-45' as timestamp: "
        "month must be in 1..12"
    )
