"""Hygon DCU and AMD Instinct/Radeon plugins, on the recorded ROCm-family outputs.

Samples are read in place from ``../shared/vendor-samples/other-vendors/``. Every expected
value below was read off the sample text by hand (the comment says where), not taken
from the parser's output.
"""

from __future__ import annotations

import json

import pytest
from conftest import samples_dir
from vendor_helpers import runner_for

from hetpatrol.collector import STATE_ABSENT, STATE_OK, CollectorError
from hetpatrol.collectors.amd import ROCM_SMI_COMMAND, AmdCollector
from hetpatrol.collectors.amd import card_type_for as amd_type
from hetpatrol.collectors.amd_smi import parse_amd_smi_tree
from hetpatrol.collectors.hygon import DEFAULT_COMMAND, HygonCollector
from hetpatrol.collectors.hygon import card_type_for as hygon_type
from hetpatrol.collectors.rocm_family import parse_rocm_smi
from hetpatrol.config import load_config
from hetpatrol.judge import judge
from hetpatrol.tool import ToolOutput

OTHER = samples_dir("other-vendors")
MIB = 1048576
HYGON_JSON = "hygon-dcu-rocm-smi-json-dtk24.04.3.json"
HYGON_TABLE = "hygon-dcu-rocm-smi-table-4cards.txt"
AMD_ROCM_JSON = "amd-rocm-smi-json-rocm6.2.4-navi32.json"
AMD_STATIC = "amd-smi-static-MI300A-cpu-and-gpu0.txt"
AMD_POWER = "amd-smi-metric-power-json.txt"
AMD_ECC = "amd-smi-metric-ecc-ecc-blocks.txt"


def text(name: str) -> str:
    return (OTHER / name).read_text(encoding="utf-8")


def collect(cls, outputs, **options):
    collector = cls(options)
    collector.runner = runner_for(outputs)
    return collector.collect()


# ------------------------------------------------------------------ Hygon


def test_hygon_json_dtk_24_04_card_values():
    result = collect(HygonCollector, {DEFAULT_COMMAND: text(HYGON_JSON)})
    assert (result.state, result.error, result.raw) == (STATE_OK, None, None)
    (card,) = result.records
    # "card0": {... "Card Series": "DCU xxxx", "Serial Number": "TPXxxxx",
    # "Unique ID": "7100fa8866904061", power "80.0", junction "39.0" (edge 41.0, mem 44.0),
    # "DCU use (%)": "0", vram Total 65520 MiB, Used 2 MiB}
    assert (card.vendor, card.index, card.model, card.card_type) == ("hygon", 0, "DCU xxxx", "dcu")
    assert (card.serial, card.uuid) == ("TPXxxxx", "7100fa8866904061")
    assert card.temperature_celsius == 39.0  # junction, not edge 41.0
    assert card.power_watts == 80.0
    assert card.utilization_ratio == 0.0
    assert (card.memory_total_bytes, card.memory_used_bytes) == (65520 * MIB, 2 * MIB)
    assert card.memory_kind == "fb"
    assert card.bus_id is None and card.vendor_health is None
    # no process list in this read: unknown with the reason, never "none"
    assert card.processes == []
    assert {"source": "rocm-smi processes", "error": "unknown: this read lists no processes"} in (
        card.errors
    )
    # the empty "" key of DTK's JSON is skipped, not a problem
    assert all(e["source"] != "rocm-smi " for e in card.errors)
    assert card.read_ok


