"""Intel Gaudi (Habana) accelerators through ``hl-smi -Q <fields> --format csv,noheader``,
one record per card.

The query names the fields, so each CSV column is read by the field name it was asked
for (``HL_FIELDS`` or the configured ``fields``), never by a guessed position, and each
cell by its unit (``131072 MiB``, ``226 W``, ``36 C``, ``0 %``). A row with more or fewer
cells than fields asked for, or a cell that is neither a number in the expected unit nor
``N/A``, is damage: that card is judged ``unknown``.

Value sources (query field -> :class:`~hetpatrol.schema.CardRecord` field):

=====================  ===========================================================
``index``              ``index``
``uuid``               ``uuid`` (the board serial, e.g. ``01P4-HL3090A0-18-U4V193-22-07-00``)
``name``               ``model``; :func:`card_type_for` -> ``card_type``
``driver_version``     ``driver_version``
``memory.total/used``  ``memory_total_bytes`` / ``memory_used_bytes`` (MiB, HBM)
``power.draw/max``     ``power_watts`` / ``power_limit_watts``
``temperature.aip``    ``temperature_celsius``
``utilization.aip``    ``utilization_ratio`` (/100)
``bus_id``             ``bus_id`` (when asked for; not in the default query)
=====================  ===========================================================

The recorded sample (``habana-hl-smi-csv-HL-325L.txt``, all-smi's parser test) was read
with the default query. A configured ``command`` may print another of hl-smi's forms,
each read by what it names (:func:`parse_hl_smi`): CSV with its header row
(``memory.used [MiB]`` over ``512``: the unit from the header) or the plain table
(:func:`parse_hl_smi_table`, hl-smi 1.4 to 1.20, which lists processes). hl-smi prints
no health word; the CSV forms list no processes: ``vendor_health`` is None, the
processes unknown (an error entry says so).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from hetpatrol.collector import CollectorError, DeviceNode, GresDevice, VendorInfo
from hetpatrol.collectors.smi_table import (
    describe,
    is_na,
    number_unit,
    parse_blocks,
    read_pair,
    read_side,
)
from hetpatrol.collectors.smi_tool import SmiToolCollector
from hetpatrol.pci_census import ACCELERATOR_CLASSES, PciCards
from hetpatrol.schema import CardRecord, ProcessInfo, normalize_bus_id

MIB = 1 << 20
HL_FIELDS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "memory.total",
    "memory.used",
    "memory.free",
    "power.draw",
    "power.max",
    "temperature.aip",
    "utilization.aip",
)
#: field -> (record attribute, unit hl-smi prints, factor)
_NUMERIC = {
    "memory.total": ("memory_total_bytes", "MiB", MIB),
    "memory.used": ("memory_used_bytes", "MiB", MIB),
    "power.draw": ("power_watts", "W", 1),
    "power.max": ("power_limit_watts", "W", 1),
    "temperature.aip": ("temperature_celsius", "C", 1),
    "utilization.aip": ("utilization_ratio", "%", 0.01),
}
_CELL = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,6})?)\s*([A-Za-z%]{1,4})")
_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._:/-]{0,80}")
_NA = frozenset({"N/A", "NA", "[N/A]", "-"})


def card_type_for(model: str | None) -> str:
    """``HL-325L``/``HL-338`` (Gaudi 3) -> ``"gaudi3"``, ``HL-225*`` (Gaudi 2) ->
    ``"gaudi2"``, ``HL-205`` -> ``"gaudi"``; anything else -> ``"gaudi"``."""
    m = re.search(r"HL-?([0-9]{2})", model or "", re.IGNORECASE)
    if m and m[1].startswith("3"):
        return "gaudi3"
    if m and m[1].startswith("2") and m[1] != "20":  # HL-205 is first-generation Gaudi
        return "gaudi2"
    return "gaudi"


def parse_hl_smi_csv(
    text: str, fields: tuple[str, ...] = HL_FIELDS
) -> tuple[list[CardRecord], list[str]]:
    """Records and problems of ``hl-smi -Q <fields> --format csv,noheader`` output.

    Raises :class:`CollectorError` (``raw=text``) when no row has a readable index."""
    records: list[CardRecord] = []
    problems: list[str] = []
    lines = text.splitlines()
    head = next((ln for ln in lines if ln.strip()), "")
    if _is_csv_header(head):
        return _parse_headered_csv(text, lines, problems)
    if lines and not text.endswith(("\n", "\r")):
        problems.append("last line has no line end: cut, not read")
        lines.pop()
    for line in lines:
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if not cells[0].isdigit():
            problems.append(f"row {line[:40]!r} not understood")
            continue
        rec = CardRecord(vendor="gaudi", index=int(cells[0]))
        records.append(rec)
        if len(cells) != len(fields):
            rec.read_ok = False
            rec.add_error("hl-smi", f"row has {len(cells)} cells for {len(fields)} fields")
            continue
        for name, cell in zip(fields, cells, strict=True):
            _cell(rec, name, cell)
        rec.card_type = card_type_for(rec.model)
        if rec.memory_total_bytes is not None:
            rec.memory_kind = "hbm"
        rec.add_error("hl-smi processes", "unknown: this query lists no processes")
    if not records:
        raise CollectorError(f"hl-smi: no card row in the output ({describe(text)})", raw=text)
    return records, problems


#: a header cell of ``--format csv`` (with its header row): ``memory.used [MiB]``
_HEADER_CELL = re.compile(r"([a-z][a-z0-9_.]{0,40})(?:\s*\[([A-Za-z%]{1,4})\])?")


def _is_csv_header(line: str) -> bool:
    cells = [c.strip() for c in line.split(",")]
    return len(cells) > 1 and all(_HEADER_CELL.fullmatch(c) for c in cells)


def _parse_headered_csv(
    text: str, lines: list[str], problems: list[str]
) -> tuple[list[CardRecord], list[str]]:
    """``hl-smi -Q <fields> --format csv[,nounits]`` with its header row: each column read
    by the field it names, a cell without a unit in the unit its header gives
    (``memory.used [MiB]`` over ``512``; 2maz/slurm-monitor's recorded hl-smi 1.18 query).
    A query without ``index`` numbers the cards in row order (hl-smi prints them by
    index), with that said in an error entry; ``uuid`` stays the card's identity."""
    header = [_HEADER_CELL.fullmatch(c.strip()) for c in lines[0].split(",")]
    while not lines[0].strip():
        lines.pop(0)
        header = [_HEADER_CELL.fullmatch(c.strip()) for c in lines[0].split(",")]
    names = [(m[1], m[2]) for m in header if m]
    field_names = [n for n, _ in names]
    if lines and not text.endswith(("\n", "\r")):
        problems.append("last line has no line end: cut, not read")
        lines = lines[:-1]
    records: list[CardRecord] = []
    for row_no, line in enumerate(ln for ln in lines[1:] if ln.strip()):
        cells = [c.strip() for c in line.split(",")]
        rec = CardRecord(vendor="gaudi", index=row_no)
        if "index" not in field_names:
            rec.add_error("hl-smi index", "not in the query: numbered in row order")
        records.append(rec)
        if len(cells) != len(names):
            rec.read_ok = False
            rec.add_error("hl-smi", f"row has {len(cells)} cells for {len(names)} fields")
            continue
        for (name, unit), cell in zip(names, cells, strict=True):
            if name == "index":
                if cell.isdigit():
                    rec.index = int(cell)
                else:
                    rec.read_ok = False
                    rec.add_error("hl-smi index", f"{cell[:20]!r} not an index")
                continue
            expected = _NUMERIC.get(name, (None, None, None))[1]
            if unit and name in _NUMERIC and unit != expected:
                rec.add_error(f"hl-smi {name}", f"header unit {unit!r} not {expected!r}: not read")
                continue
            if unit and name in _NUMERIC and number_unit(cell) and number_unit(cell)[1] == "":
                cell = f"{cell} {unit}"
            _cell(rec, name, cell)
        rec.card_type = card_type_for(rec.model)
        if rec.memory_total_bytes is not None:
            rec.memory_kind = "hbm"
        rec.add_error("hl-smi processes", "unknown: this query lists no processes")
    if not records:
        raise CollectorError(f"hl-smi: no card row in the output ({describe(text)})", raw=text)
    return records, problems


# ------------------------------------------------------------------ hl-smi (table)

_DRIVER = re.compile(r"Driver Version:\s*(\S+)")
#: hl-smi's table prints MiB as "Mib" up to 1.6 (32768Mib on a 32 GiB HL-205)
_MIB_UNITS = {"MiB": MIB, "Mib": MIB}


def parse_hl_smi_table(text: str) -> tuple[list[CardRecord], list[str]]:
    """Records and problems of plain ``hl-smi`` (its nvidia-smi-like table: ``AIP Name
    Persistence-M | Bus-Id Disp.A | Volatile Uncorr. ECC`` over ``Fan Temp Perf
    Pwr:Usage/Cap | Memory-Usage | AIP-Util Compute M.``), read by the header rows' names
    (:mod:`hetpatrol.collectors.smi_table`). Recorded from hl-smi 1.4.1 to 1.20.

    Value sources: ``AIP`` -> ``index``, ``Name`` -> ``model``, ``Bus-Id`` -> ``bus_id``,
    ``Temp`` -> ``temperature_celsius``, ``Pwr:Usage/Cap`` -> ``power_watts`` /
    ``power_limit_watts``, ``Memory-Usage`` -> ``memory_used_bytes`` /
    ``memory_total_bytes`` (MiB, HBM), ``AIP-Util`` -> ``utilization_ratio``, ``Volatile
    Uncorr. ECC`` -> ``counters["ecc_uncorrected_volatile"]``, the title's ``Driver
    Version:`` -> ``driver_version``; the ``Compute Processes`` rows -> ``processes``
    (``N/A`` rows: none on that AIP; a row cut or wrapped: processes unknown).
    :class:`CollectorError` (raw kept) when no AIP row is found."""
    table = parse_blocks(text, "AIP", "HL-SMI")
    if not table.cards:
        raise CollectorError(f"hl-smi: no AIP table in the output ({describe(text)})", raw=text)
    problems = list(table.problems)
    if table.title is None:
        problems.append("no 'HL-SMI Version' title row: head of the output missing")
    driver = _DRIVER.search(text)
    procs: dict[int, list[ProcessInfo]] = {}
    known = table.processes_complete
    for row, closed in table.process_rows:
        toks = row.split()
        if closed and len(toks) >= 5 and toks[0].isdigit() and toks[1] == "N/A":
            continue  # "0  N/A  N/A  N/A  N/A": nothing on that AIP
        usage = read_side(toks[-1], _MIB_UNITS)[0] if toks else None
        if not closed or len(toks) < 5 or not (toks[0].isdigit() and toks[1].isdigit()):
            known = False
            problems.append(f"process row {row[:40]!r} cut or not understood")
            continue
        procs.setdefault(int(toks[0]), []).append(
            ProcessInfo(
                pid=int(toks[1]),
                name=" ".join(toks[3:-1]) or None,
                memory_bytes=int(usage) if usage is not None else None,
            )
        )
    if not table.processes_complete:
        problems.append("process table missing or cut")
    records = []
    for block in table.cards:
        rec = CardRecord(vendor="gaudi", index=block.index)
        rec.driver_version = driver[1] if driver else None
        v = block.values
        if not block.complete:
            rec.read_ok = False
            rec.add_error("hl-smi", f"card rows damaged: {block.damage}: card not fully read")
        name = v.get("Name")
        if name and _TEXT.fullmatch(name):
            rec.model = name
        elif name is not None:
            rec.read_ok = False
            rec.add_error("hl-smi Name", f"garbled text {name[:30]!r}: not read")
        rec.card_type = card_type_for(rec.model)
        bus = v.get("Bus-Id")
        rec.bus_id = normalize_bus_id(bus) if bus and not is_na(bus) else None
        if rec.bus_id is None and (bus is not None or block.complete):
            rec.add_error("hl-smi Bus-Id", repr(bus) if bus else "not read")
        for key, attr, units in (
            ("Temp", "temperature_celsius", {"C": 1.0}),
            ("AIP-Util", "utilization_ratio", {"%": 0.01}),
        ):
            if key not in v and not block.complete:
                continue
            value, why = read_side(v.get(key), units)
            setattr(rec, attr, value)
            if value is None:
                rec.add_error(f"hl-smi {key}", why or "not read")
        for key, attrs, units in (
            ("Pwr:Usage/Cap", ("power_watts", "power_limit_watts"), {"W": 1.0}),
            ("Memory-Usage", ("memory_used_bytes", "memory_total_bytes"), _MIB_UNITS),
        ):
            if key not in v and not block.complete:
                continue
            for attr, (value, why) in zip(attrs, read_pair(v.get(key), units), strict=True):
                if value is None:
                    rec.add_error(f"hl-smi {key}", f"{attr}: {why}")
                elif key == "Memory-Usage":
                    setattr(rec, attr, int(value))
                    rec.memory_kind = "hbm"
                else:
                    setattr(rec, attr, value)
        ecc = v.get("Volatile-Uncorr.-ECC")
        if ecc is not None and ecc.isdigit():
            rec.counters["ecc_uncorrected_volatile"] = int(ecc)
        elif ecc is not None:
            rec.add_error("hl-smi Volatile Uncorr. ECC", f"{ecc[:20]!r}: not read")
        if known:
            rec.processes = procs.get(block.index, [])
        else:
            rec.add_error("hl-smi processes", "unknown: process table cut or a row not read")
        records.append(rec)
    return records, problems


def parse_hl_smi(
    text: str, fields: tuple[str, ...] = HL_FIELDS
) -> tuple[list[CardRecord], list[str]]:
    """Any of hl-smi's printed forms, told apart by what the text is: its table (a
    ``+---`` border or the ``HL-SMI Version`` title: :func:`parse_hl_smi_table`), CSV with
    a header row (the header names the columns), or ``--format csv,noheader`` read by
    ``fields`` (:func:`parse_hl_smi_csv`). :class:`CollectorError` (raw kept) when none
    holds a card row."""
    head = text.lstrip()[:400]
    if head.startswith(("+", "|")) or "HL-SMI Version" in head:
        return parse_hl_smi_table(text)
    return parse_hl_smi_csv(text, fields)


def _cell(rec: CardRecord, name: str, cell: str) -> None:
    src = f"hl-smi {name}"
    if name in _NUMERIC:
        attr, unit, factor = _NUMERIC[name]
        m = _CELL.fullmatch(cell)
        if m and m[2] == unit:
            value = float(m[1]) * factor
            setattr(rec, attr, int(value) if factor == MIB else value)
        elif cell in _NA:
            rec.add_error(src, f"{cell}: not reported")
        else:
            rec.read_ok = False
            rec.add_error(src, f"not a number in {unit}: {cell[:30]!r}")
        return
    if name in ("uuid", "name", "driver_version", "bus_id"):
        if cell in _NA or not cell:
            rec.add_error(src, f"{cell or 'empty'}: not reported")
        elif not _TEXT.fullmatch(cell):
            rec.read_ok = False
            rec.add_error(src, f"garbled text {cell[:30]!r}: not read")
        elif name == "uuid":
            rec.uuid = cell
        elif name == "name":
            rec.model = cell
        elif name == "driver_version":
            rec.driver_version = cell
        else:
            rec.bus_id = normalize_bus_id(cell)


class GaudiCollector(SmiToolCollector):
    """Intel Gaudi through ``hl-smi``. Options (``collectors.gaudi``): ``fields`` (the
    query, default :data:`HL_FIELDS`), ``command`` (argv; default ``hl-smi -Q <fields>
    --format csv,noheader``), ``timeout_seconds`` (default 10)."""

    name: ClassVar[str] = "gaudi"
    tool: ClassVar[str] = "hl-smi"
    vendor_info: ClassVar[VendorInfo] = VendorInfo(
        # /dev/accel/accelN and accel_controlDN: the kernel's compute-accelerator major
        # "accel" (drivers/accel/drm_accel.c: register_chrdev(ACCEL_MAJOR, "accel", ...)),
        # which the habanalabs driver uses since Linux 6.2; the unit allows that major
        device_nodes=(
            DeviceNode("/dev/accel/accel{n}", "rw", "hl-smi", "accel", 8),
            DeviceNode("/dev/accel/accel_controlD{n}", "rw", "hl-smi", "accel", 8),
        ),
        # gres.conf: File=/dev/accel/accel<index> (hl-smi's index). HABANA_VISIBLE_DEVICES
        # takes these indices, HABANA_VISIBLE_MODULES module ids (hl-smi -Q
        # index,module_id), which survive a reboot (Intel Gaudi docs, "Multiple Dockers
        # Each with a Single Workload")
        gres=GresDevice(
            "/dev/accel/accel{n}",
            visible_env=("HABANA_VISIBLE_DEVICES",),
            visible_doc="https://docs.habana.ai/en/latest/Orchestration/Multiple_Tenants_on_HPU/Multiple_Dockers_each_with_Single_Workload.html",
            note="bare-metal processes read HABANA_VISIBLE_MODULES (module ids: "
            "hl-smi -Q index,module_id -f csv)",
        ),
        tool_dirs={"hl-smi": ("/usr/bin",)},
        # PCI: vendor 1da3 (pci.ids: Habana Labs; Gaudi 1000, Gaudi2 1020, Gaudi3 1060).
        pci=PciCards(
            vendor_ids=(0x1DA3,),
            classes=ACCELERATOR_CLASSES,
        ),
    )

    def __init__(self, options: Mapping[str, Any], *, replay_dir: Path | None = None):
        self.fields = tuple(str(f) for f in options.get("fields", HL_FIELDS))
        super().__init__(options, replay_dir=replay_dir)

    def default_argv(self) -> Sequence[str]:
        """``hl-smi -Q <fields> --format csv,noheader`` (``fields`` option, default
        :data:`HL_FIELDS`)."""
        return ["hl-smi", "-Q", ",".join(self.fields), "--format", "csv,noheader"]

    def parse(self, text: str) -> tuple[list[CardRecord], list[str]]:
        """:func:`parse_hl_smi` (the CSV by ``self.fields``, or hl-smi's table when a
        configured command prints it); :class:`CollectorError` (raw kept) when it printed
        no card row."""
        try:
            return parse_hl_smi(text, self.fields)
        except CollectorError:
            raise
        except Exception as exc:  # pragma: no cover - guard: a parser bug must not escape
            raise CollectorError(
                f"hl-smi: parser error {type(exc).__name__}: {exc}", raw=text
            ) from exc


__all__ = [
    "GaudiCollector",
    "card_type_for",
    "parse_hl_smi",
    "parse_hl_smi_csv",
    "parse_hl_smi_table",
]
