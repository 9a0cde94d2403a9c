"""Huawei Ascend NPUs through ``npu-smi info`` (the main table), one record per chip.

``npu-smi info`` is run once per patrol under a timeout (:func:`hetpatrol.tool.run_tool`
kills its process group when it hangs). Its table is parsed in one pass by
:func:`parse_npu_smi_info`: rows are split on ``|`` and then on whitespace, never at
fixed offsets, and the header rows say which value columns exist. Layouts from 20.2.0
(80 columns, no Hugepages) to 26.x (116 columns, 5-column process table) are handled.

Value sources (npu-smi column -> :class:`~hetpatrol.schema.CardRecord` field):

============================  =====================================================
``NPU``                       ``index`` (NPU ID: not 0..N, e.g. 215 or 32896)
``Chip``                      ``chip`` (Chip ID within the NPU)
``Name``                      ``model``; normalised by :func:`card_type_for` into
                              ``card_type``
``Health``                    ``vendor_health`` (raw: OK/Warning/Alarm/Critical/...)
``Power(W)``                  ``power_watts`` (``NA``/``-`` -> ``None`` + an error)
``Temp(C)``                   ``temperature_celsius``
``Hugepages-Usage(page)``     ``hugepages_used`` / ``hugepages_total`` (pages)
``Bus-Id``                    ``bus_id`` (normalised; ``NA`` -> ``None``)
``AICore(%)``                 ``utilization_ratio`` (= AICore / 100)
``HBM-Usage(MB)``             ``memory_used_bytes`` / ``memory_total_bytes`` with
                              ``memory_kind="hbm"`` when the column exists and its
                              total is > 0
``Memory-Usage(MB)``          the same with ``memory_kind="ddr"`` otherwise (310P,
                              310B, 310 cards have no HBM)
process table                 ``processes`` (pid, name, memory, pid in container)
``Version:`` (top line)       ``driver_version``
============================  =====================================================

npu-smi's "MB" are MiB: values are multiplied by 1048576 to give bytes.

Cut output (a tool killed mid-write, a pipe closed early) is handled this way:

- only cells closed by a ``|`` are trusted; in a cut row, the identity tokens (NPU ID,
  name, chip ID) that were followed by whitespace are kept, every value is dropped;
- a chip whose two rows are both complete is returned as read;
- a chip with only its first row, or whose second row is cut, is returned with
  ``complete=False``; the collector turns it into a record with ``read_ok=False`` and an
  error, so it is judged ``unknown``, never healthy;
- a chip row (line 2) without its NPU row (line 1) cannot be attributed and is dropped
  with a ``problems`` entry;
- a chip listed twice (a second block with the same NPU ID and Chip ID) is garbage: the
  first block is kept with ``complete=False`` and ``damage`` naming the duplicate, the
  repeat is dropped with a ``problems`` entry, so chips stay unique by (NPU, Chip);
- an empty (or NUL-filled) ``Health`` cell gives ``health=""`` and a ``problems`` entry:
  the record gets an ``npu-smi info Health`` error and the thresholds judge it
  ``unknown``, never ``ok``;
- ``truncated`` is set when the top ``npu-smi ... Version:`` line is missing (head cut),
  when a row or border is cut, or when the output does not end on a closing border;
- a missing process table means the processes are *unknown*, not "none"
  (:meth:`NpuSmiInfo.processes_known`); old 310 outputs legitimately have none, so that
  alone does not set ``truncated``. An NPU's processes are known when its complete
  "No running processes found in NPU N" row was read, or its process rows were closed by
  a border; an NPU absent from a complete table counts as "no processes" only if the
  table lists a later NPU (the records get an ``npu-smi info processes`` error otherwise);
- a cut falling exactly after a complete border line cannot be told from the real end
  of the table: the chips before it are returned as complete and ``truncated`` stays
  False. Missing cards are caught by comparing the count with the expected one (GRES).
"""

from __future__ import annotations

import functools
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hetpatrol.collector import (
    ARGV_SCHEMA,
    COLLECTOR_COMMON_OPTIONS,
    SECONDS_SCHEMA,
    STATE_ABSENT,
    Collector,
    CollectorError,
    CollectResult,
    DeviceNode,
    FaultCodes,
    GresDevice,
    JobEnvVar,
    VendorInfo,
)
from hetpatrol.collectors.ascend_actions import ACTIONS as ASCEND_ACTIONS
from hetpatrol.collectors.ascend_detail import DetailReader
from hetpatrol.collectors.ascend_levels import lookup_code
from hetpatrol.pci_census import CLASS_PROCESSING_ACCELERATOR, PciCards
from hetpatrol.schema import (
    HEALTH_CRITICAL,
    HEALTH_OK,
    HEALTH_UNKNOWN,
    HEALTH_WARNING,
    CardRecord,
    ProcessInfo,
    normalize_bus_id,
)
from hetpatrol.tool import ReplayTool, ToolOutput, run_tool

__all__ = [
    "AscendCollector",
    "NpuChip",
    "NpuProcess",
    "NpuSmiInfo",
    "card_type_for",
    "dcmi_return_code",
    "parse_npu_smi_info",
]

MIB = 1048576

#: DCMI return code meaning "not supported": treated as an absent stack, not a fault.
DCMI_NOT_SUPPORTED = -8255

_NA = frozenset({"NA", "N/A", "-", "--"})
_HEALTH_WORDS = frozenset({"ok", "warning", "alarm", "critical", "unknown", "minor", "major"})
_MAX_PROBLEMS = 50

#: How much of a runaway (size-capped) tool output is kept as ``raw``.
RAW_KEEP = 64 * 1024
_INT_RE = re.compile(r"[0-9]{1,12}")
_FLOAT_RE = re.compile(r"-?[0-9]{1,9}(?:\.[0-9]{1,9})?")
_PAIR_RE = re.compile(r"([0-9]{1,12}|NA|N/A|-)/([0-9]{1,12}|NA|N/A|-)")
_VERSION_RE = re.compile(r"npu-smi\s+(\S+)\s+Version:\s*(\S+)")
_NO_PROC_RE = re.compile(r"No running processes found in NPU\s+([0-9]{1,12})\s*$")
_BUS_RE = re.compile(r"[0-9a-fA-Fx]{2,8}:[0-9a-fA-Fx]{2}(?::[0-9a-fA-Fx]{2})?\.[0-7x]")
_DCMI_RES = (
    re.compile(r"ret is\s*(-[0-9]{1,6})"),
    re.compile(r"error code:?\s*(-[0-9]{1,6})", re.IGNORECASE),
    re.compile(r"(?<![0-9])(-8[0-9]{3})(?![0-9])"),
)

