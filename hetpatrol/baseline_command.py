"""``hetpatrol baseline`` and ``once --baseline``: the baseline file as a command sees it.

The baseline drift check and the file's format live in :mod:`hetpatrol.checks.baseline`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hetpatrol.checks.baseline import (
    NAME,
    baseline_document,
    dump_baseline,
    load_baseline_file,
    unread_for_baseline,
)
from hetpatrol.config import Config, ConfigError
from hetpatrol.exporters.state import write_atomic
from hetpatrol.report import PatrolReport
from hetpatrol.schema import rfc3339


def with_baseline_file(config: Config, path: Path) -> Config:
    """``config`` checking against the baseline file ``path`` (``once --baseline FILE``);
    ``ConfigError`` when it cannot be read."""
    try:
        table = load_baseline_file(Path(path))
    except ValueError as exc:
        raise ConfigError(str(exc), path=str(path)) from None
    return replace(config, top={**config.top, NAME: table}, baseline_file=Path(path))


def write_baseline(report: PatrolReport, path: Path | None, out, err, force: bool = False) -> int:
    """``hetpatrol baseline``: the report's versions as a baseline file, printed or
    written atomically to ``path``. Exit 0; 3 when no card type could be read (a
    baseline of nothing would check nothing), or when some card or collector could not
    be read (:func:`unread_for_baseline`) and ``force`` is false: nothing is written."""
    doc = baseline_document(report.cards, report.node, rfc3339(report.finished))
    if not doc["baseline"]:
        # never replace a good baseline file with an empty one
        err.write("no card type could be read: no baseline written\n")
        return 3
    missed = unread_for_baseline(report)
    if missed and not force:
        # a baseline that silently lacks a card type would check nothing for it
        err.write(
            f"could not read {', '.join(missed)}: the baseline would miss them; "
            "no baseline written (--force writes it anyway)\n"
        )
        return 3
    text = dump_baseline(doc)
    if path is None or str(path) == "-":
        out.write(text)
    else:
        write_atomic(Path(path), text.encode())
    for row in doc["baseline"]:
        mixed = [n for n in ("driver_version", "firmware_version") if isinstance(row[n], list)]
        note = f" (cards disagree on {', '.join(mixed)}: all their versions kept)" if mixed else ""
        driver = row["driver_version"] or "unknown"
        firmware = row["firmware_version"] or "unknown"
        err.write(
            f"{row['vendor']} {row['card_type']}: {row['cards']} cards, driver "
            f"{driver}, firmware {firmware}{note}\n"
        )
    if path is not None and str(path) != "-":
        err.write(f"baseline written to {path}\n")
    return 0
