"""Loading and checking the YAML configuration.

The file is parsed with PyYAML, checked against a JSON Schema (``jsonschema``) and then
against the rules a schema cannot say (warning below critical, a valid regular
expression). Every error names the key path and the line of the file, e.g.::

    /etc/hetpatrol/hetpatrol.yaml:42: profiles[3].temperature_celsius.warning: 95 is
    above critical (90)

:func:`load_config` raises :class:`ConfigError` (the CLI exits 78, EX_CONFIG).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from hetpatrol import deep_health
from hetpatrol.schema import HEALTH_CRITICAL, HEALTH_WARNING, SEVERITY_INFO
from hetpatrol.slurm.settings import SLURM_SCHEMA, SlurmSettings, build_slurm_settings
from hetpatrol.yaml_document import (
    DocumentError,
    format_key_path,
    parse_document,
    read_document,
)

EX_CONFIG = 78

THRESHOLD_KEYS = (
    "temperature_celsius",
    "memory_used_ratio",
    "power_ratio",
    "ecc_uncorrected_total",
)
STATE_CHECK_KEYS = ("remapped_rows_pending", "remapped_rows_failure", "retired_pages_pending")


#: Collectors run when the config has no ``collectors:`` section.
DEFAULT_COLLECTORS = ("nvidia", "ascend")


class ConfigError(Exception):
    """A configuration that cannot be used. ``str()`` names file, line and key path."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ):
        self.path, self.line, self.key = path, line, key
        where = path or "<config>"
        if line is not None:
            where += f":{line}"
        text = f"{where}: {key}: {message}" if key else f"{where}: {message}"
        super().__init__(text)


# --------------------------------------------------------------------------- schema
_LEVEL = {"type": ["number", "null"]}
_THRESHOLD = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"warning": _LEVEL, "critical": _LEVEL},
}
_SEVERITY = {"enum": [SEVERITY_INFO, HEALTH_WARNING, HEALTH_CRITICAL]}
_THRESHOLDS = {k: _THRESHOLD for k in THRESHOLD_KEYS} | {k: _SEVERITY for k in STATE_CHECK_KEYS}
_THRESHOLDS |= deep_health.PROFILE_SCHEMA  # baseline, clock events, PCIe, NVLink, RoCE...

_SECONDS = {"type": "number", "exclusiveMinimum": 0, "maximum": 3600}
_ARGV = {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}
_COLLECTOR_COMMON: dict[str, Any] = {
    "enabled": {"type": "boolean"},
    "timeout_seconds": _SECONDS,
    "command": _ARGV,
}
_NVIDIA_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "enabled": {"type": "boolean"},
        "timeout_seconds": _SECONDS,
        "nvlink": {"type": "boolean"},
        "nvlink_interval_seconds": {"type": "number", "minimum": 0, "maximum": 86400},
        # consecutive patrols an NVML field read may answer Unknown before the card is
        # critical (collectors/nvidia.py); one patrol's Unknown is a warning
        "field_error_patrols": {"type": "integer", "minimum": 1, "maximum": 1000},
    },
}
_ASCEND_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        **_COLLECTOR_COMMON,
        "detail": {"type": "boolean"},
        "detail_interval_seconds": {"type": "number", "minimum": 0, "maximum": 86400},
        "detail_timeout_seconds": _SECONDS,
        "detail_budget_seconds": _SECONDS,
        "hccn_tool": _ARGV,
    },
}

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "node": {"type": ["string", "null"], "minLength": 1},
        "interval_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
        "recovery_patrols": {"type": "integer", "minimum": 1},
        "listen": {"type": ["string", "null"], "minLength": 1},
        "state_path": {"type": ["string", "null"], "minLength": 1},  # null: off; "" is no path
        "textfile_path": {"type": ["string", "null"], "pattern": "\\.prom$"},
        "metrics_user_labels": {"type": "boolean"},
        "jsonl": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "path": {"type": ["string", "null"], "minLength": 1},
                "max_bytes": {"type": "integer", "minimum": 0},
                "backups": {"type": "integer", "minimum": 0, "maximum": 1000},
            },
        },
        "collectors": {
            "type": "object",
            # the built-in collectors' options are checked key by key; a third-party
            # plugin's section may carry options of its own
            "properties": {"nvidia": _NVIDIA_SCHEMA, "ascend": _ASCEND_SCHEMA},
            "additionalProperties": {"type": "object", "properties": _COLLECTOR_COMMON},
        },
        "defaults": {"type": "object", "additionalProperties": False, "properties": _THRESHOLDS},
        "slurm": SLURM_SCHEMA,
        **deep_health.TOP_SCHEMA,  # kernel_log, baseline_file, environment
        "profiles": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "vendor"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "vendor": {"type": "string", "minLength": 1},
                    "card_types": {"type": "array", "items": {"type": "string"}},
                    "model": {"type": "string"},
                    "gres": {"type": ["string", "null"]},
                    "gres_type": {"type": ["string", "null"]},
                    **_THRESHOLDS,
                },
            },
        },
    },
}