def test_hygon_table_four_dcus():
    result = collect(HygonCollector, {("rocm-smi",): text(HYGON_TABLE)}, command=["rocm-smi"])
    assert result.state == STATE_OK and result.error is None
    # DCU  Temp   AvgPwr  Fan   Perf  PwrCap  VRAM%  DCU%
    # 0    30.0c  38.0W   ...         280.0W    0%   0%   (1: 30.0c 41.0W, 2: 29.0c 38.0W,
    # 3: 29.0c 39.0W)
    got = [
        (c.index, c.temperature_celsius, c.power_watts, c.power_limit_watts, c.utilization_ratio)
        for c in result.records
    ]
    assert got == [
        (0, 30.0, 38.0, 280.0, 0.0),
        (1, 30.0, 41.0, 280.0, 0.0),
        (2, 29.0, 38.0, 280.0, 0.0),
        (3, 29.0, 39.0, 280.0, 0.0),
    ]
    for card in result.records:
        # VRAM% only: memory is null with the reason, never 0
        assert card.memory_total_bytes is None and card.memory_used_bytes is None
        sources = {e["source"]: e["error"] for e in card.errors}
        assert sources["rocm-smi memory"] == "the table prints VRAM% only: no bytes"
        assert card.model is None and card.card_type == "dcu"


def test_hygon_leaves_amd_cards_to_the_amd_plugin():
    result = collect(HygonCollector, {DEFAULT_COMMAND: text(AMD_ROCM_JSON)})
    assert result.state == STATE_ABSENT
    assert result.error == "rocm-smi lists no Hygon DCU (AMD cards only)"
    assert collect(HygonCollector, {}).state == STATE_ABSENT  # no program at all


def test_hygon_card_types():
    assert [hygon_type(m) for m in ("K100_AI", "DCU K100", "Z100L", "Z100", "DCU xxxx", None)] == [
        "k100_ai",
        "k100",
        "z100l",
        "z100",
        "dcu",
        "dcu",
    ]


# ------------------------------------------------------------------ AMD


def test_amd_rocm_smi_fallback_navi32_bytes():
    """No amd-smi (older ROCm): rocm-smi --json, whose VRAM keys are in bytes."""
    result = collect(AmdCollector, {ROCM_SMI_COMMAND: text(AMD_ROCM_JSON)})
    assert result.state == STATE_OK
    (card,) = result.records
    # "Card Series": "Navi 32 [Radeon RX 7700 XT / 7800 XT]", "Unique ID": "0x5c88007d760374f3",
    # "Serial Number": "N/A", junction "51.0" (edge 45.0, memory 54.0), power "53.0",
    # "GPU use (%)": "100", "VRAM Total Memory (B)": "17163091968", Used "11615076352"
    assert card.model == "Navi 32 [Radeon RX 7700 XT / 7800 XT]"
    assert (card.card_type, card.uuid, card.serial) == ("radeon", "0x5c88007d760374f3", None)
    assert (card.temperature_celsius, card.power_watts) == (51.0, 53.0)
    assert card.utilization_ratio == 1.0
    assert (card.memory_total_bytes, card.memory_used_bytes) == (17163091968, 11615076352)


def test_amd_rocm_smi_leaves_hygon_cards():
    result = collect(AmdCollector, {ROCM_SMI_COMMAND: text(HYGON_JSON)})
    assert (result.state, result.records) == (STATE_ABSENT, [])


