"""Garbage from vendor tools (hypothesis), through the real collectors.

EVERY recorded ``npu-smi info`` table (``vendor-samples/ascend/npu-smi-info_*.txt``) and
EVERY ``nvidia-smi -q -x`` dump (``vendor-samples/nvidia/nvidia-smi-q-x_*.xml``), read in
place, is mutated: truncated, bytes replaced by garbage, lines dropped, cells swapped,
non-UTF-8 bytes inserted, blank lines added, CRLF line ends, value columns swapped in the
header and in every row alike, XML siblings reordered. The mutated text goes through the
real :class:`AscendCollector` (the runner answers with it, decoded as ``run_tool``
decodes) and the real :class:`NvidiaCollector` (a replay directory holding it), and each
card is judged with the bundled thresholds.

The collector must either return cards or raise :class:`CollectorError` with the raw
text kept; nothing else may escape. It must never invent a healthy card: a card judged
``ok`` must be a card of the unmutated output that was ``ok`` there too, and every value
it carries (numbers, health words, bus id, processes) must be the unmutated value; a
value it could not read must be ``None`` with an error entry, never a guess. Mutations
that change nothing a reader relies on (blank lines, CRLF, columns swapped consistently,
XML siblings reordered) must give exactly the unmutated cards.

Garbage bytes are never digits, letters, ``|``, ``/``, ``.``, ``-``, ``+``, ``:`` or
space: a digit turned into another digit is a different reading no parser can tell from
the truth. ``HETPATROL_FUZZ_EXAMPLES`` scales the example counts.
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from pathlib import Path

import pytest
from conftest import SAMPLES, samples_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetpatrol.collector import CollectorError
from hetpatrol.collectors.ascend import AscendCollector
from hetpatrol.collectors.nvidia import NvidiaCollector
from hetpatrol.collectors.nvml_replay import RAW_LIMIT
from hetpatrol.config import load_config
from hetpatrol.judge import judge
from hetpatrol.tool import ToolOutput

SCALE = float(os.environ.get("HETPATROL_FUZZ_EXAMPLES", "1"))
CONFIG = load_config()


def recorded(vendor: str, pattern: str) -> list:
    """The recorded sample names to fuzz, or one parameter skipped with the reason
    (pytest's own "got empty parameter set" says nothing of why)."""
    names = sorted(p.name for p in (SAMPLES / vendor).glob(pattern))
    if names:
        return names
    reason = f"no {pattern} under {SAMPLES / vendor} (../shared beside the checkout?)"
    return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-samples")]


ASCEND = recorded("ascend", "npu-smi-info_*.txt")
NVIDIA = recorded("nvidia", "nvidia-smi-q-x_*.xml")

#: bytes that make a token unreadable, never a different plausible reading
GARBAGE = [*b"#?@!*~^`%&$;=<>", *range(0x01, 0x09), 0x0B, 0x0C, 0x0E, 0x1F, 0x7F]
GARBAGE += list(range(0x80, 0x100))

#: values compared between a mutated ``ok`` card and its unmutated self
VALUES = (
    "vendor_health",
    "bus_id",
    "utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_celsius",
    "power_watts",
    "power_limit_watts",
    "clock_sm_hertz",
    "ecc_corrected_total",
    "ecc_uncorrected_total",
    "retired_pages_pending",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "pcie_link_gen",
    "pcie_link_gen_max",
    "pcie_link_width",
    "pcie_link_width_max",
    "hugepages_used",
    "hugepages_total",
)


def fuzz(n: int):
    return settings(
        max_examples=max(1, int(n * SCALE)),
        derandomize=True,  # the same examples in every run: CI never meets a new one
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def sample(vendor: str, name: str) -> bytes:
    return (samples_dir(vendor) / name).read_bytes()


# --------------------------------------------------------------------------- collectors


def collect_ascend(data: bytes):
    """Cards of ``data`` as stdout of npu-smi info, or the CollectorError."""
    text = data.decode("utf-8", errors="replace")  # exactly what run_tool hands over
    collector = AscendCollector({})
    collector.runner = lambda argv, timeout: ToolOutput(tuple(argv), text, "", 0, False, 0.0)
    try:
        result = collector.collect()
    except CollectorError as exc:
        assert exc.raw == text, "the raw text must be kept"
        return exc
    if result.state == "ok" and result.error:  # damage noted: the raw text is kept
        assert result.raw == text
    return [judge(rec, CONFIG) for rec in result.records]


def collect_nvidia(data: bytes):
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "nvidia-smi-q.xml").write_bytes(data)
        collector = NvidiaCollector({}, replay_dir=Path(tmp))
        try:
            result = collector.collect()
        except CollectorError as exc:
            # the dump's text is kept (its head, for a huge one)
            assert exc.raw == data[:RAW_LIMIT].decode("utf-8", "replace"), str(exc)
            return exc
        finally:
            collector.close()
    assert result.state == "ok", result
    return [judge(rec, CONFIG) for rec in result.records]


_clean: dict[tuple[str, str], object] = {}


def clean(vendor: str, name: str):
    key = (vendor, name)
    if key not in _clean:
        collect = collect_ascend if vendor == "ascend" else collect_nvidia
        _clean[key] = collect(sample(vendor, name))
    return _clean[key]


def cards_by_key(result) -> dict:
    if isinstance(result, CollectorError):
        return {}
    return {(c.index, c.chip): c for c in result}


def comparable(card) -> dict:
    doc = card.to_dict()
    doc.pop("ts", None)
    return doc


def changed_lines(vendor: str, name: str, mutated: bytes) -> str:
    """The lines a mutation changed, for the failure message."""
    before = sample(vendor, name).decode("utf-8", "replace").splitlines()
    after = mutated.decode("utf-8", "replace").splitlines()
    diff = difflib.unified_diff(before, after, lineterm="", n=0)
    return "\n".join(list(diff)[2:40])


def assert_never_invents(vendor: str, name: str, mutated: bytes, result) -> None:
    try:
        _assert_never_invents(vendor, name, result)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nmutation:\n{changed_lines(vendor, name, mutated)}") from None


def _assert_never_invents(vendor: str, name: str, result) -> None:
    truth = cards_by_key(clean(vendor, name))
    if isinstance(result, CollectorError):
        return
    for card in result:
        if card.health != "ok":
            continue
        key = (card.index, card.chip)
        assert key in truth, f"invented healthy card {key}: {comparable(card)}"
        real = truth[key]
        assert real.health == "ok", f"{key} is {real.health}, reported ok"
        for field in VALUES:
            got, want = getattr(card, field), getattr(real, field)
            if got is None:
                continue  # not read: must say why (below), never guessed
            assert got == want, f"{key}.{field}: {got!r} reported, {want!r} read clean"
        missing = [f for f in VALUES if getattr(card, f) is None and getattr(real, f) is not None]
        if missing:
            assert card.errors, f"{key}: {missing} dropped without an error entry"
        if not any("processes" in e["source"].lower() for e in card.errors):
            # a dropped row looks like a process that ended; none may be made up, and a
            # memory figure is the real one or None (unreadable)
            real_procs = {p.pid: p.memory_bytes for p in real.processes}
            for proc in card.processes:
                assert proc.pid in real_procs, (key, proc)
                assert proc.memory_bytes in (None, real_procs[proc.pid]), (key, proc)


def assert_same(vendor: str, name: str, result) -> None:
    want = clean(vendor, name)
    if isinstance(want, CollectorError):
        assert isinstance(result, CollectorError), result
        return
    assert not isinstance(result, CollectorError), result
    assert [comparable(c) for c in result] == [comparable(c) for c in want]


# ---------------------------------------------------------------------------- mutations


@st.composite
def damaged(draw, data: bytes, drop_lines: bool = True):
    """Truncation, garbage bytes, dropped lines, swapped cells, inserted non-UTF-8.

    XML gets no dropped lines: a dump without an element is, for the NVML replay, a dump
    of an older driver (no ``<reserved>``: ``used`` already holds it), a different truth.
    """
    out = bytearray(data)
    ops = ["truncate", "flip", "swap_cells", "high"] + (["drop_line"] if drop_lines else [])
    dropped = 0
    for _ in range(draw(st.integers(1, 3))):
        if not out:
            break
        op = draw(st.sampled_from(ops))
        if op == "drop_line" and dropped == 2:
            # a third dropped line can take exactly the tail of one chip block (its chip
            # row and border) and the head of the next (its NPU row): what is left is a
            # well-formed block naming the next chip's bus id, which no parser can tell
            op = "flip"
        dropped += op == "drop_line"
        pos = draw(st.integers(0, len(out) - 1))
        if op == "truncate":
            del out[pos:]
        elif op == "flip":
            out[pos] = draw(st.sampled_from(GARBAGE))
        elif op == "high":
            out[pos:pos] = bytes(draw(st.lists(st.integers(0x80, 0xFF), min_size=1, max_size=3)))
        elif op == "drop_line":
            lines = bytes(out).split(b"\n")
            del lines[draw(st.integers(0, len(lines) - 1))]
            out = bytearray(b"\n".join(lines))
        elif op == "swap_cells":
            lines = bytes(out).split(b"\n")
            # device rows only: two number cells of a process row swapped (pid, memory)
            # read as another process, which no parser can tell from a real one
            procs = [i for i, ln in enumerate(lines) if b"Process" in ln] or [len(lines)]
            rows = [i for i, ln in enumerate(lines[: procs[0]]) if ln.count(b"|") >= 3]
            if rows:
                i = draw(st.sampled_from(rows))
                cells = lines[i].split(b"|")
                a, b = draw(st.lists(st.integers(1, len(cells) - 2), min_size=2, max_size=2))
                cells[a], cells[b] = cells[b], cells[a]
                lines[i] = b"|".join(cells)
                out = bytearray(b"\n".join(lines))
    return bytes(out)


@st.composite
def harmless(draw, data: bytes):
    """Extra blank lines and/or CRLF line ends: nothing a reader relies on changes."""
    lines = data.split(b"\n")
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(1, len(lines)))  # not before an <?xml?> declaration
        lines.insert(i, draw(st.sampled_from([b"", b"   ", b"\t", b"  \t "])))
    out = b"\n".join(lines)
    if draw(st.booleans()):
        out = out.replace(b"\n", b"\r\n")
    return out


