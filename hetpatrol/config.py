"""Loading and checking the YAML configuration.

The file is parsed with PyYAML, checked against a JSON Schema (``jsonschema``) and then
against the rules a schema cannot say (warning below critical, a valid regular
expression). Every error names the key path and the line of the file, e.g.::

    /etc/hetpatrol/hetpatrol.yaml:42: profiles[3].temperature_celsius.warning: 95 is
    above critical (90)

and every error is said at once, in the order of the file's lines (at most
``MAX_REPORTED_ERRORS``, then how many more): a site file laid over the bundled one is
checked as laid, each error said at the file, key path and line that wrote it.

:func:`load_config` raises :class:`ConfigError` (the CLI exits 78, EX_CONFIG).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import ipaddress
import math
import os
import re
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hetpatrol.actions.settings import ACTIONS_SCHEMA, ActionSettings, parse_actions_section
from hetpatrol.checks.registry import CARD_CHECKS, TOP_SECTIONS
from hetpatrol.collector import COLLECTOR_COMMON_OPTIONS, Collector, discover
from hetpatrol.config_file import (
    EX_CONFIG,
    ConfigError,
    SettingError,
    all_errors,
    bundled_config_path,
    config_error,
    expand_path,
    line_for,
    line_map,
)
from hetpatrol.json_schema import iter_errors
from hetpatrol.slurm.settings import SLURM_SCHEMA, SlurmSettings, build_slurm_settings
from hetpatrol.yaml_document import (
    DocumentError,
    format_key_path,
    key_text,
    parse_document,
    read_document,
)

#: The built-in collectors, in the order they run when the config has no ``collectors:``
#: section; every other plugin registered in the ``hetpatrol.collectors`` entry-point
#: group runs after them, by name (a new vendor edits nothing here).
DEFAULT_COLLECTORS = ("nvidia", "ascend")
#: A plugin's default card-type profiles (and so its GRES name): ``<module>_profiles.yaml``
#: beside its module (``profiles.yaml`` in a plugin package), a mapping with one key,
#: ``profiles``, shaped like the config's. Used for a vendor the config has no profile for.
PLUGIN_PROFILES_SUFFIX = "_profiles.yaml"


# --------------------------------------------------------------------------- schema
#: a GRES name or type: letters, digits, '_', '.', '-' (AutoDetect's MIG types hold '.')
_GRES_WORD = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
#: the keys of a profile (and of ``defaults``) that the check families declare
_THRESHOLDS: dict[str, Any] = {}
for _check in CARD_CHECKS:
    _THRESHOLDS |= _check.PROFILE_SCHEMA
#: the top-level keys the check families declare (kernel_log, baseline_file, environment)
_TOP: dict[str, Any] = {}
for _check in TOP_SECTIONS:
    _TOP |= _check.TOP_SCHEMA

#: a collector section whose plugin declares no schema (``Collector.options_schema``)
_COLLECTOR_GENERIC: dict[str, Any] = {"type": "object", "properties": COLLECTOR_COMMON_OPTIONS}

_SHARE = {"type": "number", "minimum": 0, "maximum": 1}
#: ``hetpatrol ledger capacity`` verdict thresholds (hetpatrol/ledger/capacity.py)
LEDGER_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "additionalProperties": False,
    "properties": {
        "capacity": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "expand_allocated_share": _SHARE,
                "expand_wait_p90_hours": {"type": "number", "minimum": 0, "maximum": 8760},
                "underused_allocated_share": _SHARE,
                "underused_busy_share": _SHARE,
                "unhealthy_down_share": _SHARE,
            },
        }
    },
}

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "node": {"type": ["string", "null"], "minLength": 1},
        "interval_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
        "recovery_patrols": {"type": "integer", "minimum": 1},
        # 1 would make one patrol's short list critical (a drain): the project's rule is
        # never a drain from one ambiguous signal
        "missing_patrols": {"type": "integer", "minimum": 2, "maximum": 1000},
        "hung_tool_patrols": {"type": "integer", "minimum": 1, "maximum": 10000},
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
            # the common keys here; a plugin's section by the schema it declares
            # (Collector.options_schema), laid in by config_schema() for the sections a
            # file has
            "additionalProperties": _COLLECTOR_GENERIC,
        },
        "defaults": {"type": "object", "additionalProperties": False, "properties": _THRESHOLDS},
        "slurm": SLURM_SCHEMA,
        "actions": {**ACTIONS_SCHEMA, "type": ["object", "null"]},
        "ledger": LEDGER_SCHEMA,
        **_TOP,
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
                    # one word as gres.conf, Gres= and a TaskProlog carry it: gres.conf(5)
                    # splits on blanks, Gres= on ':' and ',' (gres-conf writes the value
                    # into all three; '$(...)' here ran in every job's TaskProlog)
                    "gres": {"type": ["string", "null"], "pattern": _GRES_WORD},
                    "gres_type": {"type": ["string", "null"], "pattern": _GRES_WORD},
                    **_THRESHOLDS,
                },
            },
        },
    },
}


# ----------------------------------------------------------------------- data model
@dataclass(frozen=True)
class Profile:
    """GRES mapping and the check families' settings for one card type (or family).

    ``checks`` maps each card check family's ``NAME`` to its settings for this profile
    (``checks["card_thresholds"].thresholds["temperature_celsius"]``)."""

    name: str
    vendor: str
    card_types: tuple[str, ...] = ()
    model: re.Pattern[str] | None = None
    gres: str | None = None
    gres_type: str | None = None
    checks: Mapping[str, Any] = field(default_factory=dict)

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
    #: patrols in a row a card listed before is no longer listed before card_missing is
    #: critical (reboot_node), unless the kernel log or the PCI census corroborates it
    missing_patrols: int = 3
    #: patrols in a row a vendor tool stays in D state before collector_hung names it
    hung_tool_patrols: int = 3
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
    #: the ``actions:`` section: per-code overrides, the actions that drain, escalation
    actions: ActionSettings = field(default_factory=ActionSettings)
    #: top-level settings of the check families, by their ``NAME``: ``kernel_events``
    #: (the ``kernel_log`` section), ``environment``, ``baseline`` (expected versions per
    #: (vendor, card type) from ``baseline_file``)
    top: Mapping[str, Any] = field(default_factory=dict)
    baseline_file: Path | None = None
    #: ``ledger: capacity:`` thresholds as written (hetpatrol/ledger/capacity.py Thresholds)
    ledger_capacity: Mapping[str, float] = field(default_factory=dict)
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
#: Control characters no setting holds (a tab may sit in a path or a command).
_CONTROL_RE = re.compile(r"[\x01-\x08\x0a-\x1f\x7f]")


#: ``1e308``: a float to the eye, text to YAML 1.1 (PyYAML wants ``1.0e+308``).
_YAML11_TEXT_FLOAT = re.compile(r"([-+]?[0-9]+)[eE]([-+]?[0-9]+)")


def _check_normalised_keys(data: dict, places: _Places, found: _Found) -> None:
    """Refuse two keys of one mapping that are read as the same one (one would silently
    win): "0079" and "79" are one XID, 8c03a000 and 8C03A000 one fault code. The check
    families declare such mappings: ``TOP_NORMALISED_KEYS`` (top level) and
    ``PROFILE_NORMALISED_KEYS`` (``defaults`` and every profile), as (key path, how a key
    is read). Each such pair is added to ``found``."""
    with found.unit():
        _check_normalised(data, places, found)


def _check_normalised(data: dict, at: _Places, found: _Found) -> None:
    places: list[tuple[tuple, Any, Any]] = []
    for check in TOP_SECTIONS:
        for keys, read in getattr(check, "TOP_NORMALISED_KEYS", ()):
            places.append((keys, (data.get(keys[0]) or {}).get(keys[1]), read))
    sections = [(("defaults",), data.get("defaults") or {})] + [
        (("profiles", i), p) for i, p in enumerate(data.get("profiles") or [])
    ]
    for check in CARD_CHECKS:
        for keys, read in getattr(check, "PROFILE_NORMALISED_KEYS", ()):
            for where, section in sections:
                value = (section.get(keys[0]) or {}).get(keys[1])
                places.append(((*where, *keys), value, read))
    for path, mapping, read in places:
        seen: dict[Any, Any] = {}
        for key in mapping or {}:
            norm = read(str(key))
            if norm in seen:
                found.append(
                    at.error(
                        f"the same key as {seen[norm]!r} (both read as {norm!r})", (*path, key)
                    )
                )
                continue
            seen[norm] = key


def _check_values(value: Any, path: tuple, src: str, lines: dict, found: list) -> None:
    """Refuse NaN and infinities (``.nan``, ``.inf``) and strings with a NUL byte or
    another control character anywhere: no setting means them (a path with a NUL cannot
    be opened; ``"x.prom\\n"`` is not a ``.prom`` file; a newline would split a drain
    reason). Each is added to ``found``."""
    problem = None
    if isinstance(value, float) and not math.isfinite(value):
        problem = f"{value} is not a finite number"
    elif isinstance(value, str) and "\0" in value:
        problem = "contains a NUL byte"
    elif isinstance(value, str) and (m := _CONTROL_RE.search(value)):
        problem = f"contains a control character (U+{ord(m[0]):04X})"
    if problem:
        found.append(config_error(problem, src, lines, path))
    if isinstance(value, dict):
        for k, v in value.items():
            _check_values(v, (*path, k), src, lines, found)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_values(v, (*path, i), src, lines, found)


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
    lines = line_map(node, src=src) if node is not None else {}
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of keys", path=src, line=1)
    found = _Found()
    _check_values(data, (), src, lines, found)
    base = data.pop("base", "bundled")
    if base not in ("bundled", "none"):
        found.append(config_error("must be bundled or none", src, lines, ("base",)))
    places = _Places(_Layer(src, lines, data))
    if base != "none" and src_path != bundled_config_path():
        # an unknown base word is said above, and the file checked as laid over the
        # bundled one (the default), so that its other errors are said with it
        _check_profile_switches(data, src, lines, found)
        try:
            bundled, base_layer, bundled_at = _bundled_layers()
        except ConfigError as exc:  # a plugin's profile file: the site file cannot be laid
            raise all_errors([*found, exc], src) from None
        marks: list[list[tuple[str, int]]] = []
        data = layered(bundled, data, origins=marks)
        site = places.site
        places = _Places(
            site,
            base_layer,
            [[(site, j) if kind == "site" else bundled_at[j] for kind, j in m] for m in marks],
        )

    schema = config_schema(data.get("collectors"))
    for err in iter_errors(schema, data):
        for epath, message in schema_problems(err):
            found.append(places.error(message, epath))
    shaped = len(found)  # errors of the values as written and of the schema
    _check_normalised_keys(data, places, found)
    config = _build(data, places, found)
    if found or config is None:
        # the checks that run on the laid config go on where the schema refused a value
        # (so that their errors are said too), but one of a section holding a refused
        # key, or under one, says the same error again: `actions` refused for the
        # unknown key `actions.drain_onn`
        early = [e for exc in found[:shaped] for e in exc.errors]
        later = [
            e
            for exc in found[shaped:]
            for e in exc.errors
            if not any(_same_place(e, x) for x in early)
        ]
        raise all_errors([*found[:shaped], *later], src)  # type: ignore[misc]
    return config


def _same_place(a: ConfigError, b: ConfigError) -> bool:
    """True when ``a`` and ``b`` are in one file at one key, or one's key is a section
    holding the other's."""
    if a.path != b.path or a.key is None or b.key is None:
        return False
    short, long = sorted((a.key, b.key), key=len)
    return long == short or long.startswith((short + ".", short + "["))


