"""Prometheus exposition of a patrol report, rendered once per patrol and served as bytes.

Nothing is collected on a scrape: :class:`MetricsServer` serves the bytes rendered from
the last :class:`~hetpatrol.patrol.PatrolReport` (vendor tools can take seconds; a scrape
must not). Names follow Prometheus conventions: prefix ``hetpatrol_``, base units,
``_total`` only on counters, identity in ``hetpatrol_card_info``. Per-card series carry
the labels ``vendor``, ``card_type``, ``index``, ``chip``, ``uuid`` only.

Absent values: a label whose value is unknown or does not apply (``chip`` of a GPU,
``uuid`` of a card never read, ``user`` of a process that exited) is left out of the
series, never written as ``""`` nor as a made-up word. Prometheus treats an empty label
value as no label at all, so ``{chip=""}`` selectors keep working
(https://prometheus.io/docs/concepts/data_model/: "Labels with an empty label value are
considered equivalent to labels that do not exist").
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from hetpatrol import __version__
from hetpatrol.actions.vocabulary import ACTIONS
from hetpatrol.collector import STATE_ABSENT, STATE_DISABLED, STATE_FAILED, STATE_HUNG, STATE_OK
from hetpatrol.exporters.deep_metrics import deep_metrics
from hetpatrol.exporters.labels import CARD_LABELS, card_labels
from hetpatrol.exporters.text_format import (
    CounterFamily,
    Family,
    GaugeFamily,
    InfoFamily,
    StateSetFamily,
    TextRenderer,
)
from hetpatrol.report import PatrolReport
from hetpatrol.schema import EXIT_CODES, HEALTH_STATES, CardRecord

COLLECTOR_STATES = (STATE_OK, STATE_ABSENT, STATE_FAILED, STATE_HUNG, STATE_DISABLED, "pending")


#: vendor_health markers after which the NVIDIA collector stops reading a GPU: its
#: process list was never asked for (see hetpatrol.collectors.nvidia)
_READ_STOPPED = frozenset({"gpu_is_lost", "reset_required"})


def processes_read(rec: CardRecord) -> bool:
    """True when the card's process list was read in this patrol: the card was read
    (``read_ok``), not given up on (GPU lost, reset required) and no error entry names
    the process query (``nvmlDeviceGetComputeRunningProcesses``, ``npu-smi info
    processes``). Otherwise no process series is exported: an empty list there is no
    proof of an idle card."""
    if not rec.read_ok or rec.vendor_health in _READ_STOPPED:
        return False
    return not any("process" in e.get("source", "").lower() for e in rec.errors)


@dataclass
class ExporterStats:
    """Counters owned by the daemon's sinks, exported beside the report."""

    jsonl_write_errors: int = 0
    jsonl_lines_written: int = 0
    state_write_errors: int = 0
    textfile_write_errors: int = 0
    config_reload_failures: int = 0
    interval_seconds: float | None = None
    #: Slurm drain policy decisions by event (``drain``, ``resume``, ``drain_skipped``...)
    slurm_events: dict[str, int] = field(default_factory=dict)
    #: the drain circuit breaker holds a drain (None: draining is off)
    drain_breaker_open: bool | None = None
    extra: dict[str, float] = field(default_factory=dict)


