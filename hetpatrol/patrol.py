"""One patrol: run every collector (bounded in time), judge the records, build the report.

Data flows one way: collectors -> :func:`hetpatrol.judge.judge` -> an immutable
:class:`PatrolReport` that the exporters only read.

Time bounds: each collector runs in its own long-lived worker thread
(:class:`~hetpatrol.bounded.BoundedCollector`) and the patrol waits for each call at
most ``timeout_seconds`` + :data:`HANG_MARGIN_SECONDS`. A collector still running then is
reported ``hung``; no second call is started into it while it stays stuck, and it is
used again once its call returns. The cards it reported last are kept as ``unknown``
with a finding that says why, so a hung tool, a failed collector and a sick card are
three different verdicts.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetpatrol import processes
from hetpatrol.actions import findings as action_findings
from hetpatrol.actions.apply import judge_card, kernel_event_key, state_keys
from hetpatrol.actions.escalation import CARD_MISSING_KEY, Escalation, card_identity
from hetpatrol.actions.fault_events import FaultLog, event_time
from hetpatrol.actions.reboot_history import RebootHistory
from hetpatrol.actions.vocabulary import highest, worst_verdict
from hetpatrol.boot import BootWatch, learn_links, read_boot
from hetpatrol.bounded import HANG_MARGIN_SECONDS, BoundedCollector
from hetpatrol.checks import kernel_events
from hetpatrol.checks import pci_census as census_check
from hetpatrol.checks import stray_process as stray_check
from hetpatrol.checks.card_hung import HungWatch
from hetpatrol.checks.environment import EnvironmentCheck
from hetpatrol.checks.fabric import FabricWatch
from hetpatrol.checks.facts import BootFacts, NodeCheck
from hetpatrol.collector import (
    STATE_ABSENT,
    STATE_DISABLED,
    STATE_FAILED,
    STATE_HUNG,
    STATE_OK,
    Collector,
    CollectorStatus,
    CollectResult,
    discover,
    load_collector,
)
from hetpatrol.config import Config
from hetpatrol.hung_tools import HungToolWatch, evidence
from hetpatrol.hung_tools import scan as scan_hung_tools
from hetpatrol.judge import judge, run_node_check
from hetpatrol.kernel_log import open_kernel_log
from hetpatrol.logs import get_logger
from hetpatrol.pci_census import Census, CensusCard, CensusReader, PciCards
from hetpatrol.report import PatrolReport, encode_line, patrol_summary
from hetpatrol.schema import (
    HEALTH_CRITICAL,
    HEALTH_OK,
    HEALTH_UNKNOWN,
    HEALTH_WARNING,
    SEVERITY_INFO,
    CardRecord,
    Finding,
    rfc3339,
    worst,
)
from hetpatrol.slurm.inventory import GresCheck

log = get_logger("hetpatrol.patrol")


def default_node_checks() -> list[NodeCheck]:
    """The built-in node checks (each is a no-op while its config section is off)."""
    return [GresCheck()]


#: node findings held by their own rule, not by ``_hold_node_findings``: per card
#: (``card_missing``), by the kernel log's window (``xid``, ``kernel_fault``)
_OWN_HOLD = frozenset({"card_missing", "xid", "kernel_fault"})


@functools.cache
def plugin_pci_rules() -> dict[str, PciCards | None]:
    """``{plugin name: its VendorInfo.pci}`` of every installed collector plugin (one
    that fails to import is left out: it is reported when configured). Read once per
    process (the installed plugins do not change under a running daemon; a reload
    storm must not scan the entry points again). Do not modify the returned dict."""
    rules: dict[str, PciCards | None] = {}
    for name, ep in sorted(discover().items()):
        try:
            cls = ep.load()  # type: ignore[attr-defined]
            rules[name] = cls.vendor_info.pci
        except Exception:  # noqa: BLE001, S112 - a broken plugin stops only itself
            continue
    return rules


@functools.cache
def plugin_tools() -> dict[str, str]:
    """``{program: plugin name}`` of the vendor tools every installed plugin declares
    (``VendorInfo.tool_dirs``), read once per process."""
    tools: dict[str, str] = {}
    for name, ep in sorted(discover().items()):
        try:
            cls = ep.load()  # type: ignore[attr-defined]
            for program in cls.vendor_info.tool_dirs:
                tools.setdefault(program, name)
        except Exception:  # noqa: BLE001, S112 - a broken plugin stops only itself
            continue
    return tools


#: the escalation identity of node findings (a hung collector, a missing card)
NODE_IDENTITY = "node"


class Patroller:
    """Owns the collectors for the daemon's life and runs patrols.

    ``replay_dir`` swaps every collector's vendor boundary for recorded output.
    ``enrich_processes`` fills process user and Slurm job from this host (off in replay:
    recorded pids belong to another machine). ``collectors`` gives ready collector
    instances by name instead of loading the plugins the config names (tests, embedding).
    ``node_checks`` replaces the built-in node checks (:func:`default_node_checks`: the
    Slurm GRES check, a no-op while ``slurm.enabled`` is off); they run after the
    thresholds and the recovery hold, before the report is built.
    """

    def __init__(
        self,
        config: Config,
        *,
        replay_dir: Path | None = None,
        enrich_processes: bool | None = None,
        collectors: dict[str, Collector] | None = None,
        node_checks: Sequence[NodeCheck] | None = None,
    ):
        self.config = config
        self.node_checks = list(default_node_checks() if node_checks is None else node_checks)
        # Kernel log (XIDs) and the environment check read this host: not for the
        # scripted collectors of tests and embedders (``collectors`` given).
        kl = config.top[kernel_events.NAME]
        self.kernel_log = (
            open_kernel_log(
                kl.enabled,
                kl.path,
                window_seconds=kl.window_seconds,
                burst_seconds=kl.burst_seconds,
                replay_dir=replay_dir,
            )
            if collectors is None
            else None
        )
        if node_checks is None and collectors is None:
            self.node_checks.append(EnvironmentCheck(replay_dir))
        # PCI census (hetpatrol.pci_census): this host's bus, or the replay's recording;
        # not for the scripted collectors of tests and embedders
        cs = config.top[census_check.NAME]
        self.census_reader: CensusReader | None = None
        self.pci_rules: dict[str, PciCards | None] = {}
        self._census_cards: tuple[Census | None, tuple[CensusCard, ...]] = (None, ())
        self._patrol_census: census_check.PatrolCensus | None = None
        #: plugins that answered absent with no card of theirs on the bus: monotonic
        #: time of that answer, and the answer (they are not asked again for a while)
        self._absent: dict[str, tuple[float, CollectResult]] = {}
        if cs.enabled and collectors is None:
            self.pci_rules = plugin_pci_rules()
            vendor_ids = {v for r in self.pci_rules.values() if r for v in r.vendor_ids}
            self.census_reader = CensusReader(
                cs.root,
                replay_dir=replay_dir,
                interval_seconds=cs.interval_seconds,
                vendor_ids=vendor_ids,
            )
            if node_checks is None:
                # unlisted counts by bus id live with the boot (state file, reload)
                self.node_checks.insert(
                    0,
                    census_check.PciCensusCheck(
                        lambda: self._patrol_census, lambda: self.boot.unlisted_patrols
                    ),
                )
                for check in self.node_checks:
                    if isinstance(check, GresCheck):
                        check.census = lambda: self._patrol_census
        self.replay_dir = replay_dir
        #: where this boot is read (hetpatrol.boot): the host, the replay; not for the
        #: scripted collectors of tests and embedders
        self.boot_root: Path | None = (
            replay_dir if replay_dir is not None else (Path("/") if collectors is None else None)
        )
        #: patrols of this boot and the links learned in it (restored by the daemon)
        self.boot = BootWatch()
        #: whether the post-boot grace applies (the daemon's patrols only: a one-off
        #: patrol, `once` or the Epilog's, is the first of its process at any uptime and
        #: must judge a link down as it is)
        self.post_boot_grace = False
        #: vendor tools and collector threads in D state, patrols in a row (boot_root:
        #: where /proc is read)
        self.hung_tools = HungToolWatch(config.hung_tool_patrols)
        self.enrich_processes = replay_dir is None if enrich_processes is None else enrich_processes
        self.seq = 0
        self._collectors: dict[str, BoundedCollector] = {}
        self._load_errors: dict[str, str] = {}
        self._last_cards: dict[str, list[CardRecord]] = {}
        #: every card each collector listed since start, by identity (see _missing_finding)
        self._seen_cards: dict[str, dict[tuple, CardRecord]] = {}
        #: per collector, the cards missing at the last patrol or listed again since and
        #: still held: identity -> (card, severity of its finding, good patrols since back)
        self._missing: dict[str, dict[tuple, tuple[CardRecord, str, int]]] = {}
        #: critical node findings of the last patrols, held after they go: (check, bus
        #: id of the card it names or None) -> (finding, patrols since it was last seen)
        self._held_node: dict[tuple[str, str | None], tuple[Finding, int]] = {}
        #: the cards gone from their collector's list in this patrol and critical on
        #: their own (missing_patrols in a row, or corroborated): for escalation
        self._gone_now: list[CardRecord] = []
        #: wall time of the last patrol that listed each card, by identity (a census
        #: read before it cannot say the card left the bus)
        self._listed_at: dict[tuple, float] = {}
        #: published verdict and recovery streak of every card, by identity (UUID,
        #: serial, bus id; the position only for a card never read with any of them)
        self._tracked: list[_Tracked] = []
        self._last_collector_state: dict[str, str] = {}
        #: this run's id, on every JSONL line (a reload keeps it: see adopt)
        self.run_id = uuid.uuid4().hex[:12]
        #: escalation counts by card identity (restored from the state file by the daemon)
        self.escalation = Escalation(config.actions.escalation)
        #: the recent card fault events with their jobs, for the state file (restored
        #: from it by the daemon)
        self.fault_log = FaultLog(config.actions.fault_events)
        #: wall time of the first patrol that read the cards' jobs (their allocation and
        #: the jobs of their processes) since this kernel-log reader started: a kernel
        #: record older than it (the ring buffer read again at a start, a record past the
        #: kept fault events) happened while nobody read whose job held the card, so it
        #: gets no jobs (:meth:`_jobs_on_events`); None until that patrol
        self.jobs_known_since: float | None = None
        #: the same moment on CLOCK_MONOTONIC (None: not read, or set from outside)
        self._jobs_known_monotonic: float | None = None
        #: boots each card's critical fault families were seen in (restored and written
        #: by the daemon: reboot-history.json beside the state file)
        self.reboot_history = RebootHistory(config.actions.reboot_survival)
        #: busy-but-stuck clocks by card identity (hetpatrol.checks.card_hung)
        self.hung_watch = HungWatch()
        #: fabric registration streaks by card identity (hetpatrol.checks.fabric)
        self.fabric_watch = FabricWatch()
        #: stray processes by card identity and pid (hetpatrol.checks.stray_process)
        self.stray_watch = stray_check.StrayWatch()
        #: the Slurm jobs of each card (hetpatrol.slurm.card_jobs.CardJobs: refresh(cards),
        #: jobs_of(card)); set by the daemon where Slurm is on, else None
        self.card_jobs: Any = None
        #: the last patrol's cards with the jobs then on each (see _jobs_on_events)
        self._jobs_before: list[tuple[CardRecord, frozenset[str]]] = []
        self._lock = threading.Lock()
        #: the monotonic clock escalation spans are checked against (a test's may follow
        #: the wall times it passes)
        self.monotonic = time.monotonic
        if collectors is not None:
            timeouts = {c.name: c.timeout_seconds for c in config.collectors}
            for name, collector in collectors.items():
                self._collectors[name] = BoundedCollector(name, collector, timeouts.get(name, 10.0))
        else:
            self._setup_collectors()

    def _setup_collectors(self) -> None:
        for cc in self.config.collectors:
            if not cc.enabled:
                continue
            try:
                cls = load_collector(cc.name)
                collector = cls(cc.options, replay_dir=self.replay_dir)
            except KeyError:
                self._load_errors[cc.name] = f"no collector plugin named {cc.name!r} is installed"
                continue
            except Exception as exc:  # noqa: BLE001 - a broken plugin stops only itself
                self._load_errors[cc.name] = f"plugin failed to load: {type(exc).__name__}: {exc}"
                continue
            self._collectors[cc.name] = BoundedCollector(cc.name, collector, cc.timeout_seconds)

    def adopt(self, previous: Patroller) -> None:
        """Carry the running state over from the patroller this one replaces (reload).

        The patrol sequence, the published verdicts with their recovery holds and the
        last known cards go on; so does the kernel-log reader when its settings did not
        change, so events already reported are not read and written a second time.
        """
        self.seq = previous.seq
        self._tracked = previous._tracked
        self._last_cards = previous._last_cards
        self._seen_cards = previous._seen_cards
        self._missing = previous._missing
        self._listed_at = previous._listed_at
        self._held_node = previous._held_node
        self._last_collector_state = previous._last_collector_state
        self._absent = previous._absent
        if (
            self.census_reader is not None
            and previous.census_reader is not None
            and previous.config.top[census_check.NAME] == self.config.top[census_check.NAME]
        ):
            self.census_reader = previous.census_reader  # no re-read of the bus on reload
        self.run_id = previous.run_id
        self.boot = previous.boot
        self.post_boot_grace = previous.post_boot_grace
        self.hung_tools = previous.hung_tools
        self.hung_tools.patrols = self.config.hung_tool_patrols
        self.escalation = previous.escalation
        self.hung_watch = previous.hung_watch
        self.fabric_watch = previous.fabric_watch
        self.stray_watch = previous.stray_watch
        self.card_jobs = previous.card_jobs
        self._jobs_before = previous._jobs_before
        self.escalation.rules = self.config.actions.escalation
        self.fault_log = previous.fault_log
        self.fault_log.rule = self.config.actions.fault_events
        self.reboot_history = previous.reboot_history
        self.reboot_history.rule = self.config.actions.reboot_survival
        if previous.config.top[kernel_events.NAME] == self.config.top[kernel_events.NAME]:
            if self.kernel_log is not None:
                self.kernel_log.close()
            self.kernel_log, previous.kernel_log = previous.kernel_log, None
            # the same reader goes on: what it reads next is new; a new reader reads
            # the ring buffer again, and its older records get no jobs
            self.jobs_known_since = previous.jobs_known_since
            self._jobs_known_monotonic = previous._jobs_known_monotonic

    def restore_cards(self, cards: Iterable[Any]) -> int:
        """Take the cards the last daemon of this boot listed (the state file's card
        lines: ``vendor``, ``index``, ``chip``, ``uuid``, ``serial``, ``bus_id``, ``gres``)
        as listed before, so a card that went while no daemon ran is counted as gone
        (``card_missing``) instead of never seen. Each is taken for the collector named
        as its vendor (the plugins name their cards so), only for a collector that has
        listed nothing in this process yet; a damaged line is left out. The caller checks
        that the state file is of this boot (a reboot is a new enumeration). Returns how
        many cards were taken."""
        taken = 0
        fresh = {name for name in self._collectors if not self._seen_cards.get(name)}
        for line in cards:
            if not isinstance(line, Mapping) or line.get("vendor") not in fresh:
                continue
            index, chip = line.get("index"), line.get("chip")
            if not isinstance(index, int) or isinstance(index, bool):
                continue
            if chip is not None and (not isinstance(chip, int) or isinstance(chip, bool)):
                continue
            ids = {
                k: (v if isinstance(v, str) and v else None)
                for k, v in ((k, line.get(k)) for k in ("uuid", "serial", "bus_id", "gres"))
            }
            rec = CardRecord(vendor=str(line["vendor"]), index=index, chip=chip, **ids)
            self._seen_cards.setdefault(rec.vendor, {})[card_identities(rec)[0]] = rec
            taken += 1
        return taken

    def close(self) -> None:
        for bc in self._collectors.values():
            bc.close()
        if self.kernel_log is not None:
            self.kernel_log.close()

    def run(self) -> PatrolReport:
        """Run one patrol and return its report. Never raises for vendor trouble."""
        with self._lock:
            return self._run()

    def _run(self) -> PatrolReport:
        self.seq += 1
        started = time.time()
        t0 = time.monotonic()
        self._gone_now = []
        if self.boot_root is not None:
            self.boot.note(read_boot(self.boot_root))
        skipped = self._read_census(t0)
        started_now = {
            name: bc.start() for name, bc in self._collectors.items() if name not in skipped
        }
        results: list[CollectResult] = []
        for name, bc in self._collectors.items():
            if name in skipped:
                results.append(skipped[name])
                continue
            deadline = t0 + bc.timeout_seconds + HANG_MARGIN_SECONDS
            result = bc.wait(deadline, started_now[name])
            results.append(result)
            if result.state == STATE_ABSENT:
                self._absent[name] = (t0, result)
            else:
                self._absent.pop(name, None)
        for name, error in self._load_errors.items():
            results.append(CollectResult(name, state=STATE_FAILED, error=error))
        disabled = [c.name for c in self.config.collectors if not c.enabled]

        ts = rfc3339(time.time())
        cards: list[CardRecord] = []
        statuses: list[CollectorStatus] = []
        node_findings: list[Finding] = []
        changes: list[dict[str, Any]] = []
        for result in results:
            records = self._records_for(result)
            for rec in records:
                rec.node = self.config.node
                rec.ts = ts
                if self.enrich_processes:
                    processes.enrich(rec.processes)
                rec.drop_implausible()
                judge(rec, self.config, self._boot_facts(rec))
                if self.boot.boot_id is not None:
                    learn_links(self.boot, card_identity(rec), rec.links)
            cards.extend(records)
            node_findings.extend(result.node_findings)
            if result.state in (STATE_FAILED, STATE_HUNG) and not records:
                check = "collector_hung" if result.state == STATE_HUNG else "collector_failed"
                node_findings.append(
                    Finding(check, HEALTH_UNKNOWN, f"{result.collector}: {result.error}")
                )
            statuses.append(
                CollectorStatus.bounded(  # the raw output cut to an excerpt, size and hash
                    result.collector,
                    result.state,
                    len(records),
                    result.duration_seconds,
                    result.error,
                    result.raw,
                )
            )
            prev = self._last_collector_state.get(result.collector)
            if prev != result.state:
                changes.append({"collector": result.collector, "from": prev, "to": result.state})
                why = {"error": result.error} if result.error else {}
                log.info(
                    "collector_state",
                    collector=result.collector,
                    previous=prev or "new",
                    state=result.state,
                    **why,
                )
            self._last_collector_state[result.collector] = result.state
        statuses.extend(CollectorStatus(n, STATE_DISABLED, 0, 0.0) for n in disabled)
        # the cards' processes were read above, their allocation just below: the first
        # such read marks where the jobs of kernel records begin to be known
        if self.jobs_known_since is None:
            self.jobs_known_since = time.time()
            self._jobs_known_monotonic = time.monotonic()
        self.hung_watch.observe(cards, self.config, self.monotonic())
        self.fabric_watch.observe(cards, self.config, lambda rec: self._boot_facts(rec).patrols)
        if self.card_jobs is not None:
            # the IDX order of GRES names of several types: the last GRES check's (the
            # registration is read every registration_cache_seconds; jobguard checks it
            # against these cards)
            orders = [c.order for c in self.node_checks if isinstance(c, GresCheck)]
            self.card_jobs.gres_order = orders[0] if orders else None
            self.card_jobs.refresh(cards)
            self.stray_watch.observe(
                cards, self.card_jobs.stray_jobs_of, self.config.top[stray_check.NAME]
            )
            if self.card_jobs.stray_note and self.config.top[stray_check.NAME].enabled:
                node_findings.append(
                    Finding("stray_process_unjudged", SEVERITY_INFO, self.card_jobs.stray_note)
                )
            if self.card_jobs.error:
                node_findings.append(
                    Finding(
                        "card_jobs_unread",
                        SEVERITY_INFO,
                        f"the Slurm jobs of the cards: {self.card_jobs.error}",
                    )
                )

        kernel = kernel_events.patrol_kernel_log(
            self.kernel_log,
            cards,
            self.config.top[kernel_events.NAME],
            node=self.config.node,
            seq=self.seq,
            ts_format=rfc3339,
            enrich_processes=self.enrich_processes,
            boot_time=self.boot.boot_time if self.boot.boot_id is not None else None,
        )
        node_findings.extend(kernel.findings)
        # a card no longer listed, judged with this patrol's kernel log and census
        codes = action_findings.vendor_tables().off_bus_codes
        for bus_id, what in kernel_events.off_bus_events(kernel.snapshot, codes):
            self.boot.note_off_bus(bus_id, what)
        for result in results:
            missing = self._missing_finding(result)
            if missing is not None:
                node_findings.append(missing)
        self._jobs_on_events(cards, kernel.events)
        for event in kernel.events:  # the boot it was read in: with kmsg_seq, the record
            event["boot_id"] = self.boot.boot_id
        now = time.time()
        self.fault_log.note_clock(now, self.monotonic())  # a clock step ages no event
        again = self.fault_log.observe(kernel.events, self.boot.boot_id, now, self.run_id)
        if again:  # records already kept, read again (a restart): no second line, no count
            seen = {id(e) for e in again}
            summary = {**(kernel.summary or {}), "reread_events": len(again)}
            summary["new_events"] -= len(again)
            kernel = dataclasses.replace(
                kernel, events=tuple(e for e in kernel.events if id(e) not in seen), summary=summary
            )
        changes.extend(self._apply_recovery(cards))
        check_data: dict[str, Any] = {}
        for check in self.node_checks:
            result = run_node_check(check, cards, statuses, self.config)
            check_data[check.name] = result.data if result is not None else None
            if result is not None:
                node_findings.extend(result.findings)
        check_data["kernel_log"] = kernel.summary
        if self.boot_root is not None:
            check_data["boot"] = self.boot.summary()
        if not cards and not any(
            f.severity in (HEALTH_CRITICAL, HEALTH_UNKNOWN) for f in node_findings
        ):
            # a patrol that found nothing to patrol is no proof of health
            states = ", ".join(f"{s.name} {s.state}" for s in statuses) or "no collector"
            node_findings.append(
                Finding(
                    "no_cards",
                    HEALTH_UNKNOWN,
                    f"no card was found on this node ({states}): nothing was patrolled",
                )
            )
        self._name_hung_tools(node_findings)
        node_findings = self._hold_node_findings(node_findings)
        health = worst(*(c.health for c in cards), *(f.severity for f in node_findings))
        node_action = self._assign_actions(cards, node_findings, kernel.events, time.time())
        finished = time.time()
        summary = patrol_summary(
            self.seq,
            self.config.node,
            started,
            finished,
            cards,
            statuses,
            node_findings,
            changes,
            health,
            check_data,
            action=node_action,
        )
        return PatrolReport(
            seq=self.seq,
            node=self.config.node,
            started=started,
            finished=finished,
            cards=tuple(cards),
            collectors=tuple(statuses),
            node_findings=tuple(node_findings),
            changes=tuple(changes),
            health=health,
            node_checks=check_data,
            card_lines=tuple(encode_line(self._stamped(c.to_dict())) for c in cards),
            patrol_line=encode_line(self._stamped(summary)),
            event_lines=tuple(encode_line(self._stamped(e)) for e in kernel.events),
            run_id=self.run_id,
            kernel_log=kernel.snapshot,
            census=self._patrol_census.census if self._patrol_census is not None else None,
            action=node_action,
            escalation=self.escalation.to_dict(),
            fault_events=self.fault_log.json_text(),
        )

    def _name_hung_tools(self, node_findings: list[Finding]) -> None:
        """Name the vendor tools and collector threads in D state for
        ``hung_tool_patrols`` patrols in a row (:mod:`hetpatrol.hung_tools`) in the
        ``collector_hung`` finding of their collector, or in a ``collector_hung`` node
        finding of their own when no collector says it is hung (a tool root started, stuck
        in the same driver; another user's process is never counted: its comm is text
        that user chose, :mod:`hetpatrol.hung_tools`); either feeds the ``check:collector_hung``
        escalation to ``reboot_node``. On the host ``/proc`` is scanned only in a patrol
        with a hung or failed collector, or after a scan that found a task in D (then
        every patrol, so the count is one of patrols in a row); a replay's recorded
        ``proc/`` is read every patrol."""
        if self.boot_root is None:
            return
        troubled = any(
            f.check in ("collector_hung", "collector_failed") for f in node_findings
        ) or any(s in (STATE_HUNG, STATE_FAILED) for s in self._last_collector_state.values())
        if not (troubled or self.hung_tools.candidates or self.replay_dir is not None):
            # all collectors answered and no task was in D at the last scan: no scan of
            # every process on the host (about 0.2 ms each) in a healthy patrol
            self.hung_tools.observe(())
            return
        threads = {
            tid: name for name, bc in self._collectors.items() if (tid := bc.worker_tid) is not None
        }
        stuck = self.hung_tools.observe(scan_hung_tools(self.boot_root, plugin_tools(), threads))
        if not stuck:
            return
        named = set()
        for i, f in enumerate(node_findings):
            if f.check != "collector_hung":
                continue
            mine = [t for t in stuck if f.message.startswith(f"{t.owner}:")]
            if mine:
                named.update(id(t) for t in mine)
                node_findings[i] = Finding(
                    f.check,
                    f.severity,
                    f"{f.message}; {evidence(mine)}",
                    value={"stuck": [t.to_dict() for t in mine]},
                    threshold=self.hung_tools.patrols,
                )
        rest = [t for t in stuck if id(t) not in named]
        if rest:
            node_findings.append(
                Finding(
                    "collector_hung",
                    HEALTH_UNKNOWN,
                    "vendor tool(s) " + evidence(rest),
                    value={"stuck": [t.to_dict() for t in rest]},
                    threshold=self.hung_tools.patrols,
                )
            )

    def _boot_facts(self, rec: CardRecord) -> BootFacts:
        """The card's place in this boot for its checks (none while no boot id is read:
        a replay without one, the scripted collectors of tests; the patrols of the boot
        only with ``post_boot_grace``)."""
        if self.boot.boot_id is None:
            return BootFacts()
        return BootFacts(
            self.boot.patrols if self.post_boot_grace else 0,
            self.boot.learned_links.get(card_identity(rec), {}),
        )

    def _jobs_on_events(self, cards: Sequence[CardRecord], events: Sequence[Any]) -> None:
        """Each card fault event read this patrol gets ``jobs``: the Slurm jobs on its
        card then (the card's allocation, where read, and the jobs of its processes),
        matched by UUID or bus id, else by the vendor and index the kernel-log reader gave
        the event (a GPU lost before this patrol read its identity); with them the jobs
        on the same card in the last patrol. A record first read now was written since
        the last patrol read the log, and the job it hit has often ended before this
        read (the fault kills its processes, Slurm removes the job's cgroup, the next job
        may be given the card at once): without the last patrol's jobs the fault would
        be credited to the next job alone. ``None`` when the card is neither one of this
        patrol's nor of the last one's (a card no longer listed: its last patrol's
        jobs). The last patrol's jobs are the local ones only (its map and its
        processes): no query of slurmctld is made for them.

        ``None`` too, with ``jobs_unknown`` saying why, for a record older than what this
        daemon can know: from before :attr:`jobs_known_since` by its own time (a
        ``/dev/kmsg`` record's stamp: the ring buffer read again by a restarted daemon,
        a record past the kept fault events), or in a text log before its first read
        (the reader marked it). The jobs on the card now may be a later job's. A record
        kept in the state file keeps the jobs of its first read
        (:meth:`hetpatrol.actions.fault_events.FaultLog.observe`)."""
        cards = list(cards)
        now = [_local_jobs(self.card_jobs, c) for c in cards]
        before, self._jobs_before = self._jobs_before, list(zip(cards, now, strict=True))
        earlier_cards = [c for c, _jobs in before]
        since = self.jobs_known_since
        mono = getattr(self, "_jobs_known_monotonic", None)
        if since is not None and mono is not None:
            # that moment on the wall clock of now: the kmsg reader times a record by the
            # wall clock of its read (now, less the record's age on CLOCK_MONOTONIC), so
            # a step of the wall clock since the first read (an RTC ahead at boot that
            # NTP steps back) moves the records' times and must move this one too, or
            # every fault for as long as the step would get no jobs
            since = time.time() - (time.monotonic() - mono)
        for event in events:
            if event.get("jobs_unknown"):  # the reader could not time it
                event["jobs"] = None
                continue
            when = event_time(event.get("ts"))
            # ``ts`` is cut to the millisecond: one in the same millisecond is not older
            if since is not None and when is not None and when < since - 0.001:
                event["jobs"] = None
                event["jobs_unknown"] = (
                    f"older than this daemon's first read of the cards' jobs ({rfc3339(since)})"
                )
                continue
            card = _event_card(event, cards)
            earlier = _event_card(event, earlier_cards)
            prior = next((j for c, j in before if c is earlier), frozenset())
            if card is None:
                event.setdefault("jobs", sorted(prior) if earlier is not None else None)
                continue
            jobs = {p.job_id for p in card.processes if p.job_id} | prior
            unread = False
            if self.card_jobs is not None:
                # fault_jobs_of: read for the event where no per-patrol map exists
                ask = getattr(self.card_jobs, "fault_jobs_of", self.card_jobs.jobs_of)
                held = ask(card)
                unread = held is None
                jobs |= held or set()
            if event.get("job_id"):
                jobs.add(str(event["job_id"]))
            if unread and not jobs:
                # the card's allocation could not be read (card_jobs_unread says why): its
                # jobs are unknown, never "none on the card" (jobs: [])
                event["jobs"] = None
                event["jobs_unknown"] = JOBS_UNREAD
                continue
            event["jobs"] = sorted(jobs)

    def _read_census(self, now: float) -> dict[str, CollectResult]:
        """This patrol's census (re-read by the reader at its own interval), kept for the
        census and GRES checks; and the collectors not to ask this patrol: each whose
        last answer was ``absent`` and of whose vendor the bus holds no card, until
        ``pci_census.absent_recheck_seconds`` have passed since that answer. (A missing
        library or tool is then no dlopen and no spawn per patrol; a card of its vendor
        appearing on the bus, or the recheck, asks it again.) Without a readable census
        every collector is asked every patrol."""
        if self.census_reader is None:
            return {}
        census = self.census_reader.get()
        if self._census_cards[0] is not census:
            self._census_cards = (census, census.cards(self.pci_rules))
        cards = self._census_cards[1]
        enabled = frozenset(c.name for c in self.config.collectors if c.enabled)
        self._patrol_census = census_check.PatrolCensus(
            census, cards, enabled, frozenset(self.pci_rules)
        )
        if not census.known:
            return {}
        recheck = self.config.top[census_check.NAME].absent_recheck_seconds
        on_bus = {c.plugin for c in cards}
        skipped: dict[str, CollectResult] = {}
        for name, (since, result) in self._absent.items():
            if name in on_bus or self.pci_rules.get(name) is None or now - since >= recheck:
                continue
            why = f"{result.error}; " if result.error else ""
            skipped[name] = CollectResult(
                name,
                state=STATE_ABSENT,
                error=f"{why}no {name} card on the PCI bus: asked again in "
                f"{max(0.0, recheck - (now - since)):.0f} s or when one appears",
            )
        return skipped

    def _stamped(self, line: dict[str, Any]) -> dict[str, Any]:
        """``line`` with this run's id after its ``schema`` key (every JSONL line carries
        it: ``seq`` starts at 1 again with each start, the run id tells the runs apart)."""
        out: dict[str, Any] = {}
        for key, value in line.items():
            out[key] = value
            if key == "schema":
                out["run_id"] = self.run_id
        out.setdefault("run_id", self.run_id)
        return out

    def _assign_actions(
        self,
        cards: Sequence[CardRecord],
        node_findings: Sequence[Finding],
        events: Sequence[Mapping[str, Any]],
        now: float,
    ) -> str:
        """Give every finding, card and the node its action (:mod:`hetpatrol.actions`):
        the kernel-log faults first read in this patrol and the keys each card holds feed
        the escalation (by card identity, never position), then each card's action is
        its findings' highest, with the config's overrides, raised by escalation in
        force. Returns the node's action: the highest of its cards' and node findings'."""
        settings = self.config.actions
        levels = action_findings.bundled_levels()
        esc = self.escalation
        # a step of the wall clock moves the stored times with it: spans stay monotonic
        esc.note_clock(now, self.monotonic())
        for event in events:  # a fault read once counts once (not read again on reload)
            if event.get("in_window") is False or not (event.get("uuid") or event.get("bus_id")):
                continue
            if event.get("nvlink_action") in ("IGNORE", "XID_154_EVAL"):
                continue  # the catalog's decode needs no action: no repeat to escalate
            if event.get("jobs_unknown") == kernel_events.JOBS_UNKNOWN_EARLIER:
                continue  # in a text log before its first read, of unknown age
            key = kernel_event_key(event.get("xid"), event.get("reason"))
            esc.observe_event(card_identity(event), key, _epoch(event.get("ts"), now), now)
        for rec in cards:
            esc.observe_present(card_identity(rec), state_keys(rec.findings, levels), now)
        for gone in self._gone_now:  # a card gone from its list holds card:missing
            esc.observe_present(card_identity(gone), {CARD_MISSING_KEY}, now)
        esc.observe_present(NODE_IDENTITY, state_keys(node_findings, levels), now)
        esc.decay(now)
        if self.boot.boot_id is not None:  # a fault family critical in this boot, by card
            self.reboot_history.observe(
                [
                    (
                        card_identity(c),
                        {f.check for f in c.findings if f.severity == HEALTH_CRITICAL},
                    )
                    for c in cards
                ],
                self.boot.boot_id,
                now,
                names={
                    card_identity(c): [
                        n for n in (c.bus_id and c.bus_id.lower(), c.serial, c.uuid) if n
                    ]
                    for c in cards
                },
            )
        verdicts = []
        for items, identity, rec in [
            *((c.findings, card_identity(c), c) for c in cards),
            (node_findings, NODE_IDENTITY, None),
        ]:
            verdict, per = judge_card(
                items,
                identity=identity,
                escalation=esc,
                now=now,
                overrides=settings.overrides,
                levels=levels,
            )
            for finding, v in zip(items, per, strict=True):
                finding.action = v.action
            survived = self.reboot_history.verdict(identity) if rec is not None else None
            if survived is not None:  # the same fault back after N reboots: replace it
                verdict = worst_verdict([verdict, survived])
            if rec is not None:
                rec.action, rec.action_source, rec.action_code, rec.action_reason = verdict
            verdicts.append(verdict.action)
        return highest(verdicts)

    def _records_for(self, result: CollectResult) -> list[CardRecord]:
        """Fresh records, or the last known cards marked unknown when the collector failed."""
        if result.state == STATE_OK:
            records = list(result.records)
            _recover_identity(records, self._last_cards.get(result.collector, []))
            self._last_cards[result.collector] = [r.identity() for r in records]
            return records
        if result.state in (STATE_FAILED, STATE_HUNG):
            check = "collector_hung" if result.state == STATE_HUNG else "collector_failed"
            kept = []
            for ident in self._last_cards.get(result.collector, []):
                rec = ident.identity(read_ok=False)
                rec.add_error(result.collector, result.error or result.state)
                rec.findings.append(
                    Finding(check, HEALTH_UNKNOWN, f"{result.collector}: {result.error}")
                )
                kept.append(rec)
            return kept
        return []

    def _missing_finding(self, result: CollectResult) -> Finding | None:
        """``card_missing`` when a card this collector listed before is no longer listed
        (an NPU gone from ``npu-smi info``, a GPU gone from NVML's count). Cards are
        matched by UUID, serial or bus id (indexes may shift when one goes).

        One patrol's short list is no proof the card is gone (a card reset or a driver
        reload in progress, a partial answer of the tool): each card gone is counted,
        by its identity (:func:`missing_key`), in the patrols in a row its collector
        answered without it (:attr:`hetpatrol.boot.BootWatch.missing_cards`: kept with
        the boot, restored by a daemon restarted within it, reset by a new boot), and is
        ``critical`` (``reboot_node``) only at ``missing_patrols`` (3), or at once when
        another signal says the same of that card (:func:`missing_evidence`: the kernel
        log's off-the-bus event on its bus id in this boot, or the PCI census without
        its bus id); before, ``warning`` ("1 of 3 patrols", ``watch``). A patrol whose
        output was itself damaged (``result.error`` on an ok collector: a dropped row is
        no proof) makes it ``unknown`` and keeps its count without counting; a collector
        that did not answer ok keeps everything as it was. A card listed again starts
        its count again.

        A card that was critical and is listed again is held as it was (the same
        finding, the same severity, so the same action and drain) until
        ``recovery_patrols`` patrols in a row have listed it, as a bad card's verdict is
        held (``_apply_recovery``): a card that drops out now and then does not drain and
        resume the node each time; gone again within that hold it is critical at once.
        A warning ends when the card is listed again. The hold follows the card's
        identity, never its position."""
        if result.state != STATE_OK:
            return None
        collector = result.collector
        store = self.boot.missing_cards
        seen = dict(self._seen_cards.get(collector, {}))
        for entry in store.values():  # a daemon restarted within the boot: its cards
            if entry.get("collector") == collector:
                card = _missing_record(entry)
                ids = set(card_identities(card))
                if not any(ids & set(card_identities(c)) for c in seen.values()):
                    seen[card_identities(card)[0]] = card
        gone = cards_no_longer_listed(result.records, seen.values())
        # this patrol's cards, by what names them now, and the ones gone, kept
        self._seen_cards[collector] = {
            card_identities(r)[0]: r.identity() for r in result.records
        } | {card_identities(c)[0]: c for c in gone}
        now = time.time()
        for r in result.records:
            self._listed_at[card_identities(r)[0]] = now
        # only the cards some collector still tracks (listed, or gone and counted): a
        # card read under a new first identity (a new UUID on its bus id: a swapped card)
        # must not leave its old key here for the life of the daemon
        tracked = {k for cards in self._seen_cards.values() for k in cards}
        if len(self._listed_at) > len(tracked):
            self._listed_at = {k: t for k, t in self._listed_at.items() if k in tracked}
        present = {i for r in result.records for i in card_identities(r)}
        need = self.config.recovery_patrols
        before = self._missing.get(collector, {})
        census = self._patrol_census.census if self._patrol_census is not None else None
        counts: dict[str, int] = {}
        evidence: dict[str, str] = {}
        held: set[str] = set()
        for c in gone:
            key = missing_key(c)
            entry = store.get(key) or {}
            counts[key] = int(entry.get("patrols", 0)) + (0 if result.error else 1)
            was = before.get(card_identities(c)[0], (None, entry.get("severity"), 0))[1]
            if was == HEALTH_CRITICAL:
                held.add(key)
            why = missing_evidence(
                c, census, self.boot.off_bus, listed_at=self._listed_at.get(card_identities(c)[0])
            )
            if why is not None:
                evidence[key] = why
        verdicts = missing_verdicts(
            gone,
            result.error,
            patrols=self.config.missing_patrols,
            counts=counts,
            evidence=evidence,
            held=held,
        )
        # the cards really missing (counted out or corroborated) hold card:missing
        self._gone_now.extend(v.card for v in verdicts if v.confirmed)
        for key in [k for k, e in store.items() if e.get("collector") == collector]:
            del store[key]
        for v in verdicts:
            if v.patrols > 0:
                store[v.key] = missing_entry(v.card, collector) | {
                    "patrols": v.patrols,
                    "severity": v.severity,
                }
        gone_ids = {card_identities(c)[0] for c in gone}
        back: list[tuple[CardRecord, str, int]] = []  # critical, listed again, still held
        for ident, (card, was, streak) in before.items():
            if ident in gone_ids or not present.intersection(card_identities(card)):
                continue
            if was == HEALTH_WARNING:
                continue  # never confirmed: listed again, it is over
            if streak + 1 < need:
                back.append((card, was, streak + 1))
        self._missing[collector] = {
            card_identities(v.card)[0]: (v.card, v.severity, 0) for v in verdicts
        } | {card_identities(c)[0]: (c, was, streak) for c, was, streak in back}
        if not gone and not back:
            return None
        return _missing_finding(collector, verdicts, back, need, self.config.missing_patrols)

    def _hold_node_findings(self, findings: list[Finding]) -> list[Finding]:
        """``findings`` with each critical node finding of an earlier patrol that is no
        longer raised kept (same check, severity and message, "held" said) until
        ``recovery_patrols`` patrols in a row have gone without it: the hysteresis a
        bad card's verdict has (``_apply_recovery``), for the node findings that drain.
        Not for ``card_missing`` (held per card, by identity: ``_missing_finding``) nor
        the kernel log's (held by their window). A finding that names one card by its
        PCI bus id (``pci_unwatched``) is held per bus id: another card's finding of the
        same check neither ends nor replaces its hold."""
        need = self.config.recovery_patrols
        raised = {_hold_key(f) for f in findings}
        out = list(findings)
        held: dict[tuple[str, str | None], tuple[Finding, int]] = {}
        for key, (finding, streak) in self._held_node.items():
            check = key[0]
            if key in raised:
                continue  # raised again (critical: held anew below), or no longer critical
            streak += 1
            if streak < need:
                out.append(
                    Finding(
                        check,
                        finding.severity,
                        f"{finding.message} (not raised for {streak} of {need} patrols: held)",
                        value=finding.value,
                        threshold=finding.threshold,
                    )
                )
                held[key] = (finding, streak)
        for f in findings:
            if f.severity == HEALTH_CRITICAL and f.check not in _OWN_HOLD:
                held[_hold_key(f)] = (f, 0)
        self._held_node = held
        return out

    def _apply_recovery(self, cards: Iterable[CardRecord]) -> list[dict[str, Any]]:
        """Hold a card at its bad verdict until ``recovery_patrols`` good patrols in a row.

        Verdicts and streaks follow the card, not its index: a card is matched to the
        one of the last patrol that shares its UUID, serial or bus id (the position
        only when neither was ever read with any). When a GPU drops out of the
        enumeration the GPUs after it move down one index; each keeps its own verdict,
        and the one gone is reported as such (``to: null``) under its last name."""
        need = self.config.recovery_patrols
        changes: list[dict[str, Any]] = []
        remaining = list(self._tracked)
        tracked: list[_Tracked] = []
        for rec in cards:
            ids = frozenset(_track_ids(rec))
            prev_track = next((t for t in remaining if t.ids & ids), None)
            if prev_track is not None:
                remaining.remove(prev_track)
            prev = prev_track.health if prev_track is not None else None
            streak = 0
            if rec.health == HEALTH_OK and prev not in (None, HEALTH_OK):
                assert prev_track is not None
                streak = prev_track.streak + 1
                if streak < need:
                    rec.health = prev
                    rec.findings.append(
                        Finding(
                            "recovering",
                            prev,
                            f"good for {streak} of {need} patrols needed before ok",
                            value=streak,
                            threshold=need,
                        )
                    )
            track = _Tracked(ids, _card_name(rec), rec.health, streak, rec.uuid, rec.bus_id)
            if prev != rec.health:
                changes.append(track.change(prev, rec.health))
            tracked.append(track)
        for gone in remaining:
            changes.append(gone.change(gone.health, None))
        self._tracked = tracked
        return changes


