"""The collector plugin interface: what a vendor plugin gets and what it must return.

A collector only reads vendor state and fills :class:`~hetpatrol.schema.CardRecord`
objects. It never judges (the checks do, :mod:`hetpatrol.checks`) and never writes
anywhere (the exporters do). Plugins register in the ``hetpatrol.collectors``
entry-point group; what the checks must know of a vendor's words, the plugin declares
in :class:`VendorInfo`.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hetpatrol.pci_census import PciCards
from hetpatrol.schema import CardRecord, Finding

if TYPE_CHECKING:
    from hetpatrol.actions.escalation import DurationRule, FrequencyRule

#: Collector states, as exported in ``hetpatrol_collector_up`` and the patrol line.
STATE_OK = "ok"  #: the vendor stack answered and the output was understood
STATE_ABSENT = "absent"  #: no such vendor stack on this node (not a failure)
STATE_FAILED = "failed"  #: the stack is there but the read failed (DCMI error, garbage...)
STATE_HUNG = "hung"  #: the read did not return within its timeout
STATE_DISABLED = "disabled"  #: switched off in the config


class CollectorError(Exception):
    """A whole-collector failure: nothing trustworthy could be read.

    ``raw`` keeps the vendor tool's raw output for debugging.
    """

    def __init__(self, message: str, raw: str | None = None, *, hung: bool = False):
        super().__init__(message)
        self.raw = raw
        self.hung = hung


@dataclass
class CollectResult:
    """What one collector run produced.

    - ``records``: one per card (or chip); never empty when ``state`` is ``ok`` with cards.
    - ``state``: one of the ``STATE_*`` constants above.
    - ``error``: human-readable reason when state is not ok.
    - ``raw``: the raw vendor output, kept when it could not be (fully) understood.
    - ``node_findings``: findings about the node rather than a card (a driver/library
      version mismatch makes the whole NVIDIA stack unusable, for example).
    """

    collector: str
    records: list[CardRecord] = field(default_factory=list)
    state: str = STATE_OK
    error: str | None = None
    raw: str | None = None
    node_findings: list[Finding] = field(default_factory=list)
    duration_seconds: float = 0.0


@dataclass(frozen=True)
class DeviceNode:
    """One device node (or numbered family) a vendor's reads open, and who opens it:
    ``path`` (``{n}`` numbered ``0 .. count-1``), the least ``access`` (``"r"``/``"rw"``),
    ``user`` (the library or tool), ``group`` (the ``/proc/devices`` group systemd's
    ``DeviceAllow=char-<group>`` names; None: only the path)."""

    path: str
    access: str
    user: str
    group: str | None = None
    count: int = 1


@dataclass(frozen=True)
class GresDevice:
    """How Slurm's ``gres.conf`` names one of this vendor's cards, and what a job needs
    that Slurm does not set (``hetpatrol gres-conf``, :mod:`hetpatrol.slurm.gres_conf`).

    - ``file``: the card's own device node, ``{n}`` its number (``/dev/davinci{n}``);
      ``number``: where the number comes from: ``"device_number"`` (the record's
      :attr:`~hetpatrol.schema.CardRecord.device_number`, which the plugin fills),
      ``"index"`` (the record's index, the tool's card number) or ``"drm_render"`` (the
      DRM render node of the card's PCI function in sysfs: ``/dev/dri/renderD{n}``);
    - ``autodetect``: the ``gres.conf`` ``AutoDetect=`` mode with which Slurm finds these
      cards itself (``nvml``, ``rsmi``, ``oneapi``, ``nrt``), or None;
    - ``visible_env``: the variables that make only the job's cards visible to the
      vendor's runtime, as a TaskProlog must set them (empty: Slurm sets what is needed);
      ``visible_id``: the value each card gives them (``"device_number"``, ``"index"``);
      ``visible_doc``: the vendor documentation that names the variables;
      ``note``: what the operator must know beyond that (one line, or None).
    """

    file: str
    number: str = "index"
    autodetect: str | None = None
    visible_env: tuple[str, ...] = ()
    visible_id: str = "index"
    visible_doc: str | None = None
    note: str | None = None


#: what the numbers of a :class:`JobEnvVar` are
JOB_ENV_IDS = ("vendor_order", "gres_idx")


@dataclass(frozen=True)
class JobEnvVar:
    """One variable of a job's environment (Prolog, Epilog, task) that says which of the
    vendor's cards the job holds, read by :func:`hetpatrol.slurm.jobguard.parse_job_env`
    (the daemon writes every plugin's rows into its state file, ``job_env``, so the
    Prolog imports no plugin: :func:`job_env_declarations`).

    - ``name``: the variable (``ASCEND_VISIBLE_DEVICES``), its value a comma-separated
      list of numbers or ranges (``0,2-3``);
    - ``ids``: what its numbers are: ``"vendor_order"``, the vendor's cards of the
      verdict in (index, chip) order (the first of the vendor's such variables that is
      set and readable wins); ``"gres_idx"``, the IDX of GRES ``gres``, read only when no
      earlier source (Slurm's ``SLURM_JOB_GPUS``) gave that GRES;
    - ``uuid_prefixes``: entries starting with one of these (any case) are card UUIDs
      (matched to the cards' ``uuid``; the numbers are then not read);
    - ``doc``: where the vendor defines the variable.
    """

    name: str
    ids: str = "vendor_order"
    gres: str | None = None
    uuid_prefixes: tuple[str, ...] = ()
    doc: str | None = None

    def __post_init__(self) -> None:
        if self.ids not in JOB_ENV_IDS or (self.ids == "gres_idx") != bool(self.gres):
            raise ValueError(f"job env {self.name}: ids in {JOB_ENV_IDS}, gres with gres_idx")


@dataclass(frozen=True)
class FaultCodes:
    """The error codes a vendor's cards list in their own health report
    (:attr:`hetpatrol.schema.CardRecord.health_detail`: ``{"status", "codes", "info"}``),
    as the core's :mod:`hetpatrol.checks.fault_codes` judges them.

    - ``check``: the finding's name (``ascend_fault_code``);
    - ``report``: what the codes were read from, the head of the finding's message
      (``npu-smi -t health``);
    - ``lookup``: ``fn(code) -> (severity, class, action text)`` of one code by the
      plugin's table, ``(None, None, None)`` for a code it does not list (may read the
      table on first call; raises OSError / ValueError when it cannot be read).
    """

    check: str
    report: str
    lookup: Callable[[str], tuple[str | None, str | None, str | None]]


#: ``fn(code, severity, message, levels, overrides) -> ActionVerdict``: the action of one
#: code of a code finding (see :class:`VendorActions`)
CodeAction = Callable[
    [str, str, "str | None", "Mapping[str, str] | None", "Mapping[str, str] | None"], Any
]


@dataclass(frozen=True)
class VendorActions:
    """The vendor's fault tables: what to do (a word of
    :data:`hetpatrol.actions.vocabulary.ACTIONS`) about the findings only its plugin
    makes, read by :mod:`hetpatrol.actions.findings` through :class:`VendorInfo`.

    - ``code_actions``: check name -> ``fn(code, severity, message, levels, overrides)``
      for a finding whose ``value`` maps codes to counts (``{"79": 2}``): the
      :class:`~hetpatrol.actions.vocabulary.ActionVerdict` of one code (``str``), given
      the finding's severity and message, the caller's code table ``levels`` (None: the
      plugin's own, from ``code_table``) and the config's per-code ``overrides``
      (``xid:<n>`` ...); the finding's action is the highest of its codes';
    - ``value_actions``: check name -> ``fn(value) -> ActionVerdict`` for a finding whose
      one ``value`` names the action (a non-quiet severity only);
    - ``code_table``: ``fn() -> {code: level}``, the bundled code table ``code_actions``
      read (may read a file; raises OSError / ValueError), or None;
    - ``check_actions``: check name -> ``{severity: action}`` (``"*"``: any other
      non-quiet severity) for the other checks only this plugin makes (``nvml_driver``);
    - ``health_actions``: the ``vendor_health`` words the plugin writes (lower case, as
      in ``VendorInfo.health_words``) -> action (a word no plugin lists: ``watch``);
    - ``code_keys``: check name -> ``fn(code, levels) -> iterable of str``: the escalation
      keys one code of such a finding holds while present (any severity;
      :func:`hetpatrol.actions.apply.state_keys`), ``levels`` the caller's code table;
    - ``frequency_rules`` / ``duration_rules``: the escalation rules over the vendor's
      keys (:class:`hetpatrol.actions.escalation.FrequencyRule` /
      :class:`~hetpatrol.actions.escalation.DurationRule`, each citing its source),
      defaults of :class:`~hetpatrol.actions.escalation.EscalationRules` before the
      core's own (a config's ``actions.escalation`` list replaces them all);
    - ``off_bus_codes``: check name -> the codes of that check's kernel-log events that
      say the card left the bus (NVIDIA: ``xid`` ``79``, ``kernel_fault``
      ``fallen_off_bus``). Such an event on a card's bus id in this boot corroborates its
      tool no longer listing it: ``card_missing`` is then critical at once
      (:mod:`hetpatrol.patrol`), not only after ``missing_patrols`` patrols.

    Functions must not raise on odd codes or values (they give ``watch``).
    """

    code_actions: Mapping[str, CodeAction] = field(default_factory=dict)
    value_actions: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)
    code_table: Callable[[], Mapping[str, str]] | None = None
    check_actions: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    health_actions: Mapping[str, str] = field(default_factory=dict)
    code_keys: Mapping[str, Callable[[str, Mapping[str, str]], Any]] = field(default_factory=dict)
    frequency_rules: tuple[FrequencyRule, ...] = ()
    duration_rules: tuple[DurationRule, ...] = ()
    off_bus_codes: Mapping[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class VendorInfo:
    """What the checks must know of a vendor's words, declared by its plugin
    (:attr:`Collector.vendor_info`), so that no check names a vendor.

    - ``health_words``: the raw ``vendor_health`` words the plugin writes (lower case) ->
      (severity, text of the finding or None for "vendor health is <word>"); a word not
      listed is ``unknown``;
    - ``clock_event_reason_bits``: what the bits of ``counters["clocks_event_reasons"]``
      mean (``sw_thermal``, ``hw_thermal``, ``hw_slowdown``, ``hw_power_brake``); empty
      when the vendor reports no such mask;
    - ``link_kinds``: the ``links[].kind`` values the plugin writes;
    - ``kernel_log``: the vendor's kernel-log line patterns, a
      :class:`hetpatrol.kernel_log.KernelLogPatterns` (None: its faults are not in the
      kernel log);
    - ``device_nodes``: the :class:`DeviceNode` rows its reads open (a sandbox must keep
      them open: :mod:`hetpatrol.host_access`); ``tool_dirs``: program -> the
      directories the vendor installs it in;
    - ``gres``: how ``gres.conf`` names its cards and which variables a job needs
      (:class:`GresDevice`; None: ``hetpatrol gres-conf`` cannot write its lines).
    - ``pci``: which PCI functions are this vendor's cards, a
      :class:`hetpatrol.pci_census.PciCards` (vendor ids, classes, device id -> card
      type); None: the census does not know this vendor's cards.
    - ``actions``: its fault tables, a :class:`VendorActions` (XID, recovery action,
      fault code -> action word); None: its findings take the generic rows of
      :mod:`hetpatrol.actions.findings`.
    - ``fault_codes``: how its cards' own error codes are judged, a :class:`FaultCodes`
      (None: its records carry no ``health_detail`` codes).
    - ``job_env``: the :class:`JobEnvVar` rows of the variables that name the job's cards
      of this vendor, in the order they are read (empty: Slurm's own ``SLURM_JOB_GPUS``
      and ``squeue --json`` alone).
    """

    health_words: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)
    clock_event_reason_bits: Mapping[str, int] = field(default_factory=dict)
    link_kinds: tuple[str, ...] = ()
    kernel_log: Any = None
    device_nodes: tuple[DeviceNode, ...] = ()
    tool_dirs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    gres: GresDevice | None = None
    pci: PciCards | None = None
    actions: VendorActions | None = None
    job_env: tuple[JobEnvVar, ...] = ()
    fault_codes: FaultCodes | None = None


#: Characters of a tool's raw output kept in a patrol line and the state file: the first
#: :data:`RAW_HEAD_CHARS` and the last :data:`RAW_TAIL_CHARS` (a tool says what went wrong
#: at the start or at the end), the rest left out with a marker; its full size and SHA-256
#: are kept beside it. A tool may print 16 MiB (``hetpatrol.tool.STDOUT_CAP``): kept whole
#: that was 15 MB per patrol line.
RAW_HEAD_CHARS = 3072
RAW_TAIL_CHARS = 1024


def bound_raw(raw: str | None) -> tuple[str | None, int | None, str | None]:
    """``(excerpt, bytes, sha256)`` of a tool's raw output: the excerpt is ``raw`` itself
    when it is at most :data:`RAW_HEAD_CHARS` + :data:`RAW_TAIL_CHARS` characters, else
    its head and tail around ``[... N bytes left out ...]``; ``bytes`` is the UTF-8 size
    of the whole output and ``sha256`` its hex digest. ``(None, None, None)`` for None."""
    if raw is None:
        return None, None, None
    data = raw.encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(data).hexdigest()
    if len(raw) <= RAW_HEAD_CHARS + RAW_TAIL_CHARS:
        return raw, len(data), digest
    head, tail = raw[:RAW_HEAD_CHARS], raw[-RAW_TAIL_CHARS:]
    left_out = (
        len(data)
        - len(head.encode("utf-8", "surrogatepass"))
        - len(tail.encode("utf-8", "surrogatepass"))
    )
    return f"{head}\n[... {left_out} bytes left out ...]\n{tail}", len(data), digest


@dataclass(frozen=True)
class CollectorStatus:
    """How one collector fared in one patrol (exported per collector).

    ``raw`` is bounded (:func:`bound_raw`): an excerpt of the tool's output, with
    ``raw_bytes`` (its whole size, UTF-8 bytes) and ``raw_sha256``; :meth:`bounded`
    makes one from the whole output.
    """

    name: str
    state: str
    cards: int
    duration_seconds: float
    error: str | None = None
    raw: str | None = None
    raw_bytes: int | None = None
    raw_sha256: str | None = None

    @classmethod
    def bounded(
        cls,
        name: str,
        state: str,
        cards: int,
        duration_seconds: float,
        error: str | None = None,
        raw: str | None = None,
    ) -> CollectorStatus:
        """A status keeping only :func:`bound_raw` of ``raw``."""
        excerpt, size, digest = bound_raw(raw)
        return cls(name, state, cards, duration_seconds, error, excerpt, size, digest)

    @property
    def up(self) -> bool:
        """True when the collector answered (``ok``) or correctly found no stack (``absent``)."""
        return self.state in (STATE_OK, STATE_ABSENT, STATE_DISABLED)

    def to_dict(self) -> dict[str, Any]:
        return {
            "up": self.up,
            "state": self.state,
            "cards": self.cards,
            "duration_seconds": round(self.duration_seconds, 6),
            "error": self.error,
            "raw": self.raw,
            "raw_bytes": self.raw_bytes,
            "raw_sha256": self.raw_sha256,
        }


#: JSON schema pieces a plugin's :attr:`Collector.options_schema` may use: seconds of a
#: timeout, a command's argv, and the keys every collector section takes
SECONDS_SCHEMA: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "maximum": 3600}
ARGV_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "string", "minLength": 1},
}
COLLECTOR_COMMON_OPTIONS: dict[str, Any] = {
    "enabled": {"type": "boolean"},
    "timeout_seconds": SECONDS_SCHEMA,
    "command": ARGV_SCHEMA,
}


class Collector(abc.ABC):
    """Base class of every vendor collector.

    Subclasses set :attr:`name` and implement :meth:`collect`. The daemon creates one
    instance per configured collector for its whole life, calls :meth:`collect` once per
    patrol (from a worker thread, bounded by ``timeout_seconds``), and :meth:`close` at
    shutdown.

    ``options`` is the collector's config section (``collectors.<name>``). ``replay_dir``,
    when set, swaps the vendor boundary for recorded output (``--replay``): everything
    above the boundary runs as in production.
    """

    name: ClassVar[str] = ""
    #: the vendor words the checks read (see :class:`VendorInfo`)
    vendor_info: ClassVar[VendorInfo] = VendorInfo()
    #: the JSON schema of its ``collectors.<name>`` config section (an object schema,
    #: checked by :func:`hetpatrol.config.load_config`, which names the key and line of a
    #: bad value); None: the keys of :data:`COLLECTOR_COMMON_OPTIONS` are checked and
    #: any other key is the plugin's own
    options_schema: ClassVar[Mapping[str, Any] | None] = None

    def __init__(self, options: Mapping[str, Any], *, replay_dir: Path | None = None):
        self.options = dict(options)
        self.replay_dir = Path(replay_dir) if replay_dir is not None else None

    @abc.abstractmethod
    def collect(self) -> CollectResult:
        """Read every card of this vendor once.

        Returns a :class:`CollectResult`. May raise :class:`CollectorError` for a
        whole-collector failure; any other exception is caught by the patrol and reported
        as a failed collector with the exception text.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release vendor sessions (``nvmlShutdown``...). Default: nothing."""


def discover() -> dict[str, type[Collector]]:
    """Collector classes registered in the ``hetpatrol.collectors`` entry-point group.

    Returns ``{name: class}``. A plugin that fails to import is skipped here and reported
    by the caller when it is configured (so one broken plugin does not stop the daemon).
    """
    found: dict[str, type[Collector]] = {}
    for ep in entry_points(group="hetpatrol.collectors"):
        found[ep.name] = ep  # type: ignore[assignment]
    return found  # values are EntryPoint objects until loaded by load_collector()


_job_env_cache: tuple[tuple, list[dict[str, Any]]] | None = None


def job_env_declarations() -> list[dict[str, Any]]:
    """Every installed plugin's :attr:`VendorInfo.job_env` rows, JSON-ready:
    ``[{"vendor", "name", "ids", "gres", "uuid_prefixes"}]`` (``vendor``: the collector's
    name, as the cards' ``vendor``), plugins in name order, each's rows in its order.
    Plugins are loaded on the first call and again only when ``sys.path`` changes; one
    that cannot be imported is left out. Never raises. The daemon writes this list into
    its state file (``job_env``) for the Prolog."""
    import sys

    global _job_env_cache
    key = tuple(sys.path)  # plugins come and go with the import path
    if _job_env_cache is not None and _job_env_cache[0] == key:
        return [dict(row) for row in _job_env_cache[1]]
    rows: list[dict[str, Any]] = []
    for ep in sorted(entry_points(group="hetpatrol.collectors"), key=lambda e: e.name):
        try:
            cls = load_collector(ep.name)
            declared = tuple(cls.vendor_info.job_env)
        except Exception:  # a broken plugin is reported where it is configured
            continue
        for var in declared:
            rows.append(
                {
                    "vendor": cls.name or ep.name,
                    "name": var.name,
                    "ids": var.ids,
                    "gres": var.gres,
                    "uuid_prefixes": list(var.uuid_prefixes),
                }
            )
    _job_env_cache = (key, rows)
    return [dict(row) for row in rows]


def load_collector(name: str) -> type[Collector]:
    """Load the collector class registered as ``name``.

    Raises ``KeyError`` when no plugin has that name, and re-raises the plugin's own
    import error when it cannot be imported.
    """
    for ep in entry_points(group="hetpatrol.collectors"):
        if ep.name == name:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, Collector)):
                raise TypeError(f"entry point {name!r} does not name a Collector subclass")
            return cls
    raise KeyError(name)
