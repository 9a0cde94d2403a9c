"""The two-rows-per-card ``|`` table that nvidia-smi made common, as ``cnmon`` (Cambricon)
and ``ixsmi`` (Iluvatar) print it, read by the header rows' names.

Each ``|``-cell of the two header rows names the values of the same cell in every card's
two rows (``| Card  VF  Name  Firmware |`` over ``| 0  /  MLU370-X4  v1.1.6 |``). A value
pair with units (``30 W/ 150 W``, ``257MiB / 32768MiB``) is one value (``30W/150W``); a
header naming a free-text value (``Name``) takes the tokens the other names leave; a
two-word header (``Compute M.``, ``Volatile Uncorr. ECC``) is one name; a pair with an
``N/A`` side (``N/A / N/A``) is one value; a cell that names one value is that value
whole (``0 MiB/ xxxxx MiB``), for the vendor's reader to read each side of on its own
(:func:`read_pair`). Only cells closed by a ``|`` are trusted.
A card whose rows are not both complete, or whose cell holds a different number of values
than its header names, is ``complete=False`` with ``damage`` saying why. The process
section's rows are handed back as text for the vendor's reader.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

PAIR = re.compile(
    r"([0-9]{1,12}(?:\.[0-9]{1,6})?)\s*([A-Za-z]{1,4})\s*/\s*([0-9]{1,12}(?:\.[0-9]{1,6})?)\s*([A-Za-z]{1,4})"
)
#: a pair of which one side or both are ``N/A`` (``N/A / N/A``: ixsmi 4.0 on a BI-V150S
#: that reports no power; ``54W / N/A``): one value, each side read on its own
_NA_PAIR = re.compile(
    r"(N/A|[0-9]{1,12}(?:\.[0-9]{1,6})?\s*[A-Za-z]{1,4})\s*/\s*"
    r"(N/A|[0-9]{1,12}(?:\.[0-9]{1,6})?\s*[A-Za-z]{1,4})"
)
#: header words printed with a space that name one value (ixsmi/nvidia-smi-like
#: ``Compute M.``; hl-smi's ``Volatile Uncorr. ECC`` and, from 1.20, ``Volatile Uncor-Events``)
_JOINED_NAMES = (
    ("Compute M.", "Compute-M."),
    ("Volatile Uncorr. ECC", "Volatile-Uncorr.-ECC"),
    ("Volatile Uncor-Events", "Volatile-Uncor-Events"),
)
#: the first words of a process section's title row (cnmon/ixsmi ``Processes:``, hl-smi
#: ``Compute Processes:``)
_PROCESS_TITLES = ("Processes", "Compute Processes")
_NUM_UNIT = re.compile(r"([-+]?[0-9]{1,12}(?:\.[0-9]{1,6})?)\s*([A-Za-z%\u00b0\u2103]{0,4})")
#: ``N/A`` alone or with an annotation (``N/A (Secondary die)``, ``[N/A]``)
_NA_TEXT = re.compile(r"\[?(?:N/A|NA|Not Supported|Unsupported)\]?(?:\s*\(.{0,60}\))?", re.I)


def is_na(text: str | None) -> bool:
    """True for ``N/A`` (any case, bracketed, or followed by an annotation in
    parentheses: ``N/A (Secondary die)``), ``Not Supported`` and ``Unsupported``."""
    return bool(text) and _NA_TEXT.fullmatch(text.strip()) is not None


def number_unit(text: str | None) -> tuple[float, str] | None:
    """``"33C"`` -> ``(33.0, "C")``, ``"34\u2103"`` / ``"32.0\u00b0C"`` -> ``(.., "C")``,
    ``"0%"`` -> ``(0.0, "%")``, ``"1500MHz"`` -> ``(1500.0, "MHz")``; None when the text
    is not one number with an optional unit (``N/A`` included: see :func:`is_na`)."""
    m = _NUM_UNIT.fullmatch((text or "").strip())
    if not m:
        return None
    unit = m[2]
    if unit in ("\u2103", "\u00b0C", "\u00b0c", "c"):
        unit = "C"
    return float(m[1]), unit


def pair_sides(text: str | None) -> tuple[str, str] | None:
    """The two sides of a ``used/total`` value (``"54W/250W"``, ``"N/A/N/A"``, ``"512Mib /
    32768Mib"``) as text, each to be read on its own; None when the text is no pair."""
    m = _NA_PAIR.fullmatch((text or "").strip())
    return (m[1].replace(" ", ""), m[2].replace(" ", "")) if m else None


def describe(text: str) -> str:
    """What an output held, for the reason of a refusal: its line count, how many rows
    were ``|``-table rows and the first three non-border lines (cut to 60 characters)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    bars = sum(1 for ln in lines if ln.startswith("|"))
    heads = [ln for ln in lines if not set(ln) <= set("+-=| ")][:3]
    shown = "; ".join(repr(" ".join(h.split())[:60]) for h in heads) or "nothing"
    return f"saw {len(lines)} lines, {bars} '|' rows, first: {shown}"


@dataclass
class Block:
    """One card's two rows: ``values`` by header name, as text."""

    index: int
    values: dict[str, str] = field(default_factory=dict)
    complete: bool = True
    damage: str | None = None


@dataclass
class SmiTable:
    """A whole table: the title row (text), the card blocks, the process rows (joined
    text, closed by ``|``), whether the process section ended on its border, problems."""

    title: str | None = None
    cards: list[Block] = field(default_factory=list)
    process_rows: list[tuple[str, bool]] = field(default_factory=list)
    processes_complete: bool = False
    header_seen: bool = False
    problems: list[str] = field(default_factory=list)


def cells_of(line: str) -> tuple[list[str], bool]:
    """The ``|``-cells of a row and whether the row was closed by a final ``|``."""
    body = line.strip()
    closed = body.endswith("|") and len(body) > 1
    parts = body.strip("|").split("|") if closed else body.lstrip("|").split("|")
    return (parts if closed else parts[:-1]), closed


def tokens_of(cell: str) -> list[str]:
    """Whitespace tokens of a cell, a ``30 W/ 150 W`` pair kept as one (``30W/150W``), as
    is a pair with an ``N/A`` side (``N/A / N/A`` -> ``N/A/N/A``)."""
    cell = PAIR.sub(lambda m: f"{m[1]}{m[2]}/{m[3]}{m[4]}", cell)
    if "N/A" in cell and "/" in cell.replace("N/A", ""):
        cell = _NA_PAIR.sub(lambda m: f"{m[1].replace(' ', '')}/{m[2].replace(' ', '')}", cell)
    return cell.split()


_NAME = re.compile(r"[A-Za-z][A-Za-z0-9.:/()%-]{0,30}")


@functools.lru_cache(maxsize=256)
def _names(cell: str) -> tuple[str, ...] | None:
    """The value names of a header cell; None when one is garbled (its cell unreadable).
    Cached: a tool prints the same header every patrol."""
    for words, name in _JOINED_NAMES:
        cell = cell.replace(words, name)
    names = tuple(cell.split())
    return names if all(_NAME.fullmatch(n) for n in names) else None


def parse_blocks(
    text: str, header_word: str, title_word: str, free_text: frozenset[str] = frozenset()
) -> SmiTable:
    """Read ``text``: the title row (the first row holding ``title_word``), the two header
    rows (the first starts with ``header_word``), the card blocks, the process rows.
    ``free_text``: header names whose value may hold spaces (ixsmi's ``Name``)."""
    table = SmiTable()
    header: list[list[tuple[str, ...] | None]] = []
    section = "head"
    pending: Block | None = None
    row_no = 0
    last = ""
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        last = s
        if s.startswith("+") or (s.startswith("|-") and section != "head"):
            if pending is not None and row_no != 2:
                pending.complete, pending.damage = False, pending.damage or "second row missing"
            pending, row_no = None, 0
            continue
        if s.startswith("|="):
            section = "procs" if section == "proc-head" else "cards"
            continue
        if not s.startswith("|"):
            continue
        cells, closed = cells_of(s)
        joined = " ".join(s.strip("|").split())
        if section == "head":
            if table.title is None and title_word in joined:
                table.title = joined
            elif closed and (joined.startswith(header_word) or header) and len(header) < 2:
                header.append([_names(c) for c in cells])
            continue
        if section == "cards" and joined.startswith(_PROCESS_TITLES):
            section = "proc-head"
            continue
        if section == "proc-head":
            continue
        if section == "procs":
            table.process_rows.append((joined, closed))
            continue
        if row_no == 0:
            toks = cells[0].split() if cells else s.strip("|").split()
            if not toks or not toks[0].isdigit():
                table.problems.append(f"row {joined[:40]!r} not understood")
                continue
            pending = Block(index=int(toks[0]))
            table.cards.append(pending)
        elif pending is None or row_no >= 2:
            table.problems.append(f"row {joined[:40]!r} outside a card block")
            continue
        if len(header) < 2:
            pending.complete, pending.damage = False, "no header rows"
        else:
            _row(pending, header[row_no], cells, closed, free_text)
        row_no += 1
    table.header_seen = len(header) == 2
    if pending is not None and row_no != 2:
        pending.complete, pending.damage = False, pending.damage or "output ends in the card"
    table.processes_complete = section == "procs" and last.startswith("+")
    return table


def _row(
    card: Block,
    names: list[list[tuple[str, ...] | None]],
    cells: list[str],
    closed: bool,
    free_text: frozenset[str],
) -> None:
    if not closed:
        card.complete, card.damage = False, "row cut"
    for i, cell_names in enumerate(names):
        if i >= len(cells):
            break
        if cell_names is None:
            card.complete, card.damage = False, "header cell garbled: its values not read"
            continue
        toks = tokens_of(cells[i])
        extra = len(toks) - len(cell_names)
        free = [j for j, n in enumerate(cell_names) if n in free_text]
        if len(cell_names) == 1 and toks:
            # a cell that names one value cannot misalign: its whole text is that value,
            # read (or refused) by the vendor's reader on its own ("0 MiB/ xxxxx MiB")
            toks = [" ".join(toks)]
        elif extra > 0 and len(free) == 1:
            j = free[0]
            toks = [*toks[:j], " ".join(toks[j : j + extra + 1]), *toks[j + extra + 1 :]]
        if len(toks) != len(cell_names):
            card.complete = False
            card.damage = (
                f"cell {' '.join(cell_names)!r} holds {len(toks)} values for"
                f" {len(cell_names)} names: {' '.join(toks)[:60]!r}"
            )
            continue
        card.values.update(zip(cell_names, toks, strict=True))


def read_side(text: str | None, units: dict[str, float]) -> tuple[float | None, str | None]:
    """One value in one of ``units`` (unit -> factor), as ``(value * factor, None)``, or
    ``(None, reason)``: ``"N/A: not reported"`` for an ``N/A`` (a value the tool did not
    report, never 0), ``"not read"`` when absent, the text itself when garbled."""
    if text is None:
        return None, "not read"
    if is_na(text):
        return None, f"{text.strip()}: not reported"
    got = number_unit(text)
    if got is None or got[1] not in units:
        return None, f"{text.strip()[:40]!r} not a number in {'/'.join(units)}"
    return got[0] * units[got[1]], None


def read_pair(
    text: str | None, units: dict[str, float]
) -> tuple[tuple[float | None, str | None], tuple[float | None, str | None]]:
    """Both sides of a ``used / total`` value, each read on its own by :func:`read_side`
    (``N/A / 250W``: used None with its reason, total 250)."""
    sides = pair_sides(text)
    if sides is None and text is not None and text.count("/") == 1:
        # "0 MiB/ xxxxx MiB" (a masked total): each side still read, or refused, alone
        left, right = text.split("/")
        sides = (left.strip(), right.strip())
    if sides is None:
        why = "not read" if text is None else f"{text.strip()[:40]!r} not a used/total pair"
        return (None, why), (None, why)
    return read_side(sides[0], units), read_side(sides[1], units)


# ------------------------------------------------------------------ aligned columns


_WORD_GROUP = re.compile(r"\S+(?: \S+)*")
_TOKEN = re.compile(r"\S+")


@dataclass
class Column:
    """One column of a space-aligned table: its header text (``"Temp"``, ``"Temp
    (DieEdge)"``, ``"[Model : Revision]"``), where it starts, and the text printed under it
    in the header's second row (``"(Junction)"``, ``"Name (20 chars)"``) or None."""

    name: str
    start: int
    sub: str | None = None


def aligned_columns(header: str, sub_header: str | None = None) -> list[Column]:
    """The columns of a header row whose names are set apart by two or more spaces (one
    space joins the words of one name: ``Temp (DieEdge)``), with the second header row's
    text assigned to the column it starts under."""
    cols = [Column(m[0], m.start()) for m in _WORD_GROUP.finditer(header.replace("\t", " "))]
    if sub_header and cols:
        for m in _WORD_GROUP.finditer(sub_header.replace("\t", " ")):
            col = column_at(cols, m.start())
            col.sub = m[0] if col.sub is None else f"{col.sub} {m[0]}"
    return cols


#: a value may start this many characters before its header: DTK's rocm-smi prints
#: ``AvgPwr   SCLK`` over ``20.0W   1250Mhz`` (the header one character wider)
_SLACK = 1


def column_at(cols: list[Column], pos: int) -> Column:
    """The column a text starting at ``pos`` belongs to: the last one starting at or
    before ``pos + 1`` (a value right-aligned under a longer header starts inside its
    column; one left-aligned under a header printed a character wider starts one early)."""
    found = cols[0]
    for col in cols:
        if col.start <= pos + _SLACK:
            found = col
        else:
            break
    return found


def aligned_values(cols: list[Column], row: str) -> dict[str, str]:
    """A data row's text by column name: each whitespace token goes to the column it
    starts in, the tokens of one column joined by one space (``0x74a1,   55354`` under
    ``IDs`` is ``"0x74a1, 55354"``). A column with nothing under it is absent."""
    out: dict[str, list[str]] = {}
    for m in _TOKEN.finditer(row.replace("\t", " ")):
        out.setdefault(column_at(cols, m.start()).name, []).append(m[0])
    return {k: " ".join(v) for k, v in out.items()}