# (metric suffix, record attribute, help text, scale)
_CARD_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "temperature_celsius",
        "temperature_celsius",
        "Card temperature (NVML GPU sensor; npu-smi Temp(C)).",
    ),
    (
        "power_watts",
        "power_watts",
        "Power draw (NVML nvmlDeviceGetPowerUsage; npu-smi Power(W), per card on chip 0).",
    ),
    (
        "power_limit_watts",
        "power_limit_watts",
        "Enforced power limit (NVML nvmlDeviceGetEnforcedPowerLimit).",
    ),
    (
        "utilization_ratio",
        "utilization_ratio",
        "Share of time a kernel ran, 0..1 (NVML utilization.gpu; npu-smi AICore(%)/100).",
    ),
    (
        "memory_used_bytes",
        "memory_used_bytes",
        "Device memory used (NVML memory info; npu-smi HBM-Usage, or Memory-Usage on DDR cards).",
    ),
    ("memory_total_bytes", "memory_total_bytes", "Device memory total."),
    ("clock_sm_hertz", "clock_sm_hertz", "SM clock (NVML nvmlDeviceGetClockInfo SM)."),
    ("pcie_link_generation", "pcie_link_gen", "Current PCIe link generation."),
    ("pcie_link_generation_max", "pcie_link_gen_max", "Maximum PCIe link generation."),
    ("pcie_link_width", "pcie_link_width", "Current PCIe link width (lanes)."),
    ("pcie_link_width_max", "pcie_link_width_max", "Maximum PCIe link width (lanes)."),
)
_CARD_FLAGS: tuple[tuple[str, str, str], ...] = (
    (
        "remapped_rows_pending",
        "remapped_rows_pending",
        "1 when NVML reports remapped rows pending (a reset is needed).",
    ),
    (
        "remapped_rows_failure",
        "remapped_rows_failure",
        "1 when NVML reports a row remapping failure (RMA).",
    ),
    (
        "retired_pages_pending",
        "retired_pages_pending",
        "1 when NVML reports retired pages pending (a reset is needed).",
    ),
)


def report_metrics(
    report: PatrolReport | None,
    stats: ExporterStats,
    collectors: Sequence[str],
    patrols_total: int,
    *,
    user_labels: bool = True,
) -> Iterator[Family]:
    """Every metric family for one report (``None`` before the first patrol), with the
    labels of absent values left out (see the module docstring). ``user_labels``
    false: no ``user`` / ``slurm_job`` labels (config ``metrics_user_labels``)."""
    return _report_metrics(report, stats, collectors, patrols_total, user_labels)


def _report_metrics(
    report: PatrolReport | None,
    stats: ExporterStats,
    collectors: Sequence[str],
    patrols_total: int,
    user_labels: bool,
) -> Iterator[Family]:
    up = GaugeFamily("hetpatrol_up", "1 while the hetpatrol daemon runs.")
    up.add_metric([], 1)
    yield up
    build = InfoFamily("hetpatrol_build", "hetpatrol version.")
    build.add_metric([], {"version": __version__})
    yield build
    yield CounterFamily("hetpatrol_patrols", "Patrols completed since start.", value=patrols_total)
    ready = GaugeFamily(
        "hetpatrol_patrol_ready", "1 once the first patrol has completed; 0 means no data yet."
    )
    ready.add_metric([], 0 if report is None else 1)
    yield ready
    if stats.interval_seconds is not None:
        yield GaugeFamily(
            "hetpatrol_patrol_interval_seconds",
            "Configured seconds between patrol starts (for staleness alerts).",
            value=stats.interval_seconds,
        )
    yield from _sink_metrics(stats)

    col_up = GaugeFamily(
        "hetpatrol_collector_up",
        "1 when the collector answered or found no stack of its "
        "vendor (absent); 0 when it failed, hung or has not run yet.",
        labels=["collector"],
    )
    col_state = StateSetFamily(
        "hetpatrol_collector_state", "Collector state in the last patrol.", labels=["collector"]
    )
    col_dur = GaugeFamily(
        "hetpatrol_collector_duration_seconds",
        "Time the collector took in the last patrol.",
        labels=["collector"],
    )
    col_cards = GaugeFamily(
        "hetpatrol_collector_cards",
        "Cards reported by the collector in the last patrol.",
        labels=["collector"],
    )
    statuses = {s.name: s for s in report.collectors} if report is not None else {}
    for name in sorted(set(collectors) | set(statuses)):
        s = statuses.get(name)
        state = s.state if s is not None else "pending"
        col_up.add_metric([name], 1 if s is not None and s.up else 0)
        col_state.add_metric([name], {st: st == state for st in COLLECTOR_STATES})
        if s is not None:
            col_dur.add_metric([name], s.duration_seconds)
            col_cards.add_metric([name], s.cards)
    yield from (col_up, col_state, col_dur, col_cards)
    if report is None:
        return

    last = GaugeFamily(
        "hetpatrol_last_patrol_timestamp_seconds", "Unix time at which the last patrol finished."
    )
    last.add_metric([], report.finished)
    dur = GaugeFamily("hetpatrol_patrol_duration_seconds", "Wall time of the last patrol.")
    dur.add_metric([], report.duration_seconds)
    node_code = GaugeFamily(
        "hetpatrol_node_health_code", "Node verdict: 0 ok, 1 warning, 2 critical, 3 unknown."
    )
    node_code.add_metric([], EXIT_CODES[report.health])
    node_find = GaugeFamily(
        "hetpatrol_node_finding",
        "Active node-level findings (1 per check and severity).",
        labels=["check", "severity"],
    )
    # one series per (check, severity): two findings of one check (gres_mismatch for
    # gpu:a100 and for ascend:910b) must not render a duplicate series, which
    # node_exporter's textfile collector refuses and Prometheus drops
    for check, severity in dict.fromkeys((f.check, f.severity) for f in report.node_findings):
        node_find.add_metric([check, severity], 1)
    yield from (last, dur, node_code, node_find)
    yield from _card_metrics(report.cards)
    yield process_memory_metric(report.cards, user_labels=user_labels)
    yield from partition_metrics(report.cards)
    yield from _gres_metrics(report.node_checks.get("gres"))
    yield from _census_metrics(report.node_checks.get("pci_census"))
    yield from deep_metrics(report)  # XIDs, kernel log, NVLink / RoCE links