# Value columns: key -> (kind, field names). "pair" columns print "used / total".
_COLUMNS: dict[str, str] = {
    "power": "scalar",
    "temp": "scalar",
    "hugepages": "pair",
    "aicore": "scalar",
    "memory": "pair",
    "hbm": "pair",
}
_DEFAULT_LINE1 = ["power", "temp", "hugepages"]
_DEFAULT_LINE2 = ["aicore", "memory", "hbm"]
#: npu-smi column titles, for error sources.
COLUMN_TITLES = {
    "power": "Power(W)",
    "temp": "Temp(C)",
    "hugepages": "Hugepages-Usage(page)",
    "aicore": "AICore(%)",
    "memory": "Memory-Usage(MB)",
    "hbm": "HBM-Usage(MB)",
    "bus_id": "Bus-Id",
    "health": "Health",
}


@dataclass
class NpuChip:
    """One chip as two rows of the ``npu-smi info`` table show it.

    Units are npu-smi's: W, degrees C, pages, percent, MiB ("MB" in the headers).
    A value is ``None`` when the column is absent from this layout or its cell held no
    number; ``raw_values`` then keeps the cell text by column key (``"power": "NA"``,
    ``"temp": "cut"``...). ``phy_id`` is the ``Phy-ID`` column (A3), ``device_id`` the
    ``Device`` column (310 family); both ``None`` when not shown or when the header rows
    are missing. ``hbm_*`` are ``None`` on cards without an HBM column (DDR only).
    ``complete`` is False when either row was missing or cut (see module doc), or was
    damaged: a value cell holding something that is neither a number nor ``NA``/``-``,
    more values than columns, a Chip ID that is not a number, a Bus-Id that is not one
    (``damage`` then says what). Such a chip is never reported healthy.
    ``health`` is the ``Health`` cell as printed: ``""`` when that cell was closed but
    empty (health not read), ``None`` when the row ended before it.
    """

    npu_id: int
    chip_id: int | None = None
    name: str | None = None
    health: str | None = None
    phy_id: int | None = None
    device_id: int | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None
    hugepages_used: int | None = None
    hugepages_total: int | None = None
    bus_id: str | None = None
    aicore_percent: float | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    hbm_used_mib: int | None = None
    hbm_total_mib: int | None = None
    complete: bool = True
    raw_values: dict[str, str] = field(default_factory=dict)
    damage: str | None = None


@dataclass
class NpuProcess:
    """One row of the process table: NPU ID, Chip ID, Process id, Process name (``""``
    when npu-smi printed none, as for a process in another PID namespace), Process
    memory(MB) in MiB (``None`` if not a number), and "Process id in container"
    (26.x 5-column tables; ``None`` when absent or ``NA``)."""

    npu_id: int
    chip_id: int | None
    pid: int
    name: str
    memory_mib: int | None
    pid_in_container: int | None = None


@dataclass
class NpuSmiInfo:
    """Everything one ``npu-smi info`` table says.

    ``tool_version`` and ``driver_version`` come from the top line
    ``npu-smi <tool>  Version: <driver>`` (``None`` when it was cut away).
    ``chip_id_label`` is the second title of the ``Chip`` header cell (``"Phy-ID"``,
    ``"Device"``) or ``None``. ``has_hbm_column`` says whether the header showed
    ``HBM-Usage(MB)``. ``truncated`` and ``problems`` (human-readable notes on lines that
    were not understood) are described in the module doc.
    """

    tool_version: str | None = None
    driver_version: str | None = None
    chips: list[NpuChip] = field(default_factory=list)
    processes: list[NpuProcess] = field(default_factory=list)
    truncated: bool = False
    problems: list[str] = field(default_factory=list)
    chip_id_label: str | None = None
    has_hbm_column: bool | None = None
    process_table_seen: bool = False
    process_table_complete: bool = False
    process_npus_closed: set[int] = field(default_factory=set)

    def processes_known(self, npu_id: int) -> bool:
        """True when the process list of ``npu_id`` is fully known (possibly empty).

        True when the NPU's group of rows ("No running processes found in NPU N" or its
        process rows) was closed by a border, or when the table is complete and lists an
        NPU that comes after this one in the device table. False when there was no
        process table, or it was cut or damaged before this NPU's group.
        """
        if not self.process_table_seen:
            return False
        if npu_id in self.process_npus_closed:
            return True
        if not self.process_table_complete:
            return False
        # An NPU missing from a complete-looking table has no processes only if the table
        # went past it (groups follow the device order): a cut exactly after a group's
        # closing border looks like a complete table.
        order = list(dict.fromkeys(chip.npu_id for chip in self.chips))
        if npu_id not in order:
            return False
        later = order[order.index(npu_id) + 1 :]
        return any(n in self.process_npus_closed for n in later)

    def processes_of(self, npu_id: int, chip_id: int | None) -> list[NpuProcess]:
        """Process rows of one chip (the rows naming that NPU ID and Chip ID)."""
        return [p for p in self.processes if p.npu_id == npu_id and p.chip_id == chip_id]


# ----------------------------------------------------------------------------- helpers


def dcmi_return_code(text: str) -> int | None:
    """The DCMI return code in an npu-smi failure text (``ret is -8005`` -> -8005)."""
    for regex in _DCMI_RES:
        m = regex.search(text)
        if m:
            return int(m.group(1))
    return None


