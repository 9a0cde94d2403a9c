"""Parsers for what Slurm says about a node: ``scontrol show node``, GRES strings,
``gres.conf`` and host lists. Pure text in, values out; nothing here runs a command.

GRES strings as Slurm prints them (``scontrol show node``, ``sinfo %G``)::

    gpu:a100:8(S:0-1),ascend:910b:8     typed, with socket affinity
    gpu:8                               untyped
    gpu:(null):4(IDX:0-3)               untyped (22.05 prints the missing type as "(null)")
    gpu:1080ti:1(IDX:0),gpu:980gtx:1(IDX:1)
    vmem:2G                             count with a K/M/G/T suffix (powers of 1024)
    (null)                              no GRES at all

A trailing number is the count, as in Slurm's own parser (``gpu:3090`` is 3090 GPUs;
a type made of digits needs the three-part form ``gpu:3090:2``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache

_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
# ASCII digits only, as Slurm's strtol/strtoull read a count (Python's \d takes "١" too)
_COUNT_RE = re.compile(r"^([0-9]+)([KMGTP]?)$", re.IGNORECASE)
_NULLS = {"", "(null)", "null", "n/a", "none"}


def parse_count(text: str) -> int | None:
    """``8`` -> 8, ``4G`` -> 4 * 1024**3; None when ``text`` is not a count."""
    m = _COUNT_RE.match(text.strip())
    if not m:
        return None
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside ``()`` and ``[]``: ``a(S:0,1),b[1,2]`` -> 2 parts."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]" and depth:
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


# ---------------------------------------------------------------------------- GRES
@dataclass(frozen=True)
class GresEntry:
    """One GRES of a node: ``name`` (``gpu``), ``type`` (``a100``, None = untyped), count."""

    name: str
    type: str | None
    count: int

    @property
    def key(self) -> tuple[str, str | None]:
        """Case-insensitive identity (Slurm compares GRES names and types that way)."""
        return (self.name.lower(), self.type.lower() if self.type else None)

    @property
    def label(self) -> str:
        """``gpu:a100`` or ``gpu`` (untyped)."""
        return f"{self.name}:{self.type}" if self.type else self.name


class GresParseError(ValueError):
    """A GRES string Slurm would not have printed; ``raw`` is the whole text as read."""

    def __init__(self, message: str, raw: str):
        super().__init__(message)
        self.raw = raw


# A type as Slurm prints it: no ":", no brackets, no blanks; "a100_3g.20gb", "nvidia-rtx-3090"
_TYPE_RE = re.compile(r"^[^:()\[\]\s,=]+$")
_SPEC_RE = re.compile(r"\([^()]*\)$")  # (S:0-1), (IDX:0-3): socket / index spec


def parse_gres_item(item: str) -> GresEntry | None:
    """One comma-separated item of a GRES string; None for ``(null)`` or an empty item.

    ``name[:type][:count][(spec)]`` as Slurm prints it (``no_consume`` ignored);
    :class:`GresParseError` for anything else (``gpu:a100:X(S:0-1)``: a count that is
    not a number), never a guess.
    """
    text = item.strip()
    if text.lower() in _NULLS:
        return None
    text = _SPEC_RE.sub("", text).strip()
    parts = [p for p in text.split(":") if p.lower() != "no_consume"]
    if not parts or not parts[0]:
        raise GresParseError(f"GRES item {item!r}: no name", item)
    name, rest = parts[0], parts[1:]
    count = 1
    if rest and parse_count(rest[-1]) is not None:
        count = parse_count(rest[-1]) or 0
        rest = rest[:-1]
    if len(rest) > 1:
        raise GresParseError(f"GRES item {item!r}: not name[:type][:count]", item)
    gtype = rest[0] if rest else None
    if gtype is not None and gtype.lower() in _NULLS:
        gtype = None
    for word, what in ((name, "name"), (gtype, "type")):
        if word is not None and not _TYPE_RE.match(word):
            raise GresParseError(f"GRES item {item!r}: {what} {word!r} is not one", item)
    return GresEntry(name, gtype, count)


def parse_gres(text: str | None) -> tuple[GresEntry, ...]:
    """A GRES string (``gpu:a100:8(S:0-1),ascend:910b:8``) -> its entries, in order.

    :class:`GresParseError` (with the whole text in ``raw``) when an item is not one.
    """
    if text is None or text.strip().lower() in _NULLS:
        return ()
    try:
        items = [parse_gres_item(i) for i in split_top(text)]
    except GresParseError as exc:
        raise GresParseError(f"{exc} in {text!r}", text) from None
    return tuple(e for e in items if e is not None)


def sum_gres(entries: Iterable[GresEntry]) -> tuple[GresEntry, ...]:
    """Entries with the same (name, type) added up, first spelling kept, order kept."""
    out: dict[tuple[str, str | None], GresEntry] = {}
    for e in entries:
        prev = out.get(e.key)
        out[e.key] = e if prev is None else GresEntry(prev.name, prev.type, prev.count + e.count)
    return tuple(out.values())


# ----------------------------------------------------------------------- host lists
#: Most names :func:`expand_hostlist` builds; a larger list is refused (``ValueError``).
HOSTLIST_MAX = 65536
_GROUP_RE = re.compile(r"\[([^\[\]]*)\]")
_ASCII_DIGITS = frozenset("0123456789")


def _is_num(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also takes ``٧`` and ``²``)."""
    return bool(text) and set(text) <= _ASCII_DIGITS


