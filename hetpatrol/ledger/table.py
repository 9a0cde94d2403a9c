"""The ledger's tables and text fitted to a terminal's width (``width`` from
:func:`hetpatrol.node_view.terminal_width`: ``COLUMNS`` or the tty's width; None for a
pipe, which gets every column and every line whole, as ``--format csv``/``json`` do).

A table too wide first gets its short headers, then loses its least useful columns in
the order the caller gives (a note under the table names them), then puts its label
columns (account, user, GRES...) on a line of their own with the numbers on an indented
line below, as ``hetpatrol fleet`` does. Free text (notes, reasons) is wrapped at spaces.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence


def wrap(text: str, width: int | None, indent: int = 0, hang: int = 2) -> list[str]:
    """``text`` (already printable) as lines of at most ``width`` columns, broken at
    spaces only (a word longer than the line stays whole); continuation lines indented
    ``hang`` more than the first. One line, as it is, when ``width`` is None."""
    lead = " " * indent
    if width is None or len(lead) + len(text) <= width:
        return [lead + text]
    return textwrap.wrap(
        text,
        width=max(width, indent + hang + 20),
        initial_indent=lead,
        subsequent_indent=" " * (indent + hang),
        break_long_words=False,
        break_on_hyphens=False,
    ) or [lead]


def _line(cells: Sequence[str], widths: Sequence[int], left: Sequence[bool], lead: str) -> str:
    return (
        lead
        + "  ".join(
            c.ljust(w) if lf else c.rjust(w) for c, w, lf in zip(cells, widths, left, strict=True)
        )
    ).rstrip()


def fit(
    head: Sequence[str],
    body: Sequence[Sequence[str]],
    width: int | None,
    *,
    labels: int = 0,
    left: Sequence[str] = (),
    short: dict[str, str] | None = None,
    drop: Sequence[str] = (),
) -> list[str]:
    """The table ``head`` + ``body`` (cells already printable) as lines of at most
    ``width`` columns where it can be (None: every column, full headers).

    ``labels``: how many leading columns are labels (may go on a line of their own);
    ``left``: the headers whose cells are left-aligned (labels always are; the rest is
    right-aligned); ``short``: header -> shorter header, used first; ``drop``: headers
    in the order they may be left out. The last line, when columns were left out, says
    which.
    """
    head, rows = list(head), [list(r) for r in body]
    lefts = [i < labels or h in left for i, h in enumerate(head)]

    def widths(cols: list[list[str]], skip: int = 0) -> list[int]:
        return [max(len(r[i]) for r in cols) for i in range(skip, len(cols[0]))]

    def total(cols: list[list[str]], skip: int = 0, lead: int = 0) -> int:
        return lead + sum(widths(cols, skip)) + 2 * (len(cols[0]) - skip - 1)

    if width is None or total([head, *rows]) <= width:
        return [_line(r, widths([head, *rows]), lefts, "") for r in [head, *rows]]

    def narrowed(skip: int, lead: int) -> tuple[list[list[str]], list[bool], list[str]]:
        """Short headers, then columns of ``drop`` left out until the numbers fit."""
        cols = [[(short or {}).get(h, h) for h in head], *[list(r) for r in rows]]
        names, lf, gone = list(head), list(lefts), []
        for name in drop:
            if total(cols, skip, lead) <= width:
                break
            if name in names:
                i = names.index(name)
                for r in (names, lf, *cols):
                    del r[i]
                gone.append(name)
        return cols, lf, gone

    cols, lf, dropped = narrowed(0, 0)
    if total(cols) <= width:
        lines = [_line(r, widths(cols), lf, "") for r in cols]
    else:  # labels on a line of their own, the numbers under short headers below
        n, lead = labels, "    "
        cols, lf, dropped = narrowed(n, len(lead))
        num_w = widths(cols, n)
        lines = []
        for r in cols:
            lines += wrap("  ".join(r[:n]).rstrip(), width)
            lines.append(_line(r[n:], num_w, lf[n:], lead))
    if dropped:
        what = ", ".join(dropped)
        lines += wrap(
            f"({what} left out to fit {width} columns; a pipe or another --format shows them)",
            width,
        )
    return lines
