"""GRES registration compared with the cards that are really there and healthy.

The registration is what Slurm believes this node has: the node's GRES in slurmctld,
read for this one node (:func:`registration_argv`: ``sinfo --noheader --all --Node
--nodes=<NodeName> --Format=NodeList:|,Gres:0``, one ``REQUEST_NODE_INFO_SINGLE``);
when sinfo cannot be run or read, ``Gres=`` of ``scontrol show node -o <NodeName>``
(which loads the whole node table: ``REQUEST_NODE_INFO``); when neither answers
(slurmctld down, no Slurm commands), the ``gres.conf`` lines for this node. It is read
at most every ``registration_cache_seconds`` (a failed read is retried after at most
60 s), each command under ``timeout_seconds``.

Each card counts under its GRES name (the card's ``gres``, from its profile). A
registered type names a card as Slurm's AutoDetect matches a configured type to a
device: the type is a case-insensitive substring of the card's model in Slurm's form
(lower case, spaces as underscores: ``gpu:h100`` and ``gpu:nvidia_h100_80gb_hbm3`` both
name an ``NVIDIA H100 80GB HBM3``); the profile's ``gres_type`` or the card's
``card_type`` (``910b``) also names it, whole. Longer registered types take their cards
first, each up to its count (see :func:`_assign`). Every chip record counts once (Slurm
counts device files, one per chip); an untyped registration (``gpu:8``) counts the cards
of that name no typed one takes.

Per (name, type) the registered count is compared with the cards found *and healthy*
(not critical, not unknown):

- fewer healthy than registered: critical node finding ``gres_mismatch``; but
  ``unknown`` when the shortfall may only be unread cards (a card of that kind is
  ``unknown``, or a collector failed or hung): a hung vendor tool is not a lost card,
  and must not drain a node on its own;
- but a shortfall the node's other cards of that name make up (``gpu:a100:8``
  registered, 8 healthy H100 found) is a warning naming both: the counts agree, the
  type names do not; that is a configuration matter, never a drain;
- more healthy than registered: warning ``gres_mismatch`` (Slurm will not schedule them);
- registration unreadable: info finding ``gres_registration`` (the check is skipped);
  a ``Gres=`` string that does not parse: ``unknown`` ``gres_registration`` with the
  raw text.

Only GRES names that some profile (or card) uses are compared: ``mps``, ``shard`` or a
site's ``bandwidth`` GRES are not cards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetpatrol.checks.facts import NodeCheckResult
from hetpatrol.collector import STATE_ABSENT, STATE_DISABLED, STATE_OK, CollectorStatus
from hetpatrol.logs import get_logger
from hetpatrol.schema import (
    HEALTH_CRITICAL,
    HEALTH_UNKNOWN,
    HEALTH_WARNING,
    SEVERITY_INFO,
    CardRecord,
    Finding,
    PartitionInfo,
)
from hetpatrol.slurm.gres import (
    GresEntry,
    GresParseError,
    find_node,
    gres_conf_for_node,
    parse_gres,
    parse_gres_conf,
    sum_gres,
)
from hetpatrol.slurm.settings import SlurmSettings
from hetpatrol.tool import ToolOutput, run_tool

log = get_logger("hetpatrol.slurm")

#: ``runner(argv, timeout_seconds) -> ToolOutput``; :func:`hetpatrol.tool.run_tool` in production.
Runner = Callable[[Sequence[str], float], ToolOutput]

#: A failed scontrol read is retried after at most this many seconds.
FAILED_READ_RETRY_SECONDS = 60.0

SOURCE_SINFO = "sinfo"
SOURCE_SCONTROL = "scontrol"
SOURCE_GRES_CONF = "gres.conf"
#: the sources that are slurmctld's own answer (cached for registration_cache_seconds)
SLURMCTLD_SOURCES = (SOURCE_SINFO, SOURCE_SCONTROL)
#: the node's name and GRES, nothing padded or cut (sinfo(1) ``--Format``:
#: "type[:[.][size][suffix]]"; ``:|`` is size 0 with the suffix ``|``, and size 0 prints
#: the value whole: ``_parse_long_token()`` in src/sinfo/opts.c, ``_print_str()`` in
#: src/sinfo/print.c, 22.05)
REGISTRATION_FORMAT = "NodeList:|,Gres:0"


@dataclass(frozen=True)
class Registration:
    """The GRES Slurm has for this node, where it was read, and why not when it failed.

    ``unreadable`` is the raw ``Gres=`` text when Slurm answered with a GRES string that
    does not parse (``gpu:a100:X(S:0-1)``): the check is then ``unknown``, not skipped
    silently and not compared with a guess.
    """

    node: str
    source: str | None
    entries: tuple[GresEntry, ...]
    error: str | None
    read_at: float
    unreadable: str | None = None

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


def registration_sinfo(settings: SlurmSettings) -> list[str]:
    """The sinfo the registration is read with: beside ``slurm.scontrol`` with the same
    argv prefix when that command is named ``scontrol`` (``["env", "SLURM_CONF=...",
    "/usr/bin/scontrol"]`` -> ``[..., "/usr/bin/sinfo"]``), else ``slurm.drain.breaker.
    sinfo`` (the root helper's client runs scontrol only; sinfo needs no privilege)."""
    *prefix, tool = settings.scontrol
    head, sep, name = tool.rpartition("/")
    if name == "scontrol":
        return [*prefix, f"{head}{sep}sinfo"]
    return list(settings.drain.breaker.sinfo)


def registration_argv(sinfo: Sequence[str], node: str) -> list[str]:
    """``sinfo --noheader --all --Node --nodes=<node> --Format=NodeList:|,Gres:0``: one node
    named in ``--nodes`` is ``slurm_load_node_single()`` (src/sinfo/opts.c 22.05 sets
    ``node_name_single`` when the host list has one name, src/sinfo/sinfo.c then asks
    for that node alone), where ``scontrol show node <node>`` loads every node and
    picks one (``scontrol_load_nodes()`` -> ``slurm_load_node()``, src/scontrol/
    info_node.c, 22.05 to 25.11). Seen at debug2 on the real slurmctld 22.05:
    ``REQUEST_NODE_INFO_SINGLE`` against ``REQUEST_NODE_INFO``. ``--all``: sinfo(1)
    "Display information about all partitions. This causes information to be displayed
    about partitions that are configured as hidden and partitions that are unavailable
    to the user's group"; without it a node whose partitions are all ``Hidden=YES`` or
    ``AllowGroups=`` groups the daemon's user is not in (a GPU partition for some
    groups) is no line at all, seen on slurmctld 22.05 as uid 65534: the registration
    then fell back to ``scontrol show node`` (the whole node table) every read."""
    return [
        *sinfo,
        "--noheader",
        "--all",
        "--Node",
        f"--nodes={node}",
        f"--Format={REGISTRATION_FORMAT}",
    ]


def parse_sinfo_gres(text: str, node: str) -> str | None:
    """The node's GRES string (``gpu:a100:8(S:0-1),ascend:910b:8``, ``(null)``: the same
    ``node_ptr->gres`` as scontrol's ``Gres=``, src/sinfo/sinfo.c) from
    :func:`registration_argv`'s answer: one ``NODE|GRES`` line per partition of the
    node. Raises ValueError when no line names ``node`` or two lines differ."""
    said = set()
    for line in text.splitlines():
        name, sep, gres = line.partition("|")
        if sep and name == node:
            said.add(gres.strip())
    if not said:
        raise ValueError(f"sinfo: no node named {node!r} in the answer")
    if len(said) > 1:
        raise ValueError(f"sinfo: node {node!r} listed with different GRES {sorted(said)}")
    return said.pop()


def _read_sinfo(settings: SlurmSettings, node: str, runner: Runner, now: float):
    """The registration from sinfo, or (None, why not, whether sinfo hung)."""
    argv = registration_argv(registration_sinfo(settings), node)
    try:
        out = runner(argv, settings.timeout_seconds)
    except OSError as exc:
        return None, f"cannot run {argv[0]}: {exc.strerror or exc}", False
    error = tool_error(out)
    if error is not None:
        return None, error, out.hung
    try:
        raw = parse_sinfo_gres(out.stdout, node)
    except ValueError as exc:
        return None, str(exc), False
    try:
        gres = parse_gres(raw)
    except GresParseError as exc:
        return Registration(node, SOURCE_SINFO, (), str(exc), now, raw), None, False
    return Registration(node, SOURCE_SINFO, gres, None, now), None, False


def read_registration(settings: SlurmSettings, node: str, runner: Runner) -> Registration:
    """Read the registration now: sinfo for this one node first; ``scontrol show node -o``
    when sinfo cannot be run or read (not when it hung: slurmctld would not answer
    scontrol either); ``gres.conf`` when both fail. The error says each failure."""
    now = time.time()
    reg, sinfo_error, hung = _read_sinfo(settings, node, runner, now)
    if reg is not None:
        return reg
    if hung:
        out, error = None, sinfo_error
    else:
        out, error = run_scontrol(settings, ["show", "node", "-o", node], runner)
        if error is not None:
            error = f"{sinfo_error}; {error}"
    if out is not None and error is None:
        info = find_node(out.stdout, node)
        if info is not None and info.gres_error is not None:
            raw = info.fields.get("Gres", "")
            return Registration(node, SOURCE_SCONTROL, (), info.gres_error, now, raw)
        if info is not None:
            return Registration(node, SOURCE_SCONTROL, info.gres, None, now)
        error = f"{sinfo_error}; scontrol show node: no node named {node!r} in the answer"
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
            if self._value.source not in SLURMCTLD_SOURCES:
                ttl = min(ttl, FAILED_READ_RETRY_SECONDS)
            if now - self._at < ttl:
                return self._value
        reg = read_registration(settings, node, self.runner)
        self.reads += 1
        if reg.source not in SLURMCTLD_SOURCES and (
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


def card_gres(rec: CardRecord, config: Any) -> tuple[str, str | None] | None:
    """(GRES name, GRES type) a card counts under; None when no profile gives a name."""
    profile = config.profile_for(rec.vendor, rec.card_type, rec.model)
    name = rec.gres or profile.gres
    if not name:
        return None
    return name, profile.gres_type or rec.card_type


def slurm_device_name(model: str | None) -> str | None:
    """A card's model as Slurm's AutoDetect names its type: lower case, spaces as
    underscores (``NVIDIA H100 80GB HBM3`` -> ``nvidia_h100_80gb_hbm3``).

    Slurm: ``gpu_common_underscorify_tolower()`` applied to ``nvmlDeviceGetName()`` in
    ``_nvml_get_device_name()``, src/plugins/gpu/nvml/gpu_nvml.c (SchedMD/slurm, tag
    slurm-22-05-11-1).
    """
    if not model or not model.strip():
        return None
    return model.strip().lower().replace(" ", "_")


def slurm_mig_name(model: str | None, part: PartitionInfo) -> str | None:
    """A MIG device's type as Slurm's AutoDetect names it: the GPU's device name (lower
    case, underscores) cut at its first ``-``, then ``_<slices>g.<memory GiB>gb``
    (``NVIDIA A100-SXM4-80GB``, 1 slice, 19968 MiB -> ``nvidia_a100_1g.20gb``).

    Slurm: ``_get_system_gpu_list_nvml()`` clears the name from its first ``-``,
    ``_handle_mig()`` appends ``"_%ug.%lugb"`` of ``gpuInstanceSliceCount`` and
    ``roundl(memorySizeMB / 1024)`` (src/plugins/gpu/nvml/gpu_nvml.c, SchedMD/slurm):
    the device attributes' memory (:attr:`PartitionInfo.memory_size_mib`), not the memory
    info's total. None when the slices or that memory were not read.
    """
    device = slurm_device_name(model)
    if device is None or part.slices is None or part.memory_size_mib is None:
        return None
    gib = math.floor(part.memory_size_mib / 1024 + 0.5)  # roundl: half away from 0
    return f"{device.split('-', 1)[0]}_{part.slices}g.{gib}gb"


@dataclass(frozen=True)
class _Card:
    """A card as the comparison sees it: its record, GRES name and the names it answers to."""

    rec: CardRecord
    name: str
    short: str | None  # the profile's gres_type or hetpatrol's card_type ("h100")
    device: str | None  # the model as Slurm's AutoDetect names it

    def matches(self, registered: str) -> bool:
        """Does a registered GRES type (lower case) name this card?

        As Slurm matches a configured ``Type=`` to a device AutoDetect found: the type is
        a case-insensitive substring of the device's name (``xstrcasestr(sys_gres_type,
        conf type)`` in ``_find_type_in_gres_list()``, src/plugins/gres/gpu/gres_gpu.c,
        SchedMD/slurm tag slurm-22-05-11-1; gres.conf(5): "the Type specified should
        match or be a substring of the value that is detected, using an underscore in
        lieu of any spaces"). hetpatrol's own short type (or the profile's
        ``gres_type``) also names it, compared whole and case-insensitively.
        """
        if self.short is not None and self.short.lower() == registered:
            return True
        return self.device is not None and registered in self.device

    @property
    def label(self) -> str:
        """``h100 (nvidia_h100_80gb_hbm3)``: both names, for messages."""
        short = self.short or "untyped"
        return f"{short} ({self.device})" if self.device and self.device != short else short


def _healthy(rec: CardRecord) -> bool:
    return rec.health not in (HEALTH_CRITICAL, HEALTH_UNKNOWN)


def _assign(
    cards: Sequence[_Card], entries: Sequence[GresEntry]
) -> tuple[dict[int, list[int]], list[int]]:
    """Which cards (indices) each registered entry (index) counts; the cards none does.

    All of one GRES name. As Slurm's ``_normalize_sys_gres_types()`` (gres_gpu.c,
    22.05): typed entries longest type first (``h100`` and ``nvidia_h100_80gb_hbm3``
    both registered: the longer takes its cards first), each card to the first entry
    that names it and still has room. Cards left over that a typed entry names count
    there too (more than registered: a warning); an untyped entry (``gpu:8``) takes the
    rest of that name.
    """
    typed = sorted(
        (i for i, e in enumerate(entries) if e.type is not None),
        key=lambda i: (-len(entries[i].type or ""), (entries[i].type or "").lower()),
    )
    untyped = [i for i, e in enumerate(entries) if e.type is None]
    taken: dict[int, list[int]] = {i: [] for i in range(len(entries))}
    left: list[int] = []
    for c, crd in enumerate(cards):
        names = [i for i in typed if crd.matches((entries[i].type or "").lower())]
        room = [i for i in names if len(taken[i]) < entries[i].count]
        if room or names:
            taken[(room or names)[0]].append(c)
        else:
            left.append(c)
    if untyped:
        taken[untyped[0]].extend(left)
        left = []
    return taken, left


def compare(
    cards: Sequence[CardRecord],
    entries: Sequence[GresEntry],
    config: Any,
    *,
    collectors_up: bool = True,
) -> tuple[list[GresCount], list[Finding]]:
    """Registered vs found vs healthy per (name, type), and the findings that follow.

    ``collectors_up`` False (a collector failed or hung) makes a shortfall ``unknown``
    instead of ``critical``: the missing cards may only be unread. A shortfall that the
    node's other cards of that GRES name make up (``gpu:a100:8`` registered, 8 healthy
    H100 found) is a ``warning`` naming both types: the counts agree, the names do not.
    """
    entries = sum_gres(entries)  # gpu:a100:4(S:0),gpu:a100:4(S:1) is gpu:a100:8
    names = {p.gres.lower() for p in config.profiles if p.gres}
    mapped: list[_Card] = []
    for rec in cards:
        g = card_gres(rec, config)
        if g is not None:
            migs = [p for p in rec.partitions if p.kind == "mig"]
            # a GPU in MIG mode is its MIG devices to Slurm: one GRES each, typed by
            # its profile (gpu_nvml.c _get_system_gpu_list_nvml: add_gres_to_list per MIG
            # device, none for the GPU itself)
            mapped.extend(_Card(rec, g[0], p.profile, slurm_mig_name(rec.model, p)) for p in migs)
            if not migs:
                mapped.append(_Card(rec, g[0], g[1], slurm_device_name(rec.model)))
            names.add(g[0].lower())
    counts: list[GresCount] = []
    uncertain: set[int] = set()
    named_by: dict[int, str] = {}  # count index -> what the warning says instead
    explained: set[tuple[str, str | None]] = set()  # unregistered cards named there
    leftovers: list[_Card] = []
    by_name: dict[str, list[int]] = {}
    for i, e in enumerate(entries):
        by_name.setdefault(e.key[0], []).append(i)
    registered_names = {n for n in by_name if n in names}
    for name in {c.name.lower() for c in mapped} - registered_names:
        leftovers.extend(c for c in mapped if c.name.lower() == name)
    for name in sorted(registered_names, key=lambda n: by_name[n][0]):
        group = [entries[i] for i in by_name[name]]
        these = [c for c in mapped if c.name.lower() == name]
        taken, left = _assign(these, group)
        first = len(counts)
        for j, e in enumerate(group):
            recs = [these[c].rec for c in taken[j]]
            counts.append(GresCount(e.name, e.type, e.count, len(recs), sum(map(_healthy, recs))))
            if not collectors_up or any(r.health == HEALTH_UNKNOWN for r in recs):
                uncertain.add(len(counts) - 1)
        stray = [these[c] for c in left]
        leftovers.extend(stray)
        short = [k for k in range(first, len(counts)) if counts[k].healthy < counts[k].configured]
        if not short or not stray:
            continue
        if any(counts[k].healthy < counts[k].found for k in short):
            continue  # a card of that type is sick or unread: the shortfall stands
        n = sum(_healthy(c.rec) for c in stray)
        if n < sum(counts[k].configured - counts[k].found for k in short):
            continue  # really fewer cards: the shortfall stands (critical)
        kinds = sorted({c.label for c in stray if _healthy(c.rec)})
        for k in short:
            c = counts[k]
            named_by[k] = (
                f"{c.label}: Slurm has {c.configured} registered, {c.healthy} healthy cards "
                f"of that type; the node has {n} healthy {group[0].name} cards of type "
                f"{', '.join(kinds)} that do not match it: the counts agree, the type "
                "names do not"
            )
        explained.update((c.name, c.short) for c in stray)
    extra: dict[tuple[str, str | None], list[CardRecord]] = {}
    for crd in leftovers:
        extra.setdefault((crd.name, crd.short), []).append(crd.rec)
    unregistered = len(counts)
    for (name, gtype), recs in extra.items():
        counts.append(GresCount(name, gtype, 0, len(recs), sum(map(_healthy, recs))))
    findings = []
    for i, c in enumerate(counts):
        if i in named_by:
            findings.append(
                Finding(
                    "gres_mismatch",
                    HEALTH_WARNING,
                    named_by[i],
                    value=c.healthy,
                    threshold=c.configured,
                )
            )
        elif c.healthy < c.configured:
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
        elif c.healthy > c.configured and not (i >= unregistered and (c.name, c.type) in explained):
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


def census_counts(census_cards: Sequence[Any], config: Any) -> dict[tuple[str, str | None], int]:
    """``{(GRES name, type): cards on the PCI bus}`` of the PCI census's cards
    (:class:`hetpatrol.pci_census.CensusCard`), each named as a read card is
    (:func:`card_gres`: the first profile of its plugin and card type); a census card
    of no known type counts under ``(name, None)``, of no GRES name not at all."""
    out: dict[tuple[str, str | None], int] = {}
    for cc in census_cards:
        profile = config.profile_for(cc.plugin, cc.card_type, None)
        if not profile.gres:
            continue
        key = (profile.gres.lower(), (profile.gres_type or cc.card_type or "").lower() or None)
        out[key] = out.get(key, 0) + 1
    return out


def _with_census(
    counts: Sequence[GresCount],
    findings: list[Finding],
    entries: list[dict[str, Any]],
    census_cards: Sequence[Any],
    config: Any,
) -> list[Finding]:
    """The GRES comparison with the PCI census as well: each entry gets ``on_bus`` (the
    census cards of its name and type; None when the registered type is none the census
    names, e.g. a Slurm model string: not compared), and a shortfall finding says how
    many are on the bus (cards gone from the bus, or there and unread: a driver lost
    them, see ``pci_unwatched``). Slurm counts a GRES type as the cards whose Type= it
    matches (gres.conf(5) "Type"); the census knows card types, so only an exact type
    (or a name-only registration) is compared."""
    on_bus = census_counts(census_cards, config)
    by_label: dict[str, int] = {}
    for c, entry in zip(counts, entries, strict=True):
        name = c.name.lower()
        if c.type is None:
            n: int | None = sum(v for (gname, _), v in on_bus.items() if gname == name)
        else:
            n = on_bus.get((name, c.type.lower()))
        entry["on_bus"] = n
        if n is not None:
            by_label[c.label] = n
    out = []
    for f in findings:
        label = f.message.split(": ", 1)[0]
        if f.check == "gres_mismatch" and label in by_label and f.threshold is not None:
            f = Finding(
                f.check,
                f.severity,
                f"{f.message}; {by_label[label]} on the PCI bus",
                value=f.value,
                threshold=f.threshold,
            )
        out.append(f)
    return out


class GresCheck:
    """The node check comparing the Slurm GRES registration with the cards.

    A no-op while ``slurm.enabled`` is false. ``runner`` and ``clock`` are injectable
    (tests); production uses :func:`hetpatrol.tool.run_tool` and the monotonic clock.
    """

    name = "gres"

    def __init__(self, runner: Runner = run_tool, clock: Callable[[], float] = time.monotonic):
        self.cache = RegistrationCache(runner, clock)
        #: this patrol's PCI census (set by the patrol; None: no census)
        self.census: Callable[[], Any] | None = None
        #: the last patrol's IDX order of GRES names of several types (``data["order"]``)
        self.order: dict[str, Any] | None = None
        self._lines: tuple[float, tuple[bool | None, str]] | None = None

    def _lines_of(
        self, settings: SlurmSettings, node: str, read_at: float
    ) -> tuple[bool | None, str]:
        """(True: the node's GRES are gres.conf lines, no AutoDetect; False: AutoDetect;
        None: not known) and what was read, once per registration read. AutoDetect
        numbers its records otherwise (by device file and NVML order,
        ``_merge_system_gres_conf``, src/plugins/gres/gpu/gres_gpu.c), so a node with a
        whole GPU beside MIG devices is mapped by type order only on lines' word."""
        if self._lines is not None and self._lines[0] == read_at:
            return self._lines[1]
        answer: tuple[bool | None, str]
        if settings.gres_conf is None:
            answer = (None, "no gres_conf configured")
        else:
            try:
                text = Path(settings.gres_conf).read_text(encoding="utf-8")
                conf = gres_conf_for_node(parse_gres_conf(text), node)
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                answer = (None, f"{settings.gres_conf}: {getattr(exc, 'strerror', None) or exc}")
            else:
                mode = conf.autodetect
                if mode not in (None, "off"):
                    answer = (False, f"{settings.gres_conf}: AutoDetect={mode}")
                elif not conf.entries:
                    answer = (None, f"{settings.gres_conf}: no lines for {node}")
                else:
                    answer = (True, f"{settings.gres_conf}: lines, AutoDetect={mode or 'none'}")
        self._lines = (read_at, answer)
        return answer

    def run(
        self,
        cards: Sequence[CardRecord],
        collectors: Sequence[CollectorStatus],
        config: Any,
    ) -> NodeCheckResult | None:
        settings = config.slurm
        self.order = None  # this patrol's, as the state file has it
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
        if reg.unreadable is not None:
            finding = Finding(
                "gres_registration",
                HEALTH_UNKNOWN,
                f"GRES registration of Slurm node {node} is not a GRES string hetpatrol "
                f"can read, Gres={reg.unreadable}: {reg.error}",
            )
            return NodeCheckResult((finding,), data)
        up = all(c.state in (STATE_OK, STATE_ABSENT, STATE_DISABLED) for c in collectors)
        counts, findings = compare(cards, reg.entries, config, collectors_up=up)
        data["entries"] = [c.to_dict() for c in counts]
        # slurmctld's node_ptr->gres (sinfo's Gres and scontrol's Gres= print the same
        # string) is rebuilt from slurmd's records; the gres.conf fallback lists types in
        # its own line order, not Gres='s: no order from it
        order = gres_order(cards, reg.entries, config) if reg.source in SLURMCTLD_SOURCES else {}
        if order:
            # several types of one name: the IDX order the Prolog and card_jobs map by
            lines, why = self._lines_of(settings, node, reg.read_at)
            data["order"] = {"names": order, "gres_conf_lines": lines, "gres_conf": why}
        self.order = data.get("order")
        pc = self.census() if self.census is not None else None
        if pc is not None and pc.census.known:
            findings = _with_census(counts, findings, data["entries"], pc.cards, config)
        return NodeCheckResult(tuple(findings), data)


# ------------------------------------------------------------ IDX order, several types
def _device_key(rec: CardRecord, part: PartitionInfo | None) -> list[int | None]:
    """``[card index, chip, MIG index or None]``: a GRES device as the state file names it."""
    return [rec.index, rec.chip, None if part is None else part.index]


def gres_order(
    cards: Sequence[CardRecord], entries: Sequence[GresEntry], config: Any
) -> dict[str, dict[str, Any]]:
    """GRES name -> the devices Slurm numbers type by type, for each name whose
    registration has several types (``gpu:v100:1,gpu:a100:2``; MIG profiles; a whole GPU
    beside MIG devices): ``{"types": [{"type", "count", "devices": [[index, chip, mig],
    ...]}, ...], "error": None}`` in ``entries``' order, each type's devices in
    gres-conf's order (cards by (index, chip), a GPU's MIG devices by MIG index); or
    ``{"types": [...], "error": why}`` when the cards do not fit the registration. Also
    written for a name of one registration whose devices are of several kinds (two
    models under ``gpu:2``): it says that Slurm has one type there (file order).

    Slurm's rule (slurmd, gres.conf lines): ``_merge_gres()`` takes the types of the
    node's ``Gres=`` in the order ``gres_add_type()`` met them (src/common/gres.c 22.05,
    lines 1981-1999 and 2711-2742; src/interfaces/gres.c 23.02-24.05, ``_merge_gres``
    2031/2033/2034; 25.11 ``_merge_gres``) and for each the gres.conf records of that
    type in file order (``_match_type()``, the first left each time);
    ``common_node_config_load()`` numbers them in that order, one IDX per ``File=``
    entry or ``MultipleFiles=`` record, and slurmctld's bits (``_node_config_validate``)
    follow it. The registered ``Gres=`` that ``scontrol show node`` prints is rebuilt
    from those records at registration (``_build_node_gres_str()``, called by
    ``gres_node_config_validate()``; node_mgr.c packs ``node_ptr->gres``), so its type
    order is slurmd's. Seen on slurmd 22.05 (tests/test_gres_order.py): gres.conf a100,
    v100, a100 with ``Gres=gpu:v100:1,gpu:a100:2`` made the v100 IDX 0 and the first
    a100 IDX 1. Each device is given its type as :func:`compare` counts it
    (:func:`_assign`: MIG devices by profile, whole cards by model); the error is set
    when a device fits no type, a type's count is not its devices' number, or a typed
    and an untyped registration of the name are both there.
    """
    entries = sum_gres(entries)
    by_name: dict[str, list[GresEntry]] = {}
    for e in entries:
        by_name.setdefault(e.key[0], []).append(e)
    devices: dict[str, list[tuple[_Card, list[int | None]]]] = {}
    for rec in sorted(cards, key=lambda r: (r.index, -1 if r.chip is None else r.chip)):
        g = card_gres(rec, config)
        if g is None:
            continue
        migs = sorted((p for p in rec.partitions if p.kind == "mig"), key=lambda p: p.index)
        for p in migs:
            crd = _Card(rec, g[0], p.profile, slurm_mig_name(rec.model, p))
            devices.setdefault(g[0].lower(), []).append((crd, _device_key(rec, p)))
        if not migs:
            crd = _Card(rec, g[0], g[1], slurm_device_name(rec.model))
            devices.setdefault(g[0].lower(), []).append((crd, _device_key(rec, None)))
    out: dict[str, dict[str, Any]] = {}
    for name, group in by_name.items():
        these = devices.get(name, [])
        if len(group) < 2 and len({(c.short, c.device) for c, _k in these}) < 2:
            continue  # one type, one kind of device: the cards' own order is Slurm's
        taken, left = _assign([c for c, _k in these], group)
        types = [
            {
                "type": e.type,
                "count": e.count,
                "devices": [these[c][1] for c in taken[j]],
            }
            for j, e in enumerate(group)
        ]
        error = None
        if len(group) > 1 and any(e.type is None for e in group):
            error = "typed and untyped registrations of one name (Slurm merges them otherwise)"
        elif left:
            error = f"{len(left)} {name} devices of no registered type"
        elif len(group) > 1:  # one type: Slurm numbers its lines in file order whatever the count
            wrong = [t for t in types if len(t["devices"]) != t["count"]]
            if wrong:
                error = ", ".join(
                    f"{name}:{t['type']} registered {t['count']}, {len(t['devices'])} found"
                    for t in wrong
                )
        out[name] = {"types": types, "error": error}
    return out