def _alternatives(group: str) -> list[str | tuple[int, int, int]]:
    """The items of one ``[...]``: a literal string, or (low, high, zero-pad width)."""
    out: list[str | tuple[int, int, int]] = []
    for rng in group.split(","):
        rng = rng.strip()
        if not rng:
            continue
        lo, sep, hi = rng.partition("-")
        if sep and _is_num(lo) and _is_num(hi):
            out.append((int(lo), int(hi), len(lo) if lo.startswith("0") else 0))
        else:
            out.append(rng)
    return out


def _segments(text: str) -> list[str | list[str | tuple[int, int, int]]]:
    """One host list item as literal strings and bracket groups, in order."""
    segs: list[str | list[str | tuple[int, int, int]]] = []
    while (m := _GROUP_RE.search(text)) is not None:
        segs.append(text[: m.start()])
        segs.append(_alternatives(m.group(1)))
        text = text[m.end() :]
    segs.append(text)
    return segs


def hostlist_count(text: str) -> int:
    """How many names :func:`expand_hostlist` gives for ``text``, without building them."""
    total = 0
    for part in split_top(text):
        n = 1
        for seg in _segments(part):
            if isinstance(seg, list):
                n *= sum(1 if isinstance(a, str) else abs(a[1] - a[0]) + 1 for a in seg)
        total += n
    return total


def hostlist_contains(text: str, name: str) -> bool:
    """True when ``name`` is one of the names of host list ``text``, without expanding it.

    Same answer as ``name in expand_hostlist(text)``: a range matches a number inside it
    written at the range's zero-pad width (``gpu[0000-9999]`` holds ``gpu0042``, not
    ``gpu42``), ASCII digits only.
    """
    for part in split_top(text):
        segs = _segments(part)

        @cache
        def match(pos: int, i: int, segs=segs) -> bool:
            if i == len(segs):
                return pos == len(name)
            seg = segs[i]
            if isinstance(seg, str):
                return name.startswith(seg, pos) and match(pos + len(seg), i + 1)
            for alt in seg:
                if isinstance(alt, str):
                    if name.startswith(alt, pos) and match(pos + len(alt), i + 1):
                        return True
                    continue
                lo, hi, width = alt
                end = pos
                while end < len(name) and name[end] in _ASCII_DIGITS:
                    end += 1
                for stop in range(pos + 1, end + 1):
                    token = name[pos:stop]
                    n = int(token)
                    if (
                        min(lo, hi) <= n <= max(lo, hi)
                        and str(n).zfill(width) == token
                        and match(stop, i + 1)
                    ):
                        return True
            return False

        if match(0, 0):
            return True
    return False