def test_amd_smi_static_and_metric_mi300a():
    """amd-smi static (human form, MI300A) joined with metric -p --json and the ECC blocks."""
    metric = json.loads(text(AMD_POWER).split("\n", 1)[1])  # drop the echoed command line
    metric[0].update(parse_amd_smi_tree(text(AMD_ECC))[0])
    outputs = {
        ("amd-smi", "metric", "--json"): json.dumps(metric),
        ("amd-smi", "static", "--json"): text(AMD_STATIC),
    }
    result = collect(AmdCollector, outputs)
    assert result.state == STATE_OK and result.error is None
    (card,) = result.records
    # GPU: 0 / ASIC: MARKET_NAME: MI300A, ASIC_SERIAL: 0x7E8F7E20764E2714 (BOARD
    # PRODUCT_SERIAL: N/A) / BUS: BDF: 0000:01:00.0 / LIMIT: MAX_POWER: 550 W /
    # DRIVER: VERSION: 6.9.0-rc5+ / VBIOS: VERSION: N/A / VRAM: TYPE: HBM, SIZE: 64289 MB
    assert (card.index, card.model, card.card_type) == (0, "MI300A", "mi300a")
    assert (card.serial, card.bus_id) == ("0x7E8F7E20764E2714", "0000:01:00.0")
    assert (card.driver_version, card.firmware_version) == ("6.9.0-rc5+", None)
    assert card.power_limit_watts == 550.0
    assert (card.memory_total_bytes, card.memory_kind) == (64289 * MIB, "hbm")
    # "socket_power": {"value": 10, "unit": "W"}
    assert card.power_watts == 10.0
    # ECC: TOTAL_CORRECTABLE_COUNT: 0, TOTAL_UNCORRECTABLE_COUNT: 0; ECC_BLOCKS UMC, SDMA 0
    assert (card.ecc_corrected_total, card.ecc_uncorrected_total) == (0, 0)
    assert card.counters == {
        f"ecc_{kind}_{block}": 0
        for block in ("umc", "sdma")
        for kind in ("uncorrected", "corrected", "deferred")
    }
    # no temperature or use in these outputs: null with the reason, never 0
    assert card.temperature_celsius is None and card.utilization_ratio is None
    sources = {e["source"]: e["error"] for e in card.errors}
    assert sources["amd-smi temperature"] == "not in the output"
    assert sources["amd-smi usage"] == "not in the output"


def test_amd_smi_value_objects_units():
    """{"value", "unit"} objects converted by their unit; an unknown unit is not read."""
    doc = [
        {
            "gpu": 3,
            "usage": {"gfx_activity": {"value": 42, "unit": "%"}},
            "power": {"socket_power": {"value": 512000, "unit": "mW"}},
            "temperature": {
                "edge": {"value": 51, "unit": "C"},
                "hotspot": {"value": 70, "unit": "C"},
            },
            "mem_usage": {
                "total_vram": {"value": 196592, "unit": "MB"},
                "used_vram": {"value": 3, "unit": "GB"},
            },
        }
    ]
    result = collect(
        AmdCollector,
        {("amd-smi", "metric", "--json"): json.dumps({"gpu_data": doc})},
    )
    (card,) = result.records
    assert (card.index, card.utilization_ratio, card.power_watts) == (3, 0.42, 512.0)
    assert card.temperature_celsius == 70.0  # hotspot
    assert card.memory_total_bytes == 196592 * MIB
    assert card.memory_used_bytes is None  # "GB": decimal or binary? not guessed
    assert {
        "source": "amd-smi mem_usage.used_vram",
        "error": "unit 'GB' not understood: not read",
    } in (card.errors)
    # static missing: the values stay, identity is null with the reason
    assert card.model is None and card.card_type == "amd"
    assert any(e["source"] == "amd-smi static" for e in card.errors)


def test_amd_card_types():
    names = ("MI300X", "Aqua Vanjaram [Instinct MI300A]", "AMD Instinct MI250X", "Navi 31", None)
    assert [amd_type(m) for m in names] == ["mi300x", "mi300a", "mi250x", "radeon", "amd"]


# ------------------------------------------------------------------ bad tool runs


@pytest.mark.parametrize("cls", [HygonCollector, AmdCollector])
def test_hung_tool_is_hung_with_partial_output_kept(cls):
    argv = DEFAULT_COMMAND if cls is HygonCollector else ("amd-smi", "metric", "--json")
    hung = ToolOutput(argv, '{"card0": {"DCU', "", None, True, 10.0)
    with pytest.raises(CollectorError) as err:
        collect(cls, {argv: hung})
    assert err.value.hung and err.value.raw == '{"card0": {"DCU'
    assert "hung: killed after 10s" in str(err.value)