_PAIR = re.compile(r"\S+\s*/\s*\S+|\S+")


def _tokens(cell: str) -> list[str]:
    return [re.sub(r"\s*/\s*", " / ", t) for t in _PAIR.findall(cell)]


@st.composite
def columns_swapped(draw, data: bytes):
    """Two value columns swapped in a header row AND in every row it governs: a layout
    npu-smi could print. The parser follows the header, so the cards must not change."""
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    headers = [
        i
        for i, ln in enumerate(lines)
        if ln.lstrip().startswith("|")
        and ln.count("|") == 4
        and re.match(r"\s*\|\s*(NPU|Chip)\s", ln)
        and ("Health" in ln or "Bus-Id" in ln)
    ]
    if not headers:
        return data
    h = draw(st.sampled_from(headers))
    head_cells = lines[h].split("|")
    titles = head_cells[3].split()
    if len(titles) < 2:
        return data
    a, b = draw(st.lists(st.integers(0, len(titles) - 1), min_size=2, max_size=2, unique=True))
    is_chip_header = "Bus-Id" in lines[h]

    def swap(cell_tokens):
        cell_tokens[a], cell_tokens[b] = cell_tokens[b], cell_tokens[a]
        return " " + " ".join(cell_tokens) + " "

    head_cells[3] = swap(titles)
    lines[h] = "|".join(head_cells)
    # the rows of the same kind (NPU rows or chip rows) until the process table
    for i in range(h + 1, len(lines)):
        ln = lines[i]
        if "Process id" in ln or "Process name" in ln:
            break
        if ln.count("|") != 4 or not ln.lstrip().startswith("|"):
            continue
        cells = ln.split("|")
        second = cells[2].strip()
        chip_row = ":" in second or second in ("NA", "N/A", "-")
        if chip_row != is_chip_header or re.match(r"\s*\|\s*(NPU|Chip)\s", ln):
            continue
        toks = _tokens(cells[3])
        if len(toks) != len(titles):
            return data  # a ragged row: this layout cannot be swapped consistently
        cells[3] = swap(toks)
        lines[i] = "|".join(cells)
    return "\n".join(lines).encode()


