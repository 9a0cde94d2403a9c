"""Cambricon MLU plugin on the two recorded ``cnmon`` layouts (v4.20.11 and v5.10.13).

Samples are read in place from ``../shared/vendor-samples/other-vendors/``; every expected
value was read off the table by hand (the comments quote the rows).
"""

from __future__ import annotations

import pytest
from conftest import samples_dir
from vendor_helpers import assert_error_with_raw, assert_hung_and_missing, collect_with

from hetpatrol.collector import STATE_OK, CollectorError
from hetpatrol.collectors.cambricon import CambriconCollector, card_type_for, parse_cnmon
from hetpatrol.config import load_config
from hetpatrol.judge import judge
from hetpatrol.tool import ToolOutput

OTHER = samples_dir("other-vendors")
MIB = 1048576
V4 = "cambricon-cnmon-v4.20.11-MLU370-X4-3cards.txt"
V5 = "cambricon-cnmon-v5.10.13-MLU370-X8-2cards.txt"


def text(name: str) -> str:
    return (OTHER / name).read_text(encoding="utf-8")


def collect(output, **options):
    return collect_with(CambriconCollector, output, **options)


def test_v4_layout_three_mlu370_x4():
    result = collect(text(V4))
    assert (result.state, result.error) == (STATE_OK, None)
    # | 0     /   MLU370-X4    v1.1.6 | On          v4.20.11 | 0%          N/A       |
    # |  0%   32C         30 W/ 150 W |     0 MiB/ 23308 MiB | 10240 MiB/1048576 MiB |
    # card 1: 33C 25 W/ 150 W; card 2: 30C 26 W/ 150 W; all 0 MiB/ 23308 MiB, 0%
    got = [
        (c.index, c.model, c.temperature_celsius, c.power_watts, c.power_limit_watts)
        for c in result.records
    ]
    assert got == [
        (0, "MLU370-X4", 32.0, 30.0, 150.0),
        (1, "MLU370-X4", 33.0, 25.0, 150.0),
        (2, "MLU370-X4", 30.0, 26.0, 150.0),
    ]
    for card in result.records:
        assert (card.vendor, card.card_type) == ("cambricon", "mlu370")
        assert (card.firmware_version, card.driver_version) == ("v1.1.6", "4.20.11")
        assert (card.memory_used_bytes, card.memory_total_bytes) == (0, 23308 * MIB)
        assert card.utilization_ratio == 0.0
        # v4 has no Bus-Id column: null with the reason
        assert card.bus_id is None
        assert {"source": "cnmon Bus-Id", "error": "not in this cnmon layout (v4)"} in card.errors
        # Ecc-Error N/A: no counter, never 0
        assert "ecc_errors" not in card.counters and card.ecc_uncorrected_total is None
        # "No running processes found" in a closed process table: known, none
        assert card.processes == [] and not any("process" in e["source"] for e in card.errors)
        assert card.vendor_health is None and card.read_ok


def test_v5_layout_two_mlu370_x8_with_bus_ids():
    result = collect(text(V5))
    assert result.state == STATE_OK and result.error is None
    # | 0     /   MLU370-X8    v1.1.6 |         0000:39:00.0 | 0%                N/A |
    # |  0%   32C        106 W/ 250 W |     0 MiB/ 23374 MiB | N/A           Default |
    # card 1: 0000:3D:00.0, 39C, 106 W/ 250 W; title: CNMON v5.10.13  Driver v5.10.13
    got = [
        (c.index, c.bus_id, c.temperature_celsius, c.power_watts, c.power_limit_watts)
        for c in result.records
    ]
    assert got == [(0, "0000:39:00.0", 32.0, 106.0, 250.0), (1, "0000:3d:00.0", 39.0, 106.0, 250.0)]
    for card in result.records:
        assert (card.model, card.driver_version) == ("MLU370-X8", "5.10.13")
        assert (card.memory_used_bytes, card.memory_total_bytes) == (0, 23374 * MIB)
        assert card.errors == []