@dataclass(frozen=True)
class _Layer:
    """One file of a config: its name, its lines (:func:`line_map`), its parsed data."""

    src: str
    lines: dict[tuple, int]
    data: Any


def _written_depth(data: Any, path: tuple) -> int:
    """How many keys of ``path``, from the top, ``data`` has."""
    depth = 0
    for k in path:
        in_list = isinstance(data, list) and isinstance(k, int) and 0 <= k < len(data)
        if not (in_list or isinstance(data, Mapping) and k in data):
            break
        data = data[k]
        depth += 1
    return depth


class _Places:
    """Where each key path of a config laid over the bundled one was written: the site
    file (``site``), the bundled file (``base``), and, for each profile of the laid
    config, the files and positions it came from (``profiles[i]``: ``(layer, index)``
    pairs, the site's first). Errors found in the laid config (its schema, the check
    families' settings) are said at the file and line that wrote the key, and by that
    file's key path: ``profiles[2].x`` is the third profile *of that file*, whatever
    position the overlay gave it."""

    def __init__(
        self,
        site: _Layer,
        base: _Layer | None = None,
        profiles: list[list[tuple[_Layer, int]]] | None = None,
    ):
        self.site, self.base, self.profiles = site, base, profiles

    def of(self, path: tuple) -> tuple[_Layer, tuple]:
        """(the file, its key path) of ``path`` of the laid config: of the files that may
        have written it, the one that has most of it (the site file on a tie: its value
        won), or the site file where it wrote the section that holds it (its values,
        laid over the other file's, made the error: a critical below the bundled
        warning)."""
        path = tuple(path)
        if (
            self.profiles is not None
            and len(path) >= 2
            and path[0] == "profiles"
            and isinstance(path[1], int)
            and 0 <= path[1] < len(self.profiles)
        ):
            cands = [(layer, ("profiles", j, *path[2:])) for layer, j in self.profiles[path[1]]]
        else:
            cands = [(self.site, path)] + ([(self.base, path)] if self.base else [])
        site = cands[0]

        def written(cand: tuple[_Layer, tuple]) -> int:
            depth = _written_depth(cand[0].data, cand[1])
            parent = cand[1][:-1]
            # a section (not the top, not a profile entry) the site file wrote
            section = len(parent) > 2 or (len(parent) >= 1 and parent[0] != "profiles")
            return depth + 1 if cand is site and depth == len(parent) and section else depth

        # max() keeps the first of equals: the site file's
        return max(cands, key=written)

    def error(self, message: str, path: tuple) -> ConfigError:
        """A :class:`ConfigError` at ``path`` of the laid config, said where it was written."""
        layer, at = self.of(path)
        return config_error(message, layer.src, layer.lines, at)