def expand_hostlist(text: str, limit: int = HOSTLIST_MAX) -> list[str]:
    """Expand a Slurm host list: ``node[01-03,7],gpu1`` -> node01 node02 node03 node07 gpu1.

    Several bracket groups multiply (``r[1-2]n[1-2]``). Zero padding follows the width of
    the lower bound (``[01-10]`` -> 01 ... 10). Used for ``File=``; a list of more than
    ``limit`` names is refused with ``ValueError`` before any is built (a node's name is
    looked up with :func:`hostlist_contains`, which expands nothing).
    """
    count = hostlist_count(text)
    if count > limit:
        raise ValueError(f"host list {text[:80]!r} expands to {count} names (limit {limit})")
    out: list[str] = []
    for part in split_top(text):
        out.extend(_expand_one(part))
    return out


def _expand_one(text: str) -> list[str]:
    m = _GROUP_RE.search(text)
    if not m:
        return [text]
    head, tail = text[: m.start()], text[m.end() :]
    values: list[str] = []
    for alt in _alternatives(m.group(1)):
        if isinstance(alt, str):
            values.append(alt)
            continue
        lo, hi, width = alt
        step = 1 if hi >= lo else -1
        values.extend(str(n).zfill(width) for n in range(lo, hi + step, step))
    return [head + v + rest for v in values for rest in _expand_one(tail)]


@dataclass(frozen=True)
class HostList:
    """A host list expression kept as text; ``name in hostlist`` expands nothing."""

    text: str

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and hostlist_contains(self.text, name)


# ------------------------------------------------------------------ scontrol show node
#: The marks Slurm prints after a state name (``IDLE~``, ``DOWN*``, ``MIXED-``), sinfo(1)
#: "NODE STATE CODES" (22.05; ``node_state_string()``, src/common/slurm_protocol_defs.c,
#: prints them in ``sinfo %T``/``%t`` and in ``scontrol show node`` of older releases),
#: and the state flag each stands for. A trailing character not here is no mark: it stays
#: part of the word, which then matches no state (hands off).
STATE_MARKS: dict[str, str] = {
    "*": "NOT_RESPONDING",  # "presently not responding and will not be allocated any new work"
    "~": "POWERED_DOWN",  # "presently in powered off"
    "#": "POWERING_UP",  # "presently being powered up or configured"
    "!": "POWER_DOWN",  # "pending power down"
    "%": "POWERING_DOWN",  # "presently being powered down"
    "$": "MAINTENANCE",  # "in a reservation with a flag value of "maintenance""
    "@": "REBOOT_REQUESTED",  # "pending reboot"
    "^": "REBOOT_ISSUED",  # "The node reboot was issued"
    "-": "PLANNED",  # "planned by the backfill scheduler for a higher priority job"
}


def split_state_marks(word: str) -> tuple[str, str]:
    """(``IDLE``, ``~*``) of ``IDLE~*``: the word and its trailing :data:`STATE_MARKS`."""
    end = len(word)
    while end and word[end - 1] in STATE_MARKS:
        end -= 1
    return word[:end], word[end:]