def test_profiles_and_judgement():
    config = load_config(text="node: t\nlisten: null\n")
    result = collect(text(V5))
    for card in result.records:
        judge(card, config)
    assert [(c.gres, c.health) for c in result.records] == [("mlu", "ok"), ("mlu", "ok")]
    assert config.profile_for("cambricon", "mlu370", "MLU370-X8").name == "cambricon-mlu370"


def test_process_rows_are_read():
    lines = text(V5).splitlines()
    at = next(i for i, x in enumerate(lines) if "No running processes found" in x)
    lines[at : at + 1] = [
        "|  0     0   51203   python train.py --mlu 0                   10240 MiB |",
        "|  1     0   51204   python train.py --mlu 1                    2048 MiB |",
    ]
    result = collect("\n".join(lines) + "\n")
    procs = [[(p.pid, p.name, p.memory_bytes) for p in c.processes] for c in result.records]
    assert procs == [
        [(51203, "python train.py --mlu 0", 10240 * MIB)],
        [(51204, "python train.py --mlu 1", 2048 * MIB)],
    ]


def test_cut_in_a_card_row_is_unknown_and_processes_unknown():
    full = text(V4)
    cut = full[: full.index("|  0%   33C") + 20]  # card 1's second row cut mid-cell
    result = collect(cut)
    assert [c.index for c in result.records] == [0, 1]
    assert [c.read_ok for c in result.records] == [True, False]
    assert result.raw == cut and result.error.startswith("cnmon output truncated")
    for card in result.records:
        assert {"source": "cnmon processes", "error": "unknown: process table missing or cut"} in (
            card.errors
        )
    config = load_config(text="node: t\nlisten: null\n")
    for card in result.records:
        judge(card, config)
    assert [c.health for c in result.records] == ["ok", "unknown"]


def test_garbled_cell_is_not_read():
    bad = text(V5).replace("32C        106 W/ 250 W", "3#C        106 W/ 250 W")
    (card0, card1) = collect(bad).records
    assert card0.temperature_celsius is None
    assert {"source": "cnmon Temp", "error": "'3#C'"} in card0.errors
    assert card1.temperature_celsius == 39.0


def test_a_cell_with_too_many_values_damages_the_card():
    bad = text(V5).replace("| 0%                N/A |", "| 0%      7       N/A |", 1)
    (card0, card1) = collect(bad).records
    assert not card0.read_ok and card1.read_ok


@pytest.mark.parametrize(
    "output",
    ["", "cnmon: error while loading shared libraries: libcndev.so\n", "\x00\x00garbage"],
)
def test_no_table_is_an_error_with_raw(output):
    assert_error_with_raw(collect, output)


def test_hung_missing_and_failed_tool():
    assert_hung_and_missing(collect, ("cnmon",), "+----")
    failed = ToolOutput(("cnmon",), "", "Cambricon driver not loaded\n", 3, False, 0.1)
    with pytest.raises(CollectorError, match="exited with code 3"):
        collect(failed)


def test_card_types():
    assert [card_type_for(m) for m in ("MLU370-X8", "MLU590-H8", "MLU290-M5", None)] == [
        "mlu370",
        "mlu590",
        "mlu290",
        "mlu",
    ]


def test_parse_cnmon_tolerates_header_only():
    lines = text(V4).splitlines()[:7]
    with pytest.raises(CollectorError):
        parse_cnmon("\n".join(lines))


def test_process_rows_map_to_their_slurm_job(tmp_path):
    """cnmon's PIDs go through the same /proc lookup as every vendor's (cgroup v2 path
    of a Slurm step: ``.../job_4242/step_0/...``)."""
    from hetpatrol.processes import enrich

    lines = text(V5).splitlines()
    at = next(i for i, x in enumerate(lines) if "No running processes found" in x)
    lines[at] = "|  1     0   51204   python train.py --mlu 1                    2048 MiB |"
    (card0, card1) = collect("\n".join(lines) + "\n").records
    proc = tmp_path / "51204"
    proc.mkdir()
    (proc / "status").write_text("Name:\tpython\nPPid:\t51200\nUid:\t0\t0\t0\t0\n")
    (proc / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n")
    enrich(card1.processes, proc_root=tmp_path)
    assert card0.processes == []
    assert [(p.pid, p.job_id, p.user) for p in card1.processes] == [(51204, "4242", "root")]