class _Found(list):
    """The errors a config's checks found so far (:class:`ConfigError` each)."""

    @contextmanager
    def unit(self) -> Iterator[None]:
        """One check: the :class:`ConfigError` it raises is kept and the checks go on.
        Any other exception where an error was found already is a consequence of it (a
        value of the wrong type, said by the schema) and is dropped; without one it is
        raised (a defect)."""
        try:
            yield
        except ConfigError as exc:
            self.append(exc)
        except Exception:
            if not self:
                raise


def _bundled_layers() -> tuple[dict[str, Any], _Layer, list[tuple[_Layer, int]]]:
    """(the bundled layer, :func:`bundled_document`; the bundled file as a
    :class:`_Layer`; for each profile of the bundled layer, the file it was written in
    and its position there: the bundled file's own, then each plugin's profile file)."""
    origins: list[tuple[str, int]] = []
    bundled = bundled_document(origins)
    base = _Layer(str(bundled_config_path()), _BUNDLED_LINES, _BUNDLED)
    layers: dict[str, _Layer] = {base.src: base}
    for src, _i in origins:
        if src not in layers:
            data, lines = _plugin_document(Path(src))
            layers[src] = _Layer(src, lines, data)
    return bundled, base, [(layers[src], i) for src, i in origins]


def plugin_options_schema(name: str) -> Mapping[str, Any] | None:
    """The schema the plugin registered as ``name`` declares for its ``collectors.<name>``
    section (``Collector.options_schema``); None when it declares none, there is no such
    plugin or it cannot be imported (then it is reported where it is configured)."""
    ep = discover().get(name)
    if ep is None:
        return None
    try:
        cls = ep.load()  # type: ignore[attr-defined]
        schema = (
            cls.options_schema if isinstance(cls, type) and issubclass(cls, Collector) else None
        )
    except Exception:  # noqa: BLE001 - a broken plugin must not make every config invalid
        return None
    return schema if isinstance(schema, Mapping) else None


