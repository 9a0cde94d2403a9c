"""Reading a YAML document an operator wrote (the config, a baseline file), with guards.

YAML is parsed with ``yaml.SafeLoader`` (no Python objects), and before anything walks
the tree:

- the file is read up to :data:`MAX_DOCUMENT_BYTES` (a config is a few kilobytes; a
  log or ``/dev/zero`` named by mistake is refused, never read whole);
- it must be UTF-8 (the error gives the line of the first bad byte);
- nesting deeper than :data:`MAX_DEPTH` and an alias inside the node it names are
  refused from the parser's events, which is iterative, before PyYAML's recursive
  composer could hit Python's recursion limit;
- aliases that expand to more than :data:`MAX_VALUES` values (an "alias bomb", minutes
  and gigabytes to walk) are refused.

Every refusal is a :class:`DocumentError` with the 1-based line where it can tell.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

__all__ = [
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_VALUES",
    "DocumentError",
    "parse_document",
    "read_document",
]

#: Largest file read as a YAML document.
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
#: Deepest nesting a document may have (the config schema needs 5 levels).
MAX_DEPTH = 32
#: A configuration is a few hundred values; aliases expanding past this are refused.
MAX_VALUES = 100_000


class DocumentError(ValueError):
    """A document that cannot be parsed: ``message`` and the 1-based ``line`` (or None)."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message if line is None else f"line {line}: {message}")
        self.message, self.line = message, line


def read_document(path: str | os.PathLike[str]) -> str:
    """The text of the file at ``path``, read up to :data:`MAX_DOCUMENT_BYTES`.

    Raises ``OSError`` when it cannot be read, :class:`DocumentError` when it is larger
    or not UTF-8.
    """
    with open(path, "rb") as f:
        raw = f.read(MAX_DOCUMENT_BYTES + 1)
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"larger than {MAX_DOCUMENT_BYTES} bytes: not a YAML document")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DocumentError(f"not UTF-8: {exc.reason}", line) from None


def _error_line(exc: yaml.YAMLError, text: str) -> int | None:
    """1-based line of a YAML error (reader errors carry a character position)."""
    for attr in ("problem_mark", "context_mark"):
        mark = getattr(exc, attr, None)
        if mark is not None:
            return mark.line + 1
    position = getattr(exc, "position", None)
    if isinstance(position, int):
        return text.count("\n", 0, position) + 1
    return None


def _check_structure(text: str) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` and self-referencing aliases, over
    the parser's events. Raises ``yaml.YAMLError`` for bad syntax."""
    open_anchors: list[str | None] = []
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            open_anchors.append(event.anchor)
            if len(open_anchors) > MAX_DEPTH:
                raise DocumentError(
                    f"nested deeper than {MAX_DEPTH} levels", event.start_mark.line + 1
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            open_anchors.pop()
        elif isinstance(event, yaml.AliasEvent) and event.anchor in open_anchors:
            raise DocumentError(
                f"alias *{event.anchor} refers to a node that contains it",
                event.start_mark.line + 1,
            )


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Number of values ``node`` stands for once every alias is expanded (memoised)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a self-referencing alias counts once (it is refused before this)
    if isinstance(node, yaml.MappingNode):
        total = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        total = 1 + sum(_expanded_size(v, memo) for v in node.value)
    else:
        total = 1
    memo[key] = total
    return total


def parse_document(text: str) -> tuple[Any, yaml.Node | None]:
    """Parse ``text``: the Python value (None for an empty document) and the composed
    node tree (its marks give each key's line). Raises :class:`DocumentError`."""
    try:
        _check_structure(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None and _expanded_size(node, {}) > MAX_VALUES:
            raise DocumentError(
                f"the document expands to more than {MAX_VALUES} values "
                "(YAML anchors and aliases nested too far)",
                1,
            )
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).split("\n")[0]
        raise DocumentError(f"invalid YAML: {problem}", _error_line(exc, text)) from None
    except RecursionError:  # guard: _check_structure bounds the depth first
        raise DocumentError("invalid YAML: nested too deeply") from None
    return data, node
