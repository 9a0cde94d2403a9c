"""Slurm host list compression: ``gn001 gn002 gn003 gn042`` -> ``gn[001-003,042]``.

The inverse of :func:`hetpatrol.slurm.gres.expand_hostlist`, and read the same way Slurm
reads it (``src/common/hostlist.c`` in SchedMD/slurm: a host name is a prefix and a
numeric suffix; a range keeps the zero-pad width of its numbers): every result expands
back to exactly the given names.

- Only the trailing digits range (``r1n01 r1n02`` -> ``r1n[01-02]``), as in Slurm.
- Padding is kept: ``gn01`` and ``gn1`` are different hosts and land in different
  ranges; unpadded numbers of different lengths share one (``gn[8-11]``); an unpadded
  number of a padded group's width joins it (``gn[09-10]``).
- A name without trailing digits is kept as it is; duplicates are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

_TAIL_RE = re.compile(r"^(.*?)([0-9]+)$")


def _ranges(numbers: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for n in sorted(set(numbers)):
        if out and n == out[-1][1] + 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


def compress_hostlist(names: Iterable[str]) -> str:
    """``["gn001", ..., "gn040", "gn042"]`` -> ``"gn[001-040,042]"``; ``""`` for none.

    Groups are ordered by prefix, then width; a group of one name is printed without
    brackets (``gn007``), as ``scontrol show hostlist`` does.
    """
    literal: set[str] = set()
    # prefix -> width (0 = unpadded) -> numbers
    groups: dict[str, dict[int, list[int]]] = {}
    padded: dict[str, set[int]] = {}
    parsed: list[tuple[str, str]] = []
    for name in names:
        split = _split(name)
        if split is None:
            literal.add(name)
            continue
        prefix, digits = split
        parsed.append((prefix, digits))
        if len(digits) > 1 and digits[0] == "0":
            padded.setdefault(prefix, set()).add(len(digits))
    for prefix, digits in parsed:
        widths = padded.get(prefix, set())
        pad = len(digits) > 1 and digits[0] == "0" or len(digits) in widths
        width = len(digits) if pad else 0
        groups.setdefault(prefix, {}).setdefault(width, []).append(int(digits))
    parts: list[tuple[str, int, int, str]] = []
    for prefix, by_width in groups.items():
        for width, numbers in by_width.items():
            ranges = _ranges(numbers)
            if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
                parts.append(
                    (prefix, ranges[0][0], width, f"{prefix}{str(ranges[0][0]).zfill(width)}")
                )
                continue
            z = [(str(lo).zfill(width), str(hi).zfill(width)) for lo, hi in ranges]
            text = ",".join(lo if lo == hi else f"{lo}-{hi}" for lo, hi in z)
            parts.append((prefix, ranges[0][0], width, f"{prefix}[{text}]"))
    parts.sort(key=lambda p: (p[0], p[1], p[2]))
    return ",".join([p[3] for p in parts] + sorted(literal))


@lru_cache(maxsize=65536)
def _split(name: str) -> tuple[str, str] | None:
    """(prefix, trailing ASCII digits), or None without such digits."""
    m = _TAIL_RE.match(name)
    if m is None or not m.group(2).isascii():
        return None
    return m.group(1), m.group(2)


def name_prefix(name: str) -> str:
    """``gn001`` -> ``gn``; ``login`` -> ``login`` (the name without its trailing digits)."""
    m = _TAIL_RE.match(name)
    return m.group(1) if m else name


_RANGE_RE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")


def hostlist_problem(text: str) -> str | None:
    """Why ``text`` is not a Slurm host list, or None when it is one.

    As Slurm reads it (``_parse_single_range`` in SchedMD/slurm ``src/common/hostlist.c``;
    checked with ``scontrol show hostnames`` of Slurm 22.05): each item of a ``[...]``
    group is a decimal number or a ``lo-hi`` range with ``lo <= hi``, nothing else and
    not empty (``an[5-3x]``, ``gn[a-b]``, ``gn[3-1]``, ``gn[1,,2]``: "Invalid range"), and
    groups do not nest (``gn[[1-2]]``: "Invalid hostlist"). An unclosed ``[`` (``gn[1-``,
    which Slurm turns into the name ``gn]``) and an empty list are refused too. A ``]``
    with no ``[`` is part of a name there, and here.
    """
    if not text.strip():
        return "an empty host list"
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                return f"{text[:80]!r}: nested '[' at {i}"
            depth, start = 1, i
        elif ch == "]" and depth:
            depth = 0
            for item in text[start + 1 : i].split(","):
                m = _RANGE_RE.match(item.strip())
                bad = item.strip()[:40]
                if m is None:
                    return f"{text[:80]!r}: {bad!r} in [...] is not a number or a lo-hi range"
                if m.group(2) is not None and int(m.group(1)) > int(m.group(2)):
                    return f"{text[:80]!r}: range {bad!r} runs backwards"
    if depth:
        return f"{text[:80]!r}: '[' at {start} is not closed"
    return None