def config_schema(sections: Any) -> dict[str, Any]:
    """:data:`CONFIG_SCHEMA` with the schemas the plugins declare for the ``collectors:``
    ``sections`` given that set more than ``enabled`` (a section ``{enabled: true}``
    imports no plugin: the generic schema checks it as the plugin's would)."""
    if not isinstance(sections, Mapping):
        return CONFIG_SCHEMA
    declared = {}
    for name, section in sections.items():
        if isinstance(section, Mapping) and set(section) - {"enabled"}:
            schema = plugin_options_schema(str(name))
            if schema is not None:
                declared[str(name)] = schema
    if not declared:
        return CONFIG_SCHEMA
    props = dict(CONFIG_SCHEMA["properties"])
    props["collectors"] = {**props["collectors"], "properties": declared}
    return {**CONFIG_SCHEMA, "properties": props}


def did_you_mean(word: str, known) -> str:
    """`` (did you mean 'path'?)`` for the known word nearest ``word``
    (``difflib.get_close_matches``, its default cutoff 0.6: ``pathh`` -> ``path``,
    ``colectors`` -> ``collectors``), empty when none is near enough."""
    import difflib  # only on an error: the daemon loads configs that have none

    near = difflib.get_close_matches(str(word), [str(k) for k in known], n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


#: JSON Schema's bound keywords (draft 2020-12 validation, section 6.2) as a sentence
_BOUND_WORDS = {
    "minimum": "at least",
    "exclusiveMinimum": "more than",
    "maximum": "at most",
    "exclusiveMaximum": "less than",
}


def _types(value: Any) -> list:
    """A schema's ``type`` as a list (``"object"`` or ``["object", "null"]``)."""
    return [value] if isinstance(value, str) else list(value)


def schema_problems(err: Any) -> list[tuple[tuple, str]]:
    """Every (key path, message) of one ``jsonschema.ValidationError`` of a config-shaped
    file (:func:`schema_error`): one for each key a mapping may not have (jsonschema
    says them all in one error). An error with sub-errors (``anyOf``, ``oneOf``) is said
    by the one ``jsonschema.exceptions.best_match`` finds most relevant."""
    if err.context:
        from jsonschema.exceptions import best_match

        err = best_match([err])
    if err.validator == "additionalProperties":
        allowed = set(err.schema.get("properties", {}))
        extra = sorted(set(map(str, err.instance)) - allowed)
        if len(extra) > 1:
            return [schema_error(err, unknown=k) for k in extra]
    return [schema_error(err)]


def schema_error(err: Any, *, unknown: str | None = None) -> tuple[tuple, str]:
    """(key path, message) of a ``jsonschema.ValidationError`` of a config-shaped file
    (``unknown``: the key to name of those an ``additionalProperties`` error finds, by
    default the first by name).

    A key the schema does not allow (``additionalProperties``) is named by its own path
    with ``unknown key`` and the nearest allowed key of that mapping
    (:func:`did_you_mean`); at the top ``base`` is one (popped before the schema). An
    exponent YAML 1.1 reads as text (``1e1``) says how to write it, and a number where
    text belongs (a card type ``910_93``, read as 91093) says to quote it. A bound
    (``minimum``, ``exclusiveMaximum``...) reads ``must be at least 0 (got -1)``."""
    epath = tuple(err.absolute_path)
    message = err.message
    if err.validator == "additionalProperties":
        allowed = set(err.schema.get("properties", {}))
        extra = [unknown] if unknown is not None else sorted(set(map(str, err.instance)) - allowed)
        if extra:
            epath = (*epath, extra[0])
            # the top of a config file (CONFIG_SCHEMA, or config_schema()'s copy of it
            # with the plugins' collector sections laid in)
            if not err.absolute_path and "collectors" in allowed:
                allowed.add("base")
            message = "unknown key" + did_you_mean(extra[0], sorted(allowed))
    elif err.validator in _BOUND_WORDS:
        # jsonschema words exclusiveMinimum "-1 is less than or equal to the minimum of 0":
        # the bound as the operator must meet it, and the value given
        message = (
            f"must be {_BOUND_WORDS[err.validator]} {err.validator_value} (got {err.instance})"
        )
    elif isinstance(err.instance, str) and (m := _YAML11_TEXT_FLOAT.fullmatch(err.instance)):
        exp = m[2] if m[2][0] in "+-" else f"+{m[2]}"
        message += f" (YAML reads an exponent without a dot as text: write {m[1]}.0e{exp})"
    elif (
        err.validator == "type"
        and "string" in ([err.validator_value] if isinstance(err.validator_value, str) else [])
        and isinstance(err.instance, (int, float))
        and not isinstance(err.instance, bool)
    ):  # a card type such as 910_93 or 310 written bare
        message += " (YAML reads unquoted digits as a number, 910_93 as 91093: quote it)"
    elif (
        err.validator == "type"
        and "object" in _types(err.validator_value)
        and not isinstance(err.instance, dict)
        and err.schema.get("properties")
        and err.schema.get("additionalProperties") is False  # its keys are all listed
    ):  # `drain: true` where drain is a section: name the keys that go under it
        keys = sorted(err.schema["properties"])
        shown = ", ".join(keys[:5]) + (", ..." if len(keys) > 5 else "")
        message += f" (a section: its keys go under it: {shown})"
    if err.validator == "type" and (err.instance is None or isinstance(err.instance, bool)):
        # jsonschema writes Python's True / None: the file says true / null
        word = "null" if err.instance is None else str(err.instance).lower()
        if message.startswith(repr(err.instance) + " "):
            message = word + message[len(repr(err.instance)) :]
    return epath, message


def bundled_document(origins: list[tuple[str, int]] | None = None) -> dict[str, Any]:
    """The bundled config as a plain mapping, the layer a site file is laid over: the
    bundled file (read once) with the default profiles of the plugins its
    ``collectors:`` section names laid into its ``profiles`` (:func:`with_plugin_profiles`),
    so a site file changes a vendor's profile by its name whichever file ships it.
    ``origins``, when given, is filled with ``(file, position there)`` of each of its
    profiles. Raises :class:`ConfigError` naming a plugin's profile file that cannot be
    read or is not a list of profiles."""
    global _BUNDLED, _BUNDLED_LINES
    if _BUNDLED is None:
        data, node = parse_document(read_document(bundled_config_path()))
        src = str(bundled_config_path())
        _BUNDLED_LINES = line_map(node, src=src) if node is not None else {}
        _BUNDLED = data or {}
    if origins is not None:
        own = _BUNDLED.get("profiles")
        origins += [(str(bundled_config_path()), i) for i in range(len(own or []))]
    return with_plugin_profiles(copy.deepcopy(_BUNDLED), origins)


def with_plugin_profiles(
    data: dict[str, Any], origins: list[tuple[str, int]] | None = None
) -> dict[str, Any]:
    """``data`` (a parsed config, changed in place and returned) with the profiles of
    each plugin its ``collectors:`` section names (every registered plugin when it has
    none), in that order, appended to its ``profiles`` for each vendor it writes no
    profile for: what :func:`load_config` does with the file's own profiles, as data.
    ``origins``, when given, is extended with ``(plugin's profile file, position
    there)`` of each profile added. ``ConfigError`` naming the plugin's file as
    :func:`plugin_profile_entries`."""
    sections = data.get("collectors")
    names = list(sections) if isinstance(sections, Mapping) else list(_registered_collectors())
    profiles = data.get("profiles")
    if not isinstance(profiles, list):
        profiles = []
    written = {p.get("vendor") for p in profiles if isinstance(p, Mapping)}
    added = []
    for n in names:
        if n in written:
            continue
        entries = plugin_profile_entries(n)
        added += [copy.deepcopy(p) for p in entries]
        if origins is not None and entries:
            origins += [(str(plugin_profiles_path(n)), i) for i in range(len(entries))]
    if added:
        data["profiles"] = profiles + added
    return data


_BUNDLED: dict[str, Any] | None = None
#: the bundled file's line of each key path (:func:`line_map`)
_BUNDLED_LINES: dict[tuple, int] = {}


def layered(
    bundled: Mapping[str, Any],
    site: Mapping[str, Any],
    *,
    origins: list[list[tuple[str, int]]] | None = None,
) -> dict[str, Any]:
    """A site config laid over the bundled one, key by key, as most daemons' ``/etc``
    overrides are: mappings merged (the site's value wins), ``profiles`` merged by
    ``name`` (a site profile of a bundled name changes only the keys it sets; one with
    ``enabled: false`` switches that profile off; a new name comes before the bundled
    profiles, so it is the first to match), every other value replaced. ``base: none`` in
    the site file skips this: the file is the whole config.

    ``origins``, when given, is filled with where each profile of the result came from:
    a list of ``("site", position in site's profiles)`` and ``("bundled", position in
    bundled's)``, the site's first (both where a site profile changes a bundled one)."""
    out: dict[str, Any] = dict(bundled)
    if origins is not None:
        origins[:] = [[("bundled", i)] for i in range(len(_list_or_empty(out.get("profiles"))))]
    for key, value in site.items():
        if key == "profiles" and isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = _layered_profiles(out[key], value, origins)
        elif key == "profiles" and origins is not None:  # not a list: the site's, as it is
            out[key] = value
            origins[:] = [[("site", j)] for j in range(len(_list_or_empty(value)))]
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = layered(out[key], value)
        else:
            out[key] = value
    return out


def _check_profile_switches(site: Mapping[str, Any], src: str, lines: dict, found: list) -> None:
    """A site profile's ``enabled`` is true or false: :func:`layered` takes it out before
    the schema sees the profile, so ``enabled: flase`` (or ``no`` quoted, ``0``) left the
    profile on without a word. Adds a :class:`ConfigError` at its line to ``found``."""
    profiles = site.get("profiles")
    for i, profile in enumerate(profiles if isinstance(profiles, list) else []):
        if isinstance(profile, Mapping) and not isinstance(profile.get("enabled", True), bool):
            found.append(
                config_error(
                    f"{profile['enabled']!r} is not of type 'boolean' (true or false)",
                    src,
                    lines,
                    ("profiles", i, "enabled"),
                )
            )


def _list_or_empty(value: Any) -> list:
    return value if isinstance(value, list) else []


def _layered_profiles(
    bundled: list, site: list, origins: list[list[tuple[str, int]]] | None = None
) -> list:
    named = {p.get("name"): i for i, p in enumerate(bundled) if isinstance(p, Mapping)}
    merged: list = list(bundled)
    came: list[list[tuple[str, int]]] = [[("bundled", i)] for i in range(len(bundled))]
    new: list = []
    off: set[int] = set()
    for j, profile in enumerate(site):
        name = profile.get("name") if isinstance(profile, Mapping) else None
        i = named.get(name) if isinstance(name, str) else None
        if i is None:
            new.append((j, profile))
            continue
        if profile.get("enabled") is False:
            off.add(i)
            continue
        merged[i] = layered(merged[i], {k: v for k, v in profile.items() if k != "enabled"})
        came[i] = [("site", j), ("bundled", i)]
    kept = [
        (j, {k: v for k, v in p.items() if k != "enabled"} if isinstance(p, Mapping) else p)
        for j, p in new
        if not (isinstance(p, Mapping) and p.get("enabled") is False)
    ]
    if origins is not None:
        origins[:] = [[("site", j)] for j, _p in kept] + [
            came[i] for i in range(len(merged)) if i not in off
        ]
    return [p for _j, p in kept] + [p for i, p in enumerate(merged) if i not in off]


def effective_document(path: str | os.PathLike[str] | None) -> tuple[dict[str, Any], list[str]]:
    """(the config as it will be used, as a plain mapping; the files it came from, in
    the order laid). ``path=None``: the bundled config alone; a site file with ``base:
    bundled`` (the default) is laid over it (:func:`layered`), one with ``base: none`` is
    the whole config. The files are the bundled config, the profile files of the
    plugins it lays in (:func:`with_plugin_profiles`) and the site file. Raises
    :class:`ConfigError` as :func:`load_config` does (it is called first)."""
    load_config(path)  # every check, with the file's lines in the errors
    data: dict[str, Any] = {}
    base = "bundled"
    if path is not None and Path(path) != bundled_config_path():
        parsed, _node = parse_document(read_document(Path(path)))
        data = dict(parsed or {})
        base = data.pop("base", "bundled")
    sources: list[str] = []
    if base == "bundled":
        merged = layered(bundled_document(), data)
        sections = (_BUNDLED or {}).get("collectors")
        names = list(sections) if isinstance(sections, Mapping) else _registered_collectors()
        profiles = (_BUNDLED or {}).get("profiles")
        written = {p.get("vendor") for p in profiles or [] if isinstance(p, Mapping)}
        plugin_files = [
            str(f) for n in names if n not in written and (f := plugin_profiles_path(n)) is not None
        ]
        sources += [str(bundled_config_path()), *plugin_files]
    else:
        merged = data
    if path is not None and Path(path) != bundled_config_path():
        sources.append(str(path))
    return merged, sources


def effective_settings(path: str | os.PathLike[str]) -> list[tuple[str, Any, str]]:
    """(key path, value, where it came from) of every setting of the config at ``path`` as
    it will be used: laid over the bundled config unless it says ``base: none``. Where
    is ``<file>:<line>`` for a value the file sets, ``bundled`` for the rest. Profiles are
    named by their ``name`` (``profiles[a100].temperature_celsius.warning``). Raises
    :class:`ConfigError` as :func:`load_config` does (it is called first)."""
    load_config(path)  # every check, with the file's lines in the errors
    src = str(path)
    data, node = parse_document(read_document(Path(path)))
    data = data or {}
    lines = line_map(node, src=src) if node is not None else {}
    base = data.pop("base", "bundled")
    merged = layered(bundled_document(), data) if base == "bundled" else data

    def site_path(keys: tuple) -> tuple | None:
        """The key path of ``keys`` in the site file, or None when it sets no such value."""
        if keys[:1] == ("profiles",) and len(keys) > 1:
            site_profiles = data.get("profiles") or []
            index = next((i for i, p in enumerate(site_profiles) if p.get("name") == keys[1]), None)
            if index is None:
                return None
            keys = ("profiles", index, *keys[2:])
        value: Any = data
        for k in keys:
            if (
                isinstance(value, Mapping)
                and k in value
                or isinstance(value, list)
                and isinstance(k, int)
                and k < len(value)
            ):
                value = value[k]
            else:
                return None
        return keys

    out: list[tuple[str, Any, str]] = []

    def walk(value: Any, keys: tuple) -> None:
        if isinstance(value, Mapping) and value:
            for k, v in value.items():
                walk(v, (*keys, k))
            return
        if keys == ("profiles",) and isinstance(value, list):
            for p in value:
                for k, v in p.items():
                    walk(v, ("profiles", p.get("name"), k))
            return
        shown = keys
        at = site_path(keys)
        where = "bundled"
        if at is not None:
            line = line_for(lines, at)
            where = f"{src}:{line}" if line else src
        name = ".".join(
            f"[{k}]" if (i == 1 and shown[0] == "profiles") else str(k) for i, k in enumerate(shown)
        ).replace(".[", "[")
        out.append((name, value, where))

    walk(merged, ())
    return out


def _profile_checks(
    defaults: dict, profile: dict | None, where: tuple, at: _Places, found: _Found
) -> dict[str, Any]:
    """Each card check family's settings for one profile (``profile`` None: the
    ``defaults`` section alone); a value a family refuses is a ``ConfigError`` there,
    added to ``found`` (that family is then left out)."""
    out: dict[str, Any] = {}
    for check in CARD_CHECKS:
        with found.unit():
            try:
                out[check.NAME] = check.build_profile(defaults, profile, where)
            except SettingError as exc:
                raise at.error(exc.message, exc.key_path) from None
    return out


def _top_checks(data: dict, at: _Places, found: _Found) -> tuple[dict[str, Any], Path | None]:
    """Top-level settings of the check families, and the baseline file's path; a
    baseline file that cannot be read is a ``ConfigError`` at ``baseline_file``, added
    to ``found``."""
    top: dict[str, Any] = {}
    baseline_file = None
    for check in TOP_SECTIONS:
        with found.unit():
            if check.NAME == "baseline":
                try:
                    top[check.NAME], baseline_file = check.build_top(data, at.site.src, expand_path)
                except ValueError as exc:
                    raise at.error(str(exc), ("baseline_file",)) from None
            else:
                top[check.NAME] = check.build_top(data)
    return top, baseline_file


def _actions(data: dict, at: _Places) -> ActionSettings:
    """The ``actions:`` section (:mod:`hetpatrol.actions.settings`): a bad override key
    or action word is a ``ConfigError`` at ``actions``."""
    try:
        return parse_actions_section(data.get("actions"))
    except ValueError as exc:
        raise at.error(str(exc), ("actions",)) from None


def _registered_collectors() -> tuple[str, ...]:
    """The built-ins, then every other registered plugin by name."""
    others = sorted(set(discover()) - set(DEFAULT_COLLECTORS))
    return (*DEFAULT_COLLECTORS, *others)


def plugin_profiles_path(name: str) -> Path | None:
    """Where the plugin registered as ``name`` keeps its default profiles (the file may
    not exist); None when no plugin has that name or its module cannot be found."""
    ep = discover().get(name)
    if ep is None:
        return None
    try:
        spec = importlib.util.find_spec(ep.module)  # type: ignore[attr-defined]
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    origin = Path(spec.origin)
    if origin.name == "__init__.py":
        return origin.with_name("profiles.yaml")
    return origin.with_name(origin.stem + PLUGIN_PROFILES_SUFFIX)


#: parsed plugin profile files by path: ``(digest, data, lines)``, the digest the SHA-256
#: of the bytes read. Every shipped plugin is enabled in the bundled config, and a SIGHUP
#: storm must not parse nine YAML files per reload: each is read again (a few KB) and
#: parsed again only when its bytes changed. A stat stamp (dev, inode, mtime, size) does
#: not tell a file written in place with the same size within one tick of the kernel's
#: coarse file clock, or given its old mtime back (``cp -p``, ``touch -r``); the bytes
#: do. Only the latest parse of a path is kept.
_plugin_documents: dict[str, tuple[bytes, Any, dict]] = {}


def _plugin_document(path: Path) -> tuple[Any, dict]:
    """``(data, lines)`` of a plugin's profile file, parsed once while its bytes are
    unchanged (see :data:`_plugin_documents`); ``ConfigError`` naming the file when it
    cannot be read."""
    src = str(path)
    try:
        text = read_document(path)
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        cached = _plugin_documents.get(src)
        if cached is None or cached[0] != digest:
            data, node = parse_document(text)
            lines = line_map(node, src=src) if node is not None else {}
            cached = _plugin_documents[src] = (digest, data, lines)
    except (OSError, DocumentError) as exc:
        raise ConfigError(f"cannot read the plugin's profiles: {exc}", path=src) from None
    return cached[1], cached[2]


def plugin_profile_entries(name: str) -> list[dict[str, Any]]:
    """The profile entries (mappings, as in the config's ``profiles``; shared: do not
    change them) of the plugin ``name``'s profile file, none when it ships no file.
    ``ConfigError`` naming that file and line when it is not a ``profiles`` list of the
    config's shape or names another vendor."""
    path = plugin_profiles_path(name)
    if path is None or not path.is_file():
        return []
    src = str(path)
    data, lines = _plugin_document(path)
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["profiles"],
        "properties": {"profiles": CONFIG_SCHEMA["properties"]["profiles"]},
    }
    found = [
        config_error(message, src, lines, epath)
        for err in iter_errors(schema, data)
        for epath, message in schema_problems(err)
    ]
    if found:
        raise all_errors(found, src)  # type: ignore[misc]
    found = [
        config_error(f"a profile of vendor {name!r} only", src, lines, ("profiles", i, "vendor"))
        for i, p in enumerate(data["profiles"])
        if p["vendor"] != name
    ]
    if found:
        raise all_errors(found, src)  # type: ignore[misc]
    return data["profiles"]