def _sink_metrics(stats: ExporterStats) -> Iterable[Family]:
    yield CounterFamily(
        "hetpatrol_jsonl_write_errors",
        "JSONL lines that could not be written (ENOSPC, EACCES...).",
        value=stats.jsonl_write_errors,
    )
    yield CounterFamily(
        "hetpatrol_jsonl_lines", "JSONL lines written.", value=stats.jsonl_lines_written
    )
    yield CounterFamily(
        "hetpatrol_state_write_errors",
        "State file writes that failed.",
        value=stats.state_write_errors,
    )
    yield CounterFamily(
        "hetpatrol_textfile_write_errors",
        "node_exporter textfile writes that failed.",
        value=stats.textfile_write_errors,
    )
    yield CounterFamily(
        "hetpatrol_config_reload_failures",
        "SIGHUP reloads refused (the running config was kept).",
        value=stats.config_reload_failures,
    )
    if stats.slurm_events:
        events = CounterFamily(
            "hetpatrol_slurm_events",
            "Slurm drain policy decisions (JSONL kind=event lines), by event.",
            labels=["event"],
        )
        for event, n in sorted(stats.slurm_events.items()):
            events.add_metric([event], n)
        yield events
    if stats.drain_breaker_open is not None:
        yield GaugeFamily(
            "hetpatrol_drain_breaker_open",
            "1 while the drain circuit breaker holds this node's drain: too many nodes of "
            "its partitions were drained by hetpatrol within the window.",
            value=int(stats.drain_breaker_open),
        )


