"""Iluvatar CoreX GPUs (BI-V100, BI-V150, MR-V100...) through ``ixsmi``, an nvidia-smi-like
table, one record per GPU.

``ixsmi`` is run once per patrol under a timeout (:mod:`hetpatrol.collectors.smi_tool`);
its table is read by the header rows' names (:mod:`hetpatrol.collectors.smi_table`):
``GPU Name | Bus-Id | Clock-SM Clock-Mem`` over ``Fan Temp Perf Pwr:Usage/Cap |
Memory-Usage | GPU-Util Compute M.``; ``Name`` may hold spaces (``Iluvatar BI-V100``).

Value sources (ixsmi column -> :class:`~hetpatrol.schema.CardRecord` field):

=====================  ==============================================================
``GPU``                ``index``
``Name``               ``model``; :func:`card_type_for` -> ``card_type``
``Bus-Id``             ``bus_id`` (``00000000:98:00.0`` -> ``0000:98:00.0``)
``Clock-SM``           ``clock_sm_hertz`` (``1500MHz``)
``Temp``               ``temperature_celsius`` (``30C``)
``Pwr:Usage/Cap``      ``power_watts`` / ``power_limit_watts`` (``40W / 250W``)
``Memory-Usage``       ``memory_used_bytes`` / ``memory_total_bytes`` (MiB)
``GPU-Util``           ``utilization_ratio`` (/100)
``Driver Version:``    ``driver_version`` (title row)
=====================  ==============================================================

Each value of a cell is read on its own: ``N/A / N/A`` under ``Pwr:Usage/Cap`` (IX-ML
4.0 on a BI-V150S) nulls the two power values, never the temperature beside them. No
recorded output (IX-ML 3.0.1, 3.1.1, 4.0.0) shows a process row, so process rows are not
read: a table that lists any is
refused for processes (unknown, with the row kept in ``raw``), as is one without its
closing border. ixsmi prints no health word: ``vendor_health`` is None.
"""

from __future__ import annotations

import re
from typing import ClassVar

from hetpatrol.collector import CollectorError, DeviceNode, GresDevice, VendorInfo
from hetpatrol.collectors.smi_table import (
    Block,
    SmiTable,
    describe,
    number_unit,
    parse_blocks,
    read_pair,
)
from hetpatrol.collectors.smi_tool import SmiToolCollector
from hetpatrol.pci_census import ACCELERATOR_CLASSES, PciCards
from hetpatrol.schema import CardRecord, normalize_bus_id

MIB = 1 << 20
_DRIVER = re.compile(r"Driver Version:\s*(\S+)")
_GARBLED = re.compile(r"[\x00-\x1f\x7f\ufffd#?@!*~^`%&$;=<>]")


def card_type_for(model: str | None) -> str:
    """``Iluvatar BI-V100`` -> ``"bi-v100"``, ``MR-V100`` -> ``"mr-v100"``; anything else
    -> ``"iluvatar"``."""
    m = re.search(r"\b(BI|MR)-?V([0-9]{2,3})\b", model or "", re.IGNORECASE)
    return f"{m[1].lower()}-v{m[2]}" if m else "iluvatar"


def parse_ixsmi(text: str) -> tuple[SmiTable, list[CardRecord]]:
    """The table and one record per GPU of ``ixsmi`` output; :class:`CollectorError`
    (``raw=text``) when no GPU row is found. No other exception escapes."""
    try:
        table = parse_blocks(text, "GPU", "IX-ML", frozenset({"Name"}))
    except Exception as exc:  # pragma: no cover - guard
        raise CollectorError(f"ixsmi: parser error {type(exc).__name__}: {exc}", raw=text) from exc
    if table.cards and not table.header_seen:
        raise CollectorError(
            f"ixsmi: {len(table.cards)} card rows but no header rows to read them by"
            f" ({describe(text)})",
            raw=text,
        )
    if not table.cards:
        raise CollectorError(f"ixsmi: no GPU table in the output ({describe(text)})", raw=text)
    driver = _DRIVER.search(table.title or "")
    if table.title is None:
        table.problems.append("no 'IX-ML' title row: head of the output missing")
    rows = [row for row, _ in table.process_rows if not row.startswith("No running processes")]
    if rows:
        table.problems.append(f"process rows not read (no recorded layout): {rows[0][:40]!r}")
    elif not table.processes_complete:
        table.problems.append("process table missing or cut")
    known = table.processes_complete and not rows
    return table, [_record(b, driver[1] if driver else None, known) for b in table.cards]


def _number(rec: CardRecord, block: Block, name: str, unit: str) -> float | None:
    text = block.values.get(name)
    got = number_unit(text)
    if got and got[1] == unit:
        return got[0]
    if block.complete or text is not None:
        rec.add_error(f"ixsmi {name}", repr(text) if text is not None else "not read")
    return None