def _plugin_profiles(name: str, defaults: dict, taken: set[str], found: _Found) -> list[Profile]:
    """The default profiles the plugin ``name`` ships (none when it ships no file),
    checked like the config's own; each ``ConfigError``, naming that file, is added to
    ``found``."""
    entries = plugin_profile_entries(name)
    if not entries:
        return []
    path = plugin_profiles_path(name)
    src = str(path)
    data, lines = _plugin_document(path)  # type: ignore[arg-type]
    at = _Places(_Layer(src, lines, data))
    out = []
    for i, p in enumerate(entries):
        where = ("profiles", i)
        if p["name"] in taken:
            found.append(at.error(f"profile name {p['name']!r} used twice", where))
            continue
        taken.add(p["name"])
        out.append(_profile(p, defaults, where, at, found))
    return out


def _profile(p: dict, defaults: dict, where: tuple, at: _Places, found: _Found) -> Profile:
    """One checked profile entry (``where``: its key path in the laid config ``at``
    places); each error is added to ``found``."""
    pattern = None
    if p.get("model") is not None:
        with found.unit():
            try:
                pattern = re.compile(p["model"], re.IGNORECASE)
            except re.error as exc:
                raise at.error(f"invalid regular expression: {exc}", (*where, "model")) from exc
    return Profile(
        name=p["name"],
        vendor=p["vendor"],
        card_types=tuple(p.get("card_types", ())),
        model=pattern,
        gres=p.get("gres"),
        gres_type=p.get("gres_type"),
        checks=_profile_checks(defaults, p, where, at, found),
    )


