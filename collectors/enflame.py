"""Enflame GCUs (S60, T20, i20...) through ``efsmi``, one record per GCU.

``efsmi`` prints an nvidia-smi-like table with its own borders: a title row
(``EFSMI V1.2.0.301  Driver Ver: 1.2.0.301``; ``EFSMI    1.4.0.3``, ``EFSMI: 1.6.3.12``),
two header rows, then two rows per device between ``+---+`` / ``|---|`` / ``|===|``
borders. Cells are read by the header rows' names: ``DEV NAME | FW VER | BUS-ID ECC``
over ``TEMP Dpm Pwr(Usage/Cap) | Mem GCU Virt | DUsed SN`` (``FW VER``, ``Boot FW VER``
(1.7) and ``GCU Virt`` are one name each; ``Dpm`` is ``Lpm`` from 1.6; ``39 C``,
``71\u2103``, ``105W  300W`` and ``118W / 300W`` one value each; ``NAME`` may hold spaces:
``Enflame S60``). Each value is read on its own: a power ``N/A`` nulls the power only.

Value sources (efsmi column -> :class:`~hetpatrol.schema.CardRecord` field):

==================  ===============================================================
``DEV``             ``index``
``NAME``            ``model``; :func:`card_type_for` -> ``card_type``
``FW VER``          ``firmware_version``
``BUS-ID``          ``bus_id`` (``00:01:00.0`` -> ``0000:01:00.0``)
``TEMP``            ``temperature_celsius`` (``39 C``)
``Pwr(Usage/Cap)``  ``power_watts`` / ``power_limit_watts`` (``105W  300W``)
``SN``              ``serial``
``Driver Ver:``     ``driver_version`` (title row)
==================  ===============================================================

Recorded: efsmi 1.2, 1.4, 1.6 and 1.7 (``fixtures/vendor-outputs/enflame``); what none
of them says is not guessed: ``Mem`` (one figure: total, used or free is not
stated; 49120 MiB on an idle 48 GiB S60, 42976 MiB on a busy one) and ``DUsed`` are not
read (memory and utilization None, with that reason); there is no process table and no
health word (processes unknown, ``vendor_health`` None).
"""

from __future__ import annotations

import functools
import re
from typing import ClassVar

from hetpatrol.collector import CollectorError, DeviceNode, GresDevice, VendorInfo
from hetpatrol.collectors.smi_table import describe, is_na, number_unit, read_pair
from hetpatrol.collectors.smi_tool import SmiToolCollector
from hetpatrol.pci_census import ACCELERATOR_CLASSES, PciCards
from hetpatrol.schema import CardRecord, normalize_bus_id

#: the title row: ``EFSMI V1.2.0.301`` (1.2), ``EFSMI    1.4.0.3`` (1.4), ``EFSMI: 1.6.3.12``
_TITLE = re.compile(r"EFSMI:?\s+V?([0-9]\S*)")
_DRIVER = re.compile(r"Driver Ver:\s*(\S+)")
_JOIN_NAMES = (("Boot FW VER", "Boot-FW-VER"), ("FW VER", "FW-VER"), ("GCU Virt", "GCU-Virt"))
#: header names whose value may hold spaces (``Enflame S60`` from 1.4 on)
_FREE_TEXT = frozenset({"NAME"})
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,30}(?: [A-Za-z0-9][A-Za-z0-9._-]{0,30}){0,3}")
_JOIN_VALUES = (
    (re.compile(r"\b([0-9]{1,3}(?:\.[0-9])?) C\b"), r"\1C"),
    (re.compile(r"\b([0-9]{1,5}(?:\.[0-9]{1,3})?W)\s+([0-9]{1,5}(?:\.[0-9]{1,3})?W)"), r"\1/\2"),
    # 1.4 on: "118W / 300W"
    (
        re.compile(r"\b([0-9]{1,5}(?:\.[0-9]{1,3})?W)\s*/\s*([0-9]{1,5}(?:\.[0-9]{1,3})?W)"),
        r"\1/\2",
    ),
)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9()/:-]{0,30}")
_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,40}")


def card_type_for(model: str | None) -> str:
    """``S60`` / ``Enflame S60`` -> ``"s60"``, ``Enflame S60G`` -> ``"s60"``, ``T20`` ->
    ``"t20"``, ``i20`` -> ``"i20"``, ``Enflame L300`` -> ``"l300"``; anything else ->
    ``"enflame"``."""
    words = (model or "").split()
    m = re.fullmatch(r"([STILstil][0-9]{2,3})\S*", words[-1]) if words else None
    return m[1].lower() if m else "enflame"


