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
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from hetpatrol import deep_health
from hetpatrol.schema import HEALTH_CRITICAL, HEALTH_WARNING, SEVERITY_INFO
from hetpatrol.slurm.settings import SLURM_SCHEMA, SlurmSettings, build_slurm_settings

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
        "listen": {"type": ["string", "null"]},
        "state_path": {"type": ["string", "null"]},
        "textfile_path": {"type": ["string", "null"], "pattern": "\\.prom$"},
        "jsonl": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "path": {"type": ["string", "null"]},
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
    collectors: tuple[CollectorConfig, ...] = ()
    profiles: tuple[Profile, ...] = ()
    slurm: SlurmSettings = SlurmSettings()
    kernel_log: deep_health.KernelLogRules = deep_health.KernelLogRules()
    environment: deep_health.EnvironmentSettings = deep_health.EnvironmentSettings()
    #: expected versions per (vendor, card type) from ``baseline_file``
    baselines: deep_health.BaselineTable = field(default_factory=dict)
    baseline_file: Path | None = None

    def profile_for(self, vendor: str, card_type: str | None, model: str | None) -> Profile:
        """The first profile that applies; a built-in empty one when none does."""
        for profile in self.profiles:
            if profile.matches(vendor, card_type, model):
                return profile
        return Profile(name=f"{vendor}-builtin", vendor=vendor)


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
#: Deepest nesting a config may have (the schema needs 5 levels).
MAX_DEPTH = 32


def _yaml_error_line(exc: yaml.YAMLError, text: str) -> int | None:
    """1-based line of a YAML error (reader errors carry a character position)."""
    for attr in ("problem_mark", "context_mark"):
        mark = getattr(exc, attr, None)
        if mark is not None:
            return mark.line + 1
    position = getattr(exc, "position", None)
    if isinstance(position, int):
        return text.count("\n", 0, position) + 1
    return None


