"""The node view: one renderer for ``hetpatrol once`` and ``hetpatrol status``.

Input is a state document (the JSON the daemon writes after every patrol, see
:func:`hetpatrol.exporters.state.state_document`): ``node``, ``seq``, ``finished``,
``interval_seconds``, ``health``, ``exit_code``, ``collectors`` (name -> state),
``findings`` (node findings) and ``cards`` (the card lines of the JSONL log). ``once``
builds the same document from its report, so both commands print the same view:

- a header: node, verdict, patrol number and age, the driver versions per vendor, and
  how many cards (an Ascend chip is a card record: "16 chips on 8 cards");
- one table per vendor and card type: a row per card, its findings under it (wrapped to
  the terminal's width), then the processes on it (pid, user, Slurm job, memory) and,
  for a card that is not ok, why a value is missing;
- the collectors, node findings and kernel-log events; for the daemon's verdict
  (``status``), the last card fault events it keeps with the Slurm jobs that were on the
  card (``fault_events``, newest first, at most :data:`MAX_FAULTS`).

``info`` findings (an idle GPU's clock event reasons) are counted but hidden unless
``verbose``. Colour only when asked (:func:`use_color`: a terminal, no ``NO_COLOR``).
Every string that came from a vendor tool is shown with its control and bidi characters
escaped (:func:`printable`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

from hetpatrol.actions.fault_events import event_time
from hetpatrol.healthcheck import stopped_mark, utc_text, verdict_age

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
_ORDER = ("ok", "info", "warning", "unknown", "critical")
_COLLECTOR_HEALTH = {
    "ok": "ok",
    "absent": "ok",
    "disabled": "info",
    "failed": "unknown",
    "hung": "critical",
}
#: processes listed under a card before "+N more"
MAX_PROCESSES = 8
#: most kept card fault events ``status`` lists (``hetpatrol ledger faults`` has all)
MAX_FAULTS = 5


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


#: C0/C1 control characters and the Unicode bidi controls (LRM, RLM, LRE..RLO, LRI..PDI)
#: control characters, bidi controls, and lone surrogates (from JSON ``\\ud800``: they
#: cannot be encoded as UTF-8, so printing one would fail the whole output)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    code = ord(char)
    return _ESCAPES.get(char, f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(value: Any) -> Any:
    """``value`` with control characters in every string (keys too) shown as escapes
    (``\\x1b``, ``\\n``, bidi controls as ``\\u202e``): a vendor tool's text must not
    drive the operator's terminal nor reorder what it shows."""
    if isinstance(value, str):
        return _CONTROL.sub(lambda m: _escape(m[0]), value)
    if isinstance(value, Mapping):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable(v) for v in value]
    return value