def _card_metrics(cards: Sequence[CardRecord]) -> Iterable[Family]:
    info = InfoFamily(
        "hetpatrol_card", "Identity of each card (value 1).", labels=list(CARD_LABELS)
    )
    health = StateSetFamily(
        "hetpatrol_card_health", "Card verdict after thresholds.", labels=list(CARD_LABELS)
    )
    code = GaugeFamily(
        "hetpatrol_card_health_code",
        "Card verdict: 0 ok, 1 warning, 2 critical, 3 unknown.",
        labels=list(CARD_LABELS),
    )
    gauges = {
        name: GaugeFamily(f"hetpatrol_card_{name}", text, labels=list(CARD_LABELS))
        for name, _attr, text in _CARD_GAUGES + _CARD_FLAGS
    }
    ecc = CounterFamily(
        "hetpatrol_card_ecc_errors",
        "Volatile ECC errors since driver load (NVML nvmlDeviceGetTotalEccErrors).",
        labels=[*CARD_LABELS, "type"],
    )
    procs = GaugeFamily(
        "hetpatrol_card_processes",
        "Processes holding memory on the card.",
        labels=list(CARD_LABELS),
    )
    finding = GaugeFamily(
        "hetpatrol_card_finding",
        "Active findings per card (1 per check and severity).",
        labels=[*CARD_LABELS, "check", "severity"],
    )
    action = GaugeFamily(
        "hetpatrol_card_action",
        "What to do about the card (1 for its current action word: none, watch, "
        "restart_job, reset_card, reboot_node, isolate_card, replace_card).",
        labels=[*CARD_LABELS, "action"],
    )
    counts: dict[tuple[str, str, str], int] = {}
    actions: dict[str, int] = dict.fromkeys(ACTIONS, 0)
    for rec in cards:
        labels = card_labels(rec)
        if rec.action is not None:
            action.add_metric([*labels, rec.action], 1)
            actions[rec.action] = actions.get(rec.action, 0) + 1
        info.add_metric(
            labels,
            {
                "model": rec.model or "",
                "bus_id": rec.bus_id or "",
                "serial": rec.serial or "",
                "gres": rec.gres or "",
                "driver_version": rec.driver_version or "",
                "firmware_version": rec.firmware_version or "",
            },
        )
        health.add_metric(labels, {h: h == rec.health for h in HEALTH_STATES})
        code.add_metric(labels, EXIT_CODES[rec.health])
        for name, attr, _text in _CARD_GAUGES + _CARD_FLAGS:
            value = getattr(rec, attr)
            if value is not None:
                gauges[name].add_metric(labels, float(value))
        for kind, value in (
            ("corrected", rec.ecc_corrected_total),
            ("uncorrected", rec.ecc_uncorrected_total),
        ):
            if value is not None:
                ecc.add_metric([*labels, kind], value)
        if processes_read(rec):
            procs.add_metric(labels, len(rec.processes))
        for check, severity in dict.fromkeys((f.check, f.severity) for f in rec.findings):
            finding.add_metric([*labels, check, severity], 1)
        k = (rec.vendor, rec.card_type or "", rec.health)
        counts[k] = counts.get(k, 0) + 1
    by_type = GaugeFamily(
        "hetpatrol_cards",
        "Cards per vendor, card type and verdict.",
        labels=["vendor", "card_type", "health"],
    )
    for (vendor, card_type, h), n in sorted(counts.items()):
        by_type.add_metric([vendor, card_type, h], n)
    by_action = GaugeFamily(
        "hetpatrol_cards_by_action",
        "Cards of this node per action word (every word, 0 included).",
        labels=["action"],
    )
    for word, n in actions.items():
        by_action.add_metric([word], n)
    yield from (info, health, code, *gauges.values(), ecc, procs, finding, by_type)
    yield from (action, by_action)


#: labels of a partition's series after the parent card's: the partition's index on
#: its card (MIG device index, vNPU id), its kind and profile (``1g.20gb``, ``vir02``)
PARTITION_LABELS = ("partition", "kind", "profile")


