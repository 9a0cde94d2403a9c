"""Cambricon MLUs (MLU370, MLU590...) through the ``cnmon`` table, one record per card.

``cnmon`` is run once per patrol under a timeout (:mod:`hetpatrol.collectors.smi_tool`).
Its table is read by the header rows' names, never by offsets: each ``|``-cell of the two
header rows names the values of the same cell in every card's two rows. Both recorded
layouts are read:

- v4 (CNMON v4.20): ``Card VF Name Firmware | Inited Driver | Util Ecc-Error`` over
  ``Fan Temp Pwr:Usage/Cap | Memory-Usage | vMemory-Usage``;
- v5 (CNMON v5.10, ``Driver vX`` on the title line): ``... | Bus-Id | Util Ecc-Error``
  over ``... | Memory-Usage | SR-IOV Compute-Mode``; the process table's ``VF`` is ``MI``.

Value sources (cnmon column -> :class:`~hetpatrol.schema.CardRecord` field):

====================  ======================================================
``Card``              ``index``
``Name``              ``model``; :func:`card_type_for` -> ``card_type``
``Firmware``          ``firmware_version``
``Driver``            ``driver_version`` (column, or the title line's ``Driver vX``)
``Bus-Id``            ``bus_id`` (v5 only; v4 has none: None with that reason)
``Util``              ``utilization_ratio`` (/100)
``Ecc-Error``         ``counters["ecc_errors"]`` when a number (``N/A``: not reported)
``Temp``              ``temperature_celsius`` (``32C``)
``Pwr:Usage/Cap``     ``power_watts`` / ``power_limit_watts`` (``30 W/ 150 W``)
``Memory-Usage``      ``memory_used_bytes`` / ``memory_total_bytes`` (MiB)
process table         ``processes`` (PID, command, ``MLU Memory Usage``)
====================  ======================================================

Only cells closed by a ``|`` are read; a card whose two rows are not both complete, or
whose cell holds more or fewer values than its header names, is returned damaged and
judged ``unknown``. A missing or cut process table makes the processes unknown (an error
entry), never "none". cnmon prints no health word: ``vendor_health`` stays None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from hetpatrol.collector import (
    CollectorError,
    CollectResult,
    DeviceNode,
    GresDevice,
    VendorInfo,
)
from hetpatrol.collectors.smi_table import describe, is_na, number_unit, parse_blocks, read_pair
from hetpatrol.collectors.smi_tool import SmiToolCollector, problem_result
from hetpatrol.pci_census import ACCELERATOR_CLASSES, PciCards
from hetpatrol.schema import CardRecord, ProcessInfo, normalize_bus_id

MIB = 1 << 20
_VERSION = re.compile(r"CNMON\s+v(\S+)")
_DRIVER = re.compile(r"Driver\s+v(\S+)")
_NA = frozenset({"N/A", "NA", "-", "--"})


@dataclass
class MluCard:
    """One card as its two cnmon rows show it: ``values`` maps each header name (as
    printed: ``"Temp"``, ``"Pwr:Usage/Cap"``) to its text; ``complete`` False when a row
    was cut or a cell did not match its header (``damage`` says which)."""

    index: int
    values: dict[str, str] = field(default_factory=dict)
    complete: bool = True
    damage: str | None = None


@dataclass
class CnmonTable:
    """The whole ``cnmon`` output: version, driver, cards, process rows
    (card, pid, command, MiB or None), and whether the process table was read to its end."""

    tool_version: str | None = None
    driver_version: str | None = None
    cards: list[MluCard] = field(default_factory=list)
    processes: list[tuple[int, int, str, int | None]] = field(default_factory=list)
    processes_known: bool = False
    process_damage: bool = False
    truncated: bool = False
    problems: list[str] = field(default_factory=list)


def parse_cnmon(text: str) -> CnmonTable:
    """Parse ``cnmon`` (default table) output in one pass.

    Returns a :class:`CnmonTable`; raises :class:`CollectorError` (``raw=text``) when no
    card row is found. No other exception escapes for any input.
    """
    try:
        return _parse(text)
    except CollectorError:
        raise
    except Exception as exc:  # pragma: no cover - guard
        raise CollectorError(f"cnmon: parser error {type(exc).__name__}: {exc}", raw=text) from exc


def _parse(text: str) -> CnmonTable:
    blocks = parse_blocks(text, "Card", "CNMON")
    table = CnmonTable(problems=list(blocks.problems))
    table.cards = [MluCard(b.index, b.values, b.complete, b.damage) for b in blocks.cards]
    if not table.cards:
        raise CollectorError(f"cnmon: no MLU table in the output ({describe(text)})", raw=text)
    m = _VERSION.search(blocks.title or "")
    if m:
        table.tool_version = m[1]
        d = _DRIVER.search(blocks.title or "")
        table.driver_version = d[1] if d else None
    else:
        table.truncated = True
        table.problems.append("no 'CNMON vX' title line: head of the output missing")
    for joined, closed in blocks.process_rows:
        _proc_row(table, joined, closed)
    if not blocks.processes_complete or table.process_damage:
        table.truncated = True
        table.processes_known = False
        table.problems.append("process table missing or cut")
    else:
        table.processes_known = True
    return table


def _proc_row(table: CnmonTable, joined: str, closed: bool) -> None:
    if joined.startswith("No running processes found"):
        return
    toks = joined.split()
    m = re.fullmatch(r"([0-9]{1,12})\s*(MiB)", " ".join(toks[-2:])) if len(toks) >= 5 else None
    if not closed or not m or not toks[0].isdigit() or not toks[2].isdigit():
        table.problems.append(f"process row {joined[:40]!r} not understood")
        table.process_damage = True
        return
    table.processes.append((int(toks[0]), int(toks[2]), " ".join(toks[3:-2]), int(m[1])))


def card_type_for(model: str | None) -> str:
    """``MLU370-X8`` -> ``"mlu370"``, ``MLU590-H8`` -> ``"mlu590"``, ``MLU290-M5`` ->
    ``"mlu290"``; anything else -> ``"mlu"``."""
    m = re.search(r"MLU\s?([0-9]{3})", model or "", re.IGNORECASE)
    return f"mlu{m[1]}" if m else "mlu"


def records_from(table: CnmonTable) -> list[CardRecord]:
    """One :class:`CardRecord` per card of ``table`` (health left for the checks)."""
    return [_record(table, card) for card in table.cards]


#: a control character, U+FFFD (a byte that was not UTF-8) or one of these: garbled text
_GARBLED = re.compile(r"[\x00-\x1f\x7f\ufffd#?@!*~^`%&$;=<>]")


def _record(table: CnmonTable, card: MluCard) -> CardRecord:
    v = dict(card.values)
    garbled = [k for k in ("Name", "Firmware", "Driver", "Bus-Id") if _GARBLED.search(v.get(k, ""))]
    for key in garbled:
        card.complete = False
        card.damage = f"{key} {v.pop(key)[:30]!r} garbled"
    rec = CardRecord(
        vendor="cambricon",
        index=card.index,
        model=v.get("Name"),
        card_type=card_type_for(v.get("Name")),
        firmware_version=v.get("Firmware"),
        driver_version=(v.get("Driver") or "").lstrip("v") or table.driver_version,
    )
    if not card.complete:
        rec.read_ok = False
        rec.add_error("cnmon", f"card rows damaged: {card.damage}: card not fully read")

    def missing(name: str, why: str | None = None) -> None:
        if name in v or card.complete:
            rec.add_error(f"cnmon {name}", why or f"{v.get(name, 'not in this layout')!r}")

    for key in ("Name", "Firmware"):
        if key not in v:
            missing(key, "not read")
    if "Bus-Id" in v:
        rec.bus_id = normalize_bus_id(v["Bus-Id"])
    else:
        missing("Bus-Id", "not in this cnmon layout (v4)")
    util = number_unit(v.get("Util"))
    if util and util[1] == "%" and util[0] <= 100:
        rec.utilization_ratio = util[0] / 100.0
    else:
        missing("Util", "N/A: not reported" if is_na(v.get("Util")) else None)
    temp = number_unit(v.get("Temp"))  # "32C"; "34℃" read the same
    if temp and temp[1] == "C":
        rec.temperature_celsius = temp[0]
    else:
        missing("Temp", "N/A: not reported" if is_na(v.get("Temp")) else None)
    # each side of a used/cap pair on its own: "N/A/ 150 W" nulls the usage only
    for key, attrs, units in (
        ("Pwr:Usage/Cap", ("power_watts", "power_limit_watts"), {"W": 1.0}),
        ("Memory-Usage", ("memory_used_bytes", "memory_total_bytes"), {"MiB": MIB}),
    ):
        if key not in v:
            missing(key)
            continue
        for attr, (value, why) in zip(attrs, read_pair(v[key], units), strict=True):
            if value is None:
                rec.add_error(f"cnmon {key}", f"{attr}: {why}")
            elif key == "Memory-Usage":
                rec.memory_kind = "fb"  # device memory; cnmon does not say LPDDR or HBM
                setattr(rec, attr, int(value))
            else:
                setattr(rec, attr, value)
    ecc = v.get("Ecc-Error")
    if ecc is not None and ecc.isdigit():
        rec.counters["ecc_errors"] = int(ecc)
    elif ecc not in _NA:
        missing("Ecc-Error")
    if table.processes_known:
        rec.processes = [
            ProcessInfo(
                pid=pid, name=cmd or None, memory_bytes=mib * MIB if mib is not None else None
            )
            for idx, pid, cmd, mib in table.processes
            if idx == card.index
        ]
    else:
        rec.add_error("cnmon processes", "unknown: process table missing or cut")
    return rec


class CambriconCollector(SmiToolCollector):
    """Cambricon MLUs through ``cnmon``. Options (``collectors.cambricon``): ``command``
    (argv list or string, default ``["cnmon"]``), ``timeout_seconds`` (default 10)."""

    name: ClassVar[str] = "cambricon"
    tool: ClassVar[str] = "cnmon"
    default_command: ClassVar[tuple[str, ...]] = ("cnmon",)
    vendor_info: ClassVar[VendorInfo] = VendorInfo(
        # containers on MLU nodes get /dev/cambricon_ctl and /dev/cambricon_devN
        # (PaddlePaddle docs hardware_support/mlu/install_cn.md: docker run
        # --device=/dev/cambricon_ctl ... -v /usr/bin/cnmon:/usr/bin/cnmon)
        device_nodes=(
            DeviceNode("/dev/cambricon_ctl", "rw", "cnmon"),
            DeviceNode("/dev/cambricon_dev{n}", "rw", "cnmon", None, 16),
        ),
        # gres.conf: File=/dev/cambricon_dev<card> (cnmon's card number); the runtime
        # (CNRT) reads MLU_VISIBLE_DEVICES, card numbers (as Cambricon's model scripts
        # set it, e.g. "export MLU_VISIBLE_DEVICES=0,1,2,3"; no Cambricon page in reach
        # to cite, see docs/slurm.md)
        gres=GresDevice(
            "/dev/cambricon_dev{n}",
            visible_env=("MLU_VISIBLE_DEVICES",),
            visible_doc="https://www.cambricon.com/docs/sdk_1.15.0/cntoolkit_3.7.2/cntoolkit_install_3.7.2/index.html",
        ),
        tool_dirs={"cnmon": ("/usr/bin",)},
        # PCI: vendor cabc (pci.ids: MLU270-S4 0270, MLU370-S4 0370); an accelerator-only
        # vendor, any display or processing-accelerator class is a card.
        pci=PciCards(
            vendor_ids=(0xCABC,),
            classes=ACCELERATOR_CLASSES,
        ),
    )

    def result(self, text: str) -> CollectResult:
        """One record per MLU of :func:`parse_cnmon`; with problems or a truncated
        output, ``raw=text`` and ``error`` = ``"cnmon[ output truncated]: "`` + the first
        three problems. :class:`CollectorError` (raw kept) when it printed no MLU table."""
        table = parse_cnmon(text)
        note = "cnmon output truncated" if table.truncated else "cnmon"
        return problem_result(
            self.name, text, records_from(table), table.problems, note, table.truncated
        )


__all__ = ["CambriconCollector", "CnmonTable", "MluCard", "card_type_for", "parse_cnmon"]
