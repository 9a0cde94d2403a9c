"""Kunlunxin XPUs (R200, R300, P800...) through ``xpu_smi`` (note the underscore), one
record per XPU.

``xpu_smi`` prints sections (``DEVICES``, ``VIDEO``, ``PROCESSES``), each a one-row-per-
device ``|`` table under a header row whose cells name the columns. Only the ``DEVICES``
and ``PROCESSES`` sections are read, by those names; a row not closed by ``|`` is not
trusted, and a section that does not end on its border line is cut.

Value sources (``DEVICES`` column -> :class:`~hetpatrol.schema.CardRecord` field):

====================  ============================================================
``DevID``             ``index``
``PCI Addr``          ``bus_id``
``Model``             ``model``; :func:`card_type_for` -> ``card_type``
``SN``                ``serial`` (published samples mask it: ``02Kxxx``)
``UseRate``           ``utilization_ratio`` (``0 %`` / 100)
``Memory``            ``memory_used_bytes`` / ``memory_total_bytes`` (``0 / 32768
                      MB``; read as MiB: the R300's 32 GiB print as 32768)
``Power(W)``          ``power_watts`` (the wider layout only)
``Temp``              ``temperature_celsius`` (the wider layout only; see below)
``Firmware Version``  ``firmware_version`` (the wider layout only)
====================  ============================================================

Columns are found by their header names, wherever they stand: the wider layout of the
same driver 4.0 (``... | State | UseRate | L3 | Memory | Power(W) | Temp | Freq(MHz) |
Firmware Version | CPLD Version |``, recorded on R200, K100 and K200 nodes) is read for
its power, temperature and firmware too; a layout without them (R300 in the
PaddlePaddle docs) gives None with that reason (never 0). ``Temp`` has no unit in its
header: it is read as degrees Celsius, the only scale that puts the recorded idle cards
at 39-51. No health word is printed (``State``'s letters are not documented: not
read).

The R300 recording (PaddlePaddle docs, a documentation excerpt) has an empty
``PROCESSES`` table: an empty table closed by its border means no processes; process
rows, whose layout no recording shows, are refused (processes unknown, raw kept), never
guessed.
"""

from __future__ import annotations

import re
from typing import ClassVar

from hetpatrol.collector import CollectorError, DeviceNode, GresDevice, VendorInfo
from hetpatrol.collectors.smi_table import describe, is_na
from hetpatrol.collectors.smi_tool import SmiToolCollector
from hetpatrol.pci_census import ACCELERATOR_CLASSES, PciCards
from hetpatrol.schema import CardRecord, normalize_bus_id

MIB = 1 << 20
_VERSION = re.compile(r"^\s*Driver Version:\s*(\S+)", re.MULTILINE)
_PCT = re.compile(r"([0-9]{1,3}(?:\.[0-9]{1,3})?)\s*%")
_MEM = re.compile(r"([0-9]{1,9})\s*/\s*([0-9]{1,9})\s*MB")
_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,40}")
_NUMBER = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,3})?")
_SECTIONS = ("DEVICES", "VIDEO", "PROCESSES")


def card_type_for(model: str | None) -> str:
    """``R300`` -> ``"r300"``, ``P800`` -> ``"p800"``, ``R200-8F`` -> ``"r200"``, ``K200``
    (first generation) -> ``"k200"``; anything else -> ``"kunlunxin"``."""
    m = re.fullmatch(r"([RPK][0-9]{3})(?:-\S+)?", (model or "").strip(), re.IGNORECASE)
    return m[1].lower() if m else "kunlunxin"


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        word = line.strip()
        if word in _SECTIONS:
            current = word
            out[current] = []
        elif current is not None and word:
            out[current].append(word)
    return out


def _table(lines: list[str]) -> tuple[list[str] | None, list[tuple[list[str], bool]], bool]:
    """(header names, rows as (cells, closed), ended on a border) of one section."""
    header = None
    rows: list[tuple[list[str], bool]] = []
    for line in lines:
        if set(line) <= {"-"}:
            continue
        closed = line.endswith("|") and len(line) > 1
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells if closed else None
            continue
        rows.append((cells, closed))
    ended = bool(lines) and set(lines[-1]) <= {"-"}
    return header, rows, ended


def parse_xpu_smi(text: str) -> tuple[list[CardRecord], list[str]]:
    """Records and problems of ``xpu_smi`` output; :class:`CollectorError` (raw kept)
    when there is no ``DEVICES`` table with a readable row."""
    problems: list[str] = []
    sections = _sections(text)
    header, rows, ended = _table(sections.get("DEVICES", []))
    if header is None or not rows:
        seen = f"DEVICES header {' | '.join(header)[:80]!r}, " if header else ""
        raise CollectorError(
            f"xpu_smi: no DEVICES table in the output ({seen}{describe(text)})", raw=text
        )
    if not ended:
        problems.append("DEVICES table does not end on its border: cut")
    driver = _VERSION.search(text)
    if driver is None:
        problems.append("no 'Driver Version:' line: head of the output missing")
    records = []
    for cells, closed in rows:
        if not closed or not cells[0].isdigit():
            problems.append(f"DEVICES row {' | '.join(cells)[:40]!r} cut or not understood")
            continue
        rec = CardRecord(vendor="kunlunxin", index=int(cells[0]))
        rec.driver_version = driver[1] if driver else None
        if len(cells) != len(header):
            rec.read_ok = False
            rec.add_error("xpu_smi", f"row has {len(cells)} cells for {len(header)} columns")
        else:
            _fill(rec, dict(zip(header, cells, strict=True)))
        rec.card_type = card_type_for(rec.model)
        for name in ("Power(W)", "Temp"):
            if name not in header:
                rec.add_error(f"xpu_smi {name}", "no such column in this layout")
        records.append(rec)
    if not records:
        raise CollectorError("xpu_smi: no readable DEVICES row", raw=text)
    _processes(records, sections, problems)
    return records, problems