# ----------------------------------------------------------------------- data model
@dataclass(frozen=True)
class Threshold:
    """A warning and a critical level (``None`` = that level off)."""

    warning: float | None = None
    critical: float | None = None


@dataclass(frozen=True)
class Profile:
    """Thresholds and GRES mapping for one card type (or family)."""

    name: str
    vendor: str
    card_types: tuple[str, ...] = ()
    model: re.Pattern[str] | None = None
    gres: str | None = None
    gres_type: str | None = None
    thresholds: dict[str, Threshold] = field(default_factory=dict)
    state_checks: dict[str, str] = field(default_factory=dict)
    deep: deep_health.DeepThresholds = deep_health.DeepThresholds()

    def matches(self, vendor: str, card_type: str | None, model: str | None) -> bool:
        """True when this profile applies to a card of that vendor, type and model name."""
        if vendor != self.vendor:
            return False
        if not self.card_types and self.model is None:
            return True
        if card_type is not None and card_type in self.card_types:
            return True
        return self.model is not None and model is not None and bool(self.model.search(model))


@dataclass(frozen=True)
class CollectorConfig:
    name: str
    enabled: bool = True
    timeout_seconds: float = 10.0
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    """A checked configuration. Paths are expanded (``~``, ``$VAR``, ``${VAR:-default}``)."""

    source: str
    node: str
    interval_seconds: float = 10.0
    recovery_patrols: int = 3
    listen: str | None = "0.0.0.0:9477"
    jsonl_path: Path | None = None
    jsonl_max_bytes: int = 100 * 1024 * 1024
    jsonl_backups: int = 5
    state_path: Path | None = None
    textfile_path: Path | None = None
    #: ``user`` and ``slurm_job`` labels on ``hetpatrol_card_process_memory_bytes``
    metrics_user_labels: bool = True
    collectors: tuple[CollectorConfig, ...] = ()
    profiles: tuple[Profile, ...] = ()
    slurm: SlurmSettings = SlurmSettings()
    kernel_log: deep_health.KernelLogRules = deep_health.KernelLogRules()
    environment: deep_health.EnvironmentSettings = deep_health.EnvironmentSettings()
    #: expected versions per (vendor, card type) from ``baseline_file``
    baselines: deep_health.BaselineTable = field(default_factory=dict)
    baseline_file: Path | None = None
    #: what a card no profile applies to is judged by: the ``defaults`` section
    defaults: Profile | None = None
    #: 1-based line of each key path in the file (for errors found after loading)
    key_lines: dict[tuple, int] = field(default_factory=dict, compare=False, repr=False)

    def profile_for(self, vendor: str, card_type: str | None, model: str | None) -> Profile:
        """The first profile that applies; when none does, ``<vendor>-defaults``: the
        ``defaults`` section's thresholds, with no GRES name."""
        for profile in self.profiles:
            if profile.matches(vendor, card_type, model):
                return profile
        base = self.defaults or Profile(name="defaults", vendor=vendor)
        return replace(base, name=f"{vendor}-defaults", vendor=vendor)


# --------------------------------------------------------------------------- loading
def bundled_config_path() -> Path:
    """Path of the default configuration shipped with the package."""
    return Path(str(resources.files("hetpatrol.bundled").joinpath("hetpatrol.yaml")))


_VAR_RE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")


