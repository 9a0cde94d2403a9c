"""Garbage from the new vendors' tools (hypothesis), through their real collectors.

The same contract as ``test_fuzz_vendor_output.py`` holds for npu-smi and NVML: every
recorded Hygon / AMD ``rocm-smi`` and ``amd-smi`` output, both ``cnmon`` layouts,
``ixsmi``, ``xpu_smi``, ``efsmi`` and the ``hl-smi`` CSV rows, read in place, are mutated (cut,
bytes replaced by garbage, lines dropped, CRLF line ends) and handed to the collector
as ``run_tool`` would (undecodable bytes replaced). The collector returns cards or
raises :class:`CollectorError` with the raw text kept; nothing else escapes. A card
judged ``ok`` must be a card of the clean output that was ``ok`` there, and each value
it carries must be the clean value or ``None`` (with an error entry): never a guess.
CRLF line ends and JSON keys in another order must give exactly the clean cards.

Garbage bytes are never digits, letters, ``|``, ``/``, ``.``, ``-``, ``+``, ``:``,
quotes, braces or space (a digit turned into another is a different reading no parser
can tell from the truth). ``HETPATROL_FUZZ_EXAMPLES`` scales the example counts.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import samples_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetpatrol.collector import CollectorError
from hetpatrol.collectors.amd import ROCM_SMI_COMMAND, AmdCollector
from hetpatrol.collectors.cambricon import CambriconCollector
from hetpatrol.collectors.enflame import EnflameCollector
from hetpatrol.collectors.gaudi import HL_FIELDS, GaudiCollector
from hetpatrol.collectors.hygon import DEFAULT_COMMAND, HygonCollector
from hetpatrol.collectors.iluvatar import IluvatarCollector
from hetpatrol.collectors.kunlunxin import KunlunxinCollector
from hetpatrol.config import load_config
from hetpatrol.judge import judge
from hetpatrol.tool import ToolOutput

SCALE = float(os.environ.get("HETPATROL_FUZZ_EXAMPLES", "1"))
CONFIG = load_config(text="node: fuzz\nlisten: null\n")
OTHER = samples_dir("other-vendors")

#: sample -> (collector class, argv it answers, options)
SAMPLES = {
    "hygon-dcu-rocm-smi-json-dtk24.04.3.json": (HygonCollector, DEFAULT_COMMAND, {}),
    "hygon-dcu-rocm-smi-table-4cards.txt": (
        HygonCollector,
        ("rocm-smi",),
        {"command": ["rocm-smi"]},
    ),
    "amd-rocm-smi-json-rocm6.2.4-navi32.json": (AmdCollector, ROCM_SMI_COMMAND, {}),
    "amd-smi-static-MI300A-cpu-and-gpu0.txt": (AmdCollector, ("amd-smi", "static", "--json"), {}),
    "cambricon-cnmon-v4.20.11-MLU370-X4-3cards.txt": (CambriconCollector, ("cnmon",), {}),
    "cambricon-cnmon-v5.10.13-MLU370-X8-2cards.txt": (CambriconCollector, ("cnmon",), {}),
    "iluvatar-ixsmi-IX-ML-3.1.1-BI-V100.txt": (IluvatarCollector, ("ixsmi",), {}),
    "kunlunxin-xpu_smi-R300-2cards.txt": (KunlunxinCollector, ("xpu_smi",), {}),
    "enflame-efsmi-v1.2.0-S60-2cards.txt": (EnflameCollector, ("efsmi",), {}),
    "habana-hl-smi-csv-HL-325L.txt": (
        GaudiCollector,
        ("hl-smi", "-Q", ",".join(HL_FIELDS), "--format", "csv,noheader"),
        {},
    ),
}
#: the amd-smi metric answer that goes with the static sample (read in place too)
AMD_METRIC = ("amd-smi", "metric", "--json")

GARBAGE = [*b"#?@!*~^`%&$;=<>", *range(0x01, 0x09), 0x0B, 0x0C, 0x0E, 0x1F, 0x7F]
GARBAGE += list(range(0x80, 0x100))

VALUES = (
    "model",
    "bus_id",
    "uuid",
    "serial",
    "utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_celsius",
    "power_watts",
    "power_limit_watts",
    "ecc_corrected_total",
    "ecc_uncorrected_total",
)


def fuzz(n: int):
    return settings(
        max_examples=max(1, int(n * SCALE)),
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def run(name: str, data: bytes):
    """Judged cards of ``data`` as the sample's tool output, or the CollectorError."""
    cls, argv, options = SAMPLES[name]
    text = data.decode("utf-8", errors="replace")
    outputs = {tuple(argv): text}
    if cls is AmdCollector and argv[0] == "amd-smi":
        # the static sample is mutated; its metric partner stays clean
        outputs[AMD_METRIC] = (OTHER / "amd-smi-metric-power-json.txt").read_text()
    collector = cls(options)

    def runner(call, timeout):
        if tuple(call) not in outputs:
            raise FileNotFoundError(call[0])
        return ToolOutput(tuple(call), outputs[tuple(call)], "", 0, False, 0.0)

    collector.runner = runner
    try:
        result = collector.collect()
    except CollectorError as exc:
        assert exc.raw is not None, "the raw text must be kept"
        return exc
    if result.state == "ok" and result.error and cls is not AmdCollector:
        assert result.raw == text
    return [judge(rec, CONFIG) for rec in result.records]


