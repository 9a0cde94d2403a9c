"""Enflame plugin on the recorded ``efsmi`` table (V1.2.0, 2 x S60; a documentation
excerpt read in place, values read off the table by hand)."""

from __future__ import annotations

import pytest
from conftest import samples_dir
from vendor_helpers import assert_error_with_raw, assert_hung_and_missing, collect_with

from hetpatrol.collector import STATE_OK
from hetpatrol.collectors.enflame import EnflameCollector, card_type_for
from hetpatrol.config import load_config
from hetpatrol.judge import judge

SAMPLE = samples_dir("other-vendors") / "enflame-efsmi-v1.2.0-S60-2cards.txt"


def collect(output):
    return collect_with(EnflameCollector, output)


def test_two_s60():
    result = collect(SAMPLE.read_text())
    assert (result.state, result.error) == (STATE_OK, None)
    # |EFSMI    V1.2.0.301       Driver Ver: 1.2.0.301                           |
    # | 0      S60                 | 33.6.2          | 00:01:00.0  Disable       |
    # | 39 C   Sleep    105W  300W | 49120MiB Disable|   0.0%      A073640510015 |
    # | 1      S60                 | 33.6.5          | 00:09:00.0  Enable        |
    # | 46 C   Active   128W  300W | 42976MiB Disable|   0.0%      C807J40510285 |
    got = [
        (
            c.index,
            c.firmware_version,
            c.bus_id,
            c.temperature_celsius,
            c.power_watts,
            c.power_limit_watts,
            c.serial,
        )
        for c in result.records
    ]
    assert got == [
        (0, "33.6.2", "0000:01:00.0", 39.0, 105.0, 300.0, "A073640510015"),
        (1, "33.6.5", "0000:09:00.0", 46.0, 128.0, 300.0, "C807J40510285"),
    ]
    config = load_config(text="node: t\nlisten: null\n")
    for card in result.records:
        assert (card.model, card.card_type, card.driver_version) == ("S60", "s60", "1.2.0.301")
        # not stated by the table: not read, with the reason
        assert card.memory_used_bytes is None and card.memory_total_bytes is None
        assert card.utilization_ratio is None
        sources = {e["source"] for e in card.errors}
        assert {"efsmi Mem", "efsmi DUsed", "efsmi processes"} <= sources
        judge(card, config)
        assert (card.gres, card.health) == ("gcu", "ok")


def test_cut_and_garbled():
    text = SAMPLE.read_text()
    cut = text[: text.index("128W") + 2]
    result = collect(cut)
    assert [c.read_ok for c in result.records] == [True, False]
    assert "tail missing" in result.error and result.raw == cut
    bad = text.replace("39 C", "3# C")
    card0, card1 = collect(bad).records
    assert not card0.read_ok and card0.temperature_celsius is None
    assert card1.temperature_celsius == 46.0


@pytest.mark.parametrize("output", ["", "efsmi: driver not loaded\n", "\x00garbage"])
def test_no_table_is_an_error_with_raw(output):
    assert_error_with_raw(collect, output)


def test_hung_and_missing():
    assert_hung_and_missing(collect, ("efsmi",), "----")


def test_card_types():
    assert [card_type_for(m) for m in ("S60", "T20", "i20", "", None)] == [
        "s60",
        "t20",
        "i20",
        "enflame",
        "enflame",
    ]