def _check_structure(text: str, src: str) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` and self-referencing aliases.

    Runs over the parser's events (iterative), before the recursive composer could hit
    Python's recursion limit on such input. Raises ``yaml.YAMLError`` for bad syntax.
    """
    open_anchors: list[str | None] = []
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            open_anchors.append(event.anchor)
            if len(open_anchors) > MAX_DEPTH:
                raise ConfigError(
                    f"nested deeper than {MAX_DEPTH} levels",
                    path=src,
                    line=event.start_mark.line + 1,
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            open_anchors.pop()
        elif isinstance(event, yaml.AliasEvent) and event.anchor in open_anchors:
            raise ConfigError(
                f"alias *{event.anchor} refers to a node that contains it",
                path=src,
                line=event.start_mark.line + 1,
            )


def _check_numbers(value: Any, path: tuple, src: str, lines: dict) -> None:
    """Refuse NaN and infinities (``.nan``, ``.inf``) anywhere: no setting means them."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(
            f"{value} is not a finite number",
            path=src,
            line=_line_for(lines, path),
            key=_fmt_path(path),
        )
    if isinstance(value, dict):
        for k, v in value.items():
            _check_numbers(v, (*path, k), src, lines)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_numbers(v, (*path, i), src, lines)


#: A configuration is a few hundred values; aliases expanding past this are refused
#: before anything walks the expanded tree (an "alias bomb" would take minutes and GBs).
MAX_CONFIG_VALUES = 100_000


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Number of values ``node`` stands for once every alias is expanded (memoised)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a self-referencing alias counts once (it is refused later)
    if isinstance(node, yaml.MappingNode):
        total = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        total = 1 + sum(_expanded_size(v, memo) for v in node.value)
    else:
        total = 1
    memo[key] = total
    return total


def _line_map(
    node: yaml.Node, path: tuple = (), out: dict | None = None, src: str = ""
) -> dict[tuple, int]:
    """Map every key path of a composed YAML tree to its 1-based line; refuse duplicates."""
    if out is None:
        out = {}
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in _KEY_TAGS:
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else "<complex>"
                raise ConfigError(
                    f"key {shown!r} is not a string (quote it)",
                    path=src,
                    line=key_node.start_mark.line + 1,
                    key=_fmt_path((*path, str(shown))),
                )
            key = key_node.value
            if key in seen:
                raise ConfigError(
                    "duplicate key",
                    path=src,
                    line=key_node.start_mark.line + 1,
                    key=_fmt_path((*path, key)),
                )
            seen.add(key)
            out[(*path, key)] = key_node.start_mark.line + 1
            _line_map(value_node, (*path, key), out, src)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*path, i)] = item.start_mark.line + 1
            _line_map(item, (*path, i), out, src)
    return out


def _fmt_path(path: tuple | list) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top>"


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
    if text is None:
        try:
            raw = src_path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc}", path=src) from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise ConfigError(f"not UTF-8: {exc.reason}", path=src, line=line) from exc
    try:
        _check_structure(text, src)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None and _expanded_size(node, {}) > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"the configuration expands to more than {MAX_CONFIG_VALUES} values "
                "(YAML anchors and aliases nested too far)",
                path=src,
                line=1,
            )
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).split("\n")[0]
        line = _yaml_error_line(exc, text)
        raise ConfigError(f"invalid YAML: {problem}", path=src, line=line) from exc
    except RecursionError as exc:  # guard: _check_structure bounds the depth first
        raise ConfigError("invalid YAML: nested too deeply", path=src) from exc
    if data is None:
        data = {}
    lines = _line_map(node, src=src) if node is not None else {}
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of keys", path=src, line=1)
    _check_numbers(data, (), src, lines)

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
        raise ConfigError(message, path=src, line=_line_for(lines, epath), key=_fmt_path(epath))
    return _build(data, src, lines)


def _check_threshold(value: dict, path: tuple, src: str, lines: dict) -> Threshold:
    t = Threshold(warning=value.get("warning"), critical=value.get("critical"))
    if t.warning is not None and t.critical is not None and t.warning > t.critical:
        key_path = (*path, "warning")
        raise ConfigError(
            f"warning {t.warning} is above critical {t.critical}",
            path=src,
            line=_line_for(lines, key_path),
            key=_fmt_path(key_path),
        )
    for level in ("warning", "critical"):
        v = getattr(t, level)
        if v is not None and v < 0:
            key_path = (*path, level)
            raise ConfigError(
                f"{v} is negative",
                path=src,
                line=_line_for(lines, key_path),
                key=_fmt_path(key_path),
            )
    return t


def _build(data: dict, src: str, lines: dict) -> Config:
    defaults = data.get("defaults", {}) or {}
    default_thresholds = {
        k: _check_threshold(defaults[k], ("defaults", k), src, lines)
        for k in THRESHOLD_KEYS
        if k in defaults
    }
    default_states = {k: defaults[k] for k in STATE_CHECK_KEYS if k in defaults}

    profiles = []
    names: set[str] = set()
    for i, p in enumerate(data.get("profiles", []) or []):
        if p["name"] in names:
            raise ConfigError(
                f"profile name {p['name']!r} used twice",
                path=src,
                line=_line_for(lines, ("profiles", i, "name")),
                key=_fmt_path(("profiles", i, "name")),
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
                    key=_fmt_path(key_path),
                ) from exc
        thresholds = dict(default_thresholds)
        for k in THRESHOLD_KEYS:
            if k in p:
                thresholds[k] = _check_threshold(p[k], ("profiles", i, k), src, lines)
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

    collectors = []
    # No `collectors:` section means every built-in collector with its defaults (a node
    # without a vendor's stack reports that collector `absent`); an explicit empty
    # mapping means none.
    sections = data.get("collectors")
    if sections is None:
        sections = {name: {} for name in DEFAULT_COLLECTORS}
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
        collectors=tuple(collectors),
        profiles=tuple(profiles),
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