def _failure_message(text: str, what: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return "npu-smi info printed nothing"
    excerpt = "; ".join(lines[:3])
    if len(excerpt) > 240:
        excerpt = excerpt[:240] + "..."
    code = dcmi_return_code(text)
    if code is not None:
        return f"npu-smi info failed: DCMI return code {code}: {excerpt}"
    return f"npu-smi info: {what}: {excerpt}"


def _int(tok: str | None) -> int | None:
    if tok is not None and _INT_RE.fullmatch(tok):
        return int(tok)
    return None


def _float(tok: str | None) -> float | None:
    if tok is not None and _FLOAT_RE.fullmatch(tok):
        return float(tok)
    return None


def _pair(tok: str) -> tuple[int | None, int | None] | None:
    m = _PAIR_RE.fullmatch(tok)
    if not m:
        return None
    return _int(m.group(1)), _int(m.group(2))


def _column_key(title: str) -> str:
    """The value kind a column title names (``power``, ``hbm``...), or the title itself
    when unknown. A title whose unit in parentheses is not the one npu-smi prints
    (``HBM-Usage(GB)``, ``Temp(F)``) is unknown too: read as MB or °C it would be wrong
    by a factor, so its values are not read (and the problem is said)."""
    low = title.lower()
    for needle, key in (
        ("power", "power"),
        ("temp", "temp"),
        ("hugepage", "hugepages"),
        ("aicore", "aicore"),
        ("hbm", "hbm"),
        ("memory", "memory"),
    ):
        if needle in low:
            unit = _UNIT_RE.search(title)
            expected = _UNIT_RE.search(COLUMN_TITLES[key])
            if unit and expected and unit[1].lower() != expected[1].lower():
                return title
            return key
    return title  # unknown column: kept by its title


_UNIT_RE = re.compile(r"\(([^)]*)\)\s*$")


def _column_kind(key: str) -> str:
    return _COLUMNS.get(key, "pair" if "usage" in key.lower() else "scalar")


@functools.lru_cache(maxsize=64)
def _columns_by_kind(cols: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(scalar columns, pair columns) of a header, in order; once per layout."""
    return (
        tuple(c for c in cols if _column_kind(c) == "scalar"),
        tuple(c for c in cols if _column_kind(c) == "pair"),
    )


@dataclass
class _Row:
    """A ``|``-row: ``cells`` closed by ``|``; ``cut`` = trusted tokens of a final cell
    that was not closed (None when the row is complete)."""

    cells: list[str]
    cut: list[str] | None

    @property
    def complete(self) -> bool:
        return self.cut is None

    def tokens(self, i: int) -> list[str] | None:
        """Whitespace tokens of cell ``i``: from a closed cell, or the trusted ones of the
        cut cell; None when the row ends before it."""
        if i < len(self.cells):
            return self.cells[i].split()
        if i == len(self.cells) and self.cut is not None:
            return self.cut
        return None

    def text(self) -> str:
        parts = [" ".join(c.split()) for c in self.cells]
        return " ".join(parts + (self.cut or []))


def _split_row(line: str) -> _Row:
    body = line.lstrip()[1:]
    parts = body.split("|")
    tail = parts[-1]
    if len(parts) >= 2 and tail.strip() == "":
        return _Row(parts[:-1], None)
    toks = tail.split()
    if not tail[-1:].isspace():
        toks = toks[:-1]  # the last token may have been cut mid-word
    return _Row(parts[:-1], toks)


def _is_border(stripped: str) -> bool:
    return len(stripped) >= 2 and stripped[0] == "+" and set(stripped) <= {"+", "-", "="}


# ----------------------------------------------------------------------------- parser


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.info = NpuSmiInfo()
        self.line1_cols: list[str] | None = None
        self.line2_cols: list[str] | None = None
        self.header_seen = False
        self.section = "devices"
        self.pending: NpuChip | None = None
        self.pending_line_no = 0
        self.chips_seen: dict[tuple[int, int | None], NpuChip] = {}
        self.last_structural = ""  # "border", "cut-border", "row", "cut-row", "other"
        # process-table state
        self.group_npus: set[int] = set()
        self.process_table_npus: set[int] = set()  # every NPU the process table names
        self.group_damaged = False
        self.proc_damaged = False
        self.proc_cols: list[str] = []
        self.border_width = 0

    # -- bookkeeping
    def problem(self, msg: str) -> None:
        if len(self.info.problems) < _MAX_PROBLEMS:
            self.info.problems.append(msg)
        elif len(self.info.problems) == _MAX_PROBLEMS:
            self.info.problems.append("further problems not listed")

    def flush_pending(self, why: str) -> None:
        chip = self.pending
        if chip is None:
            return
        self.pending = None
        chip.complete = False
        self.problem(f"line {self.pending_line_no}: NPU {chip.npu_id}: {why}")
        self.add_chip(chip, self.pending_line_no)

    def add_chip(self, chip: NpuChip, no: int) -> None:
        """Append ``chip`` unless an earlier block had the same (NPU ID, Chip ID).

        npu-smi lists each chip once: a repeat is garbage. The first block is kept but
        marked damaged (so judged ``unknown``), the repeat is dropped.
        """
        key = (chip.npu_id, chip.chip_id)
        first = self.chips_seen.get(key)
        if first is None:
            self.chips_seen[key] = chip
            self.info.chips.append(chip)
            return
        dup = f"duplicate: NPU {chip.npu_id} Chip {chip.chip_id} listed again at line {no}"
        first.damage = f"{first.damage}; {dup}" if first.damage else dup
        first.complete = False
        self.problem(f"line {no}: duplicate NPU {chip.npu_id} Chip {chip.chip_id}: dropped")

    # -- main loop
    def run(self) -> NpuSmiInfo:
        text = self.text.replace("\x00", " ").replace("\t", " ")
        lines = text.splitlines()
        for no, raw in enumerate(lines, start=1):
            stripped = raw.strip()
            if not stripped:
                continue
            if stripped[0] == "+":
                self.on_border(stripped, no)
            elif stripped[0] == "|":
                row = _split_row(raw)
                self.last_structural = "row" if row.complete else "cut-row"
                if not row.complete:
                    self.info.truncated = True
                self.on_row(row, no)
            else:
                self.last_structural = "other"
                self.problem(f"line {no}: not a table line: {stripped[:80]!r}")
        return self.finish()

    def on_border(self, stripped: str, no: int) -> None:
        # A border cut exactly at a column junction still ends with "+": the borders of
        # one table all have the same width, so a narrower one was cut.
        complete = (
            _is_border(stripped)
            and stripped[-1] == "+"
            and len(stripped) > 2
            and len(stripped) >= self.border_width
        )
        self.border_width = max(self.border_width, len(stripped))
        if not complete:
            self.info.truncated = True
            self.last_structural = "cut-border"
            if not _is_border(stripped):
                self.problem(f"line {no}: damaged border: {stripped[:80]!r}")
        else:
            self.last_structural = "border"
        if self.section == "devices":
            self.flush_pending("chip row (line 2) missing")
        elif complete:
            if not self.group_damaged:
                self.info.process_npus_closed |= self.group_npus
            self.group_npus = set()
            self.group_damaged = False

    def on_row(self, row: _Row, no: int) -> None:
        flat = row.text()
        if row.complete and len(row.cells) == 1:
            m = _VERSION_RE.search(flat)
            if m:
                self.info.tool_version, self.info.driver_version = m.group(1), m.group(2)
                return
        if "Process id" in flat or "Process name" in flat:
            self.on_process_header(row)
            return
        first = row.tokens(0) or []
        if first and first[0] == "NPU" and ("Health" in flat or "Name" in flat):
            self.on_header1(row)
            return
        if first and first[0] == "Chip" and ("Bus-Id" in flat or "AICore" in flat):
            self.on_header2(row)
            return
        m = _NO_PROC_RE.search(flat) if len(row.cells) <= 1 else None
        if m or "No running processes" in flat:
            self.enter_processes()
            if m and row.complete:  # a whole statement: known at once, no border needed
                self.group_npus.add(int(m.group(1)))
                self.process_table_npus.add(int(m.group(1)))
                if not self.group_damaged:
                    self.info.process_npus_closed.add(int(m.group(1)))
            else:
                self.damage_processes(no, flat)
            return
        if self.section == "processes":
            self.on_process_row(row, no, flat)
        else:
            self.on_device_row(row, no, flat)

    # -- headers
    def on_header1(self, row: _Row) -> None:
        self.flush_pending("chip row (line 2) missing")
        self.section = "devices"
        self.header_seen = True
        toks = row.tokens(2)
        if toks is not None and row.complete:
            self.line1_cols = [_column_key(t) for t in toks]
            self.unknown_columns(self.line1_cols)

    def on_header2(self, row: _Row) -> None:
        self.section = "devices"
        self.header_seen = True
        first = row.tokens(0) or []
        if len(first) >= 2:
            self.info.chip_id_label = first[1]
        toks = row.tokens(2)
        if toks is not None and row.complete:
            self.line2_cols = [_column_key(t) for t in toks]
            self.info.has_hbm_column = "hbm" in self.line2_cols
            self.unknown_columns(self.line2_cols)

    def unknown_columns(self, cols: list[str]) -> None:
        for key in cols:
            if key not in _COLUMNS:  # a new or damaged title: its values are not read
                self.problem(f"unknown column {key[:30]!r}: its values are not read")

    def on_process_header(self, row: _Row) -> None:
        self.flush_pending("chip row (line 2) missing")
        self.enter_processes()
        self.proc_cols = []
        for cell in row.cells if row.complete else []:
            low = " ".join(cell.split()).lower()
            if "container" in low:
                self.proc_cols.append("pid_in_container")
            elif "process id" in low:
                self.proc_cols.append("pid")
            elif "name" in low:
                self.proc_cols.append("name")
            elif "memory" in low:
                self.proc_cols.append("memory")
            elif "npu" in low and "chip" in low:
                self.proc_cols.append("npu_chip")
            elif "npu" in low:
                self.proc_cols.append("npu")
            elif "chip" in low:
                self.proc_cols.append("chip")
            else:
                self.proc_cols.append(low)

    def enter_processes(self) -> None:
        if self.section != "processes":
            self.flush_pending("chip row (line 2) missing")
            self.section = "processes"
            self.info.process_table_seen = True
            self.group_npus = set()
            self.group_damaged = False

    def damage_processes(self, no: int, flat: str) -> None:
        self.group_damaged = True
        self.proc_damaged = True
        self.problem(f"line {no}: process row not understood: {flat[:80]!r}")

    # -- device rows
    def on_device_row(self, row: _Row, no: int, flat: str) -> None:
        hint = None
        if len(row.cells) >= 2:  # a closed second cell: Health (line 1) or Bus-Id (line 2)
            word = " ".join(row.cells[1].split())
            if _BUS_RE.fullmatch(word) or ":" in word:
                hint = 2
            elif word.lower() in _HEALTH_WORDS:
                hint = 1
        is_line2 = hint == 2 or (hint is None and self.pending is not None)
        if is_line2:
            if self.pending is None:
                self.info.truncated = self.info.truncated or not self.info.chips
                self.problem(f"line {no}: chip row without its NPU row: {flat[:80]!r}")
                return
            chip = self.pending
            self.pending = None
            self.parse_line2(chip, row, no)
            self.add_chip(chip, self.pending_line_no)  # named by its NPU row's line
        else:
            self.flush_pending("chip row (line 2) missing")
            chip = self.parse_line1(row, no, flat)
            if chip is not None:
                self.pending = chip
                self.pending_line_no = no

    def parse_line1(self, row: _Row, no: int, flat: str) -> NpuChip | None:
        first = row.tokens(0) or []
        npu = _int(first[0]) if first else None
        if npu is None:
            if row.complete:
                self.problem(f"line {no}: no NPU ID in row: {flat[:80]!r}")
            else:
                self.problem(f"line {no}: row cut before its NPU ID")
            return None
        chip = NpuChip(npu_id=npu, name=" ".join(first[1:]) or None)
        if not row.complete or len(row.cells) < 3:
            chip.complete = False
        if len(row.cells) >= 2:  # a closed Health cell; "" when empty (NULs are spaces)
            chip.health = " ".join(row.cells[1].split())
            if not chip.health:
                self.problem(f"line {no}: NPU {npu}: Health cell empty")
        values = self.values(row, 2, self.line1_cols or _DEFAULT_LINE1, chip, no)
        chip.power_watts = values.get("power")
        chip.temperature_celsius = values.get("temp")
        hp = values.get("hugepages")
        if hp is not None:
            chip.hugepages_used, chip.hugepages_total = hp
        self.extra_cells(row, no)
        self.check_damage(chip, no)
        return chip

    def parse_line2(self, chip: NpuChip, row: _Row, no: int) -> None:
        if not row.complete or len(row.cells) < 3:
            chip.complete = False
            self.problem(f"line {no}: NPU {chip.npu_id}: chip row cut")
        first = row.tokens(0) or []
        chip.chip_id = _int(first[0]) if first else None
        if chip.chip_id is None and row.complete:
            self.problem(f"line {no}: NPU {chip.npu_id}: no Chip ID")
            chip.damage = chip.damage or f"no Chip ID in {' '.join(first)[:20]!r}"
        if len(first) >= 2:
            second = _int(first[1])
            label = (self.info.chip_id_label or "").lower()
            if label.startswith("phy"):
                chip.phy_id = second
            elif label.startswith("device"):
                chip.device_id = second
        if len(row.cells) >= 2:
            chip.bus_id = " ".join(row.cells[1].split()) or None
            if chip.bus_id is None:
                chip.raw_values["bus_id"] = ""
            elif chip.bus_id not in _NA and not _BUS_RE.fullmatch(chip.bus_id):
                chip.raw_values["bus_id"] = chip.bus_id[:40]  # not a bus id: damaged
                chip.bus_id = None
        cols = self.line2_cols or _DEFAULT_LINE2
        values = self.values(row, 2, cols, chip, no)
        chip.aicore_percent = values.get("aicore")
        mem = values.get("memory")
        if mem is not None:
            chip.memory_used_mib, chip.memory_total_mib = mem
        hbm = values.get("hbm")
        if hbm is not None:
            chip.hbm_used_mib, chip.hbm_total_mib = hbm
        self.extra_cells(row, no)
        self.check_damage(chip, no)

    def check_damage(self, chip: NpuChip, no: int) -> None:
        """A complete row whose cells could not all be read is damaged, not complete.

        A pair cell with ``NA`` in it (``NA / NA``, ``N/A / 65536``: the driver did not
        report the value) is no damage: only that value is null, with the cell text as
        the reason (see :func:`_record`)."""
        bad = [
            f"{COLUMN_TITLES.get(k, k)} {v!r}"
            for k, v in chip.raw_values.items()
            if v not in _NA
            and v != "cut"
            and (k in _COLUMNS or k == "bus_id")
            and not (_COLUMNS.get(k) == "pair" and _PAIR_RE.fullmatch(v))
        ]
        if bad:
            chip.damage = chip.damage or "unreadable " + ", ".join(bad)
        if chip.damage and chip.complete:
            chip.complete = False
            self.problem(f"line {no}: NPU {chip.npu_id}: row damaged: {chip.damage}")

    def extra_cells(self, row: _Row, no: int) -> None:
        if len(row.cells) > 3:
            self.problem(f"line {no}: {len(row.cells)} cells where 3 were expected")

    def values(
        self, row: _Row, idx: int, cols: list[str], chip: NpuChip, no: int
    ) -> dict[str, Any]:
        """Assign the value tokens of cell ``idx`` to ``cols`` by kind and order."""
        out: dict[str, Any] = {}
        if idx >= len(row.cells):  # missing or cut: no value is trusted
            for key in cols:
                chip.raw_values[key] = "cut" if not row.complete else "missing"
            return out
        text = row.cells[idx]
        if "/" in text:
            # "0    / 0" -> "0/0"; split and strip, not a regex (\s*/\s* is quadratic on
            # a cell of many spaces)
            text = "/".join(part.strip() for part in text.split("/"))
        scalars: list[str] = []
        pairs: list[str] = []
        for tok in text.split():
            (pairs if "/" in tok else scalars).append(tok)
        want_s, want_p = _columns_by_kind(tuple(cols))
        for key, tok in zip(want_s, scalars, strict=False):
            if key not in _COLUMNS:
                chip.raw_values[key] = tok
                continue
            value = _float(tok)
            if value is None:
                chip.raw_values[key] = tok
                if tok not in _NA:
                    self.problem(f"line {no}: {COLUMN_TITLES.get(key, key)}: {tok[:20]!r}")
            out[key] = value
        for key, tok in zip(want_p, pairs, strict=False):
            if key not in _COLUMNS:
                chip.raw_values[key] = tok
                continue
            pair = _pair(tok)
            if pair is None or None in pair:
                chip.raw_values[key] = tok
                if pair is None:
                    self.problem(f"line {no}: {COLUMN_TITLES.get(key, key)}: {tok[:20]!r}")
                    continue
            out[key] = pair
        for key in want_s[len(scalars) :]:
            chip.raw_values.setdefault(key, "missing")
        # A missing HBM pair on a header-less table just means no HBM column.
        for key in want_p[len(pairs) :]:
            if not (key == "hbm" and self.line2_cols is None):
                chip.raw_values.setdefault(key, "missing")
        if len(scalars) > len(want_s) or len(pairs) > len(want_p):
            self.problem(f"line {no}: more values than columns: {text.strip()[:80]!r}")
            chip.damage = chip.damage or f"more values than columns: {text.strip()[:40]!r}"
        return out

    # -- process rows
    def on_process_row(self, row: _Row, no: int, flat: str) -> None:
        if not row.complete:
            self.damage_processes(no, flat)
            return
        cols = self.proc_cols or [
            "npu_chip",
            "pid",
            "name",
            "memory",
            "pid_in_container",
        ]
        npu = chip = pid = mem = in_container = None
        name = ""
        for key, cell in zip(cols, row.cells, strict=False):
            toks = cell.split()
            if key == "npu_chip":
                npu = _int(toks[0]) if toks else None
                chip = _int(toks[1]) if len(toks) > 1 else None
            elif key == "npu":
                npu = _int(toks[0]) if toks else None
            elif key == "chip":
                chip = _int(toks[0]) if toks else None
            elif key == "pid":
                pid = _int(toks[0]) if len(toks) == 1 else None
            elif key == "name":
                name = " ".join(toks)
            elif key == "memory":
                mem = _int(toks[0]) if len(toks) == 1 else None
            elif key == "pid_in_container":
                in_container = _int(toks[0]) if len(toks) == 1 else None
        if npu is None or pid is None or len(row.cells) != len(cols):
            self.damage_processes(no, flat)
            return
        self.info.processes.append(NpuProcess(npu, chip, pid, name, mem, in_container))
        self.group_npus.add(npu)
        self.process_table_npus.add(npu)

    # -- end
    def finish(self) -> NpuSmiInfo:
        info = self.info
        if self.pending is not None:
            info.truncated = True
            self.flush_pending("output ends before its chip row (line 2)")
        if not info.chips:
            what = "table header but no device rows" if self.header_seen else "no NPU table"
            raise CollectorError(_failure_message(self.text, what), raw=self.text)
        if info.driver_version is None:
            info.truncated = True
            self.problem("no 'npu-smi ... Version:' line: head of the output missing")
        if not self.header_seen:
            self.problem("no header rows: value columns inferred from their shapes")
        if self.last_structural != "border":
            info.truncated = True
            self.problem("output does not end on a closing border: tail missing")
        lost = sorted(self.process_table_npus - {c.npu_id for c in info.chips})
        if lost:  # npu-smi lists every NPU in both tables: device rows were lost
            info.truncated = True
            self.problem(
                f"NPU {', '.join(map(str, lost))} in the process table but not in the "
                "device table: its rows were lost"
            )
        if info.process_table_seen:
            info.process_table_complete = not self.proc_damaged and (
                self.last_structural == "border" and self.section == "processes"
            )
            if self.last_structural == "border" and not self.group_damaged:
                info.process_npus_closed |= self.group_npus
        return info


def parse_npu_smi_info(text: str) -> NpuSmiInfo:
    """Parse the stdout of ``npu-smi info`` (the main table) in one pass.

    Returns an :class:`NpuSmiInfo` with one :class:`NpuChip` per chip, in output order,
    and the process rows. Raises :class:`~hetpatrol.collector.CollectorError` (with
    ``raw=text``) for empty output, a DCMI failure text (the message names the return
    code, e.g. ``-8005``) or any output without a recognisable device row: never an
    "empty" result. No other exception escapes for any input.
    """
    if not isinstance(text, str):
        raise CollectorError("npu-smi info: output is not text", raw=None)
    try:
        return _Parser(text).run()
    except CollectorError:
        raise
    except Exception as exc:  # pragma: no cover - guard: a parser bug must not escape
        raise CollectorError(
            f"npu-smi info: internal parser error {type(exc).__name__}: {exc}", raw=text
        ) from exc


# ----------------------------------------------------------------------------- card type

_910_RE = re.compile(r"910(?:a|proa|prob|premiuma)?")


def card_type_for(name: str | None, chips_per_npu: int = 1, has_phy_id: bool = False) -> str:
    """Normalised card type (for thresholds and GRES) from the npu-smi ``Name`` column.

    ``910B1``..``910B4``, ``910B2C``, ``910B4-1`` -> ``"910b"``; ``910A``, ``910ProA``,
    ``910ProB``, ``910`` -> ``"910"``; ``Ascend910`` with 2+ chips per NPU or a
    ``Phy-ID`` column (Atlas A3) -> ``"910_93"``; ``310P1``/``310P3`` -> ``"310p"``;
    ``310B1``/``310B4`` -> ``"310b"``; ``310`` -> ``"310"``; anything else (masked
    ``xxx``, empty, unknown) -> ``"ascend"``. An ``Ascend`` prefix and spaces are ignored.
    """
    s = "".join((name or "").split()).lower()
    prefixed = s.startswith("ascend")
    if prefixed:
        s = s[len("ascend") :]
    if s == "910" and (chips_per_npu >= 2 or has_phy_id):
        return "910_93"
    if re.fullmatch(r"910b(?:[0-9][0-9a-z-]*)?", s):
        return "910b"
    if _910_RE.fullmatch(s):
        return "910"
    if re.fullmatch(r"310p[0-9]*", s):
        return "310p"
    if re.fullmatch(r"310b[0-9]*", s):
        return "310b"
    if s == "310":
        return "310"
    return "ascend"


# ----------------------------------------------------------------------------- collector

Runner = Callable[[Sequence[str], float], ToolOutput]


#: /dev/davinciN per NPU chip: an Atlas A3 node has 16 (vendor sample
#: npu-smi-info_910_93-A3_16chip_*).
ASCEND_MAX_CHIPS = 16


class AscendCollector(Collector):
    """Ascend NPUs through ``npu-smi info``: one :class:`CardRecord` per chip.

    Options (config section ``collectors.ascend``):

    - ``command``: argv list (or a shell-quoted string), default ``["npu-smi", "info"]``;
    - ``timeout_seconds``: default 10; the tool's process group is killed after it;
    - ``detail``, ``detail_interval_seconds``, ``detail_timeout_seconds``,
      ``detail_budget_seconds``, ``hccn_tool``: the slower detail commands
      (``npu-smi info -t health``, ``hccn_tool``), see
      :class:`hetpatrol.collectors.ascend_detail.DetailReader`.

    ``runner`` (``(argv, timeout_seconds) -> ToolOutput``) is :func:`run_tool`, or
    :meth:`ReplayTool.run` when ``replay_dir`` is set; tests may replace it.
    """

    name: ClassVar[str] = "ascend"
    #: npu-smi ``Health`` words: OK, Warning (minor alarm), Alarm (major), Critical
    #: (urgent), UNKNOWN (device absent or not started)
    vendor_info: ClassVar[VendorInfo] = VendorInfo(
        health_words={
            "ok": (HEALTH_OK, None),
            "warning": (HEALTH_WARNING, None),
            "alarm": (HEALTH_CRITICAL, None),
            "critical": (HEALTH_CRITICAL, None),
            "unknown": (HEALTH_UNKNOWN, None),
        },
        link_kinds=("roce",),
        # npu-smi / hccn_tool: the management nodes and one /dev/davinciN per chip
        # (hiascend.com: "Use in Containers", --device=/dev/davinciN /dev/davinci_manager
        # /dev/hisi_hdc /dev/devmm_svm).
        device_nodes=(
            DeviceNode("/dev/davinci_manager", "rw", "npu-smi"),
            DeviceNode("/dev/devmm_svm", "rw", "npu-smi"),
            DeviceNode("/dev/hisi_hdc", "rw", "npu-smi"),
            DeviceNode("/dev/davinci{n}", "rw", "npu-smi", None, ASCEND_MAX_CHIPS),
        ),
        # npu-smi: /usr/local/sbin (/usr/local/bin on some SoC boards), hiascend.com
        # MindCluster "Default Content Mounted by Ascend Docker Runtime"; hccn_tool:
        # /usr/local/Ascend/driver/tools (MindCluster fault-diagnosis guide,
        # "/usr/local/Ascend/driver/tools/hccn_tool -i ${device_id} -link -g").
        tool_dirs={
            "npu-smi": ("/usr/local/sbin", "/usr/local/bin"),
            "hccn_tool": ("/usr/local/Ascend/driver/tools",),
        },
        # gres.conf: File=/dev/davinci<physical chip id> (MindCluster, Ascend Docker
        # Runtime: "ls /dev/davinci*" lists the physical chip ids,
        # https://www.hiascend.com/document/detail/zh/mindcluster/730/clustersched/dlug/dlruntime_ug_004.html).
        # ASCEND_RT_VISIBLE_DEVICES takes logic ids (CANN env reference,
        # https://www.hiascend.com/document/detail/en/canncommercial/850/maintenref/envvar/envref_07_0028.html);
        # outside a container the physical id is the logic id (CANN runtime API,
        # aclrtGetPhyDevIdByUserDevId,
        # https://www.hiascend.com/document/detail/en/CANNCommunityEdition/910/API/runtimeapi/aclcppdevg_03_2286.html).
        # Slurm has no AutoDetect for Ascend and sets no variable for a GRES of this name.
        gres=GresDevice(
            "/dev/davinci{n}",
            number="device_number",
            visible_env=("ASCEND_RT_VISIBLE_DEVICES",),
            visible_id="device_number",
            visible_doc="https://www.hiascend.com/document/detail/en/canncommercial/850/maintenref/envvar/envref_07_0028.html",
            note="ids in ascending order only (CANN); not for DCMI/hccn_tool in the job",
        ),
        # PCI: vendor 19e5 (Huawei), NPUs are Processing accelerators [1200]. pci.ids has
        # no Ascend entry; the ids are Huawei's own log-collection script's
        # (PCIE_BDF_310="19e5:d100", 310P d500, 910 d801, 910B d802, 910_93 d803) and real
        # `lspci -nn` (tests/fixtures/lspci/). Only these ids: Huawei's Kunpeng ZIP/SEC/
        # HPRE engines are processing accelerators too, Hi1822 NICs Ethernet [0200].
        pci=PciCards(
            vendor_ids=(0x19E5,),
            classes=(CLASS_PROCESSING_ACCELERATOR,),
            device_types={
                0xD100: "310",
                0xD500: "310p",
                0xD801: "910",
                0xD802: "910b",
                0xD803: "910_93",
            },
            listed_only=True,
        ),
        # npu-smi error code -> MindCluster level -> action word
        actions=ASCEND_ACTIONS,
        # npu-smi info -t health's Error Codes: the MindCluster classes of
        # ascend_fault_codes.yaml (severity, action prose), judged by the fault_codes check
        fault_codes=FaultCodes("ascend_fault_code", "npu-smi -t health", lookup_code),
        # the job's chips: ASCEND_VISIBLE_DEVICES (Ascend Docker Runtime: the device IDs
        # given to a container, dlruntime_ug_004 above), else ASCEND_RT_VISIBLE_DEVICES
        # (the CANN runtime's visible logical devices, envref_07_0028 above): numbers of
        # the NPUs in (index, chip) order, the first set and readable one wins
        job_env=(
            JobEnvVar(
                "ASCEND_VISIBLE_DEVICES",
                doc="https://www.hiascend.com/document/detail/zh/mindcluster/730/clustersched/dlug/dlruntime_ug_004.html",
            ),
            JobEnvVar(
                "ASCEND_RT_VISIBLE_DEVICES",
                doc="https://www.hiascend.com/document/detail/en/canncommercial/850/maintenref/envvar/envref_07_0028.html",
            ),
        ),
    )

    #: ``collectors.ascend``: npu-smi's command and the detail sweep (ascend_detail.py)
    options_schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            **COLLECTOR_COMMON_OPTIONS,
            "detail": {"type": "boolean"},
            "detail_interval_seconds": {"type": "number", "minimum": 0, "maximum": 86400},
            "detail_timeout_seconds": SECONDS_SCHEMA,
            "detail_budget_seconds": SECONDS_SCHEMA,
            "hccn_tool": ARGV_SCHEMA,
        },
    }

    def __init__(self, options: Mapping[str, Any], *, replay_dir: Path | None = None):
        super().__init__(options, replay_dir=replay_dir)
        command = self.options.get("command", ["npu-smi", "info"])
        if isinstance(command, str):
            command = shlex.split(command)
        self.command: list[str] = [str(part) for part in command]
        self.timeout_seconds = float(self.options.get("timeout_seconds", 10))
        self.runner: Runner = (
            ReplayTool(self.replay_dir).run if self.replay_dir is not None else run_tool
        )
        # the detail commands go through self.runner too (tests may replace it)
        self.detail = DetailReader(
            self.options, self.command, lambda argv, timeout: self.runner(argv, timeout)
        )

    def collect(self) -> CollectResult:
        """Run ``npu-smi info`` once and turn each chip into a record.

        Returns ``state="absent"`` when the program does not exist (no Ascend stack) or
        DCMI says ``-8255`` (not supported). Raises :class:`CollectorError` when the tool
        hung (``hung=True``, partial stdout as ``raw``), exited non-zero, or printed
        something that is not an NPU table (``raw`` = stdout + stderr). A cut table gives
        ``state="ok"`` with ``raw`` kept and ``error`` saying what was cut.
        """
        argv = self.command
        started = time.monotonic()
        try:
            out = self.runner(argv, self.timeout_seconds)
        except FileNotFoundError as exc:
            return CollectResult(
                collector=self.name, state=STATE_ABSENT, error=f"{argv[0]} not found: {exc}"
            )
        except PermissionError as exc:
            raise CollectorError(f"{argv[0]} cannot be run: {exc}") from exc
        if out.hung:
            raise CollectorError(
                f"npu-smi info hung: killed after {self.timeout_seconds:g}s",
                raw=out.stdout,
                hung=True,
            )
        if getattr(out, "truncated", False):
            raise CollectorError(
                f"npu-smi info printed more than {len(out.stdout)} bytes: killed, output "
                "cut (first part kept as raw)",
                raw=out.stdout[:RAW_KEEP],
            )
        raw = out.stdout + (("\n" + out.stderr) if out.stderr.strip() else "")
        if out.returncode != 0:
            if dcmi_return_code(raw) == DCMI_NOT_SUPPORTED:
                return self._absent(raw)
            raise CollectorError(
                f"npu-smi info exited with code {out.returncode}: "
                + _failure_message(raw, "output"),
                raw=raw,
            )
        try:
            info = parse_npu_smi_info(out.stdout)
        except CollectorError as exc:
            if dcmi_return_code(raw) == DCMI_NOT_SUPPORTED:
                return self._absent(raw)
            raise CollectorError(str(exc), raw=raw) from exc
        result = CollectResult(collector=self.name, records=self.records_from(info))
        # detail commands only while they cannot push this collect past its timeout
        self.detail.attach(result.records, deadline=started + self.timeout_seconds - 1.0)
        if info.truncated or info.problems:
            result.raw = raw
            note = "npu-smi info output truncated" if info.truncated else "npu-smi info"
            result.error = f"{note}: " + "; ".join(info.problems[:3])
        return result

    def _absent(self, raw: str) -> CollectResult:
        return CollectResult(
            collector=self.name,
            state=STATE_ABSENT,
            error=f"npu-smi info: DCMI {DCMI_NOT_SUPPORTED} (not supported)",
            raw=raw,
        )

    @staticmethod
    def records_from(info: NpuSmiInfo) -> list[CardRecord]:
        """One :class:`CardRecord` per chip of ``info`` (``health`` left ``unknown``)."""
        chips_per_npu: dict[int, int] = {}
        for chip in info.chips:
            span = (chip.chip_id + 1) if chip.chip_id is not None else 1
            count = sum(1 for c in info.chips if c.npu_id == chip.npu_id)
            chips_per_npu[chip.npu_id] = max(chips_per_npu.get(chip.npu_id, 1), span, count)
        has_phy = (info.chip_id_label or "").lower().startswith("phy")
        return [_record(info, chip, chips_per_npu[chip.npu_id], has_phy) for chip in info.chips]


def _device_number(chip: NpuChip, chips_per_npu: int) -> int | None:
    """N of the chip's ``/dev/davinciN``: its physical id. The ``Phy-ID`` column (A3),
    else the ``Device`` column (310 family), else, for a one-chip NPU, the NPU ID (on the
    host the chip's logic id, which ``npu-smi info -m`` maps the NPU ID to one to one on
    every recorded one-chip server, is its physical id: CANN ``aclrtGetPhyDevIdByUserDevId``);
    None when none of these can say."""
    if chip.phy_id is not None:
        return chip.phy_id
    if chip.device_id is not None:
        return chip.device_id
    if chips_per_npu == 1 and chip.chip_id in (0, None):
        return chip.npu_id
    return None


def _record(info: NpuSmiInfo, chip: NpuChip, chips_per_npu: int, has_phy: bool) -> CardRecord:
    rec = CardRecord(
        vendor="ascend",
        index=chip.npu_id,
        chip=chip.chip_id,
        model=chip.name,
        card_type=card_type_for(chip.name, chips_per_npu, has_phy),
        bus_id=normalize_bus_id(chip.bus_id),
        device_number=_device_number(chip, chips_per_npu),
        driver_version=info.driver_version,
        vendor_health=chip.health,
        temperature_celsius=chip.temperature_celsius,
        hugepages_used=chip.hugepages_used,
        hugepages_total=chip.hugepages_total,
    )
    src = "npu-smi info "
    if not chip.complete:
        rec.read_ok = False
        why = f"table row damaged: {chip.damage}" if chip.damage else "table row cut or missing"
        rec.add_error("npu-smi info", f"{why}: chip not fully read")
    if chip.health == "":
        rec.add_error(src + COLUMN_TITLES["health"], "empty: health not read")
    raw = chip.raw_values

    def column_error(key: str, reason: str | None = None) -> None:
        value = raw.get(key, "")
        if value == "cut":  # covered by the row error above
            return
        pair = _PAIR_RE.fullmatch(value) if reason is None else None
        if pair is not None:  # "NA/NA", "N/A/65536": the driver did not say
            missing = [n for n, v in zip(("used", "total"), pair.groups(), strict=True) if v in _NA]
            reason = f"{value!r}: {' and '.join(missing)} not reported"
        rec.add_error(src + COLUMN_TITLES.get(key, key), reason or value or "empty")

    # Power: "NA" when not reported; "-" on chips > 0 of a multi-chip card (per card).
    rec.power_watts = chip.power_watts
    if chip.power_watts is None and "power" in raw:
        per_card = raw["power"] == "-" and bool(chip.chip_id)
        column_error("power", "- (power is reported per card, on chip 0)" if per_card else None)
    if chip.aicore_percent is not None and 0 <= chip.aicore_percent <= 100:
        rec.utilization_ratio = chip.aicore_percent / 100.0
    elif chip.aicore_percent is not None:
        column_error("aicore", f"{chip.aicore_percent:g} out of 0..100")
    # Memory: HBM when that column exists with a total, else DDR (Memory-Usage). A usage
    # column whose title is not understood may be the HBM one: then no DDR stand-in.
    unknown_usage = [k for k, v in raw.items() if k not in _COLUMNS and "/" in v]
    if chip.hbm_total_mib:
        rec.memory_kind = "hbm"
        rec.memory_total_bytes = chip.hbm_total_mib * MIB
        if chip.hbm_used_mib is not None:
            rec.memory_used_bytes = chip.hbm_used_mib * MIB
    elif unknown_usage:
        rec.add_error(src + "memory", f"not read: column {unknown_usage[0][:30]!r} not understood")
    elif "hbm" in raw:  # the HBM cell says NA (said below): DDR is no stand-in for it
        if chip.hbm_used_mib is not None:
            rec.memory_kind = "hbm"
            rec.memory_used_bytes = chip.hbm_used_mib * MIB
    elif chip.memory_total_mib:
        rec.memory_kind = "ddr"
        rec.memory_total_bytes = chip.memory_total_mib * MIB
        if chip.memory_used_mib is not None:
            rec.memory_used_bytes = chip.memory_used_mib * MIB
    elif not any(raw.get(k) == "cut" for k in ("memory", "hbm")):
        column_error("memory", None if raw.get("memory") else (raw.get("hbm") or "total 0"))
    for key in ("temp", "hugepages", "bus_id", "aicore", "hbm"):
        if key in raw:
            column_error(key)
    for key, value in raw.items():
        if key not in _COLUMNS and key != "bus_id":
            rec.add_error(src + key, f"column not understood: {value[:20]!r} not read")
    if "memory" in raw and rec.memory_kind == "ddr":
        column_error("memory")
    if info.processes_known(chip.npu_id):
        rec.processes = [
            ProcessInfo(
                pid=p.pid,
                name=p.name or None,
                memory_bytes=p.memory_mib * MIB if p.memory_mib is not None else None,
                pid_in_container=p.pid_in_container,
            )
            for p in info.processes_of(chip.npu_id, chip.chip_id)
        ]
    else:
        why = "process table cut" if info.process_table_seen else "no process table in output"
        rec.add_error("npu-smi info processes", f"unknown: {why}")
    return rec
