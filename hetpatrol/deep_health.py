"""Deep health checks: config sections, thresholds per card type, and the judges.

Judges only (the thresholds side of the data flow): reads values the collectors put on
a :class:`~hetpatrol.schema.CardRecord` and the settings of its profile, returns
findings. Checks:

- ``baseline_drift``: driver / firmware version differs from the baseline of its card
  type (profile ``baseline``, or the ``baseline_file`` the config names);
- ``clock_event_reasons``: NVML clocks event reasons (SW/HW thermal slowdown, HW
  slowdown, HW power brake) from ``counters["clocks_event_reasons"]``;
- ``pcie_downtrained``: PCIe generation or width below the card's maximum while busy;
- ``nvlink_down``, ``nvlink_errors``: NVLink state and DL error counters (``links``);
- ``roce_link_down``, ``roce_net_health``, ``roce_link_flaps``, ``roce_optical``: the
  Ascend RoCE port (``links`` of kind ``roce``, from ``hccn_tool``);
- ``ascend_fault_code``: ``npu-smi info -t health`` error codes by the bundled table.

Config sections defined here (merged into :data:`hetpatrol.config.CONFIG_SCHEMA`):
``kernel_log``, ``baseline_file`` and ``environment`` at the top; per profile (and in
``defaults``) ``baseline``, ``clock_event_reasons``, ``busy_utilization_ratio``,
``pcie_downtrained``, ``nvlink``, ``roce``, ``ascend_fault_codes``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import yaml

from hetpatrol.schema import (
    HEALTH_CRITICAL,
    HEALTH_WARNING,
    SEVERITY_INFO,
    CardRecord,
    Finding,
    worst,
)
from hetpatrol.xid import KernelLogRules
from hetpatrol.yaml_document import DocumentError, parse_document, read_document

if TYPE_CHECKING:
    from hetpatrol.config import Config, Profile

# --------------------------------------------------------------------------- schema

_SEV = {"enum": [SEVERITY_INFO, HEALTH_WARNING, HEALTH_CRITICAL, None]}
_NUM = {"type": ["number", "null"], "minimum": 0}
_LEVELS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"warning": _NUM, "critical": _NUM},
}
_VERSIONS = {"type": ["string", "array", "null"], "items": {"type": "string"}}
_BASELINE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"driver_version": _VERSIONS, "firmware_version": _VERSIONS},
}

#: Keys of a profile (and of ``defaults``).
PROFILE_SCHEMA: dict[str, Any] = {
    "baseline": _BASELINE,
    "clock_event_reasons": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            k: _SEV for k in ("sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake")
        },
    },
    "busy_utilization_ratio": {"type": "number", "minimum": 0, "maximum": 1},
    "pcie_downtrained": _SEV,
    "nvlink": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"link_down": _SEV, "errors_total": _LEVELS},
    },
    "roce": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "link_down": _SEV,
            "net_health": _SEV,
            "link_flaps": _LEVELS,
            "flap_window_seconds": {"type": "number", "exclusiveMinimum": 0},
            "optical": _SEV,
        },
    },
    "ascend_fault_codes": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "unknown_code": _SEV,
            "overrides": {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9A-Fa-f]{8}$"},
                "additionalProperties": _SEV,
            },
        },
    },
}

#: Top-level keys.
TOP_SCHEMA: dict[str, Any] = {
    "kernel_log": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "enabled": {"type": "boolean"},
            "path": {"type": "string", "minLength": 1},
            "window_seconds": {"type": "number", "exclusiveMinimum": 0},
            "burst_seconds": {"type": "number", "minimum": 0},
            "xid_severity": {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9]{1,4}$"},
                "additionalProperties": _SEV,
            },
            "repeat_critical": {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9]{1,4}$"},
                "additionalProperties": {"type": "integer", "minimum": 1},
            },
            "unknown_xid_severity": _SEV,
        },
    },
    "baseline_file": {"type": ["string", "null"]},
    "environment": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "enabled": {"type": "boolean"},
            "root": {"type": "string", "minLength": 1},
            "interval_seconds": {"type": "number", "minimum": 0},
            "severity": _SEV,
            "cuda_patterns": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "cann_patterns": {"type": "array", "items": {"type": "string", "minLength": 1}},
        },
    },
}

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

# ---------------------------------------------------------------------- settings

CLOCK_REASON_BITS = {
    "hw_slowdown": 0x8,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}
CLOCK_REASON_TEXT = {
    "hw_slowdown": "HW slowdown",
    "sw_thermal": "SW thermal slowdown",
    "hw_thermal": "HW thermal slowdown",
    "hw_power_brake": "HW power brake slowdown",
}
#: Reasons that count only while the card is busy (an idle card loses no work).
_LOAD_REASONS = ("hw_slowdown", "hw_power_brake")


@dataclass(frozen=True)
class Levels:
    warning: float | None = None
    critical: float | None = None

    def severity(self, value: float) -> str | None:
        if self.critical is not None and value >= self.critical:
            return HEALTH_CRITICAL
        if self.warning is not None and value >= self.warning:
            return HEALTH_WARNING
        return None


@dataclass(frozen=True)
class DeepThresholds:
    """The deep-check settings of one profile (defaults merged in)."""

    baseline: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    clock_event_reasons: Mapping[str, str | None] = field(
        default_factory=lambda: {
            "sw_thermal": HEALTH_WARNING,
            "hw_thermal": HEALTH_WARNING,
            "hw_slowdown": HEALTH_WARNING,
            "hw_power_brake": HEALTH_WARNING,
        }
    )
    busy_utilization_ratio: float = 0.5
    pcie_downtrained: str | None = HEALTH_WARNING
    nvlink_link_down: str | None = HEALTH_WARNING
    nvlink_errors_total: Levels = Levels(warning=100, critical=None)
    roce_link_down: str | None = HEALTH_CRITICAL
    roce_net_health: str | None = HEALTH_WARNING
    roce_link_flaps: Levels = Levels(warning=1, critical=None)
    roce_flap_window_seconds: float = 86400.0
    roce_optical: str | None = HEALTH_WARNING
    fault_code_unknown: str | None = HEALTH_WARNING
    fault_code_overrides: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvironmentSettings:
    """The ``environment`` section: global library paths that mix vendor stacks."""

    enabled: bool = True
    root: str = "/"
    interval_seconds: float = 300.0
    severity: str | None = HEALTH_WARNING
    cuda_patterns: tuple[str, ...] = ("cuda",)
    cann_patterns: tuple[str, ...] = ("ascend", "cann")


def _versions(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


def _levels(section: Mapping[str, Any] | None, base: Levels) -> Levels:
    if not section:
        return base
    return Levels(
        warning=section.get("warning", base.warning),
        critical=section.get("critical", base.critical),
    )


def build_thresholds(defaults: Mapping[str, Any], profile: Mapping[str, Any]) -> DeepThresholds:
    """Deep settings of a profile: built-in defaults < ``defaults`` section < profile."""
    out = DeepThresholds()
    for section in (defaults or {}, profile or {}):
        kw: dict[str, Any] = {}
        if "baseline" in section:
            base = dict(out.baseline)
            for k, v in (section["baseline"] or {}).items():
                base[k] = _versions(v)
            kw["baseline"] = base
        if "clock_event_reasons" in section:
            kw["clock_event_reasons"] = {
                **out.clock_event_reasons,
                **(section["clock_event_reasons"] or {}),
            }
        if "busy_utilization_ratio" in section:
            kw["busy_utilization_ratio"] = float(section["busy_utilization_ratio"])
        if "pcie_downtrained" in section:
            kw["pcie_downtrained"] = section["pcie_downtrained"]
        nv = section.get("nvlink") or {}
        if "link_down" in nv:
            kw["nvlink_link_down"] = nv["link_down"]
        if "errors_total" in nv:
            kw["nvlink_errors_total"] = _levels(nv["errors_total"], out.nvlink_errors_total)
        roce = section.get("roce") or {}
        for key, attr in (
            ("link_down", "roce_link_down"),
            ("net_health", "roce_net_health"),
            ("optical", "roce_optical"),
        ):
            if key in roce:
                kw[attr] = roce[key]
        if "link_flaps" in roce:
            kw["roce_link_flaps"] = _levels(roce["link_flaps"], out.roce_link_flaps)
        if "flap_window_seconds" in roce:
            kw["roce_flap_window_seconds"] = float(roce["flap_window_seconds"])
        codes = section.get("ascend_fault_codes") or {}
        if "unknown_code" in codes:
            kw["fault_code_unknown"] = codes["unknown_code"]
        if "overrides" in codes:
            kw["fault_code_overrides"] = {
                **out.fault_code_overrides,
                **{str(k).upper(): v for k, v in (codes["overrides"] or {}).items()},
            }
        if kw:
            out = _replace(out, **kw)
    return out


def _replace(obj: Any, **kw: Any) -> Any:
    from dataclasses import replace

    return replace(obj, **kw)


def build_kernel_log_rules(section: Mapping[str, Any] | None) -> KernelLogRules:
    s = section or {}
    base = KernelLogRules()
    return KernelLogRules(
        enabled=bool(s.get("enabled", base.enabled)),
        path=str(s.get("path", base.path)),
        window_seconds=float(s.get("window_seconds", base.window_seconds)),
        burst_seconds=float(s.get("burst_seconds", base.burst_seconds)),
        xid_severity={int(k): v for k, v in (s.get("xid_severity") or {}).items()},
        repeat_critical={
            **base.repeat_critical,
            **{int(k): int(v) for k, v in (s.get("repeat_critical") or {}).items()},
        },
        unknown_xid_severity=s.get("unknown_xid_severity", base.unknown_xid_severity),
    )


def build_environment(section: Mapping[str, Any] | None) -> EnvironmentSettings:
    s = section or {}
    base = EnvironmentSettings()
    return EnvironmentSettings(
        enabled=bool(s.get("enabled", base.enabled)),
        root=str(s.get("root", base.root)),
        interval_seconds=float(s.get("interval_seconds", base.interval_seconds)),
        severity=s.get("severity", base.severity),
        cuda_patterns=tuple(s.get("cuda_patterns", base.cuda_patterns)),
        cann_patterns=tuple(s.get("cann_patterns", base.cann_patterns)),
    )


BaselineTable = Mapping[tuple[str, str], Mapping[str, tuple[str, ...] | None]]


def parse_baseline(
    data: Any, source: str
) -> dict[tuple[str, str], dict[str, tuple[str, ...] | None]]:
    """The entries of a baseline file as {(vendor, card_type): {field: versions}}.

    Raises ``ValueError`` naming ``source`` when the data is not a baseline file.
    """
    try:
        jsonschema.validate(data, BASELINE_FILE_SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "<top>"
        raise ValueError(f"{source}: {where}: {exc.message}") from None
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


# ------------------------------------------------------------------------- judges


def _baseline_findings(record: CardRecord, profile: Profile, config: Config) -> list[Finding]:
    table: BaselineTable = getattr(config, "baselines", {}) or {}
    expected: dict[str, tuple[str, ...] | None] = dict(
        table.get((record.vendor, record.card_type or ""), {})
    )
    expected.update(profile.deep.baseline)
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


def _clock_findings(record: CardRecord, th: DeepThresholds) -> list[Finding]:
    mask = record.counters.get("clocks_event_reasons")
    if mask is None:
        return []
    busy = th.busy_utilization_ratio
    idle = record.utilization_ratio is not None and record.utilization_ratio < busy
    active: list[tuple[str, str]] = []
    for reason, bit in CLOCK_REASON_BITS.items():
        severity = th.clock_event_reasons.get(reason)
        if severity is None or not mask & bit:
            continue
        if reason in _LOAD_REASONS and idle:
            severity = SEVERITY_INFO
        active.append((reason, severity))
    if not active:
        return []
    severities = [s for _r, s in active]
    severity = worst(*severities) if any(s != SEVERITY_INFO for s in severities) else SEVERITY_INFO
    names = ", ".join(f"{CLOCK_REASON_TEXT[r]} ({s})" for r, s in active)
    util = (
        "unknown" if record.utilization_ratio is None else f"{record.utilization_ratio * 100:.0f}%"
    )
    advice = (
        f"idle (below {busy * 100:.0f}%): no work is slowed"
        if severity == SEVERITY_INFO
        else "check cooling, power supply and the chassis power brake"
    )
    return [
        Finding(
            "clock_event_reasons",
            severity,
            f"clocks slowed by {names}, mask {mask:#x}, utilization {util}: {advice}",
            value=f"{mask:#x}",
            threshold=busy,
        )
    ]


def _pcie_findings(record: CardRecord, th: DeepThresholds) -> list[Finding]:
    if th.pcie_downtrained is None or record.utilization_ratio is None:
        return []
    if record.utilization_ratio < th.busy_utilization_ratio:
        return []  # idle links drop speed to save power: only a busy card is judged
    gen, gen_max = record.pcie_link_gen, record.pcie_link_gen_max
    width, width_max = record.pcie_link_width, record.pcie_link_width_max
    parts = []
    if gen is not None and gen_max is not None and gen < gen_max:
        parts.append(f"generation {gen} < {gen_max}")
    if width is not None and width_max is not None and width < width_max:
        parts.append(f"width x{width} < x{width_max}")
    if not parts:
        return []
    return [
        Finding(
            "pcie_downtrained",
            th.pcie_downtrained,
            "PCIe link " + ", ".join(parts) + f" at {record.utilization_ratio * 100:.0f}% "
            "utilization: reseat the card or check the riser/slot",
            value={"gen": record.pcie_link_gen, "width": record.pcie_link_width},
            threshold={"gen": record.pcie_link_gen_max, "width": record.pcie_link_width_max},
        )
    ]


def _nvlink_findings(record: CardRecord, th: DeepThresholds) -> list[Finding]:
    links = [lk for lk in record.links if lk.get("kind") == "nvlink"]
    if not links:
        return []
    out = []
    down = [lk["link"] for lk in links if lk.get("state") == "down"]
    if down and th.nvlink_link_down is not None:
        out.append(
            Finding(
                "nvlink_down",
                th.nvlink_link_down,
                f"NVLink link(s) {', '.join(map(str, down))} down of {len(links)}: "
                "check the NVSwitch / fabric manager, reset the GPU",
                value=down,
            )
        )
    total = sum(sum((lk.get("counters") or {}).values()) for lk in links)
    severity = th.nvlink_errors_total.severity(total)
    if severity is not None:
        level = (
            th.nvlink_errors_total.critical
            if severity == HEALTH_CRITICAL
            else th.nvlink_errors_total.warning
        )
        worst_link = max(links, key=lambda lk: sum((lk.get("counters") or {}).values()))
        counts = ", ".join(f"{k} {v}" for k, v in (worst_link.get("counters") or {}).items())
        out.append(
            Finding(
                "nvlink_errors",
                severity,
                f"{total} NVLink DL errors since driver load (most on link "
                f"{worst_link['link']}: {counts})",
                value=total,
                threshold=level,
            )
        )
    return out


def evaluate(record: CardRecord, profile: Profile, config: Config) -> list[Finding]:
    """Every deep finding for one card (empty when all is well or nothing was read)."""
    th = profile.deep
    findings = _baseline_findings(record, profile, config)
    if record.read_ok:
        findings += _clock_findings(record, th)
        findings += _pcie_findings(record, th)
        findings += _nvlink_findings(record, th)
    from hetpatrol import ascend_detail  # judges of the Ascend detail commands

    findings += ascend_detail.evaluate(record, th)
    return findings


def bundled_data(name: str) -> Path:
    """Path of a data file shipped in ``hetpatrol.bundled`` (the ``config/`` folder)."""
    return Path(str(resources.files("hetpatrol.bundled").joinpath(name)))


def build_config_fields(data: Mapping[str, Any], src: str, lines: Mapping) -> dict[str, Any]:
    """The :class:`~hetpatrol.config.Config` fields of the top-level sections defined
    here; a baseline file that cannot be read is a ``ConfigError`` at ``baseline_file``."""
    from hetpatrol.config import ConfigError, _line_for, expand_path

    fields: dict[str, Any] = {
        "kernel_log": build_kernel_log_rules(data.get("kernel_log")),
        "environment": build_environment(data.get("environment")),
    }
    text = data.get("baseline_file")
    if text:
        path = resolve_baseline_path(text, src, expand_path)
        try:
            fields["baselines"] = load_baseline_file(path)
        except ValueError as exc:
            raise ConfigError(
                str(exc), path=src, line=_line_for(lines, ("baseline_file",)), key="baseline_file"
            ) from None
        fields["baseline_file"] = path
    return fields


def baseline_override(path: Path) -> dict[str, Any]:
    """Config fields for ``once --baseline FILE``; ``ConfigError`` when unreadable."""
    from hetpatrol.config import ConfigError

    try:
        return {"baselines": load_baseline_file(Path(path)), "baseline_file": Path(path)}
    except ValueError as exc:
        raise ConfigError(str(exc), path=str(path)) from None


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


def write_baseline(report, path: Path | None, out, err, force: bool = False) -> int:
    """``hetpatrol baseline``: the report's versions as a baseline file, printed or
    written atomically to ``path``. Exit 0; 3 when no card type could be read (a
    baseline of nothing would check nothing), or when some card or collector could not
    be read (:func:`unread_for_baseline`) and ``force`` is false: nothing is written."""
    from hetpatrol.exporters.state import write_atomic
    from hetpatrol.patrol import rfc3339

    doc = baseline_document(report.cards, report.node, rfc3339(report.finished))
    if not doc["baseline"]:
        # never replace a good baseline file with an empty one
        err.write("no card type could be read: no baseline written\n")
        return 3
    missed = unread_for_baseline(report)
    if missed and not force:
        # a baseline that silently lacks a card type would check nothing for it
        err.write(
            f"could not read {', '.join(missed)}: the baseline would miss them; "
            "no baseline written (--force writes it anyway)\n"
        )
        return 3
    text = dump_baseline(doc)
    if path is None or str(path) == "-":
        out.write(text)
    else:
        write_atomic(Path(path), text.encode())
    for row in doc["baseline"]:
        mixed = [n for n in ("driver_version", "firmware_version") if isinstance(row[n], list)]
        note = f" (cards disagree on {', '.join(mixed)}: all their versions kept)" if mixed else ""
        driver = row["driver_version"] or "unknown"
        firmware = row["firmware_version"] or "unknown"
        err.write(
            f"{row['vendor']} {row['card_type']}: {row['cards']} cards, driver "
            f"{driver}, firmware {firmware}{note}\n"
        )
    if path is not None and str(path) != "-":
        err.write(f"baseline written to {path}\n")
    return 0