def _build(data: dict, at: _Places, found: _Found) -> Config | None:
    """The config of the laid, schema-checked ``data``; each error the checks find is
    added to ``found``, and None is returned when there is one (every check runs
    first, so that all are said at once)."""
    src, lines = at.site.src, at.site.lines
    defaults = data.get("defaults", {}) or {}
    sections = data.get("collectors")
    registered = _registered_collectors()
    if sections is None:
        sections = {name: {} for name in registered}
    vendors = sorted(set(registered) | set(sections))
    fallback = Profile(
        name="defaults",
        vendor="",
        checks=_profile_checks(defaults, None, ("defaults",), at, found),
    )

    profiles = []
    names: set[str] = set()
    for i, p in enumerate(data.get("profiles", []) or []):
        with found.unit():
            if p["vendor"] not in vendors:
                found.append(
                    at.error(
                        f"unknown vendor '{key_text(p['vendor'])}'"
                        f"{did_you_mean(p['vendor'], vendors)}: "
                        "a collector's name, one of " + ", ".join(vendors),
                        ("profiles", i, "vendor"),
                    )
                )
            if p["name"] in names:
                found.append(
                    at.error(f"profile name {p['name']!r} used twice", ("profiles", i, "name"))
                )
            names.add(p["name"])
            profiles.append(_profile(p, defaults, ("profiles", i), at, found))

    written = {p.vendor for p in profiles}
    for name in sections:
        if name not in written:  # a vendor the config says nothing about: its plugin's
            with found.unit():
                profiles.extend(_plugin_profiles(name, defaults, {p.name for p in profiles}, found))

    collectors = []
    # No `collectors:` section means every built-in collector with its defaults (a node
    # without a vendor's stack reports that collector `absent`); an explicit empty
    # mapping means none.
    with found.unit():
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
        with found.unit():
            try:
                parse_listen(listen)
            except ValueError as exc:
                raise at.error(str(exc), ("listen",)) from exc
    top, baseline_file = _top_checks(data, at, found)
    actions = ActionSettings()
    with found.unit():
        actions = _actions(data, at)
    if found:
        return None

    jsonl = data.get("jsonl") or {}
    jsonl_path = jsonl.get("path")
    state_path = data.get("state_path")
    textfile_path = data.get("textfile_path")
    return Config(
        source=src,
        node=data.get("node") or socket.gethostname().split(".")[0],
        interval_seconds=float(data.get("interval_seconds", 10.0)),
        recovery_patrols=int(data.get("recovery_patrols", 3)),
        missing_patrols=int(data.get("missing_patrols", 3)),
        hung_tool_patrols=int(data.get("hung_tool_patrols", 3)),
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
        actions=actions,
        top=top,
        baseline_file=baseline_file,
        ledger_capacity=dict((data.get("ledger") or {}).get("capacity") or {}),
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


#: the loader's public names (EX_CONFIG, ConfigError and the bundled file's path are
#: defined in hetpatrol.config_file, below the sections that raise them)
__all__ = [
    "EX_CONFIG",
    "CollectorConfig",
    "Config",
    "ConfigError",
    "Profile",
    "bundled_config_path",
    "load_config",
    "parse_listen",
]