@dataclass(frozen=True)
class _Tracked:
    """The published verdict of one card across patrols (see ``_apply_recovery``)."""

    ids: frozenset[tuple]
    name: str
    health: str
    streak: int
    uuid: str | None
    bus_id: str | None

    def change(self, before: str | None, after: str | None) -> dict[str, Any]:
        """A ``changes`` entry: the card's name (``vendor/index[/chip]``), UUID and bus
        id (null when never read), verdict before and after (null: not listed)."""
        return {
            "card": self.name,
            "uuid": self.uuid,
            "bus_id": self.bus_id,
            "from": before,
            "to": after,
        }


#: a PCI bus id as a node finding names one card in ``value`` (``0000:e8:00.0``)
_BUS_ID_VALUE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _hold_key(f: Finding) -> tuple[str, str | None]:
    """What a critical node finding is held by (``_hold_node_findings``): its check, and
    the bus id of the one card it names (``pci_unwatched``'s ``value``), else None."""
    value = f.value
    if isinstance(value, str) and _BUS_ID_VALUE.match(value):
        return (f.check, value)
    return (f.check, None)


def _missing_name(c: CardRecord) -> str:
    """``vendor/index[/chip] (bus id)`` of a card in a ``card_missing`` message."""
    return (
        f"{c.vendor}/{c.index}"
        + (f"/{c.chip}" if c.chip is not None else "")
        + (f" ({c.bus_id})" if c.bus_id else "")
    )