def expand_path(text: str) -> Path:
    """Expand ``${VAR:-default}``, ``$VAR`` and ``~`` in a configured path."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        value = os.environ.get(name)
        if value:
            return value
        return m.group(2) if m.group(2) is not None else ""

    return Path(os.path.expanduser(_VAR_RE.sub(sub, text)))


#: YAML tags a mapping key may have: a string, or the merge key ``<<``.
_KEY_TAGS = ("tag:yaml.org,2002:str", "tag:yaml.org,2002:merge")


#: Control characters no setting holds (a tab may sit in a path or a command).
_CONTROL_RE = re.compile(r"[\x01-\x08\x0a-\x1f\x7f]")


#: ``1e308``: a float to the eye, text to YAML 1.1 (PyYAML wants ``1.0e+308``).
_YAML11_TEXT_FLOAT = re.compile(r"([-+]?[0-9]+)[eE]([-+]?[0-9]+)")

#: Mappings whose keys are read as numbers or case-folded codes: (path pattern, how a
#: key is read). "0079" and "79" are one XID; 8c03a000 and 8C03A000 one fault code.
_NORMALISED_KEYS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("kernel_log", "xid_severity"), int),
    (("kernel_log", "repeat_critical"), int),
    (("ascend_fault_codes", "overrides"), str.upper),
)


def _check_normalised_keys(data: dict, src: str, lines: dict) -> None:
    """Refuse two keys of one mapping that are read as the same one (one would silently
    win): top-level ``kernel_log`` maps, and fault-code overrides in ``defaults`` and
    every profile."""
    places: list[tuple[tuple, Any, Any]] = []
    for keys, read in _NORMALISED_KEYS:
        if keys[0] == "kernel_log":
            places.append((keys, (data.get(keys[0]) or {}).get(keys[1]), read))
        else:
            sections = [(("defaults",), data.get("defaults") or {})] + [
                (("profiles", i), p) for i, p in enumerate(data.get("profiles") or [])
            ]
            for where, section in sections:
                value = (section.get(keys[0]) or {}).get(keys[1])
                places.append(((*where, *keys), value, read))
    for path, mapping, read in places:
        seen: dict[Any, Any] = {}
        for key in mapping or {}:
            norm = read(str(key))
            if norm in seen:
                key_path = (*path, key)
                raise ConfigError(
                    f"the same key as {seen[norm]!r} (both read as {norm!r})",
                    path=src,
                    line=_line_for(lines, key_path),
                    key=format_key_path(key_path),
                )
            seen[norm] = key


def _check_values(value: Any, path: tuple, src: str, lines: dict) -> None:
    """Refuse NaN and infinities (``.nan``, ``.inf``) and strings with a NUL byte or
    another control character anywhere: no setting means them (a path with a NUL cannot
    be opened; ``"x.prom\\n"`` is not a ``.prom`` file; a newline would split a drain
    reason)."""
    problem = None
    if isinstance(value, float) and not math.isfinite(value):
        problem = f"{value} is not a finite number"
    elif isinstance(value, str) and "\0" in value:
        problem = "contains a NUL byte"
    elif isinstance(value, str) and (m := _CONTROL_RE.search(value)):
        problem = f"contains a control character (U+{ord(m[0]):04X})"
    if problem:
        raise ConfigError(problem, path=src, line=_line_for(lines, path), key=format_key_path(path))
    if isinstance(value, dict):
        for k, v in value.items():
            _check_values(v, (*path, k), src, lines)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_values(v, (*path, i), src, lines)


def _line_map(
    node: yaml.Node, path: tuple = (), out: dict | None = None, src: str = ""
) -> dict[tuple, int]:
    """Map every key path of a composed YAML tree to its 1-based line; refuse keys that
    are not strings. (Duplicate keys were refused by the document reader.)"""
    if out is None:
        out = {}
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in _KEY_TAGS:
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else "<complex>"
                raise ConfigError(
                    f"key {shown!r} is not a string (quote it)",
                    path=src,
                    line=key_node.start_mark.line + 1,
                    key=format_key_path((*path, str(shown))),
                )
            key = key_node.value
            out[(*path, key)] = key_node.start_mark.line + 1
            _line_map(value_node, (*path, key), out, src)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*path, i)] = item.start_mark.line + 1
            _line_map(item, (*path, i), out, src)
    return out


def _line_for(lines: dict[tuple, int], path: tuple) -> int | None:
    while True:
        if path in lines:
            return lines[path]
        if not path:
            return None
        path = path[:-1]


def load_config(path: str | os.PathLike[str] | None = None, *, text: str | None = None) -> Config:
    """Read, check and return the configuration.

    ``path=None`` loads the bundled default. ``text`` (for tests and reload checks)
    parses that string instead of reading the file; ``path`` then only names it.
    Raises :class:`ConfigError` naming file, line and key path on any problem.
    """
    src_path = Path(path) if path is not None else bundled_config_path()
    # text given without a path is named <config>, never the bundled file's path
    src = "<config>" if text is not None and path is None else str(src_path)
    try:
        if text is None:
            try:
                text = read_document(src_path)
            except OSError as exc:
                raise ConfigError(f"cannot read: {exc}", path=src) from exc
        data, node = parse_document(text)
    except DocumentError as exc:
        key = format_key_path(exc.key_path) if exc.key_path else None
        raise ConfigError(exc.message, path=src, line=exc.line, key=key) from None
    if data is None:
        data = {}
    lines = _line_map(node, src=src) if node is not None else {}
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of keys", path=src, line=1)
    _check_values(data, (), src, lines)

    validator = jsonschema.Draft202012Validator(CONFIG_SCHEMA)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        err = errors[0]
        epath = tuple(err.absolute_path)
        message = err.message
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            if extra:
                epath = (*epath, extra[0])
                message = "unknown key"
        elif isinstance(err.instance, str) and (m := _YAML11_TEXT_FLOAT.fullmatch(err.instance)):
            exp = m[2] if m[2][0] in "+-" else f"+{m[2]}"
            message += f" (YAML reads an exponent without a dot as text: write {m[1]}.0e{exp})"
        raise ConfigError(
            message, path=src, line=_line_for(lines, epath), key=format_key_path(epath)
        )
    _check_normalised_keys(data, src, lines)
    return _build(data, src, lines)


def _check_threshold(value: dict, path: tuple, src: str, lines: dict) -> Threshold:
    t = Threshold(warning=value.get("warning"), critical=value.get("critical"))
    if t.warning is not None and t.critical is not None and t.warning > t.critical:
        key_path = (*path, "warning")
        raise ConfigError(
            f"warning {t.warning} is above critical {t.critical}",
            path=src,
            line=_line_for(lines, key_path),
            key=format_key_path(key_path),
        )
    for level in ("warning", "critical"):
        v = getattr(t, level)
        problem = None
        if v is not None and v < 0:
            problem = f"{v} is negative"
        elif v is not None and v > 1 and path[-1] in _AT_MOST_ONE:
            problem = f"{v} is above 1: a ratio (0.95 is 95 %)"
        if problem:
            key_path = (*path, level)
            raise ConfigError(
                problem, path=src, line=_line_for(lines, key_path), key=format_key_path(key_path)
            )
    return t


#: Thresholds that are a share of a whole (``power_ratio`` may pass 1: power over limit).
_AT_MOST_ONE = ("memory_used_ratio",)
#: Deep-health settings with a warning and a critical level, as key paths in a profile.
_DEEP_LEVELS = (("nvlink", "errors_total"), ("roce", "link_flaps"))


def _check_deep_levels(
    section: dict, built: deep_health.DeepThresholds, path: tuple, src: str, lines: dict
) -> None:
    """Each level pair of ``section`` as written, then as merged over the defaults."""
    for keys in _DEEP_LEVELS:
        value = section.get(keys[0]) or {}
        if keys[1] in value:
            _check_threshold(value[keys[1]] or {}, (*path, *keys), src, lines)
        levels = getattr(built, "_".join(keys))
        warning, critical = levels.warning, levels.critical
        if warning is not None and critical is not None and warning > critical:
            key_path = (*path, *keys)
            raise ConfigError(
                f"warning {warning} is above critical {critical} "
                "(merged with the levels it inherits)",
                path=src,
                line=_line_for(lines, key_path),
                key=format_key_path(key_path),
            )


def _build(data: dict, src: str, lines: dict) -> Config:
    defaults = data.get("defaults", {}) or {}
    default_thresholds = {
        k: _check_threshold(defaults[k], ("defaults", k), src, lines)
        for k in THRESHOLD_KEYS
        if k in defaults
    }
    default_states = {k: defaults[k] for k in STATE_CHECK_KEYS if k in defaults}

    sections = data.get("collectors")
    if sections is None:
        sections = {name: {} for name in DEFAULT_COLLECTORS}
    vendors = sorted(set(DEFAULT_COLLECTORS) | set(sections))
    fallback = Profile(
        name="defaults",
        vendor="",
        thresholds=dict(default_thresholds),
        state_checks={k: HEALTH_CRITICAL for k in STATE_CHECK_KEYS} | default_states,
        deep=deep_health.build_thresholds(defaults, {}),
    )
    _check_deep_levels(defaults, fallback.deep, ("defaults",), src, lines)

    profiles = []
    names: set[str] = set()
    for i, p in enumerate(data.get("profiles", []) or []):
        if p["vendor"] not in vendors:
            raise ConfigError(
                f"unknown vendor {p['vendor']!r}: a collector's name, one of " + ", ".join(vendors),
                path=src,
                line=_line_for(lines, ("profiles", i, "vendor")),
                key=format_key_path(("profiles", i, "vendor")),
            )
        if p["name"] in names:
            raise ConfigError(
                f"profile name {p['name']!r} used twice",
                path=src,
                line=_line_for(lines, ("profiles", i, "name")),
                key=format_key_path(("profiles", i, "name")),
            )
        names.add(p["name"])
        pattern = None
        if p.get("model") is not None:
            try:
                pattern = re.compile(p["model"], re.IGNORECASE)
            except re.error as exc:
                key_path = ("profiles", i, "model")
                raise ConfigError(
                    f"invalid regular expression: {exc}",
                    path=src,
                    line=_line_for(lines, key_path),
                    key=format_key_path(key_path),
                ) from exc
        thresholds = dict(default_thresholds)
        for k in THRESHOLD_KEYS:
            if k in p:  # a level the profile leaves unset comes from `defaults`
                base = default_thresholds.get(k, Threshold())
                levels = {"warning": base.warning, "critical": base.critical} | (p[k] or {})
                thresholds[k] = _check_threshold(levels, ("profiles", i, k), src, lines)
        states = {k: HEALTH_CRITICAL for k in STATE_CHECK_KEYS} | default_states
        states |= {k: p[k] for k in STATE_CHECK_KEYS if k in p}
        profiles.append(
            Profile(
                name=p["name"],
                vendor=p["vendor"],
                card_types=tuple(p.get("card_types", ())),
                model=pattern,
                gres=p.get("gres"),
                gres_type=p.get("gres_type"),
                thresholds=thresholds,
                state_checks=states,
                deep=deep_health.build_thresholds(defaults, p),
            )
        )
        _check_deep_levels(p, profiles[-1].deep, ("profiles", i), src, lines)

    collectors = []
    # No `collectors:` section means every built-in collector with its defaults (a node
    # without a vendor's stack reports that collector `absent`); an explicit empty
    # mapping means none.
    for name, section in sections.items():
        section = section or {}
        options = {k: v for k, v in section.items() if k != "enabled"}
        collectors.append(
            CollectorConfig(
                name=name,
                enabled=section.get("enabled", True),
                timeout_seconds=float(section.get("timeout_seconds", 10.0)),
                options=options,
            )
        )

    listen = data.get("listen", "0.0.0.0:9477")
    if listen is not None:
        _check_listen(listen, src, _line_for(lines, ("listen",)))

    jsonl = data.get("jsonl") or {}
    jsonl_path = jsonl.get("path")
    state_path = data.get("state_path")
    textfile_path = data.get("textfile_path")
    return Config(
        source=src,
        node=data.get("node") or socket.gethostname().split(".")[0],
        interval_seconds=float(data.get("interval_seconds", 10.0)),
        recovery_patrols=int(data.get("recovery_patrols", 3)),
        listen=listen,
        jsonl_path=expand_path(jsonl_path) if jsonl_path else None,
        jsonl_max_bytes=int(jsonl.get("max_bytes", 100 * 1024 * 1024)),
        jsonl_backups=int(jsonl.get("backups", 5)),
        state_path=expand_path(state_path) if state_path else None,
        textfile_path=expand_path(textfile_path) if textfile_path else None,
        metrics_user_labels=data.get("metrics_user_labels", True),
        collectors=tuple(collectors),
        profiles=tuple(profiles),
        defaults=fallback,
        key_lines=lines,
        slurm=build_slurm_settings(data.get("slurm"), expand_path),
        **deep_health.build_config_fields(data, src, lines),
    )


_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def parse_listen(listen: str) -> tuple[str, int]:
    """Split ``host:port`` (``[::1]:9477`` for IPv6) into (host, port). ValueError if bad."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"{listen!r} is not host:port")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range")
    host = host.strip("[]") or "0.0.0.0"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        # a name must be a plausible host name; it is resolved when the server binds
        if host != "localhost" and not _HOSTNAME_RE.match(host):
            raise ValueError(f"{host!r} is not an IP address or host name") from None
    return host, port


def _check_listen(listen: str, src: str, line: int | None) -> None:
    try:
        parse_listen(listen)
    except ValueError as exc:
        raise ConfigError(str(exc), path=src, line=line, key="listen") from exc