@pytest.mark.parametrize(
    "output",
    [
        "",  # printed nothing
        "ERROR: GPU[0] : Unable to open /dev/kfd\n",  # not JSON, no table
        '{"card0": {"DCU use (%)": "0", "vram Total Memory (Mi',  # cut JSON
        "\x00\x00\x00garbage\n",
    ],
)
def test_garbled_or_cut_json_is_an_error_with_raw_never_zero_cards(output):
    with pytest.raises(CollectorError) as err:
        collect(HygonCollector, {DEFAULT_COMMAND: output})
    assert err.value.raw is not None


def test_nonzero_exit_keeps_stderr():
    out = ToolOutput(DEFAULT_COMMAND, "", "rocm-smi: permission denied\n", 1, False, 0.1)
    with pytest.raises(CollectorError, match="exited with code 1") as err:
        collect(HygonCollector, {DEFAULT_COMMAND: out})
    assert "permission denied" in err.value.raw


def test_cut_table_row_is_unknown_and_the_cut_is_said():
    lines = text(HYGON_TABLE).splitlines()
    cut = "\n".join(lines[:5] + [lines[5][:14]]) + "\n"  # card 2's row ends mid-row
    result = collect(HygonCollector, {("rocm-smi",): cut}, command=["rocm-smi"])
    assert [c.index for c in result.records] == [0, 1, 2]
    assert [c.read_ok for c in result.records] == [True, True, False]
    assert result.raw == cut and "truncated" in result.error
    config = load_config(text="node: t\nlisten: null\n")
    for card in result.records:
        judge(card, config)
    assert [c.health for c in result.records] == ["ok", "ok", "unknown"]


def test_garbled_value_is_none_and_the_card_unknown():
    doc = json.loads(text(HYGON_JSON))
    doc["card0"]["Average Graphics Package Power (W)"] = "8#.0"
    result = collect(HygonCollector, {DEFAULT_COMMAND: json.dumps(doc)})
    (card,) = result.records
    assert card.power_watts is None and not card.read_ok
    assert {
        "source": "rocm-smi Average Graphics Package Power (W)",
        "error": "not a number: '8#.0'",
    } in (card.errors)


def test_na_value_is_none_with_reason():
    doc = json.loads(text(AMD_ROCM_JSON))
    doc["card0"]["Average Graphics Package Power (W)"] = "N/A"
    (card,) = collect(AmdCollector, {ROCM_SMI_COMMAND: json.dumps(doc)}).records
    assert card.power_watts is None and card.read_ok
    assert {
        "source": "rocm-smi Average Graphics Package Power (W)",
        "error": "N/A: not reported",
    } in (card.errors)


def test_parse_rocm_smi_never_raises_other_errors():
    for junk in ("{", "[1,2]", '{"card0": 5}', "DCU Temp\n0 x\n", "GPU\n"):
        try:
            parse_rocm_smi(junk)
        except CollectorError:
            pass


def test_amd_smi_static_is_read_once_per_interval_metric_every_patrol():
    metric = json.loads(text(AMD_POWER).split("\n", 1)[1])
    calls = []
    outputs = {
        ("amd-smi", "metric", "--json"): json.dumps(metric),
        ("amd-smi", "static", "--json"): text(AMD_STATIC),
    }
    collector = AmdCollector({})

    def run(argv, timeout):
        calls.append(argv[1])
        return ToolOutput(tuple(argv), outputs[tuple(argv)], "", 0, False, 0.01)

    collector.runner = run
    for _ in range(3):
        (card,) = collector.collect().records
        assert (card.model, card.power_watts) == ("MI300A", 10.0)
    assert calls == ["metric", "static", "metric", "metric"]
    # a GPU the last static read did not list: static is read again at once
    outputs[("amd-smi", "metric", "--json")] = json.dumps(metric + [dict(metric[0], gpu=1)])
    calls.clear()
    assert [c.index for c in collector.collect().records] == [0, 1]
    assert calls == ["metric", "static"]