def missing_key(c: CardRecord) -> str:
    """The key a card gone from its collector's list is counted by: its escalation
    identity (``uuid:...``, else ``serial:...``, else ``bus:...``, else its position;
    :func:`hetpatrol.actions.escalation.card_identity`), with ``/chip N`` for a chip of
    a multi-chip card named by its card's serial or bus id."""
    key = card_identity(c)
    if c.chip is not None and not key.startswith(("pos:", "uuid:")):
        key += f"/chip {c.chip}"
    return key


def missing_entry(c: CardRecord, collector: str) -> dict[str, Any]:
    """A card gone from ``collector``'s list as :attr:`BootWatch.missing_cards` keeps it
    (the state file): what names it, as last listed."""
    return {
        "collector": collector,
        "vendor": c.vendor,
        "index": c.index,
        "chip": c.chip,
        "uuid": c.uuid,
        "serial": c.serial,
        "bus_id": c.bus_id,
        "gres": c.gres,
    }


def _missing_record(entry: Mapping[str, Any]) -> CardRecord:
    """The card of a :func:`missing_entry` (restored from the state file)."""
    return CardRecord(
        vendor=str(entry["vendor"]),
        index=int(entry["index"]),
        chip=entry.get("chip"),
        uuid=entry.get("uuid"),
        serial=entry.get("serial"),
        bus_id=entry.get("bus_id"),
        gres=entry.get("gres"),
    )


