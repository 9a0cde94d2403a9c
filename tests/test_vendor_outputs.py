"""Every plugin's parser on real outputs it was not built from: other tool versions,
card generations and damaged outputs found in other projects' docs, test data and bug
reports (``fixtures/vendor-outputs/``, sources in its ``SOURCES.md``). Each expected value
below was read off the recorded text by hand; the comments quote the rows.

The rules these hold the parsers to: columns by header name and unit, each value on its
own (one ``N/A`` nulls that value only, never its cell or its card), ``N/A`` with a note
is null, extra or reordered columns are read when their header is known, and a layout
not understood is refused with what was seen.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hetpatrol.collector import CollectorError
from hetpatrol.collectors.ascend import AscendCollector, parse_npu_smi_info
from hetpatrol.collectors.ascend_detail import DetailReader, read_chip_map
from hetpatrol.collectors.cambricon import parse_cnmon, records_from
from hetpatrol.collectors.enflame import parse_efsmi
from hetpatrol.collectors.gaudi import GaudiCollector, parse_hl_smi
from hetpatrol.collectors.iluvatar import parse_ixsmi
from hetpatrol.collectors.kunlunxin import parse_xpu_smi
from hetpatrol.collectors.nvidia import NvidiaCollector
from hetpatrol.collectors.nvml_replay import load_replay_nvml
from hetpatrol.collectors.rocm_family import parse_rocm_smi, to_record
from hetpatrol.config import load_config
from hetpatrol.judge import judge
from hetpatrol.schema import CardRecord
from hetpatrol.tool import ToolOutput

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "vendor-outputs"
HEALTHY_XML = OUT.parent / "nodes" / "healthy-mixed" / "nvidia-smi-q.xml"
MIB = 1 << 20


def text(vendor: str, name: str) -> str:
    return (OUT / vendor / name).read_text(encoding="utf-8")


def errors(rec: CardRecord) -> dict[str, str]:
    return {e["source"]: e["error"] for e in rec.errors}


def test_every_recording_has_its_source_and_a_test():
    sources = (OUT / "SOURCES.md").read_text(encoding="utf-8")
    this = Path(__file__).read_text(encoding="utf-8")
    files = sorted(p for p in OUT.glob("*/*") if p.is_file())
    assert len(files) >= 30
    for p in files:
        assert f"{p.parent.name}/{p.name}" in sources, p
        assert p.name in this, p
    per_vendor = {}
    for p in files:
        per_vendor[p.parent.name] = per_vendor.get(p.parent.name, 0) + 1
    assert all(n >= 3 for n in per_vendor.values()), per_vendor


# ---------------------------------------------------------------- rocm-smi (AMD, Hygon)


def test_rocm6_concise_two_row_cards_with_sensor_sub_header():
    # Device  [Model : Revision]    Temp        Power     Partitions  ...  PwrCap  VRAM%  GPU%
    #         Name (20 chars)       (Junction)  (Socket)  (Mem, Compute)
    # 3       [0x74a1 : 0x00]       45.0°C      178.0W    NPS1, SPX  ...   750.0W   17%   0%
    #         AMD Instinct MI300X
    read = parse_rocm_smi(text("amd", "rocm-smi_MI300Xx8_rocm6_concise_junction-socket.txt"))
    assert (read.source, read.truncated, read.problems) == ("rocm-smi table", False, [])
    assert [c.index for c in read.cards] == list(range(8))
    assert [c.temperature_celsius for c in read.cards] == [
        45.0,
        41.0,
        47.0,
        45.0,
        45.0,
        43.0,
        45.0,
        43.0,
    ]
    assert [c.power_watts for c in read.cards] == [
        173.0,
        179.0,
        180.0,
        178.0,
        175.0,
        175.0,
        175.0,
        176.0,
    ]
    assert {c.power_limit_watts for c in read.cards} == {750.0}
    assert {c.model for c in read.cards} == {"AMD Instinct MI300X"}
    assert all(c.complete and c.utilization_percent == 0.0 for c in read.cards)
    rec = to_record(read.cards[3], "amd", "mi300x", "rocm-smi table")
    assert rec.read_ok and rec.memory_total_bytes is None
    assert errors(rec)["rocm-smi memory"] == "the table prints VRAM% only: no bytes"


def test_rocm6_node_and_ids_columns_are_read_around():
    # Device  Node  IDs              Temp        Power     Partitions          SCLK ...
    #               (DID,     GUID)  (Junction)  (Socket)  (Mem, Compute, ID)
    # 5       7     0x74a1,   705    42.0°C      136.0W    NPS1, SPX, 0        131Mhz ...
    read = parse_rocm_smi(text("amd", "rocm-smi_MI300Xx8_rocm6_concise_Node-IDs-columns.txt"))
    assert read.problems == [] and len(read.cards) == 8
    card = read.cards[5]
    assert (card.index, card.temperature_celsius, card.power_watts) == (5, 42.0, 136.0)
    assert (card.power_limit_watts, card.utilization_percent, card.complete) == (750.0, 0.0, True)
    assert card.errors["rocm-smi model"] == "the table prints no model name"


def test_rocm6_edge_sensor_is_no_stand_in_and_a_cut_name_is_not_a_model():
    # Temp (Edge) 43.0°C; name row "AMD INSTINCT MI200 (" cut at 20 characters; no End line
    read = parse_rocm_smi(text("amd", "rocm-smi_MI200x2_rocm6_edge-avg_name-cut.txt"))
    assert read.truncated
    first, second = read.cards
    assert first.temperature_celsius is None
    assert first.errors["temperature"] == "this table prints the edge sensor only"
    assert (first.power_watts, first.power_limit_watts) == (0.0, 0.0)  # printed 0.0W
    assert (second.power_watts, second.power_limit_watts) == (217.0, 560.0)
    assert first.model is None and "cut at 20" in first.errors["rocm-smi model"]
    assert first.complete and second.complete


def test_rocm5_dieedge_and_secondary_die_na():
    # GPU  Temp (DieEdge)  AvgPwr  SCLK ...  PwrCap  VRAM%  GPU%
    # 0    39.0c           92.0W   800Mhz ... 560.0W    0%   0%
    # 1    28.0c           N/A     800Mhz ... 0.0W      0%   0%
    read = parse_rocm_smi(text("amd", "rocm-smi_MI250x8_rocm5_DieEdge_AvgPwr-NA.txt"))
    assert read.problems == [] and not read.truncated
    assert [c.power_watts for c in read.cards] == [92.0, None, 91.0, None, 97.0, None, 100.0, None]
    assert read.cards[1].errors["rocm-smi AvgPwr"] == "N/A: not reported"
    assert all(c.complete for c in read.cards)  # one N/A nulls that value only
    assert all(c.temperature_celsius is None for c in read.cards)  # DieEdge: not junction


def test_rocm62_plain_temp_header_is_read():
    # GPU  Temp   AvgPwr ...: 0  41.0c  96.0W ... 560.0W; 5  43.0c  N/A ... 0.0W
    read = parse_rocm_smi(text("amd", "rocm-smi_MI250Xx8_rocm6.2_Temp-AvgPwr_secondary-die-NA.txt"))
    assert [c.temperature_celsius for c in read.cards] == [
        41.0,
        31.0,
        34.0,
        35.0,
        35.0,
        43.0,
        35.0,
        37.0,
    ]
    assert (read.cards[0].power_watts, read.cards[5].power_watts) == (96.0, None)


def test_rocm_json_na_with_annotation_is_null_not_damage():
    # "Average Graphics Package Power (W)": "N/A (Secondary die)" on card1
    read = parse_rocm_smi(
        text("amd", "rocm-smi-json_MI250x2_secondary-die-NA_showuse-showmeminfo-P.json")
    )
    card0, card1 = read.cards
    assert (card0.power_watts, card0.utilization_percent) == (102.0, 50.0)
    assert (card0.memory_total_bytes, card0.memory_used_bytes) == (68702699520, 51527024640)
    assert card1.power_watts is None and card1.complete
    key = "Average Graphics Package Power (W)"
    assert card1.errors[key] == "N/A (Secondary die): not reported"
    assert (card1.utilization_percent, card1.memory_used_bytes) == (0.0, 11665408)
    rec = to_record(card1, "amd", "mi250", "rocm-smi")
    assert rec.read_ok


@pytest.mark.parametrize(
    "name, temps, powers, cap",
    [
        # DCU  Temp   AvgPwr  Fan   Perf    PwrCap  VRAM%  DCU%
        (
            "rocm-smi_DTK_Z100x4_manual-450W.txt",
            [44.0, 44.0, 44.0, 43.0],
            [20.0, 19.0, 18.0, 20.0],
            450.0,
        ),
        # DCU  Temp   AvgPwr   SCLK    MCLK  Fan ...: 0  44.0c  20.0W   1250Mhz 800Mhz 0.0% ...
        (
            "rocm-smi_DTK_Z100x4_SCLK-MCLK-one-space-apart.txt",
            [44.0, 44.0, 44.0, 43.0],
            [20.0, 19.0, 18.0, 20.0],
            450.0,
        ),
        ("rocm-smi_DTK_Z100x1_DeepXDE.txt", [47.0], [58.0], 450.0),
    ],
)
def test_hygon_dtk_tables(name, temps, powers, cap):
    read = parse_rocm_smi(text("hygon", name))
    assert read.problems == [] and not read.truncated
    assert {c.family for c in read.cards} == {"hygon"}
    assert [c.temperature_celsius for c in read.cards] == temps
    assert [c.power_watts for c in read.cards] == powers
    assert {c.power_limit_watts for c in read.cards} == {cap}
    assert all(c.complete and c.utilization_percent == 0.0 for c in read.cards)


def test_rocm_table_not_understood_says_what_it_saw():
    with pytest.raises(CollectorError) as err:
        parse_rocm_smi("WARNING: No AMD GPUs specified\nConcise Info\n")
    assert "saw 2 lines" in str(err.value) and "No AMD GPUs" in str(err.value)


# ---------------------------------------------------------------- hl-smi (Gaudi)


def test_hl_smi_141_table_with_mib_spelled_mib():
    # |   3  HL-205   N/A  | 0000:90:1d.0  N/A |  0  |
    # | N/A   32C   N/A    97W / 350W |    512Mib / 32768Mib |     0%   N/A |
    recs, problems = parse_hl_smi(text("gaudi", "hl-smi_HL-205x8_1.4.1_Mib-units_proc-NA.txt"))
    assert problems == [] and [r.index for r in recs] == list(range(8))
    r = recs[3]
    assert (r.model, r.card_type, r.bus_id, r.driver_version) == (
        "HL-205",
        "gaudi",
        "0000:90:1d.0",
        "1.4.0-d8f95f4",
    )
    assert (r.temperature_celsius, r.power_watts, r.power_limit_watts) == (32.0, 97.0, 350.0)
    assert (r.memory_used_bytes, r.memory_total_bytes) == (512 * MIB, 32768 * MIB)
    assert (r.utilization_ratio, r.counters, r.memory_kind) == (
        0.0,
        {"ecc_uncorrected_volatile": 0},
        "hbm",
    )
    assert [x.utilization_ratio for x in recs] == [0.02, 0.01, 0.03, 0.0, 0.01, 0.0, 0.04, 0.01]
    # every process row is "N/A": no process on any AIP, and that is known
    assert all(x.processes == [] and "hl-smi processes" not in errors(x) for x in recs)


def test_hl_smi_160_wrapped_process_row_makes_processes_unknown_not_empty():
    # |   1       2006754     C   python            <- the row breaks here, no closing |
    recs, problems = parse_hl_smi(text("gaudi", "hl-smi_HL-205x8_1.6.0_busy_proc-row-wrapped.txt"))
    assert problems == ["process row '1 2006754 C python' cut or not understood"]
    assert (recs[0].memory_used_bytes, recs[0].utilization_ratio) == (32454 * MIB, 0.63)
    assert (recs[2].temperature_celsius, recs[2].power_watts) == (20.0, 107.0)
    assert all(x.read_ok for x in recs)
    assert errors(recs[1])["hl-smi processes"] == "unknown: process table cut or a row not read"


def test_hl_smi_1151_gaudi2_and_1200_layout():
    (r,), problems = parse_hl_smi(text("gaudi", "hl-smi_HL-225x1_1.15.1_Gaudi2.txt"))
    assert problems == []
    assert (r.card_type, r.temperature_celsius, r.power_watts, r.power_limit_watts) == (
        "gaudi2",
        29.0,
        93.0,
        600.0,
    )
    assert (r.memory_used_bytes, r.memory_total_bytes, r.processes) == (768 * MIB, 98304 * MIB, [])
    # 1.20: "Volatile Uncor-Events", "Nic Driver Version", " 96W /  600W  " and the last
    # process row not closed by "|"
    recs, problems = parse_hl_smi(
        text("gaudi", "hl-smi_HL-225x8_1.20.0_Uncor-Events_proc-row-unclosed.txt")
    )
    assert [x.power_watts for x in recs] == [96.0, 78.0, 81.0, 92.0, 83.0, 80.0, 86.0, 100.0]
    assert recs[7].memory_used_bytes == 17538 * MIB and recs[0].driver_version == "1.19.1-6f47ddd"
    assert all(x.read_ok for x in recs)
    assert "hl-smi processes" in errors(recs[0])  # the cut row: processes unknown


def test_hl_smi_headered_csv_without_units():
    # name, uuid, power.draw [W], temperature.aip [C], utilization.aip [%], memory.used [MiB], ...
    # HL-205, 00P1-HL2000A1-14-P64X78-02-07-10, 96, 33, 12, 512, 32768
    recs, problems = parse_hl_smi(text("gaudi", "hl-smi-csv-headered-nounits_HL-205x8_1.18.0.txt"))
    assert problems == [] and [r.index for r in recs] == list(range(8))
    r = recs[2]
    assert (r.uuid, r.model, r.power_watts, r.temperature_celsius) == (
        "00P1-HL2000A1-14-P64X78-02-07-10",
        "HL-205",
        96.0,
        33.0,
    )
    assert (r.utilization_ratio, r.memory_used_bytes, r.memory_total_bytes) == (
        0.12,
        512 * MIB,
        32768 * MIB,
    )
    assert errors(r)["hl-smi index"] == "not in the query: numbered in row order"


def test_gaudi_collector_reads_the_table_when_its_command_prints_it(tmp_path):
    out = text("gaudi", "hl-smi_HL-225x1_1.15.1_Gaudi2.txt")
    records, problems = GaudiCollector({"command": ["hl-smi"]}).parse(out)
    assert problems == [] and records[0].bus_id == "0000:19:00.0"


# ---------------------------------------------------------------- ixsmi (Iluvatar)


def test_ixsmi_na_pair_nulls_power_only():
    # | 0%   33C   P0    N/A / N/A    | 114MiB / 32768MiB    | 0%        Default    |
    table, (rec,) = parse_ixsmi(text("iluvatar", "ixsmi_BI-V150S_IX-ML-4.0.0_power-NA-pair.txt"))
    assert table.problems == []
    assert (rec.model, rec.card_type, rec.bus_id) == (
        "Iluvatar BI-V150S",
        "iluvatar",
        "0000:8a:00.0",
    )
    assert rec.read_ok and rec.temperature_celsius == 33.0
    assert (rec.power_watts, rec.power_limit_watts) == (None, None)
    assert {e["error"] for e in rec.errors if e["source"] == "ixsmi Pwr:Usage/Cap"} == {
        "usage: N/A: not reported",
        "cap: N/A: not reported",
    }
    assert (rec.memory_used_bytes, rec.memory_total_bytes) == (114 * MIB, 32768 * MIB)
    assert (rec.clock_sm_hertz, rec.driver_version, rec.processes) == (500e6, "4.1.0", [])
    judge(rec, load_config(text="node: t\nlisten: null\n"))
    assert rec.health == "ok"  # judged by its values (the temperature read), not unknown


def test_ixsmi_301_seven_cards_cut_after_the_card_table():
    table, recs = parse_ixsmi(text("iluvatar", "ixsmi_BI-V100x7_IX-ML-3.0.1_cut-after-cards.txt"))
    assert table.problems == ["process table missing or cut"]
    assert [r.bus_id[5:7] for r in recs] == ["14", "15", "18", "1d", "1e", "25", "2d"]
    assert [r.power_watts for r in recs] == [54.0, 56.0, 54.0, 56.0, 55.0, 57.0, 55.0]
    assert [r.temperature_celsius for r in recs] == [31.0, 31.0, 30.0, 31.0, 32.0, 31.0, 30.0]
    assert all(r.read_ok and r.card_type == "bi-v100" for r in recs)
    assert "ixsmi processes" in errors(recs[0])


def test_ixsmi_rows_without_header_are_refused_with_what_was_seen():
    with pytest.raises(CollectorError) as err:
        parse_ixsmi(text("iluvatar", "ixsmi_BI-V100_rows-only_garbled-65535W_HEAD-CUT.txt"))
    assert "no GPU table" in str(err.value) and "8 '|' rows" in str(err.value)
    assert "Iluvatar BI-V100" in str(err.value)


# ---------------------------------------------------------------- cnmon (Cambricon)


@pytest.mark.parametrize(
    "name, version, temps, power, cap, total_mib, ecc",
    [
        # |  0%   41C         27 W/ 150 W |     0 MiB/ 23308 MiB | N/A         Exclusive |
        (
            "cnmon_v5.10.10_MLU370-X4x2_Exclusive.txt",
            "5.10.10",
            [41.0, 41.0],
            [27.0, 27.0],
            150.0,
            23308,
            None,
        ),
        # | 0  /  MLU370-X8  v1.1.6 |  0000:13:00.0 | 0%   0 |  ;  0%  28C  107 W/ 250 W
        (
            "cnmon_v5.10.22_MLU370-X8x2_Mode-FULL_Ecc0.txt",
            "5.10.22",
            [28.0, 32.0],
            [107.0, 107.0],
            250.0,
            20638,
            0,
        ),
    ],
)
def test_cnmon_v5_layouts(name, version, temps, power, cap, total_mib, ecc):
    table = parse_cnmon(text("cambricon", name))
    recs = records_from(table)
    assert (table.tool_version, table.problems, table.processes_known) == (version, [], True)
    assert [r.temperature_celsius for r in recs] == temps
    assert [r.power_watts for r in recs] == power
    assert {r.power_limit_watts for r in recs} == {cap}
    assert {r.memory_total_bytes for r in recs} == {total_mib * MIB}
    assert all(r.read_ok and r.processes == [] for r in recs)
    assert {r.counters.get("ecc_errors") for r in recs} == {ecc}


def test_cnmon_masked_total_nulls_that_value_only():
    # |  0%   35C        105 W/ 550 W |     0 MiB/ xxxxx MiB | FULL          Default |
    recs = records_from(
        parse_cnmon(text("cambricon", "cnmon_v5.10.31_MLU590x8_model-and-memory-masked.txt"))
    )
    assert len(recs) == 8
    r = recs[3]
    assert (r.bus_id, r.temperature_celsius, r.power_watts, r.power_limit_watts) == (
        "0000:73:00.0",
        34.0,
        109.0,
        550.0,
    )
    assert (r.memory_used_bytes, r.memory_total_bytes) == (0, None)
    assert errors(r)["cnmon Memory-Usage"] == "memory_total_bytes: 'xxxxx MiB' not a number in MiB"
    assert all(x.read_ok for x in recs)  # a masked value is not a damaged card


# ---------------------------------------------------------------- xpu_smi (Kunlunxin)


def test_xpu_smi_wide_layout_power_and_temperature_are_read():
    # | DevID | PCI Addr | Model | SN | INODE | State | UseRate | L3 | Memory | Power(W) | Temp |
    # |     0 | 0000:01:00.0 | R200 | 02K00Y6217V00009 | ... |  25 |   49 | ... | 0001.0002.0022 |
    # |     1 | 0000:06:00.0 | K100 | 000000000000022f | ... |  22 |   51 | ... | 0001.0015.0022 |
    recs, problems = parse_xpu_smi(
        text("kunlunxin", "xpu_smi_R200-K100_driver4.0_wide-Power-Temp-Freq.txt")
    )
    assert problems == []
    got = [
        (r.model, r.card_type, r.power_watts, r.temperature_celsius, r.firmware_version)
        for r in recs
    ]
    assert got == [
        ("R200", "r200", 25.0, 49.0, "0001.0002.0022"),
        ("K100", "k100", 22.0, 51.0, "0001.0015.0022"),
    ]
    assert (recs[1].memory_total_bytes, recs[1].serial) == (8064 * MIB, "000000000000022f")
    assert all(r.errors == [] and r.processes == [] for r in recs)


def test_xpu_smi_wide_layout_without_processes_section():
    recs, problems = parse_xpu_smi(
        text("kunlunxin", "xpu_smi_K200x4-dual-die_driver4.0_wide_no-PROCESSES.txt")
    )
    assert problems == ["no PROCESSES table"]
    assert [(r.power_watts, r.temperature_celsius) for r in recs] == [
        (37.0, 41.0),
        (37.0, 39.0),
        (36.0, 39.0),
        (36.0, 39.0),
    ]
    assert [r.bus_id for r in recs] == [
        "0000:86:00.0",
        "0000:86:00.0",
        "0000:af:00.0",
        "0000:af:00.0",
    ]
    assert errors(recs[0])["xpu_smi processes"] == "unknown: no PROCESSES table"


def test_xpu_smi_narrow_layout_says_the_columns_are_absent():
    # | 0 | 0000:06:00.0 | K200 | 0200210302000998 | /dev/xpu0 | 0 % | 14 / 16 MB | 504 / 8064 MB |
    recs, problems = parse_xpu_smi(
        text("kunlunxin", "xpu_smi_K200x4-dual-die_driver4.0_L3-and-memory-used.txt")
    )
    assert problems == []
    assert [r.memory_used_bytes for r in recs] == [504 * MIB, 504 * MIB, 0, 0]
    assert recs[2].bus_id == "0001:03:00.0"
    for r in recs:
        assert r.power_watts is None and r.temperature_celsius is None
        assert errors(r)["xpu_smi Temp"] == "no such column in this layout"


# ---------------------------------------------------------------- efsmi (Enflame)


def test_efsmi_14_two_word_names_degree_sign_and_slash_pair():
    # | 0      Enflame S60          | 33.6.5           | 00:23:00.0  Enable        |
    # | 71℃    Sleep    118W / 300W | 42976MiB Disable | 0%          C807B40520388 |
    recs, problems = parse_efsmi(text("enflame", "efsmi_1.4.0.3_S60x8_degC-sign_slash-pair.txt"))
    assert problems == [] and len(recs) == 8
    r = recs[0]
    assert (r.model, r.card_type, r.driver_version, r.firmware_version) == (
        "Enflame S60",
        "s60",
        "1.4.0.3",
        "33.6.5",
    )
    assert (r.bus_id, r.serial, r.read_ok) == ("0000:23:00.0", "C807B40520388", True)
    assert [x.temperature_celsius for x in recs] == [71.0, 74.0, 65.0, 70.0, 66.0, 68.0, 63.0, 66.0]
    assert [x.power_watts for x in recs] == [118.0, 121.0, 113.0, 113.0, 113.0, 114.0, 109.0, 114.0]
    assert {x.power_limit_watts for x in recs} == {300.0}


def test_efsmi_16_power_na_nulls_power_only():
    # | 34℃    LP0      N/A         | 23552MiB  SRIOV   | 0%          A018K30520031 |
    recs, problems = parse_efsmi(text("enflame", "efsmi_1.6.3.12_S60Gx2_SRIOV_power-NA.txt"))
    assert problems == []
    for r in recs:
        assert (r.model, r.temperature_celsius, r.power_watts, r.read_ok) == (
            "Enflame S60G",
            34.0,
            None,
            True,
        )
        assert errors(r)["efsmi Pwr(Usage/Cap)"] == "N/A: not reported"
    assert [r.bus_id for r in recs] == ["0000:2e:00.0", "0000:2f:00.0"]


def test_efsmi_17_boot_fw_ver():
    # | 0      Enflame L300         | 40.2.8.3          | 00:2d:00.0  Enable        |
    # | 35℃    LP1      68W / 300W  | 147456MiB Disable | 0%          A098Q50610048 |
    (r,), problems = parse_efsmi(text("enflame", "efsmi_1.7.2.14_L300x1_Boot-FW-VER_Lpm.txt"))
    assert problems == []
    assert (r.model, r.card_type, r.firmware_version, r.driver_version) == (
        "Enflame L300",
        "l300",
        "40.2.8.3",
        "1.7.2.14",
    )
    assert (r.temperature_celsius, r.power_watts, r.power_limit_watts) == (35.0, 68.0, 300.0)
    assert (r.serial, r.read_ok) == ("A098Q50610048", True)


# ---------------------------------------------------------------- npu-smi (Ascend)


@pytest.mark.parametrize(
    "name, aicore",
    [
        # | 0                         | 0000:C1:00.0  | 11          1413 / 15137      31842/ 32768 |
        (
            "npu-smi-info_910PremiumA_8card_AICore-busy_hugepages_v23.0.rc2.txt",
            [11, 90, 87, 15, 46, 65, 71, 71],
        ),
        (
            "npu-smi-info_910B3_8card_AICore-busy_procs_v24.1.rc2.1.txt",
            [10, 10, 13, 10, 10, 9, 15, 14],
        ),
        (
            "npu-smi-info_910B4_8card_AICore-16-on-one_HEAD-CUT_TAIL-CUT.txt",
            [16, 0, 0, 0, 0, 0, 0, 0],
        ),
    ],
)
def test_ascend_aicore_percent_to_ratio(name, aicore):
    info = parse_npu_smi_info(text("ascend", name))
    assert [c.aicore_percent for c in info.chips] == [float(a) for a in aicore]
    records = AscendCollector.records_from(info)
    assert [r.utilization_ratio for r in records] == [a / 100 for a in aicore]
    if "TAIL-CUT" in name:  # the process list stops after NPU 2: NPU 3-7 unknown, not none
        assert [bool(errors(r).get("npu-smi info processes")) for r in records] == [
            False,
            False,
            False,
            True,
            True,
            True,
            True,
            True,
        ]


def test_ascend_busy_910premiuma_values():
    # | 1     910PremiumA | OK | 295.7       41                34   / 34            |
    # | 0                 | 0000:81:00.0  | 90          1612 / 15137      31842/ 32768 |
    info = parse_npu_smi_info(
        text("ascend", "npu-smi-info_910PremiumA_8card_AICore-busy_hugepages_v23.0.rc2.txt")
    )
    chip = info.chips[1]
    assert (chip.power_watts, chip.temperature_celsius) == (295.7, 41.0)
    assert (chip.hugepages_used, chip.hugepages_total) == (34, 34)
    assert (chip.hbm_used_mib, chip.hbm_total_mib) == (31842, 32768)
    assert [(p.npu_id, p.pid, p.memory_mib) for p in info.processes][:2] == [
        (0, 5139, 31913),
        (1, 5141, 31913),
    ]


@pytest.mark.parametrize(
    "name, columns, logic_column, rows",
    [
        (
            "npu-smi-info-m_910_93-A3_Chip-Phy-ID_2chip-card_Mcu_PARTIAL.txt",
            ("NPU ID", "Chip ID", "Chip Logic ID", "Chip Phy-ID", "Chip Name"),
            "Chip Logic ID",
            [
                (0, 0, 0, "Ascend910"),
                (0, 1, 1, "Ascend910"),
                (0, 2, None, "Mcu"),
                (1, 0, 2, "Ascend910"),
            ],
        ),
        (
            "npu-smi-info-m_Ascend950PR_Slot-ID_Chip-Phy-ID_no-logic-id.txt",
            ("NPU ID", "Slot ID", "Chip ID", "Chip Phy-ID", "Chip Name"),
            "Chip Phy-ID",
            [(0, 0, 0, "Ascend950PR"), (1, 0, 1, "Ascend950PR")],
        ),
    ],
)
def test_chip_map_read_by_its_header(name, columns, logic_column, rows):
    got = read_chip_map(text("ascend", name))
    assert (got.columns, got.logic_column, list(got.rows), got.problems) == (
        columns,
        logic_column,
        rows,
        (),
    )


def test_chip_map_without_header_says_what_it_saw():
    got = read_chip_map("0 0 0 Ascend910B\n")
    assert got.rows == () and got.problems == (
        "no 'NPU ID ... Chip ID' header row: '0 0 0 Ascend910B'",
    )


class _Runner:
    """npu-smi/hccn_tool answered from recordings: ``-m`` from ``chip_map``, everything
    else from the recorded outputs of the ascend-roce-alarm node (fixtures/nodes)."""

    def __init__(self, chip_map: str):
        self.chip_map = chip_map
        self.node = OUT.parent / "nodes" / "ascend-roce-alarm"
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv, timeout):
        self.calls.append(tuple(argv))
        if tuple(argv[-1:]) == ("-m",):
            return ToolOutput(tuple(argv), self.chip_map, "", 0, False, 0.01)
        path = self.node / ("_".join(argv) + ".txt")
        if not path.exists():
            raise FileNotFoundError(argv[0])
        return ToolOutput(tuple(argv), path.read_text(), "", 0, False, 0.01)


def test_950_layout_reaches_the_roce_port_and_an_unmapped_chip_is_said():
    """On the 950 layout the old position reading took ``Slot ID`` for the chip and
    skipped every chip's RoCE port in silence; by the header, chip (0, 0) is logic id 0
    and its port is asked, and a chip the map does not list says so."""
    runner = _Runner(
        text("ascend", "npu-smi-info-m_Ascend950PR_Slot-ID_Chip-Phy-ID_no-logic-id.txt")
    )
    reader = DetailReader(
        {"detail": True, "detail_interval_seconds": 0}, ["npu-smi", "info"], runner
    )
    recs = [CardRecord(vendor="ascend", index=i, chip=0, vendor_health="OK") for i in (0, 1, 2)]
    reader.attach(recs)
    assert ("hccn_tool", "-i", "0", "-link", "-g") in runner.calls
    assert ("hccn_tool", "-i", "1", "-link", "-g") in runner.calls
    assert [link["link"] for link in recs[0].links] == [0]
    assert errors(recs[2])["npu-smi info -m"] == (
        "NPU 2 chip 0 has no logic id in the map (RoCE checks not run)"
    )
    assert "npu-smi info -m" not in errors(recs[0])


# ---------------------------------------------------------------- NVIDIA fabric registration

#: ``nvidia-smi -q`` key -> the element of ``nvidia-smi -q -x`` it prints (the v13 dumps
#: in ../shared: fabric/state, status, cliqueId, clusterUuid, health/summary, bandwidth)
_FABRIC_XML = {
    "State": "fabric/state",
    "Status": "fabric/status",
    "CliqueId": "fabric/cliqueId",
    "ClusterUUID": "fabric/clusterUuid",
    "Summary": "fabric/health/summary",
    "Bandwidth": "fabric/health/bandwidth",
}
_NONE = dict.fromkeys(
    ("state", "status", "clique_id", "cluster_uuid", "health_summary", "bandwidth")
)


@pytest.mark.parametrize(
    ("name", "lines", "fabric"),
    [
        (  # NVIDIA/gpu-operator #2511: the fabric manager never registered this GPU
            "nvidia-smi-q_Fabric_In-Progress_580.159.04_FRAGMENT.txt",
            {"State": "In Progress", "Status": "N/A", "CliqueId": "N/A",
             "ClusterUUID": "N/A", "Summary": "N/A", "Bandwidth": "N/A"},
            {**_NONE, "state": "In Progress"},
        ),
        (  # Azure/azhpc-images #506: registered with an error
            "nvidia-smi-q_Fabric_Completed_Insufficient-Resources_FRAGMENT.txt",
            {"State": "Completed", "Status": "Insufficient Resources", "CliqueId": "0",
             "ClusterUUID": "00000000-0000-0000-0000-000000000000"},
            {**_NONE, "state": "Completed", "status": "InsufficientResources",
             "clique_id": 0, "cluster_uuid": "00000000-0000-0000-0000-000000000000"},
        ),
        (  # kubernetes-sigs/dra-driver-nvidia-gpu #626: registered, fabric unhealthy
            "nvidia-smi-q_Fabric_Completed_Health-Unhealthy_grep-C3.txt",
            {"State": "Completed", "Status": "Success", "CliqueId": "2",
             "ClusterUUID": "dc6e40c4-d722-4357-9ba6-5291dd461278", "Summary": "Unhealthy",
             "Bandwidth": "Full"},
            {"state": "Completed", "status": "Success", "clique_id": 2,
             "cluster_uuid": "dc6e40c4-d722-4357-9ba6-5291dd461278",
             "health_summary": "Unhealthy", "bandwidth": "Full"},
        ),
    ],
)  # fmt: skip
def test_nvidia_fabric_recordings_read_key_by_key(name, lines, fabric):
    """Each recorded Fabric block holds these lines (by key name, each value on its
    own); the same values in a dump's <fabric> reach the record through the NVML calls
    the collector makes (v3 struct; v1 where the dump, like drivers before R550, has no
    CliqueId), one N/A nulling one value."""
    recorded = text("nvidia", name)
    for key, value in lines.items():
        assert re.search(rf"^\s*{key}\s+: {re.escape(value)}$", recorded, re.M), (key, value)
    overrides = {_FABRIC_XML[k]: v for k, v in lines.items()}
    nvml = load_replay_nvml(HEALTHY_XML, {"gpus": {0: {"xml_overrides": overrides}}})
    collector = NvidiaCollector({}, nvml=nvml)
    try:
        rec = collector.collect().records[0]
    finally:
        collector.close()
    assert rec.fabric == fabric
    assert not [e for e in rec.errors if "Fabric" in e["source"]]


def test_nvidia_fabric_state_not_supported_as_gpud_reads_it_on_gb200():
    """gpud's NVML table of a GB200 (leptonai/gpud #1108): State Not Supported with
    Status Success and Clique ID 0; the record keeps the state and nothing that only a
    completed registration gives, and no fabric finding is made."""
    recorded = text("nvidia", "gpud-fabric-state_GB200_NVML_Not-Supported.txt")
    assert re.search(r"^\| State\s+\| Not Supported\s+\|$", recorded, re.M)
    assert re.search(r"^\| Clique ID\s+\| 0\s+\|$", recorded, re.M)
    overrides = {"fabric/state": "Not Supported", "fabric/status": "Success",
                 "fabric/cliqueId": "0", "fabric/health/summary": "Not Supported",
                 "fabric/health/bandwidth": "Not Supported"}  # fmt: skip
    nvml = load_replay_nvml(HEALTHY_XML, {"gpus": {0: {"xml_overrides": overrides}}})
    collector = NvidiaCollector({}, nvml=nvml)
    try:
        rec = collector.collect().records[0]
    finally:
        collector.close()
    assert rec.fabric == {**_NONE, "state": "Not Supported"}
    judge(rec, load_config())
    assert not [f for f in rec.findings if f.check.startswith("fabric")]


# ------------------------------------------------------------- NVIDIA text kernel logs


@pytest.mark.parametrize(
    ("name", "faults"),
    [
        (  # NVIDIA/open-gpu-kernel-modules #1151: journalctl short, no kernel stamp
            "journalctl-k-short_rm-init-adapter-failed_repeated_595.71.05.txt",
            [("kernel", "0000:09:00.0", None, "rm_init_adapter_failed", "May 27 16:50:10")] * 5,
        ),
        (  # NVIDIA/open-gpu-kernel-modules #1150: the bare kernel: tag, no time at all
            "kernel-tag_xid-45-after-149-145_no-stamp_590.48.01.txt",
            [("xid", f"0000:{b}:00.0", 45, None, None)
             for b in ("dc", "ed", "ba", "97", "dc", "ba", "ed")],
        ),
        (  # a Fedora write-up: journalctl -b short, Xid 120 among other NVRM lines
            "journalctl-b-short_xid-120_gsp-task-exception_continuation.txt",
            [("xid", "0000:23:00.0", 120, None, "Aug 19 21:36:23")],
        ),
    ],
)  # fmt: skip
def test_nvidia_text_kernel_logs_read_record_by_record(name, faults):
    """Each GPU fault record of the recorded text logs, as read off the file: kind, bus
    id, Xid or reason and the time stamp as written (none where the line has none);
    every record gets its own name (tests/test_fault_events_text.py)."""
    from hetpatrol.kernel_log import TextLogReader

    events = [ev for ev, _when in TextLogReader(OUT / "nvidia" / name).read().events]
    assert [(e.kind, e.bus_id, e.xid, e.reason, e.log_time) for e in events] == faults
    assert len({e.record for e in events}) == len(events)


def test_journalctl_short_monotonic_prefix_is_taken_off():
    """``journalctl -o short-monotonic`` (systemd/systemd #22554): the kernel's stamp,
    the host and ``kernel:`` come off each real line. A GPU record in that shape (that
    prefix before the Xid 48 text of ../shared's syslog_xid-48 recording, composed: no
    recorded short-monotonic GPU line was found) is read with its stamp; a ``kernel[pid]:``
    tag is a user's ``logger -t kernel`` line, not the kernel's, and is not read."""
    from hetpatrol.kernel_log import TextLogReader, _strip_prefixes, parse_text

    name = "journalctl-short-monotonic_kernel-lines_prefix-shape.txt"
    lines = [_strip_prefixes(line) for line in text("nvidia", name).splitlines()]
    assert [(x.log_time, x.clock, x.text[:27]) for x in lines] == [
        ("4274.052063", ("boot", 4274.052063), "i915 0000:00:02.0: [drm:__i"),
        ("4274.089861", ("boot", 4274.089861), "ACPI: EC: interrupt blocked"),
        ("4596.683362", ("boot", 4596.683362), "ACPI: EC: interrupt unblock"),
        ("4599.484288", ("boot", 4599.484288), "i915 0000:00:02.0: [drm:__i"),
    ]
    assert TextLogReader(OUT / "nvidia" / name).read().events == []  # no GPU fault
    xid48 = (
        OUT.parents[2]
        / "shared"
        / "vendor-samples"
        / "nvidia"
        / "syslog_xid-48-dbe_xid-64_rminitadapter-failed.txt"
    ).read_text()
    record = xid48.splitlines()[3].split("] ", 1)[1]  # "NVRM: Xid (PCI:0000:07:00): 48, ..."
    events = parse_text(f"[ 4274.052063] fovo.local kernel: {record}")
    assert [(e.kind, e.bus_id, e.xid, e.log_time) for e in events] == [
        ("xid", "0000:07:00.0", 48, "4274.052063")
    ]
    assert parse_text(f"[ 4274.052063] fovo.local kernel[4242]: {record}") == []
