"""The bottom of the configuration: its error, its line numbers, its paths, and the
schema pieces every section uses.

Sections (each collector's options, each check family's settings) are declared beside
the code that reads them; :mod:`hetpatrol.config` assembles them and is the only loader.
A section's builder raises :class:`SettingError` with the key path *inside the file*;
the loader turns it into a :class:`ConfigError` naming the file and the line
(:func:`line_for`): line numbers are found in one place.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hetpatrol.schema import HEALTH_CRITICAL, HEALTH_WARNING, SEVERITY_INFO, Levels
from hetpatrol.yaml_document import format_key_path

#: exit status of a command refused for its configuration (sysexits.h EX_CONFIG)
EX_CONFIG = 78


#: at most this many errors of one config are said at once; the rest are counted ("and
#: 4 more errors"), as compilers cap theirs (gcc's -fmax-errors)
MAX_REPORTED_ERRORS = 20


class ConfigError(Exception):
    """A configuration that cannot be used. ``str()`` names file, line and key path.

    ``message``, ``path``, ``line`` and ``key`` are the first error's (in the order of
    the file's lines); ``errors`` holds every error said (this one first, at most
    :data:`MAX_REPORTED_ERRORS`), each a ``ConfigError`` of one error, ``unshown`` how
    many more were found. ``str()`` is one line per error, then ``and N more errors``."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        key: str | None = None,
        others: tuple[ConfigError, ...] = (),
        unshown: int = 0,
    ):
        self.message, self.path, self.line, self.key = message, path, line, key
        where = path or "<config>"
        if line is not None:
            where += f":{line}"
        #: this error alone, ``file:line: key: message``
        self.text = f"{where}: {key}: {message}" if key else f"{where}: {message}"
        first = ConfigError(message, path=path, line=line, key=key) if others else self
        self.errors: tuple[ConfigError, ...] = (first, *others)
        self.unshown = unshown
        super().__init__("\n".join(self.report()))

    @classmethod
    def of(cls, errors: Sequence[ConfigError], unshown: int = 0) -> ConfigError:
        """One error of ``errors`` (each of one error, in the order said; at least one),
        the first as its head, the rest as its others."""
        head = errors[0]
        return cls(
            head.message,
            path=head.path,
            line=head.line,
            key=head.key,
            others=tuple(errors[1:]),
            unshown=unshown,
        )

    def report(self) -> list[str]:
        """One text per error said, in order, then ``and N more errors`` when some
        were left out."""
        out = [e.text for e in self.errors]
        if self.unshown:
            out.append(f"and {self.unshown} more error{'s' if self.unshown > 1 else ''}")
        return out

    def summary(self) -> str:
        """The first error on one line, with how many more there are (a one-line verdict,
        a check's detail): ``f:3: key: why (and 2 more errors)``."""
        n = len(self.errors) - 1 + self.unshown
        return self.errors[0].text + (f" (and {n} more error{'s' if n > 1 else ''})" if n else "")

    def said(self, prefix: str = "hetpatrol: configuration error: ") -> str:
        """Every error said, one line each with ``prefix`` (a command's stderr, the
        daemon's refusal at start), then ``hetpatrol: and N more configuration errors``
        when some were left out."""
        out = [prefix + e.text for e in self.errors]
        if self.unshown:
            n = self.unshown
            out.append(f"hetpatrol: and {n} more configuration error{'s' if n > 1 else ''}")
        return "\n".join(out)


