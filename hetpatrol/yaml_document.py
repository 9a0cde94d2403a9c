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
  and gigabytes to walk) or deeper than :data:`MAX_DEPTH` (a chain of aliases) are
  refused;
- a value YAML cannot build (``2024-13-45`` as a date) is an error with its line;
- a key repeated in one mapping is refused (PyYAML would keep the last, silently).

Every refusal is a :class:`DocumentError` with the 1-based line where it can tell.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import yaml

__all__ = [
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_VALUES",
    "DocumentError",
    "format_key_path",
    "key_text",
    "parse_document",
    "read_document",
    "recording_reads",
]

#: the list :func:`recording_reads` collects into, where one is in force
_reads: ContextVar[list[list[str]] | None] = ContextVar("reads", default=None)


@contextmanager
def recording_reads() -> Iterator[list[list[str]]]:
    """Within this block every :func:`read_document` that returns adds ``[path,
    sha256 hex of the bytes read]`` to the yielded list (in read order): what a check in
    another process read can be compared with what this one read
    (:mod:`hetpatrol.config_check`)."""
    reads: list[list[str]] = []
    token = _reads.set(reads)
    try:
        yield reads
    finally:
        _reads.reset(token)


#: Largest file read as a YAML document.
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
#: Deepest nesting a document may have (the config schema needs 5 levels).
MAX_DEPTH = 32
#: A configuration is a few hundred values; aliases expanding past this are refused.
MAX_VALUES = 100_000


class DocumentError(ValueError):
    """A document that cannot be parsed: ``message``, the 1-based ``line`` (or None) and
    the ``key_path`` (keys and list indexes from the top) where it can tell."""

    def __init__(self, message: str, line: int | None = None, key_path: tuple = ()):
        where = "" if line is None else f"line {line}: "
        where += f"{format_key_path(key_path)}: " if key_path else ""
        super().__init__(where + message)
        self.message, self.line, self.key_path = message, line, key_path


#: most characters of one key shown in a key path (a longer key is cut, its length said)
MAX_KEY_SHOWN = 80


def key_text(key: object) -> str:
    """One key as an error shows it: a control or other unprintable character as its
    escape (``\\x1b``: a key is text a file's writer chose, and an error goes to a
    terminal or a log line), at most :data:`MAX_KEY_SHOWN` characters of it."""
    text = str(key)
    cut = text[:MAX_KEY_SHOWN]
    shown = "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in cut
    )
    return shown if len(text) <= MAX_KEY_SHOWN else f"{shown}...({len(text)} characters)"


def format_key_path(path: tuple | list) -> str:
    """``("profiles", 0, "name")`` as ``profiles[0].name``; ``<top>`` for ``()``. Keys
    are shown by :func:`key_text` (escaped, cut)."""
    text = ""
    for part in path:
        key = key_text(part)
        text += f"[{part}]" if isinstance(part, int) else (f".{key}" if text else key)
    return text or "<top>"


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _check_duplicate_keys(root: yaml.Node) -> None:
    """Refuse a mapping that repeats a key (PyYAML keeps the last one, silently)."""
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    if key_node.value in keys:
                        raise DocumentError(
                            "duplicate key",
                            key_node.start_mark.line + 1,
                            (*path, key_node.value),
                        )
                    keys.add(key_node.value)
                    stack.append((value_node, (*path, key_node.value)))
                else:
                    stack.append((value_node, path))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*path, i)) for i, item in enumerate(node.value))


def read_document(path: str | os.PathLike[str]) -> str:
    """The text of the regular file at ``path``, read up to :data:`MAX_DOCUMENT_BYTES`.

    Opened without blocking: a FIFO or a device is refused, never waited on. Raises
    ``OSError`` when it cannot be read, :class:`DocumentError` when it is not a regular
    file, is larger, or is not UTF-8.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DocumentError(
                "a directory, not a file" if stat.S_ISDIR(mode) else "not a regular file"
            )
        raw = b""
        while len(raw) <= MAX_DOCUMENT_BYTES:
            chunk = os.read(fd, MAX_DOCUMENT_BYTES + 1 - len(raw))
            if not chunk:
                break
            raw += chunk
    finally:
        os.close(fd)
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"larger than {MAX_DOCUMENT_BYTES} bytes: not a YAML document")
    reads = _reads.get()
    if reads is not None:
        reads.append([os.fspath(path), hashlib.sha256(raw).hexdigest()])
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


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _expanded_shape(root: yaml.Node) -> tuple[int, int]:
    """(values, depth) of ``root`` once every alias is expanded: an alias is the node it
    names, so a chain of aliases nests far deeper than the text. Iterative, memoised per
    node (the composed graph has no cycles: :func:`_check_structure` refused those)."""
    shape: dict[int, tuple[int, int]] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in shape:
            continue
        kids = _children(node)
        if children_done or not kids:
            sizes = [shape[id(k)] for k in kids]
            shape[id(node)] = (
                1 + sum(s for s, _ in sizes),
                1 + max((d for _, d in sizes), default=0),
            )
            continue
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in shape)
    return shape[id(root)]


class _Loader(yaml.SafeLoader):
    """SafeLoader whose value errors (``2024-13-45`` as a date, a 5,000-digit integer,
    ``!!float abc``) carry the line of the value, as its YAML errors do."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, OverflowError) as exc:
            shown = str(node.value) if isinstance(node, yaml.ScalarNode) else "this node"
            shown = repr(shown if len(shown) <= 40 else shown[:40] + "...")
            kind = node.tag.rsplit(":", 1)[-1]  # tag:yaml.org,2002:timestamp -> timestamp
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {shown} as {kind}: {exc}", node.start_mark
            ) from None


def parse_document(text: str) -> tuple[Any, yaml.Node | None]:
    """Parse ``text``: the Python value (None for an empty document) and the composed
    node tree (its marks give each key's line). Raises :class:`DocumentError`."""
    try:
        _check_structure(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None:
            values, depth = _expanded_shape(node)
            if values > MAX_VALUES:
                raise DocumentError(
                    f"the document expands to more than {MAX_VALUES} values "
                    "(YAML anchors and aliases nested too far)",
                    1,
                )
            if depth > MAX_DEPTH + 1:  # + the scalars at the bottom
                raise DocumentError(
                    f"nested deeper than {MAX_DEPTH} levels once its YAML aliases are expanded",
                    1,
                )
            _check_duplicate_keys(node)
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).split("\n")[0]
        raise DocumentError(f"invalid YAML: {problem}", _error_line(exc, text)) from None
    except RecursionError:  # guard: _check_structure bounds the depth first
        raise DocumentError("invalid YAML: nested too deeply") from None
    return data, node
