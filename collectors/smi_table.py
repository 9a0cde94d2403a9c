"""The two-rows-per-card ``|`` table that nvidia-smi made common, as ``cnmon`` (Cambricon)
and ``ixsmi`` (Iluvatar) print it, read by the header rows' names.

Each ``|``-cell of the two header rows names the values of the same cell in every card's
two rows (``| Card  VF  Name  Firmware |`` over ``| 0  /  MLU370-X4  v1.1.6 |``). A value
pair with units (``30 W/ 150 W``, ``257MiB / 32768MiB``) is one value (``30W/150W``); a
header naming a free-text value (``Name``) takes the tokens the other names leave; a
two-word header (``Compute M.``) is one name. Only cells closed by a ``|`` are trusted.
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
#: header words printed with a space that name one value
_JOINED_NAMES = (("Compute M.", "Compute-M."),)


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
    """Whitespace tokens of a cell, a ``30 W/ 150 W`` pair kept as one (``30W/150W``)."""
    return PAIR.sub(lambda m: f"{m[1]}{m[2]}/{m[3]}{m[4]}", cell).split()


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
        if section == "cards" and joined.startswith("Processes"):
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
        if extra > 0 and len(free) == 1:
            j = free[0]
            toks = [*toks[:j], " ".join(toks[j : j + extra + 1]), *toks[j + extra + 1 :]]
        if len(toks) != len(cell_names):
            card.complete = False
            card.damage = f"cell {' '.join(cell_names)!r} holds {len(toks)} values"
            continue
        card.values.update(zip(cell_names, toks, strict=True))
