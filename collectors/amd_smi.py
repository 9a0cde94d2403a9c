"""``amd-smi`` read into :class:`~hetpatrol.collectors.rocm_family.RocmCard`: JSON (a
list, or ``{"gpu_data": [...]}`` in newer releases) or the human ``KEY: value`` tree,
``static`` and ``metric`` joined on the ``gpu`` index. Values are read by unit
(``{"value": 10, "unit": "W"}``, ``550 W``); amd-smi's memory "MB" are MiB: amdsmi_cli
divides the byte counts by 1024*1024 (github.com/ROCm/amdsmi
``amdsmi_cli/amdsmi_commands.py``). One key per value, no fallback to another field: a
garbled key leaves the value None with the reason, never another field's text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hetpatrol.collector import CollectorError
from hetpatrol.collectors.rocm_family import (
    BYTES,
    CELSIUS,
    NUM,
    WATTS,
    RocmCard,
    identity_text,
    read_value,
)
from hetpatrol.schema import normalize_bus_id


def parse_amd_smi_tree(text: str) -> list[dict[str, Any]]:
    """``amd-smi`` output as a list of per-GPU mappings with lower-case keys.

    JSON (a list, or ``{"gpu_data": [...]}`` in newer releases) is taken as is; the
    human form (``GPU: 0`` then indented ``KEY: value`` lines) is turned into the same
    nesting (``CPU:`` blocks are skipped, a ``...`` line ends nothing). Raises
    :class:`CollectorError` when no ``GPU`` entry is found.
    """
    # a shell echo of the command line may precede the document
    start = re.search(r"^[ \t]*[\[{]", text, re.MULTILINE)
    if start is not None and not _HUMAN_GPU.search(text):
        try:
            doc = json.loads(text[start.start() :])
        except ValueError as exc:
            raise CollectorError(f"amd-smi --json: not JSON ({exc})", raw=text) from None
        if isinstance(doc, dict):
            doc = doc.get("gpu_data", [doc])
        if not isinstance(doc, list):
            raise CollectorError("amd-smi --json: not a list of GPUs", raw=text)
        gpus = [_lower(e) for e in doc if isinstance(e, dict) and "gpu" in e]
    else:
        gpus = _human_tree(text)
    if not gpus:
        raise CollectorError("amd-smi: no GPU entry in the output", raw=text)
    return gpus


_HUMAN_GPU = re.compile(r"^GPU:[ \t]*[0-9]+[ \t]*$", re.MULTILINE)


def _lower(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k).lower(): _lower(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_lower(v) for v in obj]
    return obj


def _human_tree(text: str) -> list[dict[str, Any]]:
    gpus: list[dict[str, Any]] = []
    stack: list[tuple[int, dict]] = []
    lines = text.splitlines()
    if lines and not text.endswith(("\n", "\r")):
        lines.pop()  # a last line without its line end may be cut mid-value: not trusted
    for line in lines:
        if not line.strip() or line.strip() == "..." or line.lstrip().startswith("$"):
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if indent == 0:
            stack = []
            if key == "gpu" and NUM.fullmatch(value):
                entry: dict[str, Any] = {"gpu": int(value)}
                gpus.append(entry)
                stack = [(-1, entry)]
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value == "":
            child: dict[str, Any] = {}
            parent[key] = child
            stack.append((indent, child))
        else:
            parent[key] = value
    return gpus


def _get(entry: dict, *path: str) -> Any:
    node: Any = entry
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _first(entry: dict, section: str, *keys: str) -> tuple[str | None, Any]:
    for key in keys:
        value = _get(entry, section, key)
        if value is not None:
            return f"{section}.{key}", value
    return None, None


def amd_smi_cards(static: list[dict] | None, metric: list[dict] | None) -> list[RocmCard]:
    """One :class:`RocmCard` per GPU of ``amd-smi static`` and ``amd-smi metric``
    (either may be None when that run failed), joined on the ``gpu`` index."""
    by_index: dict[int, RocmCard] = {}
    in_static: set[int] = set()

    def card_for(entry: dict) -> RocmCard | None:
        idx = entry.get("gpu")
        if isinstance(idx, str) and idx.isdigit():
            idx = int(idx)
        if not isinstance(idx, int) or isinstance(idx, bool):
            return None
        return by_index.setdefault(idx, RocmCard(index=idx))

    for entry in static or []:
        card = card_for(entry)
        if card is None:
            continue
        # one key each, no fallback: a garbled key must leave the value None, not swap in
        # another field's text
        card.model = identity_text(_get(entry, "asic", "market_name"), card, "amd-smi asic")
        card.serial = identity_text(_get(entry, "asic", "asic_serial"), card, "amd-smi asic")
        card.bus_id = normalize_bus_id(
            identity_text(_get(entry, "bus", "bdf"), card, "amd-smi bus")
        )
        card.driver_version = identity_text(
            _get(entry, "driver", "version"), card, "amd-smi driver"
        )
        card.firmware_version = identity_text(
            _get(entry, "vbios", "version"), card, "amd-smi vbios"
        )
        src, raw = _first(entry, "limit", "max_power", "socket_power", "power_cap")
        if src is not None:
            card.power_limit_watts = read_value(card, "amd-smi " + src, raw, None, WATTS)
        in_static.add(card.index)
        kind = (identity_text(_get(entry, "vram", "type")) or "").lower()
        card.memory_kind = "hbm" if kind.startswith("hbm") else "gddr" if "gddr" in kind else None
        src, raw = _first(entry, "vram", "size")
        if src is not None:
            total = read_value(card, "amd-smi static " + src, raw, None, BYTES)
            card.memory_total_bytes = int(total) if total is not None else None
    for entry in metric or []:
        card = card_for(entry)
        if card is None:
            continue
        _metric(card, entry)
    for card in by_index.values():
        for attr, what in _AMD_STATIC if card.index in in_static else ():
            if getattr(card, attr) is None and not any(what in k for k in card.errors):
                card.errors[f"amd-smi static {what}"] = "not in the output"
        for attr, what in _AMD_NEEDED:
            if getattr(card, attr) is None and not any(what in k for k in card.errors):
                card.errors[f"amd-smi {what}"] = "not in the output"
    return [by_index[i] for i in sorted(by_index)]


_AMD_STATIC = (
    ("model", "asic.market_name"),
    ("serial", "asic.asic_serial"),
    ("bus_id", "bus.bdf"),
    ("driver_version", "driver.version"),
    ("power_limit_watts", "limit.max_power"),
    ("memory_total_bytes", "vram.size"),
)
_AMD_NEEDED = (
    ("temperature_celsius", "temperature"),
    ("power_watts", "power"),
    ("utilization_percent", "usage"),
    ("memory_used_bytes", "mem_usage"),
)


def _metric(card: RocmCard, entry: dict) -> None:
    reads = (
        ("utilization_percent", "usage", ("gfx_activity",), {"%"}),
        (
            "power_watts",
            "power",
            ("socket_power", "current_socket_power", "average_socket_power"),
            WATTS,
        ),
        ("temperature_celsius", "temperature", ("hotspot", "junction"), CELSIUS),
        ("memory_total_bytes", "mem_usage", ("total_vram",), BYTES),
        ("memory_used_bytes", "mem_usage", ("used_vram",), BYTES),
        ("ecc_corrected_total", "ecc", ("total_correctable_count",), None),
        ("ecc_uncorrected_total", "ecc", ("total_uncorrectable_count",), None),
    )
    for attr, section, keys, units in reads:
        src, raw = _first(entry, section, *keys)
        if src is None:
            if section in entry:
                card.errors[f"amd-smi {section}.{keys[0]}"] = "not in the output"
            continue
        value = read_value(card, "amd-smi " + src, raw, None, units)
        if value is not None and attr.startswith(("memory", "ecc")):
            value = int(value)
        setattr(card, attr, value)
    blocks = _get(entry, "ecc_blocks")
    if isinstance(blocks, dict):
        for block, counts in blocks.items():
            if not isinstance(counts, dict):
                continue
            name = re.sub(r"[^a-z0-9]+", "_", block.lower()).strip("_")
            for key, counter in (
                ("uncorrectable_count", "ecc_uncorrected_"),
                ("correctable_count", "ecc_corrected_"),
                ("deferred_count", "ecc_deferred_"),
            ):
                if key in counts:
                    value = read_value(
                        card, f"amd-smi ecc_blocks.{block}.{key}", counts[key], None, None
                    )
                    if value is not None:
                        card.counters[counter + name] = int(value)