@dataclass(frozen=True)
class NodeInfo:
    """One node of ``scontrol show node [-o]`` output.

    ``state`` is the raw state (``IDLE+DRAIN``); ``reason`` the reason text without the
    ``[user@time]`` suffix Slurm appends, who set it in ``reason_user``. ``gres_error``
    says why ``Gres=`` could not be read (``gres`` is then empty; the raw text is in
    ``fields["Gres"]``).
    """

    name: str
    state: str
    gres: tuple[GresEntry, ...] = ()
    reason: str | None = None
    reason_user: str | None = None
    reason_time: str | None = None
    fields: Mapping[str, str] = field(default_factory=dict)
    gres_error: str | None = None

    @property
    def base_state(self) -> str:
        """``IDLE`` of ``IDLE+DRAIN`` and of ``IDLE~`` (the marks of :data:`STATE_MARKS`
        go to :attr:`flags`); a mark not in that table stays (``IDLE&``: a base state no
        table knows, so hetpatrol acts on nothing)."""
        return split_state_marks(self.state.split("+", 1)[0])[0].upper()

    @property
    def flags(self) -> frozenset[str]:
        """``{DRAIN}`` of ``IDLE+DRAIN``; each known trailing mark of a word counts as its
        flag (``IDLE~`` -> ``{POWERED_DOWN}``, ``DOWN*`` -> ``{NOT_RESPONDING}``)."""
        parts = self.state.upper().split("+")
        flags: set[str] = set()
        for i, part in enumerate(parts):
            word, marks = split_state_marks(part)
            if i and word:
                flags.add(word)
            flags.update(STATE_MARKS[m] for m in marks)
        return frozenset(flags)

    @property
    def drained(self) -> bool:
        """True when the node carries the DRAIN flag (drained or draining)."""
        return "DRAIN" in self.flags or self.base_state in ("DRAINED", "DRAINING", "DRAIN")


# Reason=<text> [<user>@<time>]: the bracket Slurm appends; an admin's text may hold "[x]"
# or "a=b", so the reason runs to the first " [user@time]", not to the next "key=".
_REASON_BY_RE = re.compile(r" \[(?P<user>[^\]\s@]*)@(?P<time>[^\]\s]*)\]")
_FIELD_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/]*)=(\S*)")


def parse_scontrol_nodes(text: str) -> list[NodeInfo]:
    """Every node in ``scontrol show node`` output, one-line (``-o``) or multi-line.

    Lines before the first ``NodeName=`` (a shell prompt in a recording) are ignored.
    Values with spaces (``OS=``) keep their first word only; ``Reason=`` is read whole.
    """
    blocks = re.split(r"(?m)^(?=\s*NodeName=)", text)
    nodes = []
    for block in blocks:
        if not block.lstrip().startswith("NodeName="):
            continue
        reason = reason_user = reason_time = None
        rest_lines = []
        for line in block.splitlines():
            idx = _reason_start(line)
            if idx is None:
                rest_lines.append(line)
                continue
            start = idx + len("Reason=")
            m = _REASON_BY_RE.search(line, start)
            if m:
                reason = line[start : m.start()].strip()
                reason_user, reason_time = m.group("user"), m.group("time")
                rest_lines.append(line[:idx] + line[m.end() :])
            else:  # no [user@time]: the rest of the line is the reason
                reason = line[start:].strip()
                rest_lines.append(line[:idx])
        fields: dict[str, str] = {}
        for m in _FIELD_RE.finditer("\n".join(rest_lines)):
            fields.setdefault(m.group(1), m.group(2))
        gres_error = None
        try:
            gres = parse_gres(fields.get("Gres"))
        except GresParseError as exc:
            gres, gres_error = (), str(exc)
        nodes.append(
            NodeInfo(
                name=fields.get("NodeName", ""),
                state=fields.get("State", ""),
                gres=gres,
                reason=reason or None,
                reason_user=reason_user,
                reason_time=reason_time,
                fields=fields,
                gres_error=gres_error,
            )
        )
    return nodes


def _reason_start(line: str) -> int | None:
    m = re.search(r"(?:^|\s)Reason=", line)
    if m is None:
        return None
    return m.end() - len("Reason=")


def find_node(text: str, name: str) -> NodeInfo | None:
    """The node called ``name`` in ``scontrol show node`` output, or None."""
    for node in parse_scontrol_nodes(text):
        if node.name == name:
            return node
    return None