def all_errors(found: list[ConfigError], first_file: str | None = None) -> ConfigError | None:
    """One :class:`ConfigError` saying every error of ``found`` (each may hold several),
    None when there is none. They are put in the order an operator reads them, the way
    compilers report: the file ``first_file`` (the one the operator wrote) first, then
    any other by name, each by line (an error without a line first), errors on one line
    in the order found; one error per file and key (the first found: a key that is
    refused twice, as text with a control character and as a pattern, is said once).
    At most :data:`MAX_REPORTED_ERRORS` are said, the rest counted."""
    flat = [e for exc in found for e in exc.errors]
    unshown = sum(exc.unshown for exc in found)
    seen: set[tuple] = set()
    kept = []
    for e in flat:
        mark = (e.path, e.key) if e.key is not None else (e.path, e.line, e.message)
        if mark not in seen:
            seen.add(mark)
            kept.append(e)
    if not kept:
        return None
    order = sorted(
        range(len(kept)),
        key=lambda i: (
            kept[i].path != first_file,
            kept[i].path or "",
            kept[i].line or 0,
            i,
        ),
    )
    said = [kept[i] for i in order]
    unshown += max(0, len(said) - MAX_REPORTED_ERRORS)
    return ConfigError.of(said[:MAX_REPORTED_ERRORS], unshown)


class SettingError(ValueError):
    """A value a section's builder refuses; ``key_path`` is where it sits in the file
    (``("profiles", 3, "nvlink", "errors_total")``)."""

    def __init__(self, message: str, key_path: tuple = ()):
        super().__init__(message)
        self.message, self.key_path = message, tuple(key_path)


# ------------------------------------------------------------------ schema pieces
#: a severity a check may be set to; null switches that check off
SEVERITY_OR_OFF: dict[str, Any] = {"enum": [SEVERITY_INFO, HEALTH_WARNING, HEALTH_CRITICAL, None]}
#: ``{warning: N, critical: N}`` of a count (null: that level off)
LEVELS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "warning": {"type": ["number", "null"], "minimum": 0},
        "critical": {"type": ["number", "null"], "minimum": 0},
    },
}


def merge_levels(section: Any, base: Levels) -> Levels:
    """``base`` with the levels ``section`` (a ``{warning, critical}`` mapping) sets."""
    if not section:
        return base
    return Levels(
        warning=section.get("warning", base.warning),
        critical=section.get("critical", base.critical),
    )


def check_levels(written: Any, merged: Levels, key_path: tuple) -> None:
    """Refuse a warning above the critical level: as written (at ``key_path.warning``),
    then as merged over the levels it inherits (at ``key_path``)."""
    written = written or {}
    w, c = written.get("warning"), written.get("critical")
    if w is not None and c is not None and w > c:
        raise SettingError(f"warning {w} is above critical {c}", (*key_path, "warning"))
    mw, mc = merged.warning, merged.critical
    if mw is not None and mc is not None and mw > mc:
        raise SettingError(
            f"warning {mw} is above critical {mc} (merged with the levels it inherits)",
            key_path,
        )


# ------------------------------------------------------------------------- paths
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


def bundled_data(name: str) -> Path:
    """Path of a data file shipped in ``hetpatrol.bundled`` (the ``config/`` folder)."""
    return Path(str(resources.files("hetpatrol.bundled").joinpath(name)))


def bundled_config_path() -> Path:
    """Path of the default configuration shipped with the package."""
    return bundled_data("hetpatrol.yaml")


# ------------------------------------------------------------------ line numbers
#: YAML tags a mapping key may have: a string, or the merge key ``<<``.
_KEY_TAGS = ("tag:yaml.org,2002:str", "tag:yaml.org,2002:merge")


def line_map(
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
            line_map(value_node, (*path, key), out, src)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*path, i)] = item.start_mark.line + 1
            line_map(item, (*path, i), out, src)
    return out


def line_for(lines: dict[tuple, int], path: tuple) -> int | None:
    """The line of ``path``, or of its nearest ancestor the file has."""
    while True:
        if path in lines:
            return lines[path]
        if not path:
            return None
        path = path[:-1]


def config_error(message: str, src: str, lines: dict[tuple, int], key_path: tuple) -> ConfigError:
    """A :class:`ConfigError` at ``key_path`` of the file ``src``."""
    return ConfigError(
        message, path=src, line=line_for(lines, key_path), key=format_key_path(key_path)
    )
