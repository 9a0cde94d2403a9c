"""Intel Gaudi plugin on the recorded ``hl-smi -Q ... --format csv,noheader`` rows
(``habana-hl-smi-csv-HL-325L.txt``, read in place; values read off the rows by hand)."""

from __future__ import annotations

import pytest
from conftest import samples_dir
from vendor_helpers import assert_error_with_raw, assert_hung_and_missing, collect_with

from hetpatrol.collector import STATE_OK
from hetpatrol.collectors.gaudi import HL_FIELDS, GaudiCollector, card_type_for
from hetpatrol.config import load_config
from hetpatrol.judge import judge

SAMPLE = samples_dir("other-vendors") / "habana-hl-smi-csv-HL-325L.txt"
MIB = 1048576
ARGV = ("hl-smi", "-Q", ",".join(HL_FIELDS), "--format", "csv,noheader")


def collect(output):
    return collect_with(GaudiCollector, output, argv=ARGV)  # the query the sample was read with


def test_two_hl_325l_cards():
    result = collect(SAMPLE.read_text())
    assert (result.state, result.error) == (STATE_OK, None)
    # 0, 01P4-HL3090A0-18-U4V193-22-07-00, HL-325L, 1.22.1-97ec1a4, 131072 MiB, 672 MiB,
    #    130400 MiB, 226 W, 850 W, 36 C, 0 %
    # 1, 01P4-HL3090A0-18-U4V298-03-04-04, ... 230 W, 850 W, 39 C, 0 %
    got = [
        (c.index, c.uuid, c.power_watts, c.temperature_celsius, c.utilization_ratio)
        for c in result.records
    ]
    assert got == [
        (0, "01P4-HL3090A0-18-U4V193-22-07-00", 226.0, 36.0, 0.0),
        (1, "01P4-HL3090A0-18-U4V298-03-04-04", 230.0, 39.0, 0.0),
    ]
    config = load_config(text="node: t\nlisten: null\n")
    for card in result.records:
        assert (card.model, card.card_type, card.driver_version) == (
            "HL-325L",
            "gaudi3",
            "1.22.1-97ec1a4",
        )
        assert (card.memory_total_bytes, card.memory_used_bytes) == (131072 * MIB, 672 * MIB)
        assert card.power_limit_watts == 850.0 and card.bus_id is None
        judge(card, config)
        assert (card.gres, card.health) == ("gpu", "ok")


def test_cut_row_is_not_read_and_the_cut_is_said():
    text = SAMPLE.read_text()
    cut = text[: text.index("230 W") + 3]  # card 1 cut after "230"
    result = collect(cut)
    assert [c.index for c in result.records] == [0]
    assert result.raw == cut and "cut" in result.error


def test_garbled_and_na_cells():
    text = SAMPLE.read_text().replace("36 C", "3# C").replace("230 W", "N/A")
    card0, card1 = collect(text).records
    assert card0.temperature_celsius is None and not card0.read_ok
    assert card1.power_watts is None and card1.read_ok
    assert {"source": "hl-smi power.draw", "error": "N/A: not reported"} in card1.errors


def test_a_row_with_a_cell_too_many_is_damaged():
    text = SAMPLE.read_text().replace("226 W,", "226 W, 7 W,")
    card0, card1 = collect(text).records
    assert not card0.read_ok and card1.read_ok


@pytest.mark.parametrize("output", ["", "hl-smi: no devices found\n", "\x00\x01"])
def test_no_rows_is_an_error_with_raw(output):
    assert_error_with_raw(collect, output)


def test_hung_and_missing():
    assert_hung_and_missing(collect, ARGV, "0, 01P4")


def test_card_types():
    assert [card_type_for(m) for m in ("HL-325L", "HL-225", "HL-205", None)] == [
        "gaudi3",
        "gaudi2",
        "gaudi",
        "gaudi",
    ]