def missing_evidence(
    card: CardRecord,
    census: Census | None,
    off_bus: Mapping[str, str],
    *,
    listed_at: float | None = None,
) -> str | None:
    """What corroborates ``card``'s tool no longer listing it, or None: a second signal,
    independent of that tool's answer, about the same card by its PCI bus id:

    - the kernel log said in this boot that the card there left the bus (``off_bus``:
      bus id -> ``"xid 79"``; :attr:`hetpatrol.boot.BootWatch.off_bus`, filled from the
      events the plugins' ``VendorActions.off_bus_codes`` name);
    - the PCI census (read, ``census.read_at``, after the patrol that last listed the
      card, ``listed_at`` in seconds since the epoch; None: not known, any read) does not
      hold its bus id: the kernel removed the function (a surprise removal, a link that
      went down for good, an ``echo 1 > .../remove``).

    A card without a plain bus id (none read, or a masked one as ``0000:xx:00.0``) has
    no such signal. Never raises."""
    bus = card.bus_id
    if not bus or not _BUS_ID_VALUE.match(bus):
        return None
    what = off_bus.get(bus)
    if what:
        return f"the kernel log has {what} for {bus} in this boot"
    if (
        census is not None
        and census.known
        and (listed_at is None or census.read_at >= listed_at)
        and all(f.bus_id != bus for f in census.functions)
    ):
        return f"{bus} is gone from the PCI bus"
    return None


