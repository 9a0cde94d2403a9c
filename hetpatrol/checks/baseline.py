"""Baseline drift: driver and firmware versions against the ones a card type should run.

Config section: per profile (and ``defaults``) ``baseline: {driver_version,
firmware_version}`` (one version or a list of accepted ones; null checks nothing); at
the top ``baseline_file``, a file written by ``hetpatrol baseline --write``
(:func:`baseline_document`), read when the config is loaded; the profile's versions win
over the file's. Finding ``baseline_drift`` (warning) naming both versions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hetpatrol.checks.facts import CardFacts
from hetpatrol.json_schema import best_error
from hetpatrol.schema import HEALTH_WARNING, CardRecord, Finding
from hetpatrol.yaml_document import DocumentError, parse_document, read_document

NAME = "baseline"

_VERSIONS = {"type": ["string", "array", "null"], "items": {"type": "string"}}
PROFILE_SCHEMA: dict[str, Any] = {
    "baseline": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"driver_version": _VERSIONS, "firmware_version": _VERSIONS},
    }
}
TOP_SCHEMA: dict[str, Any] = {"baseline_file": {"type": ["string", "null"]}}

#: A version as a card reports it: printable, no control character, not empty.
_VERSION_TEXT = {"type": "string", "pattern": "^[^\\x00-\\x1f\\x7f]+$"}
#: A baseline file's version: one, any of a non-empty list, or null (not checked).
_FILE_VERSIONS = {
    "oneOf": [
        {"type": "null"},
        _VERSION_TEXT,
        {"type": "array", "minItems": 1, "items": _VERSION_TEXT},
    ]
}
BASELINE_FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["baseline"],
    "properties": {
        "node": {"type": ["string", "null"]},
        "recorded": {"type": ["string", "null"]},
        "baseline": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["vendor", "card_type"],
                "properties": {
                    # as the collectors write them: lower case (nvidia, ascend, 910b)
                    "vendor": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]*$"},
                    "card_type": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]*$"},
                    "driver_version": _FILE_VERSIONS,
                    "firmware_version": _FILE_VERSIONS,
                    "cards": {"type": "integer", "minimum": 0},
                },
            },
        },
    },
}


@dataclass(frozen=True)
class BaselineSettings:
    """Versions a profile expects (``driver_version``/``firmware_version`` -> accepted
    versions, None: not checked)."""

    versions: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)


def _versions(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


def build_profile(
    defaults: Mapping[str, Any], profile: Mapping[str, Any] | None, where: tuple
) -> BaselineSettings:
    """Versions of a profile: ``defaults`` < the profile."""
    out: dict[str, tuple[str, ...] | None] = {}
    for section in (defaults or {}, profile or {}):
        for k, v in (section.get("baseline") or {}).items():
            out[k] = _versions(v)
    return BaselineSettings(out)


def build_top(
    data: Mapping[str, Any], source: str, expand: Callable[[str], Path]
) -> tuple[BaselineTable, Path | None]:
    """(the baseline file's table, its path) for the top-level ``baseline_file`` (a path
    relative to the config file ``source``); ``({}, None)`` without one. ``ValueError``
    naming the file when it cannot be read or is not a baseline file."""
    text = data.get("baseline_file")
    if not text:
        return {}, None
    path = resolve_baseline_path(text, source, expand)
    return load_baseline_file(path), path


BaselineTable = Mapping[tuple[str, str], Mapping[str, tuple[str, ...] | None]]


def parse_baseline(
    data: Any, source: str
) -> dict[tuple[str, str], dict[str, tuple[str, ...] | None]]:
    """The entries of a baseline file as {(vendor, card_type): {field: versions}}.

    Raises ``ValueError`` naming ``source`` when the data is not a baseline file.
    """
    exc = best_error(BASELINE_FILE_SCHEMA, data)
    if exc is not None:
        where = "/".join(str(p) for p in exc.absolute_path) or "<top>"
        raise ValueError(f"{source}: {where}: {exc.message}")
    out: dict[tuple[str, str], dict[str, tuple[str, ...] | None]] = {}
    for entry in data["baseline"]:
        key = (entry["vendor"], str(entry["card_type"]))
        if key in out:
            raise ValueError(f"{source}: {key[0]} {key[1]} listed twice")
        out[key] = {
            name: _versions(entry[name])
            for name in ("driver_version", "firmware_version")
            if name in entry
        }
    return out


def load_baseline_file(path: Path) -> dict[tuple[str, str], dict[str, tuple[str, ...] | None]]:
    """Read a baseline file written by ``hetpatrol baseline --write``. ``ValueError``
    (naming the file) when it cannot be read or is not a baseline file."""
    try:
        data, _ = parse_document(read_document(path))
    except OSError as exc:
        raise ValueError(f"cannot read baseline file {path}: {exc}") from None
    except DocumentError as exc:
        raise ValueError(f"baseline file {path}: {exc}") from None
    return parse_baseline(data, str(path))


def baseline_document(cards: Sequence[CardRecord], node: str, recorded: str) -> dict[str, Any]:
    """The baseline file for ``cards``: one entry per (vendor, card type), with every
    version seen (a single string when the cards agree, a list when they do not)."""
    seen: dict[tuple[str, str], dict[str, list[str]]] = {}
    counts: dict[tuple[str, str], int] = {}
    for card in cards:
        if not card.card_type:
            continue
        key = (card.vendor, card.card_type)
        counts[key] = counts.get(key, 0) + 1
        entry = seen.setdefault(key, {"driver_version": [], "firmware_version": []})
        for name in ("driver_version", "firmware_version"):
            value = getattr(card, name)
            if value is not None and value not in entry[name]:
                entry[name].append(value)
    rows = []
    for (vendor, card_type), entry in sorted(seen.items()):
        row: dict[str, Any] = {"vendor": vendor, "card_type": card_type}
        for name in ("driver_version", "firmware_version"):
            values = sorted(entry[name])
            row[name] = None if not values else values[0] if len(values) == 1 else values
        row["cards"] = counts[(vendor, card_type)]
        rows.append(row)
    return {"node": node, "recorded": recorded, "baseline": rows}


def dump_baseline(doc: Mapping[str, Any]) -> str:
    head = (
        "# hetpatrol baseline: the driver and firmware versions each card type is expected\n"
        "# to run. Written by `hetpatrol baseline --write`; reference it from the config\n"
        "# with `baseline_file: <path>` (relative to the config file). A list accepts any\n"
        "# of its versions; null checks nothing.\n"
    )
    return head + yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=False)


def resolve_baseline_path(text: str, config_source: str, expand) -> Path:
    path = expand(text)
    if not path.is_absolute():
        path = Path(os.path.dirname(os.path.abspath(config_source))) / path
    return path


def unread_for_baseline(report) -> list[str]:
    """What a baseline taken from ``report`` would miss: collectors that failed or hung
    (``"ascend collector failed"``) and cards whose type or row could not be read
    (``"nvidia/3"``, a GPU lost before its model was read)."""
    missed = [f"{s.name} collector {s.state}" for s in report.collectors if not s.up]
    for card in report.cards:
        if card.card_type is None or any(f.check == "card_unreadable" for f in card.findings):
            chip = "" if card.chip is None else f"/{card.chip}"
            missed.append(f"{card.vendor}/{card.index}{chip}")
    return missed


def evaluate(record: CardRecord, settings: BaselineSettings, facts: CardFacts) -> list[Finding]:
    """``baseline_drift`` (warning) when the driver or firmware version differs from the
    expected ones: the baseline file's entry for the card's (vendor, card type), then
    the profile's ``baseline`` over it."""
    table: BaselineTable = facts.top or {}
    expected: dict[str, tuple[str, ...] | None] = dict(
        table.get((record.vendor, record.card_type or ""), {})
    )
    expected.update(settings.versions)
    got, want, parts = {}, {}, []
    for name in ("driver_version", "firmware_version"):
        versions = expected.get(name)
        value = getattr(record, name)
        if not versions or value is None or value in versions:
            continue
        got[name], want[name] = value, list(versions) if len(versions) > 1 else versions[0]
        shown = " or ".join(versions)
        parts.append(f"{name.replace('_', ' ')} {value} differs from the baseline {shown}")
    if not parts:
        return []
    return [
        Finding(
            "baseline_drift",
            HEALTH_WARNING,
            "; ".join(parts) + f" ({record.vendor} {record.card_type}): update the driver "
            "or firmware, or record a new baseline",
            value=got,
            threshold=want,
        )
    ]