# ------------------------------------------------------------------------- gres.conf
@dataclass(frozen=True)
class GresConfLine:
    """One meaningful ``gres.conf`` line.

    ``nodes`` is None for a line without ``NodeName=`` (it applies to every node), else
    the ``NodeName=`` host list (``node in line.nodes`` tests it without expanding it);
    ``count`` is ``Count=``, else the number of ``File=`` devices, else 1 (a
    ``MultipleFiles=`` line is one GRES however many files it names, gres.conf(5)
    MultipleFiles: "all of the files are associated with a single GRES"; slurmd 22.05
    ``slurmd -G`` prints ``Count=1`` for it). ``autodetect`` is set on ``AutoDetect=``
    lines; ``cores`` is ``Cores=`` as written; ``multiple_files`` whether the files came
    from ``MultipleFiles=``.
    """

    line: int
    nodes: HostList | None
    name: str | None
    type: str | None
    count: int
    files: tuple[str, ...] = ()
    autodetect: str | None = None
    cores: str | None = None
    multiple_files: bool = False


@dataclass(frozen=True)
class GresConf:
    """What ``gres.conf`` says about one node: its entries and its AutoDetect mode."""

    entries: tuple[GresEntry, ...]
    autodetect: str | None

    @property
    def complete(self) -> bool:
        """False when counts come from hardware detection rather than the file."""
        return bool(self.entries) or self.autodetect in (None, "off")


def parse_gres_conf(text: str) -> list[GresConfLine]:
    """Every ``Name=`` or ``AutoDetect=`` line of a ``gres.conf`` (keys case-insensitive).

    A line ending in ``\\`` continues on the next (``_get_next_line`` in SchedMD/slurm
    ``src/common/parse_config.c``, which reads gres.conf too); the entry keeps the
    number of its first line.

    ``ValueError`` (naming the line) when a ``File=`` list expands past ``HOSTLIST_MAX``
    or ``Count=`` is not a count.
    """
    out = []
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        part = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = lineno
        if part.endswith("\\"):
            pending += part[:-1] + " "
            continue
        logical.append((start, pending + part))
        pending = ""
    if pending:
        logical.append((start, pending))
    for lineno, raw in logical:
        line = raw.strip()
        if not line:
            continue
        kv: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                kv[key.lower()] = value
        if "name" not in kv and "autodetect" not in kv:
            continue
        nodes = HostList(kv["nodename"]) if "nodename" in kv else None
        files: tuple[str, ...] = ()
        for key in ("file", "files", "multiplefiles"):
            if key in kv:
                try:
                    files = tuple(expand_hostlist(kv[key]))
                except ValueError as exc:
                    raise ValueError(f"line {lineno}: {exc}") from None
        count = parse_count(kv["count"]) if "count" in kv else None
        if "count" in kv and count is None:
            raise ValueError(f"line {lineno}: Count={kv['count']} is not a count")
        multiple = "multiplefiles" in kv
        if count is None:
            count = len(files) if files and not multiple else 1
        gtype = kv.get("type")
        out.append(
            GresConfLine(
                line=lineno,
                nodes=nodes,
                name=kv.get("name"),
                type=gtype if gtype and gtype.lower() not in _NULLS else None,
                count=count,
                files=files,
                autodetect=kv["autodetect"].lower() if "autodetect" in kv else None,
                cores=kv.get("cores") or kv.get("cpus"),
                multiple_files=multiple,
            )
        )
    return out


def gres_conf_for_node(lines: Iterable[GresConfLine], node: str) -> GresConf:
    """The GRES that ``gres.conf`` gives ``node``: lines for every node or naming it.

    A node-specific ``AutoDetect=`` wins over a global one.
    """
    entries = []
    auto_global = auto_node = None
    for ln in lines:
        if ln.nodes is not None and node not in ln.nodes:
            continue
        if ln.autodetect is not None:
            if ln.nodes is None:
                auto_global = ln.autodetect
            else:
                auto_node = ln.autodetect
        if ln.name is not None:
            entries.append(GresEntry(ln.name, ln.type, ln.count))
    autodetect = auto_node if auto_node is not None else auto_global
    return GresConf(sum_gres(entries), autodetect)