class Painter:
    def __init__(self, color: bool):
        self.color = color

    def __call__(self, text: str, style: str) -> str:
        if not self.color or style not in _STYLE:
            return text
        return f"{_STYLE[style]}{text}{_RESET}"


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def human_age(seconds: float) -> str:
    """``42 s``, ``12 min``, ``3.5 h``, ``2.0 d``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _num(value: Any, unit: str, fmt: str = "{:.0f}") -> str:
    return "-" if not _finite_number(value) else fmt.format(value) + unit


def _gib(value: Any) -> str:
    return f"{value / 2**30:.1f} GiB" if _finite_number(value) else "-"


def _memory(card: Mapping[str, Any]) -> str:
    used, total = card.get("memory_used_bytes"), card.get("memory_total_bytes")
    if not _finite_number(used) or not _finite_number(total) or not total:
        return "-"
    return f"{used / 2**30:.1f}/{total / 2**30:.1f} GiB"


def _sort_key(card: Mapping[str, Any]) -> tuple:
    index, chip = card.get("index"), card.get("chip")
    return (index if isinstance(index, int) else -1, chip if isinstance(chip, int) else -1)


def _groups(cards: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for card in cards:
        key = (str(card.get("vendor") or "?"), str(card.get("card_type") or "type unknown"))
        groups.setdefault(key, []).append(card)
    for rows in groups.values():
        rows.sort(key=_sort_key)
    return dict(sorted(groups.items()))


def card_count(cards: Sequence[Mapping[str, Any]]) -> str:
    """``"8 cards"``, or ``"16 chips on 8 cards"`` where a card has several chips
    (Ascend A3, Atlas 300I Duo): records are chips there, cards are NPU ids."""
    n = len(cards)
    boards = {(c.get("vendor"), c.get("index")) for c in cards}
    if len(boards) < n:
        return f"{n} chips on {len(boards)} card{'s' if len(boards) != 1 else ''}"
    return f"{n} card{'s' if n != 1 else ''}"


def _health_counts(cards: Iterable[Mapping[str, Any]], paint: Painter) -> str:
    counts: dict[str, int] = {}
    for c in cards:
        counts[str(c.get("health"))] = counts.get(str(c.get("health")), 0) + 1
    order = sorted(counts, key=lambda h: _ORDER.index(h) if h in _ORDER else len(_ORDER))
    return ", ".join(paint(f"{counts[h]} {h}", h) for h in order)


def _drivers(cards: Iterable[Mapping[str, Any]]) -> str:
    """``ascend 25.2.0, hygon not reported, nvidia 555.42.02``: each vendor's driver
    versions; a vendor whose tool reports none is said, not left out."""
    versions: dict[str, list[str]] = {}
    for c in cards:
        seen = versions.setdefault(str(c.get("vendor")), [])
        version = c.get("driver_version")
        if isinstance(version, str) and version and version not in seen:
            seen.append(version)
    said = {vendor: " / ".join(v) if v else "not reported" for vendor, v in versions.items()}
    return ", ".join(f"{vendor} {text}" for vendor, text in sorted(said.items()))


def _process_line(p: Mapping[str, Any]) -> str:
    parts = [f"pid {p.get('pid')}"]
    if p.get("name"):
        parts.append(str(p["name"]))
    if p.get("user"):
        parts.append(f"user {p['user']}")
    if p.get("job_id"):
        parts.append(f"job {p['job_id']}")
    if p.get("memory_bytes") is not None:
        parts.append(_gib(p.get("memory_bytes")))
    return "  ".join(parts)


def _partition_line(q: Mapping[str, Any]) -> str:
    """``mig 1  1g.20gb  GI 4 CI 0  0.0/19.5 GiB  MIG-...``: one partition of a card."""
    parts = [f"{q.get('kind')} {q.get('index')}", str(q.get("profile") or "-")]
    if q.get("kind") == "mig":
        parts.append(f"GI {q.get('gpu_instance_id', '-')} CI {q.get('compute_instance_id', '-')}")
    elif q.get("gpu_instance_id") is not None:
        parts.append(f"vgroup {q.get('gpu_instance_id')}")
    if q.get("status") is not None:
        parts.append(f"status {q['status']}")
    used, total = q.get("memory_used_bytes"), q.get("memory_total_bytes")
    parts.append(_memory(q) if used is not None else _gib(total))
    if q.get("uuid"):
        parts.append(str(q["uuid"]))
    return "  ".join(parts)


#: where a word too long for a line may break: after a path separator; a piece of it
#: still wider than a whole line (a file name such as a recording named after its argv,
#: ``rocm-smi_-i_--showmeminfo_vram_..._--json.txt``, 120 characters) is cut with ``...``
#: (:func:`_cut`), as a finding's message or a drain reason is cut, never broken
_PATH_BREAKS = re.compile(r"[^/]*/+|[^/]+")
#: a number and the unit after it (``470 s``, ``38 C``, ``36.8 GiB``) stay on one line
_NUMBER = re.compile(r"^[0-9][0-9.,]*$")
_UNIT = re.compile(r"^(?:s|ms|C|W|%|B|KiB|MiB|GiB|TiB|KB|MB|GB)[),.:;]*$")
#: a label and the number after it (``pid 4242``, ``job 1234``, ``uid 0``, ``xid 79``,
#: ``link 7``, ``GI 3``, ``boot 2``) stay on one line too: the label alone at a line's end says
#: nothing. The number may be a Slurm job id of an array or a heterogeneous job
#: (``1234_7``, ``1234+1``) and end in punctuation (``job 1234,``, ``(uid 0)``)
_LABEL = re.compile(
    r"^\(?(?:pid|pids|job|jobs|uid|gid|xid|XID|GI|CI|vgroup|mig|vnpu|boot|patrol|port|"
    r"card|cards|GPU|NPU|chip|link|links|step|index|seq|rc|exit)$"
)
_LABEL_NUMBER = re.compile(r"^[0-9][0-9_+.,]*[),.:;]*$")


def _words(text: str) -> list[tuple[str, str]]:
    """``text`` split at whitespace as (the space before it, word) pairs, a number joined
    to the unit word after it and a label to the number after it (:data:`_LABEL`:
    ``pid 4242``, ``job 1234``) when one space parts them. The space is two where
    ``text`` has two or more spaces (the gap between the parts of a MIG device's or a
    process's line), else one."""
    out: list[tuple[str, str]] = []
    for m in re.finditer(r"(\s*)(\S+)", text):
        run, word = m.groups()
        unit = out and _UNIT.match(word) and _NUMBER.match(out[-1][1])
        label = out and run == " " and _LABEL_NUMBER.match(word) and _LABEL.match(out[-1][1])
        if unit or label:
            out[-1] = (out[-1][0], out[-1][1] + " " + word)
        else:
            out.append(("  " if run.startswith("  ") and run.strip(" ") == "" else " ", word))
    return out


def _cut(name: str, room: int) -> str:
    """``name`` when it fits ``room`` columns, else its first ``room - 3`` characters
    (less the ``.``, ``_``, ``,`` or ``-`` they end in) and ``...``, the way
    :func:`hetpatrol.actions.findings.why_text` cuts a message."""
    if len(name) <= room:
        return name
    return (name[: max(room - 3, 1)].rstrip("._,-") or name[0]) + "..."


def wrap_words(text: str, width: int, first: str, rest: str) -> list[str]:
    """``text`` wrapped to ``width`` columns: the first line after ``first``, the others
    after ``rest`` (indents). Breaks at spaces; a word wider than a line breaks after a
    ``/`` (a path), and a piece still wider than a whole line goes on a line of its own,
    cut with ``...`` to fit it (:func:`_cut`): no line is wider than ``width`` and no
    name is broken across lines, nor a number from its unit. Whitespace runs read as one
    space, runs of spaces on one line as two (:func:`_words`)."""
    room = max(width - len(rest), 1)
    lines: list[str] = []
    line = first
    fresh = True  # nothing but the indent on ``line`` yet
    for gap, word in _words(text):
        pieces = [word]
        if len(word) > room:
            pieces = [_cut(part, room) for part in _PATH_BREAKS.findall(word)]
        for i, piece in enumerate(pieces):
            sep = "" if fresh or i > 0 else gap
            if not fresh and len(line) + len(sep) + len(piece) > width:
                lines.append(line)
                line, fresh = rest, True
                sep = ""
            line += sep + piece
            fresh = False
    lines.append(line)
    return lines


class _Writer:
    """Lines, with long ones wrapped to ``width`` under a hanging indent."""

    def __init__(self, width: int | None):
        self.width = width
        self.lines: list[str] = []

    def add(self, text: str = "", indent: int = 0, hang: int = 2, plain_len: int | None = None):
        """Add ``text`` at ``indent``; wrap at ``width`` (continuation lines indented by
        ``hang`` more). ``plain_len`` is the length of ``text`` without colour codes."""
        pad = " " * indent
        visible = len(text) if plain_len is None else plain_len
        if self.width is None or indent + visible <= self.width or plain_len is not None:
            self.lines.append(pad + text)
            return
        self.lines.extend(wrap_words(text, max(self.width, indent + 20), pad, pad + " " * hang))

    def add_painted(self, text: str, indent: int, paint: Painter, style: str, hang: int = 2):
        """``text`` wrapped as :meth:`add` does, then each line painted in ``style``."""
        w = _Writer(self.width)
        w.add(text, indent, hang)
        self.lines.extend(
            line[: len(line) - len(line.lstrip())] + paint(line.lstrip(), style) for line in w.lines
        )

    def add_parts(self, parts: Sequence[tuple[str, str]], sep: str = "   "):
        """One line of ``(plain text, painted text)`` parts joined by ``sep``; where it would
        pass ``width``, the parts that do not fit go on the next line, indented by 2."""
        line, plain = "", ""
        for text, painted in parts:
            if plain and self.width is not None and len(plain) + len(sep) + len(text) > self.width:
                self.lines.append(line)
                line, plain = "  " + painted, "  " + text
                continue
            line += (sep if plain else "") + painted
            plain += (sep if plain else "") + text
        self.lines.append(line)


#: Vendor words in front of a model name (``NVIDIA A100-SXM4-80GB``): the table's group
#: title already names the vendor, so a narrow view drops them first.
_MODEL_PREFIX = re.compile(r"^(NVIDIA|AMD|Huawei|Hygon|Intel|Iluvatar|Kunlunxin|Enflame)\s+", re.I)


def _fit_columns(
    cols: list[str], rows: list[list[str]], width: int | None
) -> tuple[list[str], list[list[str]], list[str]]:
    """Columns and rows that fit ``width`` (None: all of them as they are), and what was
    left out. The least useful go first, as nvitop drops its columns: MODEL loses the
    vendor's word, then MODEL goes (its value is then said once above the table when every
    card has the same), then the PCI domain 0000 leaves BUS ID, then POWER, BUS ID and
    MEMORY go; IDX, HEALTH, ACTION, TEMP and UTIL always stay."""
    cols, rows = list(cols), [list(r) for r in rows]
    dropped: list[str] = []

    def total() -> int:
        return (
            2
            + sum(max(len(r[i]) for r in [cols, *rows]) for i in range(len(cols)))
            + 2 * (len(cols) - 1)
        )

    def drop(name: str) -> None:
        if name in cols:
            i = cols.index(name)
            del cols[i]
            for r in rows:
                del r[i]
            dropped.append(name)

    def shorten(name: str, how) -> None:
        if name in cols:
            i = cols.index(name)
            for r in rows:
                r[i] = how(r[i])

    steps = (
        lambda: shorten("MODEL", lambda v: _MODEL_PREFIX.sub("", v)),
        lambda: drop("MODEL"),
        lambda: shorten("BUS ID", lambda v: v[5:] if v.startswith("0000:") else v),
        lambda: drop("POWER"),
        lambda: drop("BUS ID"),
        lambda: drop("MEMORY"),
    )
    for step in steps:
        if width is None or total() <= width:
            break
        step()
    return cols, rows, dropped


def _finding_line(f: Mapping[str, Any], paint: Painter, width: int | None, indent: int) -> list:
    sev = str(f.get("severity"))
    text = f"{sev} {f.get('check')}: {f.get('message')}"
    w = _Writer(width)
    w.add(text, indent, hang=len(sev) + 1)
    if w.lines and paint.color:  # colour the severity word of the first line only
        first = w.lines[0]
        w.lines[0] = first.replace(sev, paint(sev, sev), 1)
    return w.lines


#: a PCI bus id as node findings carry it in ``value`` (``0000:e8:00.0``)
_BUS_ID = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def _node_action_text(f: Mapping[str, Any]) -> str:
    """The line under a node finding that says its action, as a card's ACTION column
    does (``action reset_card: the card at 0000:e8:00.0``); "" for no action."""
    action = f.get("action")
    if not isinstance(action, str) or action in ("", "none"):
        return ""
    if action == "watch":
        return "action watch: kept in service and watched, no drain"
    value = f.get("value")
    if isinstance(value, str) and _BUS_ID.match(value):
        return f"action {_CONTROL.sub(' ', action)}: the card at {value}"
    return f"action {_CONTROL.sub(' ', action)} (for {_CONTROL.sub(' ', str(f.get('check')))})"


def render(
    doc: Mapping[str, Any],
    *,
    color: bool = False,
    now: float | None = None,
    source: str = "",
    verbose: bool = False,
    width: int | None = None,
    events: Sequence[Mapping[str, Any]] = (),
    live: bool = True,
) -> str:
    """The node view of a state document (see the module docstring).

    ``color``: ANSI colours; ``width``: wrap findings at this many columns (None: never);
    ``verbose``: show ``info`` findings; ``events``: kernel-log event lines to list (``once``);
    ``live``: the document is the daemon's last verdict (its age and staleness are shown),
    not a patrol just made. Control characters in its strings are printed escaped."""
    doc = printable(doc)
    source = printable(source)
    paint = Painter(color)
    health = str(doc.get("health") or "unknown")
    cards = [c for c in doc.get("cards") or [] if isinstance(c, Mapping)]
    out = _Writer(width)

    head = f"node {doc.get('node')}  " + paint(health.upper(), health)
    node_action = doc.get("action")
    if isinstance(node_action, str) and node_action not in ("none", ""):
        head += f"   action {paint(node_action, 'bold')}"
    if live:
        age, stale = verdict_age(doc, now)
        old = f"{human_age(age)} old" if math.isfinite(age) else "time unknown"
        when = f"patrol {doc.get('seq')}, verdict {old}"
        interval = doc.get("interval_seconds")
        if _finite_number(interval) and interval:
            when += f" (every {float(interval):g} s)"
        stopped = stopped_mark(doc)
        note: tuple[str, str] | None = None
        if stopped is not None:  # the daemon's own word: no guess at why it is silent
            said = f"STOPPED: the daemon was stopped at {utc_text(stopped[0])} ({stopped[1]})"
            note = (said + ", the verdict is from then", "unknown")
        elif stale:
            note = ("STALE: is the daemon running?", "critical")
    else:
        when, note = f"exit {doc.get('exit_code')}", None
    plain_head = f"node {doc.get('node')}  {health.upper()}"
    parts = [(plain_head, head[: head.index("   action ")] if "   action " in head else head)]
    if isinstance(node_action, str) and node_action not in ("none", ""):
        parts.append((f"action {node_action}", f"action {paint(node_action, 'bold')}"))
    parts.append((when, when))
    out.add_parts(parts)
    if note is not None:  # after the verdict's age where it fits, else a line of its own
        last = re.sub(r"\033\[[0-9;]*m", "", out.lines[-1])
        if out.width is None or len(last) + 2 + len(note[0]) <= out.width:
            out.lines[-1] += "  " + paint(*note)
        else:
            out.add_painted(note[0], 2, paint, note[1])
    drivers = _drivers(cards)
    if cards:
        plain = card_count(cards) + ": " + _health_counts(cards, Painter(False))
        parts = [(plain, card_count(cards) + f": {_health_counts(cards, paint)}")]
    else:
        parts = [("no card was read", "no card was read")]
    if drivers:
        parts.append((f"drivers: {drivers}", f"drivers: {drivers}"))
    out.add_parts(parts)
    if source:
        out.add_painted(f"state file: {source}", 0, paint, "dim")

    hidden = 0
    for (vendor, card_type), group in _groups(cards).items():
        gres = next((c.get("gres") for c in group if c.get("gres")), None)
        sep = ", " if card_type == "type unknown" else " "
        title = f"{vendor}{sep}{card_type}" + (f" (gres {gres})" if gres else "")
        out.add()
        out.add(
            paint(title, "bold") + f"  {card_count(group)}: {_health_counts(group, paint)}",
            plain_len=0,
        )
        chips = any(c.get("chip") is not None for c in group)
        acted = any(c.get("action") not in (None, "none") for c in group)
        cols = ["IDX", *(["CHIP"] if chips else []), "HEALTH", *(["ACTION"] if acted else [])]
        cols += ["TEMP", "POWER", "UTIL"]
        cols += ["MEMORY", "BUS ID", "MODEL"]
        rows = []
        for c in group:
            util = c.get("utilization_ratio")
            row = [str(c.get("index"))]
            if chips:
                row.append("-" if c.get("chip") is None else str(c.get("chip")))
            row.append(str(c.get("health") or "unknown").upper())
            if acted:
                row.append(str(c.get("action") or "-") if c.get("action") != "none" else "-")
            row += [
                _num(c.get("temperature_celsius"), " C"),
                _num(c.get("power_watts"), " W", "{:.1f}"),
                _num(util * 100 if _finite_number(util) else None, "%"),
                _memory(c),
                str(c.get("bus_id") or "-"),
                str(c.get("model") or "-"),
            ]
            rows.append(row)
        cols, rows, dropped = _fit_columns(cols, rows, width)
        models = {str(c.get("model")) for c in group if c.get("model")}
        if "MODEL" in dropped and len(models) == 1:
            out.add_painted(f"model {models.pop()}", 2, paint, "dim")
        widths = [max(len(r[i]) for r in [cols, *rows]) for i in range(len(cols))]
        out.add("  " + "  ".join(h.ljust(w) for h, w in zip(cols, widths, strict=True)).rstrip())
        at = cols.index("HEALTH")
        for c, row in zip(group, rows, strict=True):
            cells = [v.ljust(w) for v, w in zip(row, widths, strict=True)]
            cells[at] = paint(row[at], str(c.get("health"))) + " " * (widths[at] - len(row[at]))
            out.add("  " + "  ".join(cells).rstrip(), plain_len=0)
            for f in c.get("findings") or []:
                if f.get("severity") == "info" and not verbose:
                    hidden += 1
                    continue
                out.lines.extend(_finding_line(f, paint, width, 6))
            if c.get("action") == "watch" and c.get("health") in ("critical", "unknown"):
                # a critical card left in service reads like an oversight without this
                why = c.get("action_reason")
                text = "action watch: kept in service and watched, no drain"
                # continuation lines hang under the text, as a finding's do
                out.add_painted(text + (f" ({why})" if why else ""), 6, paint, "dim", hang=7)
            elif c.get("action_source") == "reboot_history" and c.get("action_reason"):
                # replace_card from the reboot history: the finding above says only how to
                # treat the fault once ("reset the GPU"); this says why the card goes
                out.add_painted(
                    f"action {c.get('action')}: {c['action_reason']}", 6, paint, "dim", hang=7
                )
            procs = [p for p in c.get("processes") or [] if isinstance(p, Mapping)]
            parts = [q for q in c.get("partitions") or [] if isinstance(q, Mapping)]
            inside = {q.get("index") for q in parts}
            whole = [p for p in procs if p.get("partition") not in inside]
            for p in whole[:MAX_PROCESSES]:
                out.add_painted(_process_line(p), 6, paint, "dim")
            if len(whole) > MAX_PROCESSES:
                out.add(paint(f"+{len(whole) - MAX_PROCESSES} more processes", "dim"), 6)
            for q in parts:  # MIG devices / vNPUs nested under their card, with their jobs
                out.add(_partition_line(q), 6)
                mine = [p for p in procs if p.get("partition") == q.get("index")]
                for p in mine[:MAX_PROCESSES]:
                    out.add_painted(_process_line(p), 8, paint, "dim")
                if len(mine) > MAX_PROCESSES:
                    out.add(paint(f"+{len(mine) - MAX_PROCESSES} more processes", "dim"), 8)
            # why a value is missing matters when the card is not ok (npu-smi shows power
            # on chip 0 only: that is no news on a healthy card)
            # NotSupported is "this card has no such value" (DESIGN 4), not news either,
            # unless asked for (-v)
            for e in (c.get("errors") or []) if c.get("health") != "ok" else []:
                if e.get("error") == "NotSupported" and not verbose:
                    continue
                line = f"not read {e.get('source')}: {e.get('error')}"
                out.add_painted(line, 6, paint, "dim")

    out.add()
    node_findings = [f for f in doc.get("findings") or [] if isinstance(f, Mapping)]
    said = " ".join(str(f.get("message")) for f in node_findings)
    collectors = doc.get("collectors") or {}
    out.add("collectors:" + ("" if collectors else " none"))
    absent = [n for n, s in collectors.items() if s.get("state") == "absent" and not s.get("cards")]
    for name, s in collectors.items():
        if name in absent and not verbose:
            continue
        state = str(s.get("state"))
        seconds = s.get("duration_seconds")
        text = f"{name} {state} ({s.get('cards', 0)} cards, {float(seconds or 0):.3f} s)"
        error = s.get("error")
        if error and str(error) not in said:
            text += f": {error}"
        elif error:  # a node finding below quotes it: said once
            text += ": see the node findings"
        w = _Writer(width)
        w.add(text, 2, hang=2)
        style = _COLLECTOR_HEALTH.get(state, "unknown")
        w.lines[0] = w.lines[0].replace(f" {state} ", f" {paint(state, style)} ", 1)
        out.lines.extend(w.lines)
    if absent and not verbose:
        # one config turns every plugin on: a node has one or two vendors, the others
        # are absent (no tool, no card on the bus): one line, their reasons with -v
        out.add(f"absent: {', '.join(absent)} (-v: why)", 2, hang=2)
    shown = [f for f in node_findings if verbose or f.get("severity") != "info"]
    hidden += len(node_findings) - len(shown)
    if shown:
        out.add("node findings:")
        for f in shown:
            out.lines.extend(_finding_line(f, paint, width, 2))
            text = _node_action_text(f)
            if text:
                out.add_painted(text, 4, paint, "dim", hang=7)
    if events:
        out.add("kernel log events first read in this patrol:")
    for e in events:
        what = f"xid {e.get('xid')}" if e.get("xid") is not None else str(e.get("reason"))
        sev = str(e.get("severity"))
        where = f"{e.get('vendor')}/{e.get('index')} " if e.get("index") is not None else ""
        w = _Writer(width)
        w.add(f"{sev} {what} on {where}{e.get('bus_id')} x{e.get('count')}", 2, hang=2)
        w.lines[0] = w.lines[0].replace(sev, paint(sev, sev), 1)
        out.lines.extend(w.lines)
    if live:
        _fault_lines(out, doc.get("fault_events"), paint, now)
    if hidden:
        out.add(paint(f"{hidden} info finding{'s' if hidden != 1 else ''} hidden (-v)", "dim"), 0)
    return "\n".join(out.lines) + "\n"


def _jobs_text(e: Mapping[str, Any]) -> str:
    jobs = e.get("jobs")
    if not isinstance(jobs, list):
        why = e.get("jobs_unknown")  # a record older than what the daemon could know
        if not isinstance(why, str):
            why = "not one of the patrol's cards"
        return f"jobs unknown ({why})"
    if not jobs:
        return "no job"
    more = e.get("jobs_more")
    extra = f" +{more} more" if isinstance(more, int) and more > 0 else ""
    return ("job " if len(jobs) == 1 else "jobs ") + ", ".join(map(str, jobs)) + extra


def _fault_lines(out: _Writer, kept: Any, paint: Painter, now: float | None) -> None:
    """The last :data:`MAX_FAULTS` kept card fault events, newest first: age, severity,
    XID or reason, card, the jobs on it."""
    events = [e for e in kept if isinstance(e, Mapping)] if isinstance(kept, list) else []
    if not events:
        return
    import time

    now = time.time() if now is None else now
    out.add(f"recent card faults ({len(events)} kept, newest first; ledger faults lists them):")
    rows = []
    for e in events[::-1][:MAX_FAULTS]:
        when = event_time(e.get("ts"))
        age = f"{human_age(max(0.0, now - when))} ago" if when is not None else "time unknown"
        what = f"xid {e.get('xid')}" if e.get("xid") is not None else str(e.get("reason"))
        where = f"{e.get('vendor')}/{e.get('index')} " if e.get("index") is not None else ""
        card = e.get("bus_id") or e.get("uuid") or "card unknown"
        rows.append((age, str(e.get("severity")), f"{what} on {where}{card}: {_jobs_text(e)}"))
    # the ages and severities in columns ("11 s ago  " beside "30 min ago"), as a table's
    age_w = max(len(age) for age, _s, _t in rows)
    sev_w = max(len(sev) for _a, sev, _t in rows)
    for age, sev, text in rows:
        w = _Writer(out.width)
        w.add(f"{age:<{age_w}}  {sev:<{sev_w}} {text}", 2, hang=4)
        head = f"  {age:<{age_w}}  "
        w.lines[0] = head + paint(sev, sev) + w.lines[0][len(head) + len(sev) :]
        out.lines.extend(w.lines)


def terminal_width(stream: TextIO) -> int | None:
    """Columns of the terminal ``stream`` is (``COLUMNS`` wins); None when it is no
    terminal: piped output gets every column whole and is never wrapped (``grep`` sees
    whole findings)."""
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        return 100
    # a terminal that reports no size (0: a bare pty, a serial console) is not fitted
    return columns if columns > 0 else None
