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
with the default query. hl-smi prints no health word or process list in this form:
``vendor_health`` is None, the processes are unknown (an error entry says so).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from hetpatrol.collector import CollectorError, DeviceNode, VendorInfo
from hetpatrol.collectors.smi_tool import SmiToolCollector
from hetpatrol.pci_census import ACCELERATOR_CLASSES, PciCards
from hetpatrol.schema import CardRecord, normalize_bus_id

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
        raise CollectorError("hl-smi: no card row in the output", raw=text)
    return records, problems


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
        """:func:`parse_hl_smi_csv` by ``self.fields``; :class:`CollectorError` (raw
        kept) when it printed no card row."""
        return parse_hl_smi_csv(text, self.fields)


__all__ = ["GaudiCollector", "card_type_for", "parse_hl_smi_csv"]
