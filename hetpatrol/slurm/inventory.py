"""GRES registration compared with the cards that are really there and healthy.

The registration is what Slurm believes this node has: ``Gres=`` of ``scontrol show
node -o <NodeName>``, or, when scontrol cannot answer (slurmctld down, no scontrol),
the ``gres.conf`` lines for this node. It is read at most every
``registration_cache_seconds`` (a failed scontrol read is retried after at most 60 s),
each scontrol call under ``timeout_seconds``.

Each card counts under a (GRES name, GRES type): the name is the card's ``gres`` (from
its profile), the type the profile's ``gres_type`` or else the card's ``card_type`` (a
``910b`` card counts as ``ascend:910b``). Every chip record counts once (Slurm counts
device files, one per chip). Names and types compare case-insensitively, as Slurm does;
an untyped registration (``gpu:8``) counts every card of that name.

Per (name, type) the registered count is compared with the cards found *and healthy*
(not critical, not unknown):

- fewer healthy than registered: critical node finding ``gres_mismatch``; but
  ``unknown`` when the shortfall may only be unread cards (a card of that kind is
  ``unknown``, or a collector failed or hung): a hung vendor tool is not a lost card,
  and must not drain a node on its own;
- more healthy than registered: warning ``gres_mismatch`` (Slurm will not schedule them);
- registration unreadable: info finding ``gres_registration`` (the check is skipped).

Only GRES names that some profile (or card) uses are compared: ``mps``, ``shard`` or a
site's ``bandwidth`` GRES are not cards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from hetpatrol.collector import STATE_ABSENT, STATE_DISABLED, STATE_OK
from hetpatrol.nodecheck import NodeCheckResult
from hetpatrol.schema import (
    HEALTH_CRITICAL,
    HEALTH_UNKNOWN,
    HEALTH_WARNING,
    SEVERITY_INFO,
    CardRecord,
    Finding,
)
from hetpatrol.slurm.gres import GresEntry, find_node, gres_conf_for_node, parse_gres_conf
from hetpatrol.slurm.settings import SlurmSettings
from hetpatrol.tool import ToolOutput, run_tool

if TYPE_CHECKING:
    from hetpatrol.config import Config
    from hetpatrol.patrol import CollectorStatus

log = structlog.get_logger("hetpatrol.slurm")

#: ``runner(argv, timeout_seconds) -> ToolOutput``; :func:`hetpatrol.tool.run_tool` in production.
Runner = Callable[[Sequence[str], float], ToolOutput]

#: A failed scontrol read is retried after at most this many seconds.
FAILED_READ_RETRY_SECONDS = 60.0

SOURCE_SCONTROL = "scontrol"
SOURCE_GRES_CONF = "gres.conf"


@dataclass(frozen=True)
class Registration:
    """The GRES Slurm has for this node, where it was read, and why not when it failed."""

    node: str
    source: str | None
    entries: tuple[GresEntry, ...]
    error: str | None
    read_at: float

    @property
    def ok(self) -> bool:
        return self.source is not None


def tool_error(out: ToolOutput) -> str | None:
    """Why a tool run failed (None when it exited 0)."""
    if out.hung:
        return f"{out.argv[0]} did not answer within its timeout ({out.duration_seconds:.0f} s)"
    if out.returncode != 0:
        text = (out.stderr.strip() or out.stdout.strip()).splitlines()
        detail = text[-1] if text else "no output"
        return f"{out.argv[0]} exited {out.returncode}: {detail}"
    return None


def run_scontrol(
    settings: SlurmSettings, args: Sequence[str], runner: Runner
) -> tuple[ToolOutput | None, str | None]:
    """Run ``scontrol`` (the configured argv prefix) with ``args``: (output, error)."""
    argv = [*settings.scontrol, *args]
    try:
        out = runner(argv, settings.timeout_seconds)
    except OSError as exc:  # FileNotFoundError, PermissionError
        return None, f"cannot run {argv[0]}: {exc.strerror or exc}"
    return out, tool_error(out)


def read_registration(settings: SlurmSettings, node: str, runner: Runner) -> Registration:
    """Read the registration now: scontrol first, ``gres.conf`` when scontrol fails."""
    now = time.time()
    out, error = run_scontrol(settings, ["show", "node", "-o", node], runner)
    if out is not None and error is None:
        info = find_node(out.stdout, node)
        if info is not None:
            return Registration(node, SOURCE_SCONTROL, info.gres, None, now)
        error = f"scontrol show node: no node named {node!r} in the answer"
    if settings.gres_conf is not None:
        conf_error = None
        try:
            lines = parse_gres_conf(Path(settings.gres_conf).read_text(encoding="utf-8"))
            conf = gres_conf_for_node(lines, node)
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: a huge File=
            conf_error = f"{settings.gres_conf}: {getattr(exc, 'strerror', None) or exc}"
        else:
            if conf.complete:
                return Registration(node, SOURCE_GRES_CONF, conf.entries, error, now)
            conf_error = (
                f"{settings.gres_conf}: AutoDetect={conf.autodetect} without Name= lines, "
                "counts come from the hardware"
            )
        error = f"{error}; fallback {conf_error}"
    return Registration(node, None, (), error, now)


class RegistrationCache:
    """Reads the registration at most every ``registration_cache_seconds``.

    A change of the settings that matter (node, scontrol argv, gres.conf) reads anew.
    """

    def __init__(self, runner: Runner = run_tool, clock: Callable[[], float] = time.monotonic):
        self.runner = runner
        self.clock = clock
        self.reads = 0
        self._key: tuple | None = None
        self._value: Registration | None = None
        self._at = 0.0

    def get(self, settings: SlurmSettings, node: str) -> Registration:
        key = (node, settings.scontrol, settings.gres_conf, settings.timeout_seconds)
        now = self.clock()
        if self._value is not None and self._key == key:
            ttl = settings.registration_cache_seconds
            if self._value.source != SOURCE_SCONTROL:
                ttl = min(ttl, FAILED_READ_RETRY_SECONDS)
            if now - self._at < ttl:
                return self._value
        reg = read_registration(settings, node, self.runner)
        self.reads += 1
        if reg.source != SOURCE_SCONTROL and (
            self._value is None or self._value.error != reg.error
        ):
            log.warning("gres_registration_fallback", node=node, source=reg.source, error=reg.error)
        self._key, self._value, self._at = key, reg, now
        return reg


# ---------------------------------------------------------------------- comparison
@dataclass(frozen=True)
class GresCount:
    """One (name, type): registered in Slurm, found on the node, found and healthy."""

    name: str
    type: str | None
    configured: int
    found: int
    healthy: int

    @property
    def label(self) -> str:
        return f"{self.name}:{self.type}" if self.type else self.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "configured": self.configured,
            "found": self.found,
            "healthy": self.healthy,
        }


def card_gres(rec: CardRecord, config: Config) -> tuple[str, str | None] | None:
    """(GRES name, GRES type) a card counts under; None when no profile gives a name."""
    profile = config.profile_for(rec.vendor, rec.card_type, rec.model)
    name = rec.gres or profile.gres
    if not name:
        return None
    return name, profile.gres_type or rec.card_type


def _healthy(rec: CardRecord) -> bool:
    return rec.health not in (HEALTH_CRITICAL, HEALTH_UNKNOWN)


def compare(
    cards: Sequence[CardRecord],
    entries: Sequence[GresEntry],
    config: Config,
    *,
    collectors_up: bool = True,
) -> tuple[list[GresCount], list[Finding]]:
    """Registered vs found vs healthy per (name, type), and the findings that follow.

    ``collectors_up`` False (a collector failed or hung) makes a shortfall ``unknown``
    instead of ``critical``: the missing cards may only be unread.
    """
    mapped = [(rec, card_gres(rec, config)) for rec in cards]
    names = {g[0].lower() for _, g in mapped if g} | {
        p.gres.lower() for p in config.profiles if p.gres
    }
    counts: list[GresCount] = []
    claimed: set[int] = set()
    uncertain: set[int] = set()
    for entry in entries:
        name, gtype = entry.key
        if name not in names:
            continue
        found = healthy = 0
        unread = not collectors_up
        for i, (rec, g) in enumerate(mapped):
            if g is None or g[0].lower() != name:
                continue
            if gtype is not None and (g[1] or "").lower() != gtype:
                continue
            claimed.add(i)
            found += 1
            healthy += _healthy(rec)
            unread = unread or rec.health == HEALTH_UNKNOWN
        counts.append(GresCount(entry.name, entry.type, entry.count, found, healthy))
        if unread:
            uncertain.add(len(counts) - 1)
    extra: dict[tuple[str, str | None], list[CardRecord]] = {}
    for i, (rec, g) in enumerate(mapped):
        if g is not None and i not in claimed:
            extra.setdefault((g[0], g[1]), []).append(rec)
    for (name, gtype), recs in extra.items():
        counts.append(GresCount(name, gtype, 0, len(recs), sum(_healthy(r) for r in recs)))

    findings = []
    for i, c in enumerate(counts):
        if c.healthy < c.configured:
            severity = HEALTH_UNKNOWN if i in uncertain else HEALTH_CRITICAL
            why = " (some may only be unread: a card is unknown or a collector failed)"
            findings.append(
                Finding(
                    "gres_mismatch",
                    severity,
                    f"{c.label}: Slurm has {c.configured} registered, {c.healthy} healthy "
                    f"on the node ({c.found} found)" + (why if i in uncertain else ""),
                    value=c.healthy,
                    threshold=c.configured,
                )
            )
        elif c.healthy > c.configured:
            findings.append(
                Finding(
                    "gres_mismatch",
                    HEALTH_WARNING,
                    f"{c.label}: {c.healthy} healthy on the node, Slurm has only "
                    f"{c.configured} registered",
                    value=c.healthy,
                    threshold=c.configured,
                )
            )
    return counts, findings


class GresCheck:
    """The node check comparing the Slurm GRES registration with the cards.

    A no-op while ``slurm.enabled`` is false. ``runner`` and ``clock`` are injectable
    (tests); production uses :func:`hetpatrol.tool.run_tool` and the monotonic clock.
    """

    name = "gres"

    def __init__(self, runner: Runner = run_tool, clock: Callable[[], float] = time.monotonic):
        self.cache = RegistrationCache(runner, clock)

    def run(
        self,
        cards: Sequence[CardRecord],
        collectors: Sequence[CollectorStatus],
        config: Config,
    ) -> NodeCheckResult | None:
        settings = config.slurm
        if not settings.enabled:
            return None
        node = settings.slurm_node(config.node)
        reg = self.cache.get(settings, node)
        data: dict[str, Any] = {
            "slurm_node": node,
            "source": reg.source,
            "error": reg.error,
            "read_at": round(reg.read_at, 3),
            "entries": [],
        }
        if not reg.ok:
            finding = Finding(
                "gres_registration",
                SEVERITY_INFO,
                f"GRES registration of Slurm node {node} unreadable, check skipped: {reg.error}",
            )
            return NodeCheckResult((finding,), data)
        up = all(c.state in (STATE_OK, STATE_ABSENT, STATE_DISABLED) for c in collectors)
        counts, findings = compare(cards, reg.entries, config, collectors_up=up)
        data["entries"] = [c.to_dict() for c in counts]
        return NodeCheckResult(tuple(findings), data)
