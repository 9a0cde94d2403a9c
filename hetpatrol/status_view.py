"""``hetpatrol status``: this node at a glance, from the running daemon's state file.

Reads only the state file (:func:`hetpatrol.exporters.state.read_state`): no vendor
tool, no daemon round trip, so it answers at once even while ``npu-smi`` hangs. One row
per card, grouped by vendor and card type, its findings under it, the collectors' states
and how old the verdict is. Health is coloured on a terminal (ANSI), plain when piped or
when ``NO_COLOR`` is set; ``--json`` prints the state document with ``age_seconds`` and
``stale`` added, for scripts.

Exit code: the verdict's (0 ok, 1 warning, 2 critical, 3 unknown); 3 as well when the
verdict is stale or the state file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from hetpatrol.exporters.state import read_state
from hetpatrol.healthcheck import verdict_age, verdict_code
from hetpatrol.output import plain_help, write_stdout

EXIT_UNKNOWN = 3

_RESET = "\033[0m"
_STYLE = {
    "ok": "\033[32m",  # green
    "warning": "\033[33m",  # yellow
    "critical": "\033[1;31m",  # bold red
    "unknown": "\033[35m",  # magenta
    "info": "\033[36m",  # cyan
    "dim": "\033[2m",
    "bold": "\033[1m",
}
_ORDER = ("ok", "warning", "unknown", "critical")
_COLLECTOR_HEALTH = {
    "ok": "ok",
    "absent": "ok",
    "disabled": "info",
    "failed": "unknown",
    "hung": "critical",
}


def use_color(stream: TextIO, mode: str = "auto", environ: Mapping[str, str] | None = None) -> bool:
    """Colour for ``always``; for ``auto`` only on a terminal, without NO_COLOR, TERM=dumb."""
    env = os.environ if environ is None else environ
    if mode == "always":
        return True
    if mode == "never" or env.get("NO_COLOR"):
        return False
    if env.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _Painter:
    def __init__(self, color: bool):
        self.color = color

    def __call__(self, text: str, style: str) -> str:
        if not self.color or style not in _STYLE:
            return text
        return f"{_STYLE[style]}{text}{_RESET}"


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _human_age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _num(value: Any, unit: str, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value) + unit


def _memory(card: Mapping[str, Any]) -> str:
    used, total = card.get("memory_used_bytes"), card.get("memory_total_bytes")
    if used is None or not total:
        return "-"
    return f"{used / 2**30:.1f}/{total / 2**30:.1f} GiB"


def _groups(cards: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for card in cards:
        key = (str(card.get("vendor") or "?"), str(card.get("card_type") or "(type unknown)"))
        groups.setdefault(key, []).append(card)
    for rows in groups.values():
        rows.sort(key=lambda c: (c.get("index") or 0, c.get("chip") or 0))
    return dict(sorted(groups.items()))


#: C0/C1 control characters and the Unicode bidi controls (LRM, RLM, LRE..RLO, LRI..PDI)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    code = ord(char)
    return _ESCAPES.get(char, f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _printable(value: Any) -> Any:
    """``value`` with control characters in every string (keys too) shown as escapes
    (``\\x1b``, ``\\n``, bidi controls as ``\\u202e``): a vendor tool's text must not
    drive the operator's terminal nor reorder what it shows."""
    if isinstance(value, str):
        return _CONTROL.sub(lambda m: _escape(m[0]), value)
    if isinstance(value, Mapping):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def render(
    doc: Mapping[str, Any], *, color: bool = False, now: float | None = None, source: str = ""
) -> str:
    """The human view of a state document. Control characters in its strings (a model
    name or tool error with ANSI escapes) are printed escaped, never sent raw."""
    doc = _printable(doc)
    source = _printable(source)
    paint = _Painter(color)
    health = str(doc.get("health") or "unknown")
    age, stale = verdict_age(doc, now)
    interval = doc.get("interval_seconds")
    out: list[str] = []
    head = f"node {doc.get('node')}: " + paint(health.upper(), health)
    old = f"{_human_age(age)} old" if math.isfinite(age) else "time unknown"
    when = f"patrol {doc.get('seq')}, verdict {old}"
    if _finite_number(interval) and interval:
        when += f" (every {float(interval):g} s)"
    if stale:
        when += "  " + paint("STALE: is the daemon running?", "critical")
    out.append(f"{head}   {when}")
    if source:
        out.append(paint(f"state file: {source}", "dim"))

    head_cols = ("IDX", "CHIP", "HEALTH", "TEMP", "POWER", "UTIL", "MEMORY", "BUS ID", "MODEL")
    for (vendor, card_type), cards in _groups(doc.get("cards") or []).items():
        counts: dict[str, int] = {}
        for c in cards:
            counts[str(c.get("health"))] = counts.get(str(c.get("health")), 0) + 1
        order = sorted(counts, key=lambda h: _ORDER.index(h) if h in _ORDER else len(_ORDER))
        summary = ", ".join(paint(f"{counts[h]} {h}", h) for h in order)
        noun = "chip" if any(c.get("chip") is not None for c in cards) else "card"
        noun += "" if len(cards) == 1 else "s"
        out.append("")
        out.append(paint(f"{vendor} {card_type}", "bold") + f"  ({len(cards)} {noun}: {summary})")
        rows = []
        for c in cards:
            util = c.get("utilization_ratio")
            rows.append(
                (
                    str(c.get("index")),
                    "-" if c.get("chip") is None else str(c.get("chip")),
                    str(c.get("health") or "unknown").upper(),
                    _num(c.get("temperature_celsius"), " C"),
                    _num(c.get("power_watts"), " W", "{:.1f}"),
                    _num(None if util is None else util * 100, "%"),
                    _memory(c),
                    c.get("bus_id") or "-",
                    c.get("model") or "-",
                )
            )
        widths = [max(len(r[i]) for r in [head_cols, *rows]) for i in range(len(head_cols))]
        out.append(
            "  " + "  ".join(h.ljust(w) for h, w in zip(head_cols, widths, strict=True)).rstrip()
        )
        for c, row in zip(cards, rows, strict=True):
            cells = [v.ljust(w) for v, w in zip(row, widths, strict=True)]
            cells[2] = paint(row[2], str(c.get("health"))) + " " * (widths[2] - len(row[2]))
            out.append("  " + "  ".join(cells).rstrip())
            for f in c.get("findings") or []:
                sev = str(f.get("severity"))
                out.append(f"      {paint(sev, sev)} {f.get('check')}: {f.get('message')}")
            # why a value is missing matters when the card is not ok (npu-smi shows power
            # on chip 0 only: that is no news on a healthy card)
            for e in (c.get("errors") or []) if c.get("health") != "ok" else []:
                out.append(paint(f"      error {e.get('source')}: {e.get('error')}", "dim"))

    out.append("")
    parts = []
    for name, s in (doc.get("collectors") or {}).items():
        state = str(s.get("state"))
        text = f"{name} " + paint(state, _COLLECTOR_HEALTH.get(state, "unknown"))
        text += f" ({s.get('cards', 0)} cards, {float(s.get('duration_seconds') or 0):.3f} s)"
        parts.append(text)
        if s.get("error"):
            parts[-1] += f": {s.get('error')}"
    out.append("collectors: " + ("; ".join(parts) if parts else "none"))
    for f in doc.get("findings") or []:
        sev = str(f.get("severity"))
        out.append(f"node {paint(sev, sev)} {f.get('check')}: {f.get('message')}")
    return "\n".join(out) + "\n"