def _fill(rec: CardRecord, v: dict[str, str]) -> None:
    for key, attr in (("PCI Addr", "bus_id"), ("Model", "model"), ("SN", "serial")):
        value = v.get(key)
        if value is None:
            rec.add_error(f"xpu_smi {key}", "column not in the table")
        elif not _TEXT.fullmatch(value):
            rec.read_ok = False
            rec.add_error(f"xpu_smi {key}", f"garbled text {value[:30]!r}: not read")
        else:
            setattr(rec, attr, normalize_bus_id(value) if attr == "bus_id" else value)
    m = _PCT.fullmatch(v.get("UseRate", ""))
    if m and float(m[1]) <= 100:
        rec.utilization_ratio = float(m[1]) / 100.0
    else:
        rec.add_error("xpu_smi UseRate", repr(v.get("UseRate", "column not in the table")))
    m = _MEM.fullmatch(v.get("Memory", ""))
    if m:
        rec.memory_kind = "fb"  # device memory; xpu_smi does not say which kind
        rec.memory_used_bytes, rec.memory_total_bytes = int(m[1]) * MIB, int(m[2]) * MIB
    else:
        rec.add_error("xpu_smi Memory", repr(v.get("Memory", "column not in the table")))
    # the wider layout's columns, each read on its own where its header is printed
    for name, attr in (("Power(W)", "power_watts"), ("Temp", "temperature_celsius")):
        cell = v.get(name)
        if cell is None:
            continue
        if _NUMBER.fullmatch(cell):
            setattr(rec, attr, float(cell))
        else:
            why = f"{cell}: not reported" if is_na(cell) else f"{cell[:30]!r} not a number"
            rec.add_error(f"xpu_smi {name}", why)
    fw = v.get("Firmware Version")
    if fw is not None and _TEXT.fullmatch(fw):
        rec.firmware_version = fw
    elif fw is not None:
        rec.add_error("xpu_smi Firmware Version", f"{fw[:30]!r} not read")


def _processes(
    records: list[CardRecord], sections: dict[str, list[str]], problems: list[str]
) -> None:
    lines = sections.get("PROCESSES")
    header, rows, ended = _table(lines or [])
    if header is None or not ended:
        why = "no PROCESSES table" if header is None else "PROCESSES table cut"
    elif rows:
        why = "process rows not read (no recorded layout)"
    else:
        return  # an empty table closed by its border: no processes
    problems.append(why)
    for rec in records:
        rec.add_error("xpu_smi processes", f"unknown: {why}")


class KunlunxinCollector(SmiToolCollector):
    """Kunlunxin XPUs through ``xpu_smi``. Options (``collectors.kunlunxin``):
    ``command`` (argv, default ``["xpu_smi"]``), ``timeout_seconds`` (default 10)."""

    name: ClassVar[str] = "kunlunxin"
    tool: ClassVar[str] = "xpu_smi"
    default_command: ClassVar[tuple[str, ...]] = ("xpu_smi",)
    vendor_info: ClassVar[VendorInfo] = VendorInfo(
        # one /dev/xpuN per device (the INODE column of xpu_smi) and /dev/xpuctrl
        # (PaddlePaddle docs hardware_support/xpu: docker run --device=/dev/xpu0..7
        # --device=/dev/xpuctrl); 8 per node
        device_nodes=(
            DeviceNode("/dev/xpuctrl", "rw", "xpu_smi"),
            DeviceNode("/dev/xpu{n}", "rw", "xpu_smi", None, 8),
        ),
        # gres.conf: File=/dev/xpu<DevID> (xpu_smi's INODE column names /dev/xpuN for
        # DevID N, PaddlePaddle "Kunlunxin XPU install"); the XRE runtime reads
        # XPU_VISIBLE_DEVICES (PaddlePaddle FastDeploy, Kunlunxin XPU deployment:
        # export XPU_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
        gres=GresDevice(
            "/dev/xpu{n}",
            visible_env=("XPU_VISIBLE_DEVICES",),
            visible_doc="https://paddlepaddle.github.io/FastDeploy/zh/get_started/installation/kunlunxin_xpu",
        ),
        tool_dirs={"xpu_smi": ("/usr/local/xpu/bin", "/usr/bin")},
        # PCI: vendor 1d22 (pci.ids: Baidu; Kunlun AI Accelerator 3684, Kunlun2 VF 3685,
        # and a Cloud Storage Device 1380 that is not a card): the listed ids only.
        pci=PciCards(
            vendor_ids=(0x1D22,),
            classes=ACCELERATOR_CLASSES,
            device_types={0x3684: "kunlun", 0x3685: "kunlun2"},
            listed_only=True,
        ),
    )

    def parse(self, text: str) -> tuple[list[CardRecord], list[str]]:
        """:func:`parse_xpu_smi`; :class:`CollectorError` (raw kept) when it printed no
        DEVICES table."""
        return parse_xpu_smi(text)


__all__ = ["KunlunxinCollector", "card_type_for", "parse_xpu_smi"]
