"""The ROCm family's tools read into one shape: ``rocm-smi`` (AMD, and Hygon's DTK build),
``hy-smi`` where it prints the same, and ``amd-smi`` (JSON or its human ``KEY: value``
tree, in :mod:`hetpatrol.collectors.amd_smi`). Shared by :mod:`hetpatrol.collectors.hygon`
and :mod:`hetpatrol.collectors.amd`.

Where the formats differ, the difference is read, not papered over:

- **keys**: rocm-smi's JSON keys carry their unit in the last parentheses
  (``"VRAM Total Memory (B)"`` on AMD, ``"vram Total Memory (MiB)"`` on Hygon DTK
  24.04); the unit is read from the key and converted (B, KiB, MiB, GiB; W, mW; C, %).
  A key whose unit is not one of these is not read (a problem is noted).
- **DCU vs GPU**: Hygon's build says ``"DCU use (%)"`` and heads its table ``DCU``; AMD's
  says ``GPU``. Both are the utilisation; the word also tells the two families apart on a
  node where the same program name (``rocm-smi``) is installed by either vendor
  (:attr:`RocmCard.family`; the card vendor string ``Chengdu Haiguang`` says it too).
- **temperatures**: the junction (hotspot) sensor only; an output without it gives None
  with the sensors it had (edge is no stand-in).
- **empty keys**: DTK's JSON carries a ``"": ""`` entry per card (a section separator):
  skipped, not a problem.
- **amd-smi** prints ``{"value": 10, "unit": "W"}`` objects (JSON) or ``550 W`` text
  (human form); both are read by unit. Its memory "MB" are MiB: amdsmi_cli divides the
  byte counts by 1024*1024 (github.com/ROCm/amdsmi ``amdsmi_cli/amdsmi_commands.py``).
  ECC is read in total (``ecc.total_*_count``) and per block (``ecc_blocks.<BLOCK>``,
  ``amd-smi metric --ecc-blocks``), the latter as ``counters["ecc_uncorrected_<block>"]``.
- **the plain rocm-smi table** (``DCU Temp AvgPwr Fan Perf PwrCap VRAM% DCU%``; ROCm 5's
  ``GPU Temp (DieEdge) AvgPwr ...``; ROCm 6's ``Device [Model : Revision] Temp Power ...``
  with its second header row and a name row under each card) is read by where each
  header name starts, each value by its unit; it gives VRAM only as a percentage: no
  bytes, so memory is null with that reason; a Temp column naming the edge sensor is no
  stand-in for the junction (null with that reason).

A value the tool printed as ``N/A`` (with or without a note: ``N/A (Secondary die)``) is
``None`` with the reason; a value that is neither
a number nor ``N/A`` (garbled) is ``None`` and the card is marked ``complete=False``,
judged ``unknown``. Nothing is ever read as 0 for lack of a value.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from hetpatrol.collector import CollectorError
from hetpatrol.collectors.smi_table import (
    Column,
    aligned_columns,
    aligned_values,
    describe,
    is_na,
)
from hetpatrol.schema import CardRecord, normalize_bus_id

HYGON = "hygon"
AMD = "amd"

#: the rocm-smi query both plugins run (hygon by default, amd when amd-smi is absent):
#: the recorded DTK 24.04.3 and ROCm 6.2.4 fixtures were read with it (gpustack
#: tests/detectors/rocm_smi)
ROCM_SMI_COMMAND = (
    "rocm-smi",
    "-i",
    "--showmeminfo",
    "vram",
    "--showpower",
    "--showserial",
    "--showuse",
    "--showtemp",
    "--showproductname",
    "--showuniqueid",
    "--json",
)

_UNIT_KEY = re.compile(r"^(?P<name>.*?)\s*\((?P<unit>[^()]*)\)\s*$")
NUM = re.compile(r"[-+]?[0-9]{1,15}(?:\.[0-9]{1,9})?")
_NUM_UNIT = re.compile(r"(?P<num>[-+]?[0-9]{1,15}(?:\.[0-9]{1,9})?)\s*(?P<unit>[^\s0-9.]*)")
_NA = frozenset({"n/a", "na", "-", "--", "not supported", "unknown"})
#: unit -> factor to bytes
BYTES = {"b": 1, "kib": 1024, "mib": 1 << 20, "mb": 1 << 20, "gib": 1 << 30}
WATTS = {"w": 1.0, "mw": 0.001}
CELSIUS = {"c", "°c", "\u2103", "celsius"}


@dataclass
class RocmCard:
    """One card as a ROCm-family tool printed it (units converted: bytes, W, °C, %).

    ``family`` is ``"hygon"`` or ``"amd"`` (see module doc). ``errors`` maps a value's
    source (the key or column as printed) to why it is missing; ``complete`` is False
    when a value was garbled or the row cut. ``counters`` holds per-block ECC counts.
    """

    index: int
    family: str = AMD
    model: str | None = None
    serial: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    driver_version: str | None = None
    firmware_version: str | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    utilization_percent: float | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    ecc_corrected_total: int | None = None
    ecc_uncorrected_total: int | None = None
    memory_kind: str | None = None
    counters: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    complete: bool = True


@dataclass
class RocmRead:
    """A whole tool output: its cards, the source it was read as (``"rocm-smi json"``,
    ``"rocm-smi table"``, ``"amd-smi"``), ``truncated`` and ``problems``."""

    source: str
    cards: list[RocmCard] = field(default_factory=list)
    truncated: bool = False
    problems: list[str] = field(default_factory=list)


def read_value(card: RocmCard, source: str, raw: Any, unit: str | None, table: dict | set | None):
    """``raw`` (text, number or ``{"value", "unit"}``) converted by ``unit``; None with
    ``card.errors[source]`` set when N/A, garbled or in a unit not understood."""
    if isinstance(raw, dict) and "value" in raw:
        unit = raw.get("unit") if isinstance(raw.get("unit"), str) else unit
        raw = raw["value"]
    if isinstance(raw, bool):
        raw = str(raw)
    if isinstance(raw, (int, float)):
        number: float = float(raw)
    else:
        text = str(raw).strip()
        if text.lower() in _NA or text == "" or is_na(text):
            card.errors[source] = f"{text or 'empty'}: not reported"
            return None
        m = _NUM_UNIT.fullmatch(text)
        if not m:
            card.errors[source] = f"not a number: {text[:40]!r}"
            card.complete = False
            return None
        number = float(m["num"])
        if m["unit"]:
            unit = m["unit"]
    u = (unit or "").strip().lower()
    if table is None:
        return number
    if isinstance(table, set):
        if u in table:
            return number
    elif u in table:
        return number * table[u]
    card.errors[source] = f"unit {unit!r} not understood: not read"
    return None


# ------------------------------------------------------------------ rocm-smi --json


def _parse_rocm_json(text: str) -> RocmRead:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CollectorError(f"rocm-smi --json: not JSON ({exc})", raw=text) from None
    if not isinstance(doc, dict):
        raise CollectorError("rocm-smi --json: not a JSON object of cards", raw=text)
    read = RocmRead("rocm-smi json")
    driver = None
    system = doc.get("system")
    if isinstance(system, dict):
        driver = system.get("Driver version") or None
    for key, entry in doc.items():
        m = re.fullmatch(r"card([0-9]{1,4})", key)
        if key == "system":
            continue
        if not m or not isinstance(entry, dict):
            read.problems.append(f"entry {key[:30]!r} not understood")
            continue
        card = RocmCard(index=int(m[1]), driver_version=driver if isinstance(driver, str) else None)
        _read_rocm_card(card, entry, read)
        read.cards.append(card)
    if not read.cards:
        raise CollectorError("rocm-smi --json: no card entries", raw=text)
    return read


@functools.lru_cache(maxsize=1024)
def _key_parts(key: str) -> tuple[str, str | None]:
    """(name lower-cased, unit) of a rocm-smi key; cached: the keys repeat every patrol."""
    m = _UNIT_KEY.match(key)
    return " ".join((m["name"] if m else key).split()).lower(), (m["unit"] if m else None)


#: keys read by nothing (identifiers of the PCI device and the driver's build)
_IGNORED = frozenset(
    {
        "device id",
        "device rev",
        "subsystem id",
        "guid",
        "card model",
        "card sku",
        "node id",
        "gfx version",
    }
)


def _read_rocm_card(card: RocmCard, entry: dict, read: RocmRead) -> None:
    temps: dict[str, tuple[str, Any]] = {}
    for key, raw in entry.items():
        if key == "":  # DTK's separator entry
            continue
        name, unit = _key_parts(key)
        if name in _IGNORED:
            continue
        if name.startswith("dcu "):
            card.family = HYGON
        if name in ("card series", "device name") and card.model is None:
            card.model = identity_text(raw, card, key)
        elif name == "card vendor":
            if re.search(r"haiguang|hygon", str(raw), re.IGNORECASE):
                card.family = HYGON
        elif name == "serial number":
            card.serial = identity_text(raw, card, key)
        elif name == "unique id":
            card.uuid = identity_text(raw, card, key)
        elif name == "pci bus":
            card.bus_id = normalize_bus_id(identity_text(raw, card, key))
        elif name.startswith("temperature (sensor"):
            temps[name] = (key, raw)
        elif name in ("gpu use", "dcu use"):
            card.utilization_percent = read_value(card, key, raw, unit, {"%"})
        elif name == "vram total memory":
            total = read_value(card, key, raw, unit, BYTES)
            card.memory_total_bytes = int(total) if total is not None else None
        elif name == "vram total used memory":
            used = read_value(card, key, raw, unit, BYTES)
            card.memory_used_bytes = int(used) if used is not None else None
        elif name in (
            "average graphics package power",
            "current socket graphics package power",
        ):
            if card.power_watts is None:
                card.power_watts = read_value(card, key, raw, unit, WATTS)
        elif name == "max graphics package power":
            card.power_limit_watts = read_value(card, key, raw, unit, WATTS)
    # junction (hotspot) only: the sensor the card throttles on. Edge is no stand-in (a
    # lost or damaged junction key would silently swap sensors): None with the reason.
    if "temperature (sensor junction)" in temps:
        key, raw = temps["temperature (sensor junction)"]
        card.temperature_celsius = read_value(card, key, raw, _unit_of(key), CELSIUS)
    else:
        seen = ", ".join(sorted(temps)) or "none"
        card.errors["temperature"] = f"no junction sensor key (sensors: {seen[:80]})"
    for what, value in (
        ("serial number", card.serial),
        ("card series", card.model),
        ("unique id", card.uuid),
        ("vram total memory", card.memory_total_bytes),
        ("vram total used memory", card.memory_used_bytes),
        ("use", card.utilization_percent),
        ("power", card.power_watts),
    ):
        if value is None and not any(what in k.lower() for k in card.errors):
            card.errors[what] = "not reported (key absent or N/A)"


def _unit_of(key: str) -> str | None:
    m = _UNIT_KEY.match(key)
    return m["unit"] if m else None


# ------------------------------------------------------------------ rocm-smi (table)

#: the first header word of rocm-smi's concise table: ``GPU`` (ROCm 4/5), ``Device`` (ROCm
#: 6), ``DCU`` (Hygon DTK), ``HCU`` (Hygon hy-smi)
_INDEX_HEADERS = {"GPU": AMD, "Device": AMD, "DCU": HYGON, "HCU": HYGON}
#: column (name before its parentheses, lower-cased) -> (attribute, units)
_TABLE_UNITS = {
    "temp": ("temperature_celsius", CELSIUS),
    "avgpwr": ("power_watts", WATTS),
    "power": ("power_watts", WATTS),
    "pwrcap": ("power_limit_watts", WATTS),
    "dcu%": ("utilization_percent", {"%"}),
    "gpu%": ("utilization_percent", {"%"}),
    "hcu%": ("utilization_percent", {"%"}),
}
#: columns read as text only or not needed (clocks, fan, performance level, VRAM%, the
#: PCI ids and partition modes of ROCm 6, the node number)
_TABLE_SKIP = {
    "fan",
    "fans",
    "perf",
    "sclk",
    "mclk",
    "vram%",
    "ids",
    "node",
    "partitions",
    "temp(junction)",
}
#: the sensor words a Temp column names (in its own parentheses or the row under it)
_EDGE = {"edge", "dieedge"}
#: ROCm 6 prints the card name under ``[Model : Revision]`` cut to 20 characters
_NAME_CUT = 20


def _base(name: str) -> tuple[str, str | None]:
    """``"Temp (DieEdge)"`` -> ``("temp", "dieedge")``; ``"PwrCap"`` -> ``("pwrcap", None)``."""
    m = re.fullmatch(r"(.*?)\s*\(([^()]*)\)\s*", name)
    if m and m[1]:
        return m[1].strip().lower(), m[2].strip().lower()
    return name.strip().lower(), None


def _parse_rocm_table(text: str) -> RocmRead:
    """rocm-smi's concise table read by its header: each column found by where its
    name starts (:func:`~hetpatrol.collectors.smi_table.aligned_columns`), each value
    by the column it is printed under and by its unit; the header's second row gives a
    column's sensor (``(Junction)``, ``(Edge)``) and, under ``[Model : Revision]``, says
    that the row below each card holds its name (ROCm 6)."""
    read = RocmRead("rocm-smi table")
    lines = text.splitlines()
    cols: list[Column] | None = None
    family = AMD
    ended = False
    card: RocmCard | None = None
    skip_to = -1
    for n, line in enumerate(lines):
        s = line.strip()
        if not s or n <= skip_to:
            continue
        if cols is None:
            first = s.split()[0]
            if first in _INDEX_HEADERS and len(s.split()) >= 3:
                sub = lines[n + 1] if n + 1 < len(lines) else ""
                if not sub.strip() or set(sub.strip()) <= {"="} or sub.split()[0][:1].isdigit():
                    sub = ""
                else:
                    skip_to = n + 1
                cols = aligned_columns(line, sub or None)
                family = _INDEX_HEADERS[first]
            continue
        if set(s) <= {"=", "-"}:
            continue
        if "End of" in s and "SMI Log" in s:
            ended = True
            break
        values = aligned_values(cols, line)
        index_text = values.get(cols[0].name)
        if index_text is None and card is not None and len(values) == 1:
            _name_row(card, cols, values)
            continue
        if index_text is None or not index_text.isdigit():
            read.problems.append(f"row {' '.join(s.split())[:40]!r} not understood")
            card = None
            continue
        card = RocmCard(index=int(index_text), family=family)
        _table_values(card, cols, values, read)
        read.cards.append(card)
    if cols is None or not read.cards:
        seen = f"header {' | '.join(c.name for c in cols)[:80]!r}, " if cols else ""
        raise CollectorError(
            f"rocm-smi: no DCU/GPU table in the output ({seen}{describe(text)})", raw=text
        )
    if not ended:
        read.truncated = True
        read.problems.append("no 'End of SMI Log' line: tail of the table missing")
    return read


def _name_row(card: RocmCard, cols: list[Column], values: dict[str, str]) -> None:
    """ROCm 6: the row under a card holds its name, under ``[Model : Revision]`` whose
    second header row says ``Name (20 chars)``; a name of 20 characters may be cut
    (``AMD INSTINCT MI200 (``) and is then not taken as the model."""
    col = next(c for c in cols if c.name in values)
    name = values[col.name]
    if not (col.sub or "").lower().startswith("name"):
        card.errors[f"rocm-smi {col.name[:20]}"] = f"row {name[:30]!r} under it not understood"
        return
    card.errors.pop("rocm-smi model", None)
    if len(name) >= _NAME_CUT:
        card.errors["rocm-smi model"] = f"name {name!r} cut at {_NAME_CUT} characters: not read"
    else:
        card.model = identity_text(name, card, "rocm-smi name")


def _table_values(
    card: RocmCard, cols: list[Column], values: dict[str, str], read: RocmRead
) -> None:
    for col in cols[1:]:
        base, qual = _base(col.name)
        sensor = (
            qual
            or (_base(col.sub)[1] if col.sub else None)
            or (col.sub or "").strip("()").lower()
            or None
        )
        source = f"rocm-smi {col.name[:24]}"
        if base in _TABLE_UNITS:
            attr, units = _TABLE_UNITS[base]
            cell = values.get(col.name)
            if cell is None:
                card.errors[source] = "nothing printed under the column: row cut"
                card.complete = False
                read.truncated = True
                continue
            if base == "temp" and sensor in _EDGE:
                # the junction (hotspot) sensor only, as in the JSON: edge is no stand-in
                card.errors["temperature"] = f"this table prints the {sensor} sensor only"
                continue
            setattr(card, attr, read_value(card, source, cell, None, units))
        elif base == "[model : revision]" or base.startswith("[model"):
            continue
        elif base not in _TABLE_SKIP:
            card.errors[f"rocm-smi {col.name[:20]}"] = "column not understood: not read"
            if f"column {col.name[:20]!r} not understood" not in read.problems:
                read.problems.append(f"column {col.name[:20]!r} not understood")
    card.errors["rocm-smi memory"] = "the table prints VRAM% only: no bytes"
    if not any((c.sub or "").lower().startswith("name") for c in cols):
        card.errors["rocm-smi model"] = "the table prints no model name"
    else:
        card.errors["rocm-smi model"] = "no name row under the card"


def parse_rocm_smi(text: str) -> RocmRead:
    """Parse ``rocm-smi`` (or ``hy-smi``) output: the ``--json`` form when the text is a
    JSON object, the plain ``DCU``/``GPU`` table otherwise.

    Returns a :class:`RocmRead`; raises :class:`CollectorError` (``raw=text``) for empty
    output or output with no card in it: never an empty result. No other exception
    escapes for any input.
    """
    try:
        if text.lstrip().startswith("{"):
            return _parse_rocm_json(text)
        return _parse_rocm_table(text)
    except CollectorError:
        raise
    except Exception as exc:  # pragma: no cover - guard: a parser bug must not escape
        raise CollectorError(
            f"rocm-smi: parser error {type(exc).__name__}: {exc}", raw=text
        ) from exc


#: characters no model name, serial or version holds: a control character, U+FFFD (a
#: byte that was not UTF-8) or one of these; such a text is garbled, not read
_GARBLED = re.compile(r"[\x00-\x1f\x7f\ufffd#?@!*~^`%&$;=<>]")


def identity_text(value: Any, card: RocmCard | None = None, source: str = "") -> str | None:
    """An identity text (model, serial, id, version): None when absent, ``N/A`` or
    garbled (then ``card.errors[source]`` says so)."""
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value).strip()
    if text.lower() in _NA or not text:
        return None
    if _GARBLED.search(text):
        if card is not None:
            card.errors[source] = f"garbled text {text[:40]!r}: not read"
            card.complete = False
        return None
    return text


# ------------------------------------------------------------------ records


def to_record(card: RocmCard, vendor: str, card_type: str, tool: str) -> CardRecord:
    """The :class:`CardRecord` of one card; each missing value's reason becomes an
    error entry (source: ``tool`` and the key/column). ``utilization_ratio`` is the
    percentage / 100; the health word is left None (these tools print none)."""
    rec = CardRecord(
        vendor=vendor,
        index=card.index,
        model=card.model,
        card_type=card_type,
        serial=card.serial,
        uuid=card.uuid,
        bus_id=card.bus_id,
        driver_version=card.driver_version,
        firmware_version=card.firmware_version,
        temperature_celsius=card.temperature_celsius,
        power_watts=card.power_watts,
        power_limit_watts=card.power_limit_watts,
        memory_total_bytes=card.memory_total_bytes,
        memory_used_bytes=card.memory_used_bytes,
        # the tool's VRAM: device memory of unstated kind ("fb", as NVML's framebuffer)
        # unless amd-smi static says HBM/GDDR
        memory_kind=(card.memory_kind or "fb") if card.memory_total_bytes is not None else None,
        ecc_corrected_total=card.ecc_corrected_total,
        ecc_uncorrected_total=card.ecc_uncorrected_total,
    )
    if card.utilization_percent is not None:
        if 0 <= card.utilization_percent <= 100:
            rec.utilization_ratio = card.utilization_percent / 100.0
        else:
            rec.add_error(f"{tool} use", f"{card.utilization_percent:g} out of 0..100")
    rec.counters.update(card.counters)
    for source, why in card.errors.items():
        src = source if source.startswith(tool.split()[0]) else f"{tool} {source}"
        rec.add_error(src, why)
    if not card.complete:
        rec.read_ok = False
        rec.add_error(tool, "output damaged or cut: card not fully read")
    rec.add_error(f"{tool} processes", "unknown: this read lists no processes")
    return rec