def _record(block: Block, driver: str | None, processes_known: bool) -> CardRecord:
    v = block.values
    garbled = [k for k in ("Name", "Bus-Id") if _GARBLED.search(v.get(k, ""))]
    rec = CardRecord(vendor="iluvatar", index=block.index, driver_version=driver)
    if garbled:
        block.complete, block.damage = False, f"{garbled[0]} garbled"
    else:
        rec.model = v.get("Name")
        rec.bus_id = normalize_bus_id(v.get("Bus-Id"))
    rec.card_type = card_type_for(rec.model)
    if not block.complete:
        rec.read_ok = False
        rec.add_error("ixsmi", f"card rows damaged: {block.damage}: card not fully read")
    for key, attr in (("Name", "model"), ("Bus-Id", "bus_id")):
        if getattr(rec, attr) is None and block.complete:
            rec.add_error(f"ixsmi {key}", "not read")
    rec.temperature_celsius = _number(rec, block, "Temp", "C")
    clock = _number(rec, block, "Clock-SM", "MHz")
    rec.clock_sm_hertz = clock * 1e6 if clock is not None else None
    util = _number(rec, block, "GPU-Util", "%")
    if util is not None and util <= 100:
        rec.utilization_ratio = util / 100.0
    # each side of a used/cap pair on its own: "N/A / N/A" (a BI-V150S reporting no
    # power) nulls the two power values, never the temperature beside them
    for key, attrs, units, sides in (
        ("Pwr:Usage/Cap", ("power_watts", "power_limit_watts"), {"W": 1.0}, ("usage", "cap")),
        (
            "Memory-Usage",
            ("memory_used_bytes", "memory_total_bytes"),
            {"MiB": MIB},
            ("used", "total"),
        ),
    ):
        if key not in v and not block.complete:
            continue
        for attr, (value, why), side in zip(
            attrs, read_pair(v.get(key), units), sides, strict=True
        ):
            if value is None:
                rec.add_error(f"ixsmi {key}", f"{side}: {why}")
            elif units.get("MiB"):
                setattr(rec, attr, int(value))
                rec.memory_kind = "fb"
            else:
                setattr(rec, attr, value)
    if not processes_known:
        rec.add_error("ixsmi processes", "unknown: process table cut or its rows not read")
    return rec


class IluvatarCollector(SmiToolCollector):
    """Iluvatar GPUs through ``ixsmi``. Options (``collectors.iluvatar``): ``command``
    (argv, default ``["ixsmi"]``), ``timeout_seconds`` (default 10)."""

    name: ClassVar[str] = "iluvatar"
    tool: ClassVar[str] = "ixsmi"
    default_command: ClassVar[tuple[str, ...]] = ("ixsmi",)
    vendor_info: ClassVar[VendorInfo] = VendorInfo(
        # CoreX: /dev/itrctl and one /dev/iluvatarN per GPU (containers are started with
        # --device=/dev/itrctl --device=/dev/iluvatar0..15: "without it
        # cudaGetDeviceCount() fails"); 16 covers the dual-chip BI-V150 x 8
        device_nodes=(
            DeviceNode("/dev/itrctl", "rw", "ixsmi"),
            DeviceNode("/dev/iluvatar{n}", "rw", "ixsmi", None, 16),
        ),
        # gres.conf: File=/dev/iluvatar<card> (ixsmi's index); CoreX is CUDA-compatible
        # and its runtime reads CUDA_VISIBLE_DEVICES (FlagScale's vendor table:
        # "CUDA_VISIBLE_DEVICES for nvidia, iluvatar")
        gres=GresDevice(
            "/dev/iluvatar{n}",
            visible_env=("CUDA_VISIBLE_DEVICES",),
            visible_doc="https://github.com/FlagOpen/FlagScale",
            note="a GRES named gpu gets CUDA_VISIBLE_DEVICES from Slurm itself",
        ),
        tool_dirs={"ixsmi": ("/usr/local/corex/bin",)},
        # PCI: vendor 1e3e (pci.ids: Shanghai Iluvatar CoreX); accelerators only.
        pci=PciCards(
            vendor_ids=(0x1E3E,),
            classes=ACCELERATOR_CLASSES,
        ),
    )

    def parse(self, text: str) -> tuple[list[CardRecord], list[str]]:
        """:func:`parse_ixsmi`'s records and table problems; :class:`CollectorError`
        (raw kept) when it printed no GPU table."""
        table, records = parse_ixsmi(text)
        return records, table.problems


__all__ = ["IluvatarCollector", "card_type_for", "parse_ixsmi"]
