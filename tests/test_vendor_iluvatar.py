"""Iluvatar plugin on the recorded ``ixsmi`` table (IX-ML 3.1.1, BI-V100; read in place,
values read off the table by hand). The recording is cut inside its process table."""

from __future__ import annotations

import pytest
from conftest import samples_dir
from vendor_helpers import assert_error_with_raw, assert_hung_and_missing, collect_with

from hetpatrol.collector import STATE_OK
from hetpatrol.collectors.iluvatar import IluvatarCollector, card_type_for
from hetpatrol.config import load_config
from hetpatrol.judge import judge

SAMPLE = samples_dir("other-vendors") / "iluvatar-ixsmi-IX-ML-3.1.1-BI-V100.txt"
MIB = 1048576


def collect(output):
    return collect_with(IluvatarCollector, output)


def test_one_bi_v100_and_a_cut_process_table():
    text = SAMPLE.read_text()
    result = collect(text)
    assert result.state == STATE_OK
    (card,) = result.records
    # | IX-ML: 3.1.1       Driver Version: 3.1.0       CUDA Version: 10.2          |
    # | 0    Iluvatar BI-V100         | 00000000:98:00.0     | 1500MHz   1200MHz    |
    # | 0%   30C   P0    40W / 250W   | 257MiB / 32768MiB    | 0%        Default    |
    assert (card.vendor, card.index, card.model, card.card_type) == (
        "iluvatar",
        0,
        "Iluvatar BI-V100",
        "bi-v100",
    )
    assert (card.bus_id, card.driver_version) == ("0000:98:00.0", "3.1.0")
    assert (card.temperature_celsius, card.power_watts, card.power_limit_watts) == (
        30.0,
        40.0,
        250.0,
    )
    assert (card.memory_used_bytes, card.memory_total_bytes) == (257 * MIB, 32768 * MIB)
    assert card.utilization_ratio == 0.0 and card.clock_sm_hertz == 1500e6
    # the recording ends after "No running processes found" without the closing border:
    # processes unknown, the cut said, the raw text kept
    assert card.processes == []
    assert {
        "source": "ixsmi processes",
        "error": "unknown: process table cut or its rows not read",
    } in (card.errors)
    assert result.raw == text and result.error == "ixsmi: process table missing or cut"
    judge(card, load_config(text="node: t\nlisten: null\n"))
    assert (card.gres, card.health) == ("gpu", "ok")


def test_closed_empty_process_table_means_no_processes():
    text = SAMPLE.read_text().rstrip("\n") + "\n+" + "-" * 77 + "+\n"
    result = collect(text)
    (card,) = result.records
    assert result.error is None and not any("process" in e["source"] for e in card.errors)


def test_process_rows_are_refused_not_guessed():
    text = SAMPLE.read_text().replace(
        "No running processes found                                                 ",
        "   0      51234     python                                          1024 ",
    )
    text = text.rstrip("\n") + "\n+" + "-" * 77 + "+\n"
    result = collect(text)
    (card,) = result.records
    assert card.processes == [] and "process rows not read" in result.error
    assert any(e["source"] == "ixsmi processes" for e in card.errors)


def test_garbled_and_cut_rows():
    bad = SAMPLE.read_text().replace("30C", "3#C")
    (card,) = collect(bad).records
    assert (
        card.temperature_celsius is None
        and {"source": "ixsmi Temp", "error": "'3#C'"} in card.errors
    )
    text = SAMPLE.read_text()
    cut = text[: text.index("257MiB") + 3]
    (card,) = collect(cut).records
    assert not card.read_ok and card.memory_used_bytes is None
    assert card.temperature_celsius == 30.0  # its closed cells stay read


@pytest.mark.parametrize("output", ["", "ixsmi: command failed\n", "\x00garbage"])
def test_no_table_is_an_error_with_raw(output):
    assert_error_with_raw(collect, output)


def test_hung_and_missing():
    assert_hung_and_missing(collect, ("ixsmi",), "Timestamp")


def test_card_types():
    assert [card_type_for(m) for m in ("Iluvatar BI-V100", "MR-V100", "BI-V150", None)] == [
        "bi-v100",
        "mr-v100",
        "bi-v150",
        "iluvatar",
    ]