@dataclass(frozen=True)
class MissingVerdict:
    """One card gone from its collector's list, judged (:func:`missing_verdicts`):
    ``key`` (:func:`missing_key`), ``patrols`` in a row not listed (this one counted,
    unless the output was damaged), ``severity``, ``note`` (the message's words about
    it) and ``confirmed`` (really missing: counted out or corroborated; what the
    ``card:missing`` escalation key counts)."""

    card: CardRecord
    key: str
    patrols: int
    severity: str
    note: str
    confirmed: bool


def missing_verdicts(
    gone: Sequence[CardRecord],
    error: str | None,
    *,
    patrols: int = 3,
    counts: Mapping[str, int] | None = None,
    evidence: Mapping[str, str] | None = None,
    held: Iterable[str] = (),
) -> list[MissingVerdict]:
    """The one rule of a card no longer listed, for the daemon's patrols and the
    Epilog's alike. ``gone``: the cards (:func:`cards_no_longer_listed`); ``error``: the
    collector's error on an ok answer (damaged output); ``counts``: card key -> patrols
    in a row not listed, this one included (default 1: a single patrol); ``evidence``:
    card key -> what corroborates it (:func:`missing_evidence`); ``held``: the keys of
    cards critical before and not yet listed again ``recovery_patrols`` times.

    ``unknown`` for a damaged output; else ``critical`` at ``patrols`` in a row, with
    evidence, or held; else ``warning`` ("k of N patrols")."""
    counts = counts or {}
    evidence = evidence or {}
    held = set(held)
    out = []
    for c in gone:
        key = missing_key(c)
        n = counts.get(key, 0 if error else 1)
        why = evidence.get(key)
        if error:
            severity, confirmed = HEALTH_UNKNOWN, False
            note = "(this output was damaged: not counted)"
        elif n >= patrols:
            severity, confirmed = HEALTH_CRITICAL, True
            note = f"not listed in {n} patrols in a row (missing_patrols {patrols})"
        elif why is not None:
            severity, confirmed = HEALTH_CRITICAL, True
            note = f"{n} of {patrols} patrols, and {why}"
        elif key in held:
            severity, confirmed = HEALTH_CRITICAL, False
            note = "gone again before it was listed long enough to end its hold"
        else:
            severity, confirmed = HEALTH_WARNING, False
            note = f"{n} of {patrols} patrols"
        out.append(MissingVerdict(c, key, n, severity, note, confirmed))
    return out