def _cells(line: str) -> tuple[list[str], bool]:
    body = line.strip()
    closed = body.endswith("|") and len(body) > 1
    parts = body.strip("|").split("|") if closed else body.lstrip("|").split("|")
    return (parts if closed else parts[:-1]), closed


@functools.lru_cache(maxsize=256)
def _names(cell: str) -> tuple[str, ...] | None:
    """The value names of a header cell (None: garbled); cached, the header repeats."""
    for words, name in _JOIN_NAMES:
        cell = cell.replace(words, name)
    names = tuple(cell.split())
    return names if names and all(_NAME.fullmatch(n) for n in names) else None


def _values(cell: str) -> list[str]:
    for pattern, repl in _JOIN_VALUES:
        cell = pattern.sub(repl, cell)
    return cell.split()


def parse_efsmi(text: str) -> tuple[list[CardRecord], list[str]]:
    """Records and problems of ``efsmi`` output; :class:`CollectorError` (raw kept) when
    no device row is found."""
    problems: list[str] = []
    title = driver = None
    header: list[list[tuple[str, ...] | None]] = []
    blocks: list[tuple[int, dict[str, str], str | None]] = []
    current: list[tuple[list[str], bool]] = []
    last = ""

    def close_block() -> None:
        if current:
            blocks.append(_block(current, header))
            current.clear()

    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        last = s
        if s.startswith("+") or s.startswith("|-") or s.startswith("|="):
            close_block()
            continue
        if not s.startswith("|"):
            continue
        cells, closed = _cells(s)
        joined = " ".join(s.strip("|").split())
        if title is None and _TITLE.search(joined):
            title = joined
            d = _DRIVER.search(joined)
            driver = d[1] if d else None
            continue
        if len(header) < 2 and (joined.startswith("DEV") or header):
            header.append([_names(c) for c in cells] if closed else [None])
            continue
        if not current:
            first = cells[0].split() if cells else []
            if not first or not first[0].isdigit():
                problems.append(f"row {joined[:40]!r} not understood")
                continue
        current.append((cells, closed))
    close_block()
    if not blocks:
        raise CollectorError(f"efsmi: no device table in the output ({describe(text)})", raw=text)
    if title is None:
        problems.append("no 'EFSMI V...' title row: head of the output missing")
    if not last.startswith("+"):
        problems.append("output does not end on a closing border: tail missing")
    return [_record(i, v, damage, driver) for i, v, damage in blocks], problems


def _block(
    rows: list[tuple[list[str], bool]], header: list
) -> tuple[int, dict[str, str], str | None]:
    first = rows[0][0][0].split()[0]
    values: dict[str, str] = {}
    damage = None
    if len(rows) != 2 or len(header) != 2:
        damage = f"{len(rows)} rows for 2" if len(header) == 2 else "no header rows"
    for (cells, closed), names in zip(rows, header, strict=False):
        if not closed:
            damage = "row cut"
        for i, cell_names in enumerate(names):
            if i >= len(cells):
                break
            toks = _values(cells[i])
            if cell_names is not None and len(cell_names) == 1 and toks:
                toks = [" ".join(toks)]  # one value: the whole cell ("118W / 300W", "N/A")
            free = [j for j, n in enumerate(cell_names or ()) if n in _FREE_TEXT]
            extra = len(toks) - len(cell_names or ())
            if cell_names is not None and extra > 0 and len(free) == 1:
                j = free[0]
                toks = [*toks[:j], " ".join(toks[j : j + extra + 1]), *toks[j + extra + 1 :]]
            if cell_names is None or len(toks) != len(cell_names):
                names = " ".join(cell_names or ("?",))
                damage = damage or (
                    f"cell {names!r} holds {len(toks)} values: {' '.join(toks)[:50]!r}"
                )
                continue
            values.update(zip(cell_names, toks, strict=True))
    return int(first), values, damage


