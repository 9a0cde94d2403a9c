"""Drain and resume this node in Slurm, safely. Runs after each report (in the daemon).

Rules (``slurm.enabled`` and ``slurm.drain.enabled``, both off by default):

- A **critical** patrol drains the node: ``scontrol update NodeName=<node> State=DRAIN
  Reason="hetpatrol: <action> <card> <code> <why> (+N more)"``, unless the node already
  carries a reason.
  A reason of our own (it starts with ``hetpatrol:``) is left as it is; **anyone
  else's** (an admin's drain, Slurm's own ``gres/gpu count reported lower than
  configured``) is never replaced: the decision is logged as ``drain_skipped``.
- A node carrying the DRAIN flag without any reason was drained by someone else: never
  re-drained (it would then read as ours and be resumed), ``drain_skipped`` once.
- The Slurm state decides too (:mod:`hetpatrol.slurm.states`, the table in docs/slurm.md):
  IDLE, ALLOCATED and MIXED with the DRAIN, COMPLETING, PLANNED, CLOUD, DYNAMIC_NORM or
  PERFCTRS flags are acted on; ``boot`` (REBOOT_ISSUED), ``@`` (REBOOT_REQUESTED),
  ``#`` (POWERING_UP), ``resv`` (RESERVED), ``fail`` (FAIL), ``maint``, ``*`` (not
  responding), DOWN, FUTURE and any state or flag the table does not know are skipped
  (``drain_skipped`` / ``resume_skipped``) and the event says which.
- After ``resume_after_patrols`` consecutive **healthy** patrols (ok or warning) a node
  whose current reason starts with ``hetpatrol:`` is resumed (``State=UNDRAIN``: it
  clears the DRAIN flag only, where ``RESUME`` would also clear FAIL and REBOOT flags and
  bring a DOWN node up, should one of those appear after we looked). An
  ``unknown`` patrol (a hung tool) neither drains nor counts as healthy.
- Reboot through Slurm (``slurm.drain.reboot``, off by default): when the highest action
  is ``reboot_node`` the node is not drained but ``scontrol reboot ASAP nextstate=DOWN
  reason="hetpatrol: ..." <node>`` (scontrol(1), ``reboot``: ASAP adds the DRAIN flag,
  RebootProgram runs once the node is idle, the node stays DOWN after it). The same
  rules as a drain come first: never over anyone else's reason or drain, only in the
  states of the table, held by the circuit breaker (which counts our rebooting and
  rebooted nodes as drained). Once Slurm says ``... : reboot complete`` (DOWN, our
  reason) the node is brought back with ``State=RESUME`` (the one command that ends
  DOWN) after ``resume_after_patrols`` healthy patrols that all started after the
  node's ``BootTime`` (the new boot, as slurmd reported it).
- ``dry_run`` logs every decision (``dry_run: true``) and runs no ``scontrol update``.

Every decision is a ``kind: "event"`` line (schema ``hetpatrol.event/1``, see
:func:`hetpatrol.schema.event_json_schema`). Decisions that change nothing (skips,
dry runs, failures) are written once until what they say changes, not once per patrol
(a healthy patrol ends a drain episode, a critical one a resume episode). Every scontrol
call runs through the configured argv prefix under ``timeout_seconds``.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hetpatrol.actions.apply import drain_reason as action_drain_reason
from hetpatrol.actions.findings import why_text
from hetpatrol.actions.vocabulary import (
    DEFAULT_DRAIN_ACTIONS,
    REBOOT_NODE,
    ActionVerdict,
    rank,
)
from hetpatrol.logs import get_logger
from hetpatrol.schema import (
    EVENT_SCHEMA,
    HEALTH_OK,
    HEALTH_WARNING,
    CardRecord,
    rfc3339,
)
from hetpatrol.slurm.breaker import SINFO_FORMAT, hold_reason, parse_sinfo
from hetpatrol.slurm.gres import NodeInfo, find_node
from hetpatrol.slurm.inventory import Runner, run_scontrol, tool_error
from hetpatrol.slurm.settings import SlurmSettings
from hetpatrol.slurm.states import (
    DRAIN,
    REASON_PREFIX,
    RESUME,
    foreign_reason,
    may,
    ours,
    rebooted_by_us,
)
from hetpatrol.tool import run_tool

if TYPE_CHECKING:
    from hetpatrol.config import Config
    from hetpatrol.report import PatrolReport

log = get_logger("hetpatrol.slurm")

#: Longest reason we set (Slurm keeps more, but sinfo columns and humans do not).
REASON_MAX = 200

EVENT_DRAIN = "drain"
EVENT_RESUME = "resume"
EVENT_DRAIN_SKIPPED = "drain_skipped"
EVENT_RESUME_SKIPPED = "resume_skipped"
EVENT_DRAIN_FAILED = "drain_failed"
EVENT_RESUME_FAILED = "resume_failed"
EVENT_DRAIN_HELD = "drain_held"
EVENT_REBOOT = "reboot"
EVENT_REBOOT_FAILED = "reboot_failed"
_RESUME_EVENTS = (EVENT_RESUME, EVENT_RESUME_SKIPPED, EVENT_RESUME_FAILED)
EVENTS = (
    EVENT_DRAIN,
    EVENT_DRAIN_HELD,
    EVENT_RESUME,
    EVENT_DRAIN_SKIPPED,
    EVENT_RESUME_SKIPPED,
    EVENT_DRAIN_FAILED,
    EVENT_RESUME_FAILED,
    EVENT_REBOOT,
    EVENT_REBOOT_FAILED,
)


def understood(info: NodeInfo, action: str = DRAIN) -> str | None:
    """None when we may ``action`` (drain/resume) a node in this state, else why not."""
    return may(info, action)


def _card_name(rec: CardRecord) -> str:
    return f"{rec.vendor}/{rec.index}" + (f"/{rec.chip}" if rec.chip is not None else "")


def drain_needs(
    report: PatrolReport, drain_on: frozenset[str] = DEFAULT_DRAIN_ACTIONS
) -> list[tuple[str, ActionVerdict]]:
    """(where, action) of every card and node finding whose action is one the config
    drains on (``actions.drain_on``), the highest action first: drain by what must be
    done, not by colour (an NPU in Alarm whose codes ask for nothing drains nothing)."""
    needs: list[tuple[str, ActionVerdict]] = []
    for f in report.node_findings:
        if f.action in drain_on:
            # one form with the cards': <action> node <check> <the finding's message>
            why = why_text(f.message)
            needs.append(("node", ActionVerdict(f.action, "check", f"check:{f.check}", why)))
    for rec in report.cards:
        if rec.action in drain_on:
            verdict = ActionVerdict(
                rec.action, rec.action_source or "", rec.action_code, rec.action_reason or ""
            )
            needs.append((_card_name(rec), verdict))
    return sorted(needs, key=lambda item: -rank(item[1].action))


def drain_reason(report: PatrolReport, drain_on: frozenset[str] = DEFAULT_DRAIN_ACTIONS) -> str:
    """``hetpatrol: <action> <card> <code> <why>`` for the highest action the report
    needs (``hetpatrol: reset_card nvidia/1 remapped_rows_pending remapped rows pending:
    the GPU needs a reset``; a node finding: ``reboot_node node <check> <message>``), with a
    ``(+N more)`` tail for the others; at most :data:`REASON_MAX` characters."""
    needs = drain_needs(report, drain_on)
    if not needs:
        return f"{REASON_PREFIX} node {report.health}"
    where, verdict = needs[0]
    more = f" (+{len(needs) - 1} more)" if len(needs) > 1 else ""
    text = action_drain_reason(where, verdict)
    if len(text) + len(more) > REASON_MAX:
        text = text[: REASON_MAX - len(more) - 3] + "..."
    return text + more


def reboot_args(node: str, reason: str) -> list[str]:
    """The scontrol arguments of a reboot through Slurm (scontrol(1), ``reboot [ASAP]
    [nextstate={RESUME|DOWN}] [reason=<reason>] {ALL|<NodeList>}``): the root helper
    (:mod:`hetpatrol.scontrol_helper`) takes exactly this form."""
    return ["reboot", "ASAP", "nextstate=DOWN", f"reason={reason}", node]


def boot_epoch(info: NodeInfo) -> float | None:
    """The node's ``BootTime`` (``scontrol show node``: the boot time slurmd reported,
    local time ``YYYY-MM-DDTHH:MM:SS``) as epoch seconds; None when absent or unreadable."""
    text = info.fields.get("BootTime")
    try:
        return dt.datetime.fromisoformat(text).timestamp() if text else None
    except ValueError:
        return None


def encode_event(event: dict[str, Any]) -> str:
    """One JSONL line (with its newline), encoded as the patrol lines are."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"