def _missing_finding(
    collector: str,
    verdicts: Sequence[MissingVerdict],
    back: Sequence[tuple[CardRecord, str, int]],
    recovery: int,
    patrols: int,
) -> Finding:
    """The ``card_missing`` node finding of one collector: its cards gone (``verdicts``)
    and those listed again but still held (``back``: card, severity, patrols listed)."""
    parts = []
    if verdicts:
        names = ", ".join(f"{_missing_name(v.card)} {v.note}" for v in verdicts)
        parts.append(f"{len(verdicts)} card(s) listed before no longer listed: {names}")
        if any(v.severity == HEALTH_WARNING for v in verdicts):
            parts.append(
                f"critical (action reboot_node) only after {patrols} patrols in a row, or "
                "at once when the kernel log or the PCI bus says the card left: one short "
                "list may be a card reset or a driver reload in progress, and a single "
                "patrol, as hetpatrol once or the Epilog's, never drains for it"
            )
    if back:
        names = ", ".join(f"{_missing_name(c)} {n} of {recovery}" for c, _w, n in back)
        parts.append(
            f"{len(back)} card(s) listed again, held until listed {recovery} patrols "
            f"in a row: {names}"
        )
    return Finding(
        "card_missing",
        worst(*(v.severity for v in verdicts), *(w for _c, w, _n in back)),
        f"{collector}: " + "; ".join(parts),
        value=len(verdicts) + len(back),
        threshold=patrols,
    )