def partition_metrics(cards: Sequence[CardRecord]) -> Iterable[Family]:
    """Series of each card's partitions (MIG devices, vNPUs): labelled by the parent
    card (:data:`CARD_LABELS`) and the partition's index, kind and profile; no UUID of
    the partition and nothing per process (a GPU has at most 7 MIG devices, an Ascend
    chip a few vNPUs). ``hetpatrol_card_partition_memory_bytes`` / ``_total_bytes``:
    the partition's memory (NVML memory info of the MIG device); ``_processes``: the
    card's processes that run in it (only when the card's processes were read)."""
    labels = [*CARD_LABELS, *PARTITION_LABELS]
    used = GaugeFamily(
        "hetpatrol_card_partition_memory_bytes",
        "Memory used in a card's partition (MIG device, vNPU).",
        labels=labels,
    )
    total = GaugeFamily(
        "hetpatrol_card_partition_memory_total_bytes",
        "Memory of a card's partition (MIG device, vNPU).",
        labels=labels,
    )
    procs = GaugeFamily(
        "hetpatrol_card_partition_processes",
        "Processes of the card that run in this partition.",
        labels=labels,
    )
    for rec in cards:
        if not rec.partitions:
            continue
        card = card_labels(rec)
        counted = processes_read(rec)
        for part in rec.partitions:
            values = [*card, str(part.index), part.kind, part.profile or ""]
            if part.memory_used_bytes is not None:
                used.add_metric(values, float(part.memory_used_bytes))
            if part.memory_total_bytes is not None:
                total.add_metric(values, float(part.memory_total_bytes))
            if counted:
                n = sum(1 for p in rec.processes if p.partition == part.index)
                procs.add_metric(values, n)
    yield from (used, total, procs)


#: Series of ``hetpatrol_card_process_memory_bytes`` per card: the top N (slurm_job, user)
#: by memory, the rest summed into ``slurm_job="other", user="other"``.
PROCESS_SERIES_PER_CARD = 5


def process_memory_metric(
    cards: Sequence[CardRecord], top_n: int = PROCESS_SERIES_PER_CARD, *, user_labels: bool = True
) -> GaugeFamily:
    """Card memory held per (Slurm job, user), cardinality bounded per card.

    The label is ``slurm_job``, not ``job`` (Prometheus' own target label). Processes
    outside a job get no ``slurm_job`` label, an unknown user no ``user`` label (their
    value is ``""`` here, left out when rendered); processes whose
    memory the vendor does not report are left out (they count in
    ``hetpatrol_card_processes``). ``user_labels`` false: one series per card with the
    memory of all its processes, no ``user``/``slurm_job`` labels.
    """
    if not user_labels:
        fam = GaugeFamily(
            "hetpatrol_card_process_memory_bytes",
            "Card memory held by processes (user and Slurm job labels switched off).",
            labels=list(CARD_LABELS),
        )
        for rec in cards:
            known = [p.memory_bytes for p in rec.processes if p.memory_bytes is not None]
            if processes_read(rec) and known:
                fam.add_metric(card_labels(rec), sum(known))
        return fam
    fam = GaugeFamily(
        "hetpatrol_card_process_memory_bytes",
        f"Card memory held by processes per Slurm job and user (top {top_n} per card, "
        'the rest summed as slurm_job="other").',
        labels=[*CARD_LABELS, "slurm_job", "user"],
    )
    for rec in cards:
        if not processes_read(rec):
            continue
        totals: dict[tuple[str, str], int] = {}
        for proc in rec.processes:
            if proc.memory_bytes is None:
                continue
            key = (proc.job_id or "", proc.user or "")
            totals[key] = totals.get(key, 0) + proc.memory_bytes
        ranked = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
        labels = card_labels(rec)
        for (job, user), memory in ranked[:top_n]:
            fam.add_metric([*labels, job, user], memory)
        if len(ranked) > top_n:
            fam.add_metric([*labels, "other", "other"], sum(m for _, m in ranked[top_n:]))
    return fam