def _record(index: int, v: dict[str, str], damage: str | None, driver: str | None) -> CardRecord:
    rec = CardRecord(vendor="enflame", index=index, driver_version=driver)
    if damage:
        rec.read_ok = False
        rec.add_error("efsmi", f"device rows damaged: {damage}: card not fully read")
    if "Boot-FW-VER" in v:  # efsmi 1.7 heads the firmware column "Boot FW VER"
        v["FW-VER"] = v.pop("Boot-FW-VER")
    for key, attr in (("NAME", "model"), ("FW-VER", "firmware_version"), ("SN", "serial")):
        value = v.get(key)
        if value is not None and (_MODEL if key == "NAME" else _TEXT).fullmatch(value):
            setattr(rec, attr, value)
        elif value is not None or not damage:
            rec.read_ok = rec.read_ok and value is None
            rec.add_error(f"efsmi {key}", f"{value[:30]!r} garbled" if value else "not read")
    rec.card_type = card_type_for(rec.model)
    bus = v.get("BUS-ID")
    m = re.fullmatch(r"([0-9a-fA-F]{2,4}):([0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])", bus or "")
    if m:  # efsmi prints a 2-digit PCI domain: 00:01:00.0 is 0000:01:00.0
        rec.bus_id = normalize_bus_id(f"{int(m[1], 16):04x}:{m[2]}")
    elif bus is not None or not damage:
        rec.add_error("efsmi BUS-ID", repr(bus) if bus else "not read")
    temp = number_unit(v.get("TEMP"))  # "39C" (1.2: "39 C"), "71\u2103" (1.4 on)
    if temp and temp[1] == "C":
        rec.temperature_celsius = temp[0]
    elif "TEMP" in v or not damage:
        why = "N/A: not reported" if is_na(v.get("TEMP")) else repr(v.get("TEMP", "not read"))
        rec.add_error("efsmi TEMP", why)
    pwr = v.get("Pwr(Usage/Cap)")
    if pwr is not None and is_na(pwr):
        rec.add_error("efsmi Pwr(Usage/Cap)", f"{pwr}: not reported")
    elif pwr is not None or not damage:
        # each side on its own: "105W/300W" (1.2, joined above), "118W / 300W" (1.4 on)
        sides = read_pair(pwr, {"W": 1.0})
        for attr, (value, why) in zip(("power_watts", "power_limit_watts"), sides, strict=True):
            if value is None:
                rec.add_error("efsmi Pwr(Usage/Cap)", f"{attr}: {why}")
            else:
                setattr(rec, attr, value)
    rec.add_error("efsmi Mem", "not read: one figure, total, used or free not stated")
    rec.add_error("efsmi DUsed", "not read: meaning not stated in the recorded output")
    rec.add_error("efsmi processes", "unknown: efsmi's table lists no processes")
    return rec


class EnflameCollector(SmiToolCollector):
    """Enflame GCUs through ``efsmi``. Options (``collectors.enflame``): ``command``
    (argv, default ``["efsmi"]``), ``timeout_seconds`` (default 10)."""

    name: ClassVar[str] = "enflame"
    tool: ClassVar[str] = "efsmi"
    default_command: ClassVar[tuple[str, ...]] = ("efsmi",)
    vendor_info: ClassVar[VendorInfo] = VendorInfo(
        # /dev/gcuctl and /dev/gcuN per device; efsmi in /usr/sbin (the device plugins'
        # Enflame backends: deviceCtlPath "/dev/gcuctl", prefix "/dev/gcu", smiPath
        # "/usr/sbin/efsmi"); 8 per node
        device_nodes=(
            DeviceNode("/dev/gcuctl", "rw", "efsmi"),
            DeviceNode("/dev/gcu{n}", "rw", "efsmi", None, 8),
        ),
        # gres.conf: File=/dev/gcu<card> (efsmi's device number); TopsRider's runtime
        # reads TOPS_VISIBLE_DEVICES (Enflame's vLLM platform declares it as its
        # device_control_env_var; its k8s device plugin sets it with
        # ENFLAME_VISIBLE_DEVICES)
        gres=GresDevice(
            "/dev/gcu{n}",
            visible_env=("TOPS_VISIBLE_DEVICES",),
            visible_doc="https://github.com/Project-HAMi/HAMi (docs: Enflame GCU sharing)",
        ),
        tool_dirs={"efsmi": ("/usr/sbin",)},
        # PCI: vendor 1e36 (pci.ids: Shanghai Enflame, T10..L600); accelerators only.
        pci=PciCards(
            vendor_ids=(0x1E36,),
            classes=ACCELERATOR_CLASSES,
        ),
    )

    def parse(self, text: str) -> tuple[list[CardRecord], list[str]]:
        """:func:`parse_efsmi`; :class:`CollectorError` (raw kept) when it printed no
        device table (or the parser failed)."""
        try:
            return parse_efsmi(text)
        except CollectorError:
            raise
        except Exception as exc:  # pragma: no cover - guard: a parser bug must not escape
            raise CollectorError(
                f"efsmi: parser error {type(exc).__name__}: {exc}", raw=text
            ) from exc


__all__ = ["EnflameCollector", "card_type_for", "parse_efsmi"]