def _card_name(rec: CardRecord) -> str:
    return f"{rec.vendor}/{rec.index}" + (f"/{rec.chip}" if rec.chip is not None else "")


def cards_no_longer_listed(
    records: Iterable[CardRecord], seen: Iterable[CardRecord]
) -> list[CardRecord]:
    """The cards of ``seen`` that ``records`` (one ok collector's patrol) no longer list:
    none of their UUID, serial or bus id is read again, and no card read without any
    identity (a garbled row) stands at their position. The one rule of "a card no longer
    listed", for the daemon's patrols and the Epilog's alike."""
    present: set[tuple] = set()
    anonymous = set()  # keys of cards read without any identity (a garbled row)
    for rec in records:
        ids = card_identities(rec)
        present.update(ids)
        if ids[0][0] == "key":
            anonymous.add(rec.key)
    return [
        c for c in seen if not present.intersection(card_identities(c)) and c.key not in anonymous
    ]


def card_missing_finding(
    collector: str,
    gone: Sequence[CardRecord],
    error: str | None,
    *,
    patrols: int = 3,
    counts: Mapping[str, int] | None = None,
    evidence: Mapping[str, str] | None = None,
) -> Finding | None:
    """The ``card_missing`` node finding for ``gone`` (see :func:`cards_no_longer_listed`)
    by the daemon's rule (:func:`missing_verdicts`): ``critical`` (then ``reboot_node``,
    :mod:`hetpatrol.actions.findings`) at ``patrols`` patrols in a row (``counts``:
    card key -> patrols, this one included; default 1) or with ``evidence`` (card key
    -> what corroborates it, :func:`missing_evidence`), else ``warning`` (``watch``);
    ``unknown`` when the collector's output this patrol was itself damaged (``error`` on
    an ok collector: a dropped row is no proof the card is gone); None when none is
    gone."""
    if not gone:
        return None
    verdicts = missing_verdicts(gone, error, patrols=patrols, counts=counts, evidence=evidence)
    return _missing_finding(collector, verdicts, (), 0, patrols)