_clean: dict[str, list] = {}


def clean(name: str) -> list:
    if name not in _clean:
        result = run(name, (OTHER / name).read_bytes())
        assert not isinstance(result, CollectorError), result
        _clean[name] = result
    return _clean[name]


def assert_never_invents(name: str, result) -> None:
    if isinstance(result, CollectorError):
        return
    truth = {c.index: c for c in clean(name)}
    for card in result:
        if card.health != "ok":
            continue
        assert card.index in truth, f"invented healthy card {card.index}"
        real = truth[card.index]
        assert real.health == "ok"
        for field in VALUES:
            got, want = getattr(card, field), getattr(real, field)
            if got is None:
                continue
            assert got == want, f"{name} card {card.index}.{field}: {got!r}, clean {want!r}"
        missing = [f for f in VALUES if getattr(card, f) is None and getattr(real, f) is not None]
        if missing:
            assert len(card.errors) > len(real.errors), f"{missing} dropped without a reason"
        clean_pids = {p.pid for p in real.processes}
        assert {p.pid for p in card.processes} <= clean_pids


NAMES = sorted(SAMPLES)


@pytest.mark.parametrize("name", NAMES)
def test_clean_samples_give_ok_cards(name):
    cards = clean(name)
    assert cards and all(c.health == "ok" for c in cards), [(c.index, c.health) for c in cards]


@pytest.mark.parametrize("name", NAMES)
@fuzz(60)
@given(data=st.data())
def test_cut_anywhere(name, data):
    raw = (OTHER / name).read_bytes()
    at = data.draw(st.integers(0, len(raw) - 1))
    assert_never_invents(name, run(name, raw[:at]))


@pytest.mark.parametrize("name", NAMES)
@fuzz(80)
@given(data=st.data())
def test_garbage_bytes(name, data):
    raw = bytearray((OTHER / name).read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.sampled_from(GARBAGE))
    assert_never_invents(name, run(name, bytes(raw)))


@pytest.mark.parametrize("name", NAMES)
@fuzz(40)
@given(data=st.data())
def test_lines_dropped(name, data):
    lines = (OTHER / name).read_bytes().splitlines(keepends=True)
    # at most two: cnmon's second row names no card, so dropping exactly a card's second
    # row, the border under it and the next card's first row splices two cards into one
    # well-formed block no reader can tell from the truth (npu-smi repeats the chip id)
    drop = data.draw(st.sets(st.integers(0, len(lines) - 1), min_size=1, max_size=2))
    kept = b"".join(x for i, x in enumerate(lines) if i not in drop)
    assert_never_invents(name, run(name, kept))


@pytest.mark.parametrize("name", NAMES)
def test_crlf_gives_the_clean_cards(name):
    raw = (OTHER / name).read_bytes().replace(b"\n", b"\r\n")
    got = run(name, raw)
    assert [c.to_dict() | {"ts": None} for c in got] == [
        c.to_dict() | {"ts": None} for c in clean(name)
    ]


def test_json_key_order_changes_nothing():
    name = "amd-rocm-smi-json-rocm6.2.4-navi32.json"
    doc = json.loads((OTHER / name).read_text())
    doc = {k: dict(reversed(list(v.items()))) for k, v in doc.items()}
    got = run(name, json.dumps(doc).encode())
    assert [c.to_dict() for c in got] == [c.to_dict() for c in clean(name)]
