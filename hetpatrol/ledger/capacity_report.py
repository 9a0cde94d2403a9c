"""The capacity report as a table (for a person), CSV (one row per class) or JSON (every
figure, the series per bucket and the wait distribution).

Units: card-hours (``*_card_hours``), shares 0..1 (``*_share``: allocated and down of
capacity, busy of allocated), waits in hours. ``None`` (JSON ``null``, CSV empty, table
``-``) where a figure is unknown: no cards in service, no job started, no job measured.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone

from hetpatrol.ledger.capacity import SERIES, CapacityReport, ClassReport
from hetpatrol.ledger.table import fit, wrap
from hetpatrol.node_view import printable

#: the CSV columns, in order (the table shows the first ones under short names)
COLUMNS = (
    "class", "verdict", "cards", "nodes", "capacity_card_hours", "allocated_card_hours",
    "allocated_share", "busy_card_hours", "busy_share", "busy_jobs_measured",
    "down_card_hours", "drained_card_hours", "drained_by_hetpatrol_card_hours", "down_share",
    "jobs", "wait_median_hours", "wait_p90_hours", "pending_jobs", "pending_card_hours",
    "pending_unlimited_jobs", "jobs_by_name", "jobs_any_type", "sreport_allocated_card_hours",
    "why",
)  # fmt: skip


def _h(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 3600.0, 6)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _nodes_time(report: CapacityReport) -> str | None:
    return None if report.inventory_time is None else _iso(report.inventory_time)


def _nodes_when(report: CapacityReport) -> str:
    t = _nodes_time(report)
    return "from a saved node list" if t is None else f"as of {t}"


def class_row(c: ClassReport) -> dict:
    """The summary figures of one class (the keys of :data:`COLUMNS`)."""
    busy = c.busy_card_seconds
    sr = c.sreport
    return {
        "class": c.label,
        "verdict": c.verdict,
        "cards": c.cards,
        "nodes": c.nodes,
        "capacity_card_hours": _h(c.capacity),
        "allocated_card_hours": _h(c.allocated),
        "allocated_share": _r(c.allocated_share),
        "busy_card_hours": _h(busy),
        "busy_share": _r(c.busy_share),
        "busy_jobs_measured": c.busy_jobs,
        "down_card_hours": _h(c.down),
        "drained_card_hours": _h(c.drained),
        "drained_by_hetpatrol_card_hours": _h(c.drained_by_hetpatrol),
        "down_share": _r(c.down_share),
        "jobs": c.jobs,
        "wait_median_hours": _h(c.waits.quantile(0.5)),
        "wait_p90_hours": _h(c.waits.quantile(0.9)),
        "pending_jobs": c.pending_jobs,
        "pending_card_hours": _h(c.pending_card_seconds),
        "pending_unlimited_jobs": c.pending_unlimited,
        "jobs_by_name": c.jobs_by_name,
        "jobs_any_type": c.jobs_any_type,
        "sreport_allocated_card_hours": _h(sr["allocated"]) if sr else None,
        "why": c.why,
    }


def to_dict(report: CapacityReport) -> dict:
    """Everything: window, buckets, per class the summary, the top accounts, the
    reconciliation with sreport, the series (card-hours per bucket) and the waits."""
    classes = []
    for lab in sorted(report.classes):
        c = report.classes[lab]
        row = class_row(c)
        row["top_accounts"] = [{"account": a, "card_hours": _h(s)} for a, s in c.top_accounts()]
        row["sreport"] = {k: _h(v) for k, v in c.sreport.items()} if c.sreport is not None else None
        row["sreport_note"] = c.sreport_note
        row["series"] = [
            {"start": _iso(report.edges[i]),
             **{f"{k}_card_hours": _h(c.series[k][i]) for k in SERIES}}
            for i in range(len(report.edges) - 1)
        ]  # fmt: skip
        row["wait_distribution"] = [
            {"wait_hours": _h(w), "jobs": n} for w, n in c.waits.distribution()
        ]
        classes.append(row)
    return {
        "window": {"start": _iso(report.window[0]), "end": _iso(report.window[1])},
        "bucket": report.bucket,
        "records": report.records,
        "inventory_time": _nodes_time(report),
        "classes": classes,
        "notes": report.notes,
    }


def to_json(report: CapacityReport) -> str:
    return json.dumps(to_dict(report), indent=2, allow_nan=False) + "\n"


def to_csv(report: CapacityReport) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    for lab in sorted(report.classes):
        row = class_row(report.classes[lab])
        w.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


#: a narrow terminal: shorter headers first, then these columns go, least useful first
#: (the counts behind a share, then the median wait: the share and p90 stay)
_SHORT = {"WAIT_P50_H": "P50_H", "WAIT_P90_H": "P90_H", "BY_NAME/ANY": "NAMED"}
_DROP = ("BY_NAME/ANY", "WAIT_P50_H", "CAP_H", "ALLOC_H", "PEND_H")


def to_table(report: CapacityReport, width: int | None = None) -> str:
    """The table and a few lines per class for a person; ``width``: the terminal's
    columns (None: a pipe, every column and line whole), see :mod:`.table`."""
    head = ("CLASS", "CARDS", "CAP_H", "ALLOC_H", "ALLOC", "BUSY", "DOWN", "WAIT_P50_H",
            "WAIT_P90_H", "PEND_H", "BY_NAME/ANY", "VERDICT")  # fmt: skip
    body = []
    for lab in sorted(report.classes):
        c = report.classes[lab]
        r = class_row(c)
        body.append((
            printable(lab), str(c.cards), _num(r["capacity_card_hours"]),
            _num(r["allocated_card_hours"]), _pct(c.allocated_share), _pct(c.busy_share),
            _pct(c.down_share), _num(r["wait_median_hours"]), _num(r["wait_p90_hours"]),
            _num(r["pending_card_hours"]), f"{c.jobs_by_name}/{c.jobs_any_type}", c.verdict,
        ))  # fmt: skip
    lines = wrap(
        f"window {_iso(report.window[0])} .. {_iso(report.window[1])} by {report.bucket}, "
        f"{report.records} sacct records, nodes {_nodes_when(report)}",
        width,
    )
    lines += fit(head, body, width, labels=1, left=("VERDICT",), short=_SHORT, drop=_DROP)
    if not body:
        lines.append("(no card class on the nodes nor in the jobs)")
    for lab in sorted(report.classes):
        c = report.classes[lab]
        lines += wrap(f"{printable(lab)}: {c.verdict}: {printable(c.why)}", width)
        top = ", ".join(f"{printable(a)} {s / 3600:.3f}" for a, s in c.top_accounts(3))
        if top:
            lines += wrap(f"top accounts (card-hours): {top}", width, indent=2)
        if c.drained_by_hetpatrol or c.drained or c.down:
            lines += wrap(
                f"down {c.down / 3600:.3f}, drained by others {c.drained / 3600:.3f}, "
                f"drained by hetpatrol {c.drained_by_hetpatrol / 3600:.3f} card-hours",
                width,
                indent=2,
            )
        if c.sreport_note:
            lines += wrap(f"sreport: {printable(c.sreport_note)}", width, indent=2)
    lines.extend(ln for n in report.notes for ln in wrap(f"note: {printable(n)}", width))
    return "\n".join(lines) + "\n"


def render(report: CapacityReport, fmt: str, width: int | None = None) -> str:
    """``fmt`` one of ``table``, ``csv``, ``json``; ``width`` fits the table to a
    terminal (:mod:`.table`)."""
    if fmt == "table":
        return to_table(report, width)
    return {"csv": to_csv, "json": to_json}[fmt](report)
