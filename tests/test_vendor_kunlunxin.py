"""Kunlunxin plugin on the recorded ``xpu_smi`` output (R300, 2 XPUs; a documentation
excerpt read in place, values read off the DEVICES table by hand)."""

from __future__ import annotations

import pytest
from conftest import samples_dir
from vendor_helpers import assert_error_with_raw, assert_hung_and_missing, collect_with

from hetpatrol.collector import STATE_OK
from hetpatrol.collectors.kunlunxin import KunlunxinCollector, card_type_for
from hetpatrol.config import load_config
from hetpatrol.judge import judge

SAMPLE = samples_dir("other-vendors") / "kunlunxin-xpu_smi-R300-2cards.txt"
MIB = 1048576


def collect(output):
    return collect_with(KunlunxinCollector, output, argv=["xpu_smi"])


def test_two_r300():
    result = collect(SAMPLE.read_text())
    assert (result.state, result.error) == (STATE_OK, None)
    # |     0 | 0000:53:00.0 | R300  | 02Kxxx | /dev/xpu0  |     0 % | 0 / 63 MB | 0 / 32768 MB |
    # |     1 | 0000:56:00.0 | R300  | 02Kxxx | /dev/xpu1  |     0 % | 0 / 63 MB | 0 / 32768 MB |
    # Driver Version: 4.0
    assert [(c.index, c.bus_id) for c in result.records] == [
        (0, "0000:53:00.0"),
        (1, "0000:56:00.0"),
    ]
    config = load_config(text="node: t\nlisten: null\n")
    for card in result.records:
        assert (card.model, card.card_type, card.serial, card.driver_version) == (
            "R300",
            "r300",
            "02Kxxx",
            "4.0",
        )
        assert (card.memory_used_bytes, card.memory_total_bytes) == (0, 32768 * MIB)
        assert card.utilization_ratio == 0.0
        # not printed: None with the reason, never 0
        assert card.temperature_celsius is None and card.power_watts is None
        sources = {e["source"]: e["error"] for e in card.errors}
        assert sources["xpu_smi Temp"] == "no such column in this layout"
        assert sources["xpu_smi Power(W)"] == "no such column in this layout"
        # the empty PROCESSES table, closed by its border: no processes (known)
        assert card.processes == [] and "xpu_smi processes" not in sources
        judge(card, config)
        assert (card.gres, card.health) == ("xpu", "ok")


def test_process_rows_are_refused_not_guessed():
    text = SAMPLE.read_text()
    head, tail = text.rsplit("-------------------------------------------------\n", 1)
    text = head + "|     0 | 4242 |       1 |  0 | 1024 MB | python |\n" + "-" * 49 + "\n" + tail
    result = collect(text)
    assert "process rows not read" in result.error and result.raw == text
    for card in result.records:
        assert card.processes == []
        assert any(e["source"] == "xpu_smi processes" for e in card.errors)


def test_cut_output():
    text = SAMPLE.read_text()
    cut = text[: text.index("0000:56:00.0") + 5]  # XPU 1's row cut
    result = collect(cut)
    assert [c.index for c in result.records] == [0]
    assert "cut" in result.error and result.raw == cut
    assert any(e["source"] == "xpu_smi processes" for e in result.records[0].errors)


def test_garbled_cells():
    text = (
        SAMPLE.read_text()
        .replace("0000:53:00.0", "0000:5#:00.0")
        .replace(
            "|     0 % | 0 / 63 MB | 0 / 32768 MB |\n|     1",
            "|     0 % | 0 / 63 MB | 0 / 327#8 MB |\n|     1",
        )
    )
    card0, card1 = collect(text).records
    assert card0.bus_id is None and not card0.read_ok
    assert card0.memory_total_bytes is None
    assert card1.bus_id == "0000:56:00.0" and card1.read_ok


@pytest.mark.parametrize("output", ["", "xpu_smi: no device\n", "\x00garbage"])
def test_no_table_is_an_error_with_raw(output):
    assert_error_with_raw(collect, output)


def test_hung_and_missing():
    assert_hung_and_missing(collect, ("xpu_smi",), "Runtime")


def test_card_types():
    assert [card_type_for(m) for m in ("R300", "P800", "R200-8F", "", None)] == [
        "r300",
        "p800",
        "r200",
        "kunlunxin",
        "kunlunxin",
    ]