def _track_ids(rec: CardRecord) -> list[tuple]:
    return [(rec.vendor, *i) for i in card_identities(rec)]


def _recover_identity(records: Sequence[CardRecord], previous: Sequence[CardRecord]) -> None:
    """Complete the identity of a card that was not read whole (``read_ok`` false or an
    error entry: a GPU lost before this NVML session read its identity, one that still
    answers some identity calls, a damaged row) from the last patrol's read of the same
    card: UUID, serial, bus id, model, card type and GRES where missing.

    The same card is the one sharing its UUID, serial or bus id; for a card read
    without any of them, the one at the same position (vendor, index, chip), unless
    that card is listed elsewhere in this patrol (the enumeration moved). The position
    is used for nothing else."""
    claimed = {i for r in records for i in card_identities(r) if i[0] != "key"}
    by_position = {r.key: r for r in previous}
    by_identity = {i: r for r in previous for i in card_identities(r) if i[0] != "key"}
    for rec in records:
        if rec.read_ok and not rec.errors:
            continue
        ids = [i for i in card_identities(rec) if i[0] != "key"]
        if ids:
            before = next((by_identity[i] for i in ids if i in by_identity), None)
        else:
            before = by_position.get(rec.key)
            if before is not None and claimed.intersection(card_identities(before)):
                before = None
        if before is None or not (before.uuid or before.serial or before.bus_id):
            continue
        for name in ("uuid", "serial", "bus_id", "model", "card_type", "gres"):
            if getattr(rec, name) is None:
                setattr(rec, name, getattr(before, name))


__all__ = [
    "HANG_MARGIN_SECONDS",
    "CollectorStatus",
    "PatrolReport",
    "Patroller",
    "default_node_checks",
]


def card_identities(rec: CardRecord) -> list[tuple]:
    """What names a card across patrols, most specific first: its UUID, serial and bus
    id (each with the chip; one call failing in a patrol must not make it another card),
    or its (index, chip) when it was read without any of them (a garbled row)."""
    found = [(kind, getattr(rec, kind), rec.chip) for kind in ("uuid", "serial", "bus_id")]
    return [i for i in found if i[1]] or [("key", rec.index, rec.chip)]


def _epoch(ts: Any, default: float) -> float:
    """Seconds since the epoch of an event line's RFC 3339 ``ts`` (when the fault
    happened), ``default`` when it cannot be read."""
    if not isinstance(ts, str):
        return default
    try:
        return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


#: ``jobs_unknown`` of a fault event on a card whose Slurm jobs could not be read (a
#: query failed or was refused, PrivateData, an IDX not mapped; the patrol's
#: ``card_jobs_unread`` finding says which) and that no process or earlier patrol names
JOBS_UNREAD = "the Slurm jobs of the card could not be read (see card_jobs_unread)"


def _event_card(event: Mapping[str, Any], cards: Sequence[CardRecord]) -> CardRecord | None:
    """The card of a fault event: by UUID or bus id, else by the vendor, index and chip
    the kernel-log reader gave the event (a card lost before it was read whole)."""
    return next(
        (
            c
            for c in cards
            if (event.get("uuid") and c.uuid == event.get("uuid"))
            or (event.get("bus_id") and c.bus_id == event.get("bus_id"))
        ),
        None,
    ) or next(
        (
            c
            for c in cards
            if event.get("vendor") == c.vendor
            and event.get("index") is not None
            and event.get("index") == c.index
            and event.get("chip") == c.chip
        ),
        None,
    )


def _local_jobs(card_jobs: Any, card: CardRecord) -> frozenset[str]:
    """The jobs of ``card`` known without asking slurmctld: its processes' jobs and
    ``card_jobs``' map of the last refresh (never the whole-queue fault read)."""
    jobs = {p.job_id for p in card.processes if p.job_id}
    if card_jobs is not None:
        jobs |= card_jobs.jobs_of(card) or set()
    return frozenset(jobs)
