"""The capacity report as one self-contained HTML page: no network, no external asset.

The verdicts first (a table with the numbers behind each), then per class one chart
(matplotlib, rendered to inline SVG with its fonts as paths: the page needs nothing but
itself) of the allocated, busy and down/drained shares per bucket above the wait
distribution, and the class's top accounts. matplotlib is the optional ``report`` extra
(``pip install hetpatrol[report]``); it is imported here only, when a page is asked for,
never by the daemon. :class:`MissingExtra` when it is not installed.
"""

from __future__ import annotations

import html
import io
import os
import tempfile
from datetime import datetime
from pathlib import Path

from hetpatrol.ledger.capacity import CapacityReport, ClassReport
from hetpatrol.ledger.capacity_report import _iso, _nodes_when, class_row
from hetpatrol.node_view import printable

VERDICT_COLOURS = {"expand": "#b35806", "underused": "#5e3c99", "unhealthy": "#c51b1b",
                   "fine": "#1a7a33"}  # fmt: skip


class MissingExtra(RuntimeError):
    """matplotlib is not installed (the ``report`` extra)."""


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("svg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtra(
            "--html needs matplotlib (the 'report' extra): pip install 'hetpatrol[report]'"
            ", or in a checkout pip install -e '.[report]'"
        ) from None
    # text as paths: no font is fetched or needed by the browser; a fixed hash salt
    # makes the same report give the same page
    matplotlib.rcParams.update({"svg.fonttype": "path", "svg.hashsalt": "hetpatrol",
                                "font.size": 9})  # fmt: skip
    return plt


def _share(part: list[float], whole: list[float]) -> list[float]:
    """Percent per bucket (NaN where ``whole`` is 0: no line there), the last value
    repeated for the window's end so that the last bucket is drawn to its end."""
    out = [100.0 * p / w if w > 0 else float("nan") for p, w in zip(part, whole, strict=True)]
    return [*out, out[-1]] if out else out


def class_chart(report: CapacityReport, c: ClassReport) -> str:
    """One SVG (text) for class ``c``: shares per bucket (top), waits (bottom)."""
    plt = _pyplot()
    fig, (ax, wx) = plt.subplots(2, 1, figsize=(7.5, 4.6), height_ratios=(3, 2))
    try:
        x = [datetime.fromtimestamp(t) for t in report.edges]
        s = c.series
        cap = s["capacity"]
        down = [a + b + d for a, b, d in
                zip(s["down"], s["drained"], s["drained_by_hetpatrol"], strict=True)]  # fmt: skip
        ax.step(x, _share(s["allocated"], cap), where="post", label="allocated % of capacity",
                color="#2166ac", linewidth=1.8)  # fmt: skip
        if any(s["busy_measured"]):
            ax.step(x, _share(s["busy"], s["busy_measured"]), where="post",
                    label="busy % of allocated", color="#1a9850", linewidth=1.5)  # fmt: skip
        ax.step(x, _share(down, cap), where="post", label="down/drained % of capacity",
                color="#d73027", linewidth=1.5, linestyle="--")  # fmt: skip
        ax.set_ylim(0, 105)
        ax.set_ylabel("%")
        ax.set_title(f"{c.label}: {c.cards} cards on {c.nodes} node(s), by {report.bucket}")
        ax.legend(loc="upper right", fontsize=7, frameon=False)
        ax.grid(alpha=0.3)
        ax.tick_params(axis="x", labelrotation=20, labelsize=7)
        dist = c.waits.distribution()
        if dist:
            wx.bar(range(len(dist)), [n for _, n in dist], color="#4575b4")
            wx.set_xticks(range(len(dist)))
            wx.set_xticklabels([_wait_label(w) for w, _ in dist], fontsize=7, rotation=45)
        else:
            wx.text(0.5, 0.5, "no job started in the window", ha="center", va="center",
                    transform=wx.transAxes)  # fmt: skip
            wx.set_xticks([])
        wx.set_ylabel("jobs")
        wx.set_xlabel("wait from submit to start")
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
    finally:
        plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # the XML prolog and DOCTYPE do not belong inline


def _wait_label(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _hours(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def render(report: CapacityReport) -> str:
    """The page (text). Every name from Slurm (class, account) is escaped."""
    esc = html.escape
    window = f"{_iso(report.window[0])} .. {_iso(report.window[1])}"
    rows = []
    for lab in sorted(report.classes):
        c = report.classes[lab]
        r = class_row(c)
        colour = VERDICT_COLOURS.get(c.verdict, "#333")
        rows.append(
            f'<tr><td><a href="#c-{esc(lab)}">{esc(printable(lab))}</a></td>'
            f'<td class="v" style="color:{colour}">{esc(c.verdict)}</td>'
            f"<td>{c.cards}</td><td>{_hours(r['capacity_card_hours'])}</td>"
            f"<td>{_hours(r['allocated_card_hours'])}</td><td>{_pct(c.allocated_share)}</td>"
            f"<td>{_pct(c.busy_share)}</td><td>{_pct(c.down_share)}</td>"
            f"<td>{_hours(r['wait_p90_hours'])}</td><td>{_hours(r['pending_card_hours'])}</td>"
            f"<td>{esc(printable(c.why))}</td></tr>"
        )
    sections = []
    for lab in sorted(report.classes):
        c = report.classes[lab]
        top = (
            "".join(
                f"<li>{esc(printable(a))}: {s / 3600:.3f} card-hours</li>"
                for a, s in c.top_accounts()
            )
            or "<li>none</li>"
        )
        sections.append(
            f'<section class="class" id="c-{esc(lab)}"><h2>{esc(printable(lab))} '
            f'<span style="color:{VERDICT_COLOURS.get(c.verdict, "#333")}">'
            f"{esc(c.verdict)}</span></h2>"
            f'<div class="chart">{class_chart(report, c)}</div>'
            f"<p>Top accounts:</p><ul>{top}</ul>"
            f"<p>Requests: {c.jobs_by_name} job(s) named the type, {c.jobs_any_type} asked "
            f"for any {esc(printable(lab.split(':')[0]))}; pending at the end: "
            f"{c.pending_jobs} job(s), {c.pending_card_seconds / 3600:.3f} card-hours.</p>"
            f"<p>sreport: {esc(printable(c.sreport_note or '-'))}</p></section>"
        )
    notes = "".join(f"<li>{esc(printable(n))}</li>" for n in report.notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>hetpatrol capacity {esc(window)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }}
td:first-child, td:last-child, th:first-child, th:last-child {{ text-align: left; }}
td.v {{ font-weight: bold; }}
table {{ width: 100%; }}
section.class {{ margin-top: 2em; }}
.chart svg {{ max-width: 100%; height: auto; }}
</style></head><body>
<h1>Capacity per card class</h1>
<p>Window {esc(window)} by {esc(report.bucket)}, {report.records} sacct records,
nodes {esc(_nodes_when(report))}.</p>
<table id="verdicts"><thead><tr><th>class</th><th>verdict</th><th>cards</th>
<th>capacity h</th><th>allocated h</th><th>allocated</th><th>busy</th><th>down</th>
<th>wait p90 h</th><th>pending h</th><th>why</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>
{"<ul>" + notes + "</ul>" if notes else ""}
{"".join(sections)}
</body></html>
"""


def write(report: CapacityReport, path: Path) -> None:
    """Write the page to ``path`` atomically (a temp file beside it, then renamed).
    :class:`MissingExtra` without matplotlib; ``OSError`` when it cannot be written."""
    text = render(report)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