class DrainPolicy:
    """Decides, per report, whether to drain or resume this node, and does it.

    Keeps the healthy-patrol streak across reports and config reloads. ``runner``
    and ``clock`` are injectable (tests).
    """

    def __init__(self, runner: Runner = run_tool, clock: Callable[[], float] = time.time):
        self.runner = runner
        self.clock = clock
        self.healthy_streak = 0
        #: True while the node may carry a drain of ours (unknown at start: look once)
        self.maybe_ours = True
        #: dry run: the drain we would have made, so its resume is logged too
        self.simulated_drain: str | None = None
        self.counts: dict[str, int] = {e: 0 for e in EVENTS}
        #: the actions that drain (``actions.drain_on``; set from the config per report)
        self.drain_on: frozenset[str] = DEFAULT_DRAIN_ACTIONS
        #: True while a drain is held by the circuit breaker (exported as a gauge)
        self.breaker_open = False
        self._last_quiet: tuple[str, str] | None = None
        #: start times (epoch s) of the last healthy patrols of the current streak
        self._healthy_starts: deque[float] = deque(maxlen=64)

    # --------------------------------------------------------------------- entry
    def on_report(self, report: PatrolReport, config: Config) -> list[str]:
        """Act on ``report``; return the event lines (JSONL) of the decisions made."""
        settings = config.slurm
        if not (settings.enabled and settings.drain.enabled):
            return []
        self.drain_on = config.actions.drain_on
        try:
            events = self._decide(report, settings, settings.slurm_node(config.node))
        except Exception as exc:  # noqa: BLE001 - the daemon loop must go on
            log.error("drain_policy_failed", error=f"{type(exc).__name__}: {exc}")
            return []
        lines = []
        for event in events:
            self.counts[event["event"]] = self.counts.get(event["event"], 0) + 1
            level = log.info if event["event"] in (EVENT_DRAIN, EVENT_RESUME) else log.warning
            level(
                "slurm_" + event["event"],
                slurm_node=event["slurm_node"],
                reason=event["reason"],
                dry_run=event["dry_run"],
                detail=event["detail"],
            )
            lines.append(encode_event(event))
        return lines

    # ------------------------------------------------------------------ decisions
    def _decide(
        self, report: PatrolReport, settings: SlurmSettings, node: str
    ) -> list[dict[str, Any]]:
        if drain_needs(report, self.drain_on):
            self.healthy_streak = 0
            self._healthy_starts.clear()
            if self._last_quiet is not None and self._last_quiet[0] in _RESUME_EVENTS:
                self._last_quiet = None  # a critical patrol ends the episode of resume events
            return self._on_critical(report, settings, node)
        # unknown (no verdict) or critical without a drain action: no healthy patrol
        if report.health not in (HEALTH_OK, HEALTH_WARNING):
            self.healthy_streak = 0
            self._healthy_starts.clear()
            return []
        self.healthy_streak += 1
        self._healthy_starts.append(report.started)
        self.breaker_open = False
        if self._last_quiet is not None and self._last_quiet[0] not in _RESUME_EVENTS:
            self._last_quiet = None  # a healthy patrol ends the episode of drain events
        if self.healthy_streak < settings.drain.resume_after_patrols:
            return []
        return self._on_healthy(report, settings, node)

    def _on_critical(
        self, report: PatrolReport, settings: SlurmSettings, node: str
    ) -> list[dict[str, Any]]:
        reason = drain_reason(report, self.drain_on)
        info, error = self._query(settings, node)
        if info is None:
            return self._quiet(report, node, EVENT_DRAIN_SKIPPED, reason, None, detail=error)
        if info.reason is not None and ours(info.reason) and info.drained:
            self.maybe_ours = True
            return []  # drained by us already: the first reason stays
        why = foreign_reason(info)
        if why is not None:
            return self._quiet(report, node, EVENT_DRAIN_SKIPPED, reason, info, detail=why)
        why_not = understood(info, DRAIN)
        if why_not is not None:
            return self._quiet(report, node, EVENT_DRAIN_SKIPPED, reason, info, detail=why_not)
        held = self._breaker(settings, node, info)
        self.breaker_open = held is not None
        if held is not None:
            return self._quiet(report, node, EVENT_DRAIN_HELD, reason, info, detail=held)
        argv = [*settings.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]
        done, failed = EVENT_DRAIN, EVENT_DRAIN_FAILED
        if settings.drain.reboot and drain_needs(report, self.drain_on)[0][1].action == REBOOT_NODE:
            # scontrol(1) reboot: ASAP drains at once and reboots when idle; nextstate=DOWN
            # keeps the node out after the reboot until hetpatrol has patrolled it
            argv = [*settings.scontrol, *reboot_args(node, reason)]
            done, failed = EVENT_REBOOT, EVENT_REBOOT_FAILED
        if settings.drain.dry_run:
            self.simulated_drain = reason
            return self._quiet(report, node, done, reason, info, command=argv, dry=True)
        _, error = run_scontrol(settings, argv[len(settings.scontrol) :], self.runner)
        if error is not None:
            return self._quiet(report, node, failed, reason, info, command=argv, detail=error)
        self.maybe_ours = True
        self._last_quiet = None
        return [self._event(report, node, done, reason, info, command=argv)]

    def _on_healthy(
        self, report: PatrolReport, settings: SlurmSettings, node: str
    ) -> list[dict[str, Any]]:
        if settings.drain.dry_run and self.simulated_drain is not None:
            reason = f"healthy for {self.healthy_streak} consecutive patrols"
            argv = [*settings.scontrol, "update", f"NodeName={node}", "State=UNDRAIN"]
            detail = f"dry run: would resume the drain it would have made: {self.simulated_drain}"
            self.simulated_drain = None
            return [
                self._event(
                    report, node, EVENT_RESUME, reason, None, command=argv, detail=detail, dry=True
                )
            ]
        if not self.maybe_ours:
            return []
        info, error = self._query(settings, node)
        if info is None:
            return self._quiet(report, node, EVENT_RESUME_SKIPPED, None, None, detail=error)
        if settings.drain.reboot and rebooted_by_us(info) is None:
            return self._resume_after_reboot(report, settings, node, info)
        if not (info.drained and ours(info.reason)):
            # nothing of ours to resume: stop asking. Our reason on a node not drained
            # is a reboot of ours still under way (an admin's UNDRAIN during it leaves
            # DOWN+REBOOT_ISSUED with our reason, seen on slurmctld 22.05): go on asking,
            # its "reboot complete" is ours to resume (before, never resumed)
            if not ours(info.reason):
                self.maybe_ours = False
            return []
        why_not = understood(info, RESUME)
        if why_not is not None:
            return self._quiet(
                report, node, EVENT_RESUME_SKIPPED, info.reason, info, detail=why_not
            )
        argv = [*settings.scontrol, "update", f"NodeName={node}", "State=UNDRAIN"]
        reason = f"healthy for {self.healthy_streak} consecutive patrols"
        if settings.drain.dry_run:
            return self._quiet(report, node, EVENT_RESUME, reason, info, command=argv, dry=True)
        _, error = run_scontrol(settings, argv[len(settings.scontrol) :], self.runner)
        if error is not None:
            return self._quiet(
                report, node, EVENT_RESUME_FAILED, reason, info, command=argv, detail=error
            )
        self.maybe_ours = False
        return [self._event(report, node, EVENT_RESUME, reason, info, command=argv)]

    def _resume_after_reboot(
        self, report: PatrolReport, settings: SlurmSettings, node: str, info: NodeInfo
    ) -> list[dict[str, Any]]:
        """``State=RESUME`` of a node DOWN after the reboot we asked for, once the last
        ``resume_after_patrols`` healthy patrols all started after its ``BootTime``."""
        needed = settings.drain.resume_after_patrols
        boot = boot_epoch(info)
        starts = list(self._healthy_starts)[-needed:]
        if boot is None or len(starts) < needed or min(starts) < boot:
            when = info.fields.get("BootTime", "unknown")
            detail = (
                f"rebooted (BootTime {when}): waiting for {needed} healthy patrols of the new boot"
            )
            return self._quiet(report, node, EVENT_RESUME_SKIPPED, info.reason, info, detail=detail)
        argv = [*settings.scontrol, "update", f"NodeName={node}", "State=RESUME"]
        reason = f"healthy for {len(starts)} patrols since the reboot"
        detail = f"Slurm rebooted the node (BootTime {info.fields.get('BootTime')})"
        if settings.drain.dry_run:
            return self._quiet(
                report, node, EVENT_RESUME, reason, info, command=argv, detail=detail, dry=True
            )
        _, error = run_scontrol(settings, argv[len(settings.scontrol) :], self.runner)
        if error is not None:
            return self._quiet(
                report, node, EVENT_RESUME_FAILED, reason, info, command=argv, detail=error
            )
        self.maybe_ours = False
        return [self._event(report, node, EVENT_RESUME, reason, info, command=argv, detail=detail)]

    # -------------------------------------------------------------------- helpers
    def _breaker(self, settings: SlurmSettings, node: str, info: NodeInfo) -> str | None:
        """:func:`hetpatrol.slurm.breaker.hold_reason` for this node's partitions, or
        None. When the partitions cannot be read the drain goes ahead (a real fault is
        not held for want of a count) and the log says so."""
        breaker = settings.drain.breaker
        if not breaker.enabled:
            return None
        partitions = info.fields.get("Partitions", "")
        if not partitions or partitions == "(null)":
            return None
        argv = [*breaker.sinfo, "-h", "-N", "-p", partitions, "-o", SINFO_FORMAT]
        try:
            out = self.runner(argv, settings.timeout_seconds)
        except OSError as exc:
            log.warning("drain_breaker_unread", error=exc.strerror or str(exc))
            return None
        error = tool_error(out)
        if error is not None:
            log.warning("drain_breaker_unread", error=error)
            return None
        return hold_reason(parse_sinfo(out.stdout), node, self.clock(), breaker)

    def _query(self, settings: SlurmSettings, node: str) -> tuple[NodeInfo | None, str | None]:
        out, error = run_scontrol(settings, ["show", "node", "-o", node], self.runner)
        if error is not None or out is None:
            return None, f"cannot read the Slurm state of {node}: {error}"
        info = find_node(out.stdout, node)
        if info is None:
            return None, f"scontrol show node: no node named {node!r}"
        return info, None

    def _quiet(
        self,
        report: PatrolReport,
        node: str,
        event: str,
        reason: str | None,
        info: NodeInfo | None,
        **fields: Any,
    ) -> list[dict[str, Any]]:
        """An event that changes nothing: written once until the situation changes.

        ``fields`` are :meth:`_event`'s keyword arguments (command, detail, dry).
        """
        # a resume's reason counts the healthy patrols: not part of "what changed"
        what = None if event in _RESUME_EVENTS else reason
        state = (info.state, info.reason) if info else None
        key = (event, f"{what}|{fields.get('detail')}|{state}")
        if key == self._last_quiet:
            return []
        self._last_quiet = key
        return [self._event(report, node, event, reason, info, **fields)]

    def _event(
        self,
        report: PatrolReport,
        node: str,
        event: str,
        reason: str | None,
        info: NodeInfo | None,
        *,
        command: Sequence[str] | None = None,
        detail: str | None = None,
        dry: bool = False,
    ) -> dict[str, Any]:
        return {
            "kind": "event",
            "schema": EVENT_SCHEMA,
            **({"run_id": report.run_id} if report.run_id else {}),
            "ts": rfc3339(self.clock()),
            "node": report.node,
            "slurm_node": node,
            "seq": report.seq,
            "health": report.health,
            "event": event,
            "reason": reason,
            "dry_run": dry,
            "slurm_state": info.state if info else None,
            "slurm_reason": info.reason if info else None,
            "command": list(command) if command is not None else None,
            "detail": detail,
        }