def _gres_metrics(gres: dict | None) -> Iterable[Family]:
    """Slurm GRES registration vs cards (the ``gres`` node check); nothing while off."""
    if gres is None:
        return
    up = GaugeFamily(
        "hetpatrol_gres_registration_up",
        "1 when the Slurm GRES registration of this node could be read (scontrol or "
        "gres.conf), 0 when not (the GRES check was skipped).",
    )
    up.add_metric([], 1 if gres.get("source") else 0)
    yield up
    labels = ["gres", "gres_type"]
    families = {
        key: GaugeFamily(f"hetpatrol_gres_{key}", text, labels=labels)
        for key, text in (
            ("configured", "GRES count registered in Slurm for this node."),
            ("found", "Cards found on the node that count under this GRES."),
            ("healthy", "Cards found and healthy (not critical/unknown) under this GRES."),
        )
    }
    for entry in gres.get("entries", []):
        values = [entry["name"], entry["type"] or ""]
        for key, fam in families.items():
            fam.add_metric(values, entry[key])
    yield from families.values()


def _census_metrics(census: dict | None) -> Iterable[Family]:
    """The PCI census (the ``pci_census`` node check); nothing while it is off."""
    if census is None:
        return
    up = GaugeFamily(
        "hetpatrol_pci_census_up",
        "1 when the PCI bus could be read for the census, 0 when not (no pci_unwatched "
        "check then).",
    )
    up.add_metric([], 0 if census.get("error") else 1)
    yield up
    if census.get("error"):
        return
    cards = GaugeFamily(
        "hetpatrol_pci_cards",
        "Accelerator cards on the PCI bus, per vendor plugin and card type (empty: the "
        "device id is in no table), whether or not a collector lists them.",
        labels=["vendor", "card_type"],
    )
    unwatched = GaugeFamily(
        "hetpatrol_pci_cards_unwatched",
        "Cards on the PCI bus that no collector lists (finding pci_unwatched), per vendor.",
        labels=["vendor"],
    )
    missing: dict[str, int] = {}
    for entry in census.get("types", []):
        cards.add_metric([entry["vendor"], entry["card_type"] or ""], entry["cards"])
        missing[entry["vendor"]] = missing.get(entry["vendor"], 0) + entry["unwatched"]
    for vendor, n in sorted(missing.items()):
        unwatched.add_metric([vendor], n)
    yield cards
    yield unwatched


class Exposition:
    """Holds the exposition of the last report, rendered once per patrol (thread-safe
    swap): the text, and its gzip form made once, on the first scrape that asks for it
    (Prometheus always sends ``Accept-Encoding: gzip``)."""

    def __init__(
        self,
        collectors: Sequence[str] = (),
        stats: ExporterStats | None = None,
        *,
        user_labels: bool = True,
    ):
        self._report: PatrolReport | None = None
        self._stats = stats if stats is not None else ExporterStats()
        self._collectors = tuple(collectors)
        self._patrols_total = 0
        self._user_labels = user_labels
        self._renderer = TextRenderer()
        self._lock = threading.Lock()
        self._body = self._render()
        self._gzip: bytes | None = None

    def _render(self) -> bytes:
        return self._renderer.render(
            report_metrics(
                self._report,
                self._stats,
                self._collectors,
                self._patrols_total,
                user_labels=self._user_labels,
            )
        )

    @property
    def stats(self) -> ExporterStats:
        return self._stats

    @property
    def user_labels(self) -> bool:
        """Whether ``user``/``slurm_job`` labels are rendered (from the next update)."""
        return self._user_labels

    @user_labels.setter
    def user_labels(self, on: bool) -> None:
        self._user_labels = on

    def update(self, report: PatrolReport | None, patrols_total: int | None = None) -> bytes:
        """Render ``report`` once; later scrapes get these bytes. Returns them."""
        with self._lock:
            self._report = report
            if patrols_total is not None:
                self._patrols_total = patrols_total
            body = self._render()
            self._body, self._gzip = body, None
        return body

    @property
    def body(self) -> bytes:
        return self._body

    def body_gzip(self) -> bytes:
        """The gzip form of :attr:`body` (compressed once per render, ``mtime`` 0 so the
        same text gives the same bytes)."""
        with self._lock:
            if self._gzip is None:
                self._gzip = gzip.compress(self._body, compresslevel=6, mtime=0)
            return self._gzip