def _state_path(args: argparse.Namespace) -> Path | None:
    if args.state_path is not None:
        return args.state_path
    from hetpatrol.config import load_config

    return load_config(args.config).state_path


def cmd_status(args: argparse.Namespace) -> int:
    path = _state_path(args)
    if path is None:
        print("hetpatrol status: no state_path in the config; use --state-path", file=sys.stderr)
        return EXIT_UNKNOWN
    try:
        doc = read_state(path)
    except ValueError as exc:  # not JSON, nested too deep, too large, not a state file
        print(f"hetpatrol status: the state file {path} is damaged: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN
    except OSError as exc:
        print(
            f"hetpatrol status: cannot read the state file {path}: {exc}\n"
            "  (is `hetpatrol run` running with this config? see `systemctl status hetpatrol`)",
            file=sys.stderr,
        )
        return EXIT_UNKNOWN
    try:
        age, stale = verdict_age(doc)  # the same test as `hetpatrol check`
        if args.json:
            out = dict(doc)
            age_seconds = round(age, 3) if math.isfinite(age) else None
            out.update(state_path=str(path), age_seconds=age_seconds, stale=stale)
            text = json.dumps(out, indent=2) + "\n"
        else:
            text = render(doc, color=use_color(sys.stdout, args.color), source=str(path))
    except Exception as exc:  # noqa: BLE001 - a damaged state file is UNKNOWN, no traceback
        print(
            f"hetpatrol status: the state file {path} is damaged: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return EXIT_UNKNOWN
    write_stdout(text)  # a reader gone (`| head`) keeps the exit code below
    if stale:
        return EXIT_UNKNOWN
    code = verdict_code(doc)  # the same verdict as `hetpatrol check`
    if code is None:
        print(f"hetpatrol status: the state file {path} has no valid verdict", file=sys.stderr)
        return EXIT_UNKNOWN
    return code


def add_status_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``status`` on the CLI's subparsers."""
    p = sub.add_parser(
        "status",
        help="this node at a glance, from the daemon's state file (exit 0/1/2/3)",
        description=plain_help(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="config file whose state_path to read (default: the bundled config)",
    )
    p.add_argument(
        "--state-path", type=Path, default=None, help="state file (overrides the config)"
    )
    p.add_argument("--json", action="store_true", help="the state document as JSON, for scripts")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="auto: on a terminal unless NO_COLOR is set",
    )
    p.set_defaults(func=cmd_status)
    return p
