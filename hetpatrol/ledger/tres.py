"""TRES strings as ``sacct``/``sacctmgr`` print them, and the cards they hold per GRES type.

``billing=1,cpu=1,gres/gpu:a100=2,gres/gpu=2,mem=1M,node=1`` (``sacct -o AllocTRES``,
``--noconvert``). Slurm records a typed GRES only when ``AccountingStorageTRES`` names it
(slurm.conf(5), AccountingStorageTRES: "gres/gpu:tesla" is tracked only if configured);
the untyped ``gres/gpu`` counts every GPU of the job whatever its type. So:

* ``gres/gpu:a100=2,gres/gpu=2``: 2 A100 (the untyped count repeats the typed one);
* ``gres/gpu=2`` alone (a ``--gres=gpu:2`` job where the type is not tracked, or a type
  not in ``AccountingStorageTRES``): 2 GPUs of an unknown type, which
  :meth:`CardSplit.cards` attributes to the one GPU type the job's nodes have, if they
  have one; else they stay ``gpu`` (untyped) and the report says so;
* ``gres/gpu:a100=1,gres/gpu=3``: 1 A100 and 2 GPUs of an untracked type (same rule).

:func:`split_cards` is the one place this rule is applied: ``ledger usage``
(:mod:`.usage`), ``ledger capacity`` (:mod:`.capacity`) and ``ledger efficiency``
(:func:`card_counts`) all read card GRES through it.

GRES that are not cards are left out: usage TRES (``gres/gpumem``, ``gres/gpuutil`` of
the NVML acct_gather plugin), shares of a card (``gres/mps``, ``gres/shard``) and GRES
some sites define for other things (``gres/cpu``, ``gres/vmem``, ``gres/craynetwork``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hetpatrol.slurm.gres import parse_count

#: GRES names that count something other than whole cards
NOT_CARDS = frozenset({"gpumem", "gpuutil", "mps", "shard", "cpu", "vmem", "craynetwork"})

#: More cards of one GRES than any job can hold (the largest clusters have some 10^5
#: GPUs): a count above it is unreadable, never added (``gres/gpu=99999...`` would be
#: 10^38 card-hours).
MAX_CARDS_PER_JOB = 1_000_000

CardKey = tuple[str, "str | None"]  # (gres name, type or None), lower case


def parse_tres(text: str) -> dict[str, str]:
    """``cpu=1,gres/gpu:A100=2`` -> ``{"cpu": "1", "gres/gpu:a100": "2"}`` (raw values,
    names lower case).

    Empty, ``(null)`` and items without ``=`` give nothing; a repeated name keeps the
    last. Names are compared without case, as Slurm does: ``assoc_mgr_find_tres_pos()``
    (src/common/assoc_mgr.c, SchedMD/slurm 284c3b95) and the slurmdbd TRES list lookup
    ``_list_find_tres()`` match type and name with ``xstrcasecmp``, so ``gres/gpu:A100``
    and ``gres/gpu:a100`` are one TRES: counting both would count its cards twice.
    """
    out: dict[str, str] = {}
    if not text or text == "(null)":
        return out
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if sep and key:
            out.pop(key, None)  # the last one, in its place
            out[key] = value.strip()
    return out


def gres_tres(text: str) -> tuple[dict[CardKey, int], list[str]]:
    """The card GRES of a TRES string: ``{(name, type|None): count}`` and the items whose
    count could not be read (raw text, e.g. ``gres/gpu=x``, ``gres/gpu=-5``, ``1e309``, or
    a count above :data:`MAX_CARDS_PER_JOB`), names and types lower case."""
    cards: dict[CardKey, int] = {}
    bad: list[str] = []
    for key, value in parse_tres(text).items():
        if not key.startswith("gres/"):
            continue
        name, _, gtype = key[5:].partition(":")
        if name in NOT_CARDS:
            continue
        count = parse_count(value)
        if count is None or count > MAX_CARDS_PER_JOB:
            bad.append(f"{key}={value}")
            continue
        cards[(name, gtype or None)] = count  # one per name: parse_tres kept the last
    return cards, bad


@dataclass(frozen=True, slots=True)
class CardSplit:
    """The card GRES of one TRES string, typed and untyped apart (:func:`split_cards`).

    ``typed``: ``{(name, type): cards}`` as recorded; ``rest``: ``{name: cards}``, the
    untyped count beyond the sum of that name's typed counts (only where it is above it);
    ``bad``: the items whose count could not be read (:func:`gres_tres`), raw.
    """

    typed: Mapping[CardKey, int]
    rest: Mapping[str, int]
    bad: tuple[str, ...]

    def cards(self, node_types: Mapping[str, frozenset[str]] | None = None) -> dict[CardKey, int]:
        """Cards per (GRES name, type): the typed counts, and each name's ``rest`` added to
        the one type ``node_types[name]`` names (the types the job's nodes have, from
        ``scontrol show node``; the typed count of that type, if any, grows by it), else
        kept as ``(name, None)``, type unknown."""
        out = dict(self.typed)
        for name, count in self.rest.items():
            types = node_types.get(name) if node_types else None
            key = (name, next(iter(types))) if types and len(types) == 1 else (name, None)
            out[key] = out.get(key, 0) + count
        return out


def split_cards(text: str) -> CardSplit:
    """Split the card GRES of ``AllocTRES``/``ReqTRES`` text into typed and untyped cards.

    Slurm's rule, slurm.conf(5) of Slurm 22.05, AccountingStorageTRES: with
    "AccountingStorageTRES=gres/gpu,gres/gpu:tesla,gres/gpu:volta", "gres/gpu:tesla" and
    "gres/gpu:volta" track the GPUs of those types while "gres/gpu" tracks "allocated GPUs
    of any type". So the untyped ``gres/gpu`` count already holds the typed ones: a job
    holds the typed counts plus the untyped count beyond their sum (GPUs of a type not in
    ``AccountingStorageTRES``), never the sum of both. A job that asked for untyped GPUs
    has only the untyped item in ``ReqTRES``; a typed request shows both. ``AllocTRES``
    of an untyped request shows both too where the type Slurm gave is tracked (the man
    page says otherwise, the real 22.05.8 records it: fixtures/ledger-sample/sacct.txt,
    job 2). An untyped count below the typed sum (never written by Slurm) leaves no rest
    and the typed counts stand.
    """
    cards, bad = gres_tres(text)
    typed: dict[CardKey, int] = {}
    untyped: dict[str, int] = {}
    typed_sum: dict[str, int] = {}
    for (name, gtype), count in cards.items():
        if gtype is None:
            untyped[name] = count  # one per name: parse_tres kept the last
        else:
            typed[(name, gtype)] = count
            typed_sum[name] = typed_sum.get(name, 0) + count
    rest = {n: c - typed_sum.get(n, 0) for n, c in untyped.items() if c > typed_sum.get(n, 0)}
    return CardSplit(typed, rest, tuple(bad))


def card_counts(
    text: str, node_types: Mapping[str, frozenset[str]] | None = None
) -> dict[CardKey, int]:
    """Cards per (GRES name, type) of a job's ``AllocTRES``, typed and untyped reconciled:
    ``split_cards(text).cards(node_types)`` (:class:`CardSplit`)."""
    return split_cards(text).cards(node_types)


def label(key: CardKey) -> str:
    """``("gpu", "a100")`` -> ``gpu:a100``; ``("gpu", None)`` -> ``gpu`` (type unknown)."""
    return f"{key[0]}:{key[1]}" if key[1] else key[0]


def tres_name(key: CardKey) -> str:
    """``("gpu", "a100")`` -> ``gres/gpu:a100``, the TRES name Slurm uses."""
    return "gres/" + label(key)
