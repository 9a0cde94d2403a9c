"""The ledger as a table (for a person), CSV or JSON (for scripts).

Columns: the group fields, ``gres`` (``gpu:a100``; a bare ``gpu`` is GPU time of unknown
type), ``card_hours`` (cards x hours held in the window), ``jobs``, ``runs``,
``mean_wait_hours`` (Start - Submit of the runs that started in the window; empty when
none did), ``max_cards`` (most cards of the type one run held).
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone

from hetpatrol.ledger.table import fit, wrap
from hetpatrol.ledger.usage import Ledger, Totals
from hetpatrol.node_view import printable

COLUMNS = ("gres", "card_hours", "jobs", "runs", "mean_wait_hours", "max_cards")


def rows(ledger: Ledger) -> list[dict]:
    """One dict per group, sorted by the group values then GRES label."""
    out = []
    for key in sorted(ledger.groups):
        t: Totals = ledger.groups[key]
        row: dict = dict(zip(ledger.by, key[:-1], strict=True))
        wait = t.mean_wait_seconds
        row.update(
            gres=key[-1],
            card_hours=round(t.card_hours, 6),
            card_seconds=round(t.card_seconds, 3),
            jobs=t.jobs,
            runs=t.runs,
            mean_wait_hours=None if wait is None else round(wait / 3600.0, 6),
            max_cards=t.max_cards,
        )
        out.append(row)
    return out


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def notes(ledger: Ledger) -> list[str]:
    """Things the reader must know: untyped time, unreadable TRES."""
    out = []
    for name in sorted(ledger.untyped):
        out.append(
            f"{name}: some card time has no type (AllocTRES had only gres/{name} and the "
            f"job's nodes have several or no {name} types); run `hetpatrol ledger audit`"
        )
    if ledger.bad_tres_count:
        out.append(
            f"{ledger.bad_tres_count} TRES item(s) unreadable, left out: "
            + ", ".join(ledger.bad_tres[:5])
        )
    return out


def to_json(ledger: Ledger) -> str:
    return json.dumps(
        {
            "window": {"start": _iso(ledger.window[0]), "end": _iso(ledger.window[1])},
            "group_by": list(ledger.by),
            "records": ledger.records,
            "rows": rows(ledger),
            "notes": notes(ledger),
        },
        indent=2,
    )


def to_csv(ledger: Ledger) -> str:
    buf = io.StringIO()
    fields = [*ledger.by, *COLUMNS, "card_seconds"]
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for row in rows(ledger):  # account and user names are chosen by people: no controls
        w.writerow({k: "" if v is None else printable(v) for k, v in row.items()})
    return buf.getvalue()


#: a narrow terminal: shorter headers first, then these columns go, least useful first
_SHORT = {"CARD_HOURS": "CARD_H", "MEAN_WAIT_HOURS": "WAIT_H", "MAX_CARDS": "MAX"}
_DROP = ("RUNS", "MAX_CARDS", "MEAN_WAIT_HOURS")


def to_table(ledger: Ledger, width: int | None = None) -> str:
    """The table for a person; ``width``: the terminal's columns (None: a pipe, every
    column whole), see :mod:`.table`."""
    header = [*ledger.by, *COLUMNS]
    body = []
    for row in rows(ledger):
        cells = []
        for col in header:
            v = row.get(col)
            if v is None:
                cells.append("-")
            elif col in ("card_hours", "mean_wait_hours"):
                cells.append(f"{v:.3f}")
            else:  # account and user names are chosen by people: no control characters
                cells.append(printable(str(v)))
        body.append(cells)
    lines = wrap(
        f"window {_iso(ledger.window[0])} .. {_iso(ledger.window[1])}, "
        f"{ledger.records} sacct records",
        width,
    )
    lines += fit([h.upper() for h in header], body, width, labels=len(ledger.by) + 1,
                 short=_SHORT, drop=_DROP)  # fmt: skip
    if not body:
        lines.append("(no card time in the window)")
    for n in notes(ledger):
        lines += wrap(f"note: {printable(n)}", width)
    return "\n".join(lines) + "\n"


def render(ledger: Ledger, fmt: str, width: int | None = None) -> str:
    """``fmt`` one of ``table``, ``csv``, ``json``; ``width`` fits the table to a
    terminal (:mod:`.table`)."""
    if fmt == "table":
        return to_table(ledger, width)
    return {"csv": to_csv, "json": to_json}[fmt](ledger)