@st.composite
def siblings_swapped(draw, data: bytes):
    """Two adjacent one-line XML elements swapped: the dump says the same thing."""
    lines = data.split(b"\n")
    one_line = re.compile(rb"^\s*<([A-Za-z_][\w.-]*)>[^<]*</\1>\s*$")
    pairs = [
        i
        for i in range(len(lines) - 1)
        if one_line.match(lines[i])
        and one_line.match(lines[i + 1])
        and len(lines[i]) - len(lines[i].lstrip()) == len(lines[i + 1]) - len(lines[i + 1].lstrip())
        and one_line.match(lines[i]).group(1) != one_line.match(lines[i + 1]).group(1)
    ]
    for _ in range(draw(st.integers(1, 4))):
        if not pairs:
            break
        i = draw(st.sampled_from(pairs))
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    return b"\n".join(lines)


# -------------------------------------------------------------------------------- tests


def test_every_recorded_sample_is_fuzzed():
    samples_dir("ascend"), samples_dir("nvidia")  # skip, or fail under CI, when absent
    assert len(ASCEND) >= 20 and len(NVIDIA) >= 15


@pytest.mark.parametrize("name", ASCEND)
@fuzz(30)
@given(data=st.data())
def test_npu_smi_garbage_never_invents_a_healthy_card(name, data):
    mutated = data.draw(damaged(sample("ascend", name)))
    assert_never_invents("ascend", name, mutated, collect_ascend(mutated))


@pytest.mark.parametrize("name", ASCEND)
@fuzz(6)
@given(data=st.data())
def test_npu_smi_blank_lines_crlf_and_swapped_columns_change_nothing(name, data):
    raw = sample("ascend", name)
    mutated = data.draw(harmless(data.draw(columns_swapped(raw))))
    assert_same("ascend", name, collect_ascend(mutated))


@pytest.mark.parametrize("name", NVIDIA)
@fuzz(20)
@given(data=st.data())
def test_nvidia_xml_garbage_is_a_collector_error_or_true_cards(name, data):
    mutated = data.draw(damaged(sample("nvidia", name), drop_lines=False))
    assert_never_invents("nvidia", name, mutated, collect_nvidia(mutated))


@pytest.mark.parametrize("name", NVIDIA)
@fuzz(5)
@given(data=st.data())
def test_nvidia_xml_blank_lines_crlf_and_reordered_siblings_change_nothing(name, data):
    raw = sample("nvidia", name)
    mutated = data.draw(harmless(data.draw(siblings_swapped(raw))))
    assert_same("nvidia", name, collect_nvidia(mutated))
