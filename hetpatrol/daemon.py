"""The patrol loop: owns time, signals, reload and the sinks.

- Patrols start on a fixed schedule (``start + k * interval``); a patrol that overruns
  skips the missed slots instead of running back to back.
- SIGTERM / SIGINT: the current patrol finishes (each JSONL line is one ``write()``, so
  no line is torn), the state file is marked ``stopped`` (time and signal), the sinks
  close, exit code 0.
- SIGHUP: reload the configuration (SIGHUPs coalesce: see :meth:`Daemon._wait_until`);
  a reload that fails keeps the running one, says why, and counts it. The JSONL file is
  reopened too (external logrotate).
- systemd (``Type=notify``): ``READY=1`` after the first patrol, ``RELOADING=1`` /
  ``READY=1`` around a reload, ``STOPPING=1`` on shutdown, and ``WATCHDOG=1`` pings
  while the loop keeps its deadlines (:mod:`hetpatrol.sdnotify`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType

from hetpatrol import sdnotify
from hetpatrol.actions.escalation import Escalation
from hetpatrol.actions.fault_events import FaultLog, restart_step
from hetpatrol.boot import read_boot
from hetpatrol.config import Config, ConfigError, load_config, parse_listen
from hetpatrol.exporters.failures import WriteFailures
from hetpatrol.exporters.history_file import history_path, read_history, sync_history
from hetpatrol.exporters.http_server import MetricsServer
from hetpatrol.exporters.jsonl import JsonlSink
from hetpatrol.exporters.prometheus import ExporterStats, Exposition
from hetpatrol.exporters.state import (
    boot_clock,
    clear_stopped,
    mark_stopped,
    read_state,
    write_atomic,
    write_state,
)
from hetpatrol.healthcheck import verdict_age
from hetpatrol.logs import get_logger
from hetpatrol.patrol import HANG_MARGIN_SECONDS, Patroller, PatrolReport
from hetpatrol.safe_files import UnsafePath, make_directories, open_for_lock, own_file_check
from hetpatrol.slurm.admin_comment import AdminCommenter
from hetpatrol.slurm.card_jobs import CardJobs
from hetpatrol.slurm.drain import DrainPolicy

log = get_logger("hetpatrol.daemon")

#: a SIGHUP is acted on once no other came for this long (``systemctl reload`` sends
#: one; a loop of ``kill -HUP`` or several tools reloading at once, a storm, is then one
#: reload once it is over)...
RELOAD_QUIET_SECONDS = 0.2
#: ...but at the latest this long after the first SIGHUP not yet reloaded for: a stream
#: of them that never pauses still reloads
RELOAD_MAX_DEFER_SECONDS = 5.0


def describe_change(change: dict) -> str:
    """One entry of a patrol's ``changes`` as the daemon's log says it:
    ``nvidia/3 ok -> critical``, ``collector ascend ok -> failed``, ``nvidia/7 ok -> gone``
    (a card no longer listed), ``nvidia/0 new -> ok`` (first seen)."""
    what = change.get("card")
    if what is None and change.get("collector") is not None:
        what = f"collector {change['collector']}"
    before = change.get("from") or "new"
    after = change.get("to") or "gone"
    return f"{what} {before} -> {after}"


def card_jobs_for(config: Config, replay_dir: Path | None) -> CardJobs | None:
    """The Slurm jobs of each card (the node's job cgroups, one single-job query per job:
    :mod:`hetpatrol.slurm.card_jobs`) while ``slurm.enabled``; None in a replay (recorded
    pids belong to another host) or with Slurm off: stray processes are then not judged,
    fault events carry the jobs of the card's processes only."""
    if replay_dir is not None or not config.slurm.enabled:
        return None
    slurm = config.slurm
    # scontrol/squeue read-only, as the daemon's user: beside the breaker's sinfo (the
    # scontrol prefix may be the root helper, which runs no query)
    return CardJobs(slurm.drain.breaker.sinfo, slurm.slurm_node(config.node), slurm.timeout_seconds)


def _own_state_file(st: os.stat_result) -> None:
    """Refuse (ValueError) a state file to restore from that is not root's or this
    user's, or that group or others may write (the daemon writes it 0640)."""
    if st.st_uid not in (0, os.geteuid()):
        raise ValueError(f"the file is owned by uid {st.st_uid}, not root or this user")
    if st.st_mode & 0o022:
        raise ValueError(f"the file is writable by group or others (mode {st.st_mode & 0o7777:o})")


class Daemon:
    """One hetpatrol process: a :class:`Patroller`, the sinks and the metrics server.

    ``config_path`` is kept for SIGHUP reloads (``None`` = the bundled default).
    ``overrides`` are CLI values applied on top of every (re)loaded config.
    ``config_loader`` reads the file on SIGHUP (default :func:`load_config`).
    """

    def __init__(
        self,
        config: Config,
        *,
        config_path: Path | None = None,
        replay_dir: Path | None = None,
        overrides: dict | None = None,
        config_loader: Callable[[Path | None], Config] = load_config,
    ):
        self.config_path = config_path
        #: reads the config on SIGHUP (``hetpatrol run``: the schema check in a child)
        self.config_loader = config_loader
        self.overrides = dict(overrides or {})
        self.config = self._apply_overrides(config)
        self.replay_dir = replay_dir
        self.patroller = Patroller(self.config, replay_dir=replay_dir)
        self.patroller.post_boot_grace = True  # the daemon counts the patrols of a boot
        self.patroller.card_jobs = card_jobs_for(self.config, replay_dir)
        #: (wall, steady) when this run's history clock started (see _history_now)
        self._history_base = (time.time(), _steady())
        self.stats = ExporterStats(interval_seconds=self.config.interval_seconds)
        #: Slurm drain / resume after each report (a no-op unless slurm.drain.enabled)
        self.drain_policy = DrainPolicy()
        #: card faults to the jobs' AdminComment (a no-op unless slurm.admin_comment)
        self.admin_commenter = AdminCommenter()
        self.stats.slurm_events = self.drain_policy.counts
        self.exposition = Exposition(
            self._collector_names(), self.stats, user_labels=self.config.metrics_user_labels
        )
        self.notifier = sdnotify.Notifier()
        self.watchdog = sdnotify.Watchdog(self.notifier)
        #: seconds a patrol may take beyond its slowest collector's timeout (process
        #: lookup, sinks) before the watchdog stops vouching for the loop
        self.watchdog_slack_seconds = 10.0
        self.sink = self._make_sink()
        self._state_failures = WriteFailures("state")
        self._textfile_failures = WriteFailures("textfile")
        self.server: MetricsServer | None = None
        self._wake = _Wakeup()  # poked by any signal to end the current wait
        self._stop_requested = False
        self._stop_signal: int | None = None
        #: what asked the stop (``SIGTERM``), written into the state file's stop mark
        self._stop_reason: str | None = None
        self._reload = False
        #: monotonic times of the first and the latest SIGHUP not yet reloaded for
        self._reload_first = self._reload_last = -math.inf
        self.patrols = 0
        self.last_report: PatrolReport | None = None

    # ---------------------------------------------------------------- config helpers
    def _apply_overrides(self, config: Config) -> Config:
        return replace(config, **{k: v for k, v in self.overrides.items() if v is not None})

    def _collector_names(self) -> list[str]:
        return [c.name for c in self.config.collectors]

    def _make_sink(self) -> JsonlSink | None:
        if self.config.jsonl_path is None:
            return None
        return JsonlSink(
            self.config.jsonl_path, self.config.jsonl_max_bytes, self.config.jsonl_backups
        )

    # ------------------------------------------------------------------- signals
    # A handler runs between two bytecodes of the main thread, maybe while that thread
    # holds a lock (a log line half written, a wait being set up): it only sets flags and
    # writes a byte to a pipe, and takes no lock. The loop does the logging.
    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = signum
        self._stop_requested = True
        self._wake.poke()

    def _on_hup(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()  # a clock read takes no lock
        if not self._reload:
            self._reload_first = now
        self._reload_last = now
        self._reload = True
        self._wake.poke()  # wake the wait; the loop tells reload from stop

    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)

    def request_stop(self) -> None:
        """Stop after the current patrol; callable from any thread."""
        self._stop_requested = True
        self._wake.poke()

    def _stopping(self) -> bool:
        """True once a stop was requested (logged once, with the signal that asked)."""
        if self._stop_requested and self._stop_signal is not None:
            self._stop_reason = signal.Signals(self._stop_signal).name
            log.info("signal", signal=self._stop_reason, action="stop")
            self._stop_signal = None
        return self._stop_requested

    def _mark_stopped(self) -> None:
        """On a clean stop, say so in the state file (:func:`mark_stopped`): ``status``
        and ``check`` then tell "stopped at T" from a daemon that died (a verdict that
        only goes stale). Logged, never raised: the stop goes on."""
        if self.config.state_path is None or self.patrols == 0:
            return
        reason = self._stop_reason or "stop requested"
        try:
            mark_stopped(self.config.state_path, reason)
        except (OSError, ValueError) as exc:
            log.warning("state_stop_mark_failed", path=str(self.config.state_path), error=str(exc))
        else:
            log.info("state_marked_stopped", path=str(self.config.state_path), reason=reason)

    def reload(self) -> bool:
        """Reload the config file; keep the running config if it is bad. True if applied."""
        if self.sink is not None:
            self.sink.reopen()
        try:
            new = self._apply_overrides(self.config_loader(self.config_path))
            replacement = None
            if new.collectors != self.config.collectors or new.node != self.config.node:
                replacement = Patroller(new, replay_dir=self.replay_dir)
        except Exception as exc:  # noqa: BLE001 - whatever the cause, the daemon goes on
            self.stats.config_reload_failures += 1
            self.exposition.update(self.last_report)  # the counter is visible at once
            # every error of the file, as validate-config says them (bounded): the first
            # in `error`, the others in `more_errors`, the count left out in `unshown`
            fields: dict[str, object] = {}
            if isinstance(exc, ConfigError):
                error = exc.errors[0].text
                if len(exc.errors) > 1:
                    fields["more_errors"] = [e.text for e in exc.errors[1:]]
                if exc.unshown:
                    fields["unshown"] = exc.unshown
            else:
                error = f"{type(exc).__name__}: {exc}"
            log.error(
                "config_reload_failed", error=error, **fields, action="keeping running config"
            )
            return False
        if replacement is not None:
            replacement.adopt(self.patroller)
            self.patroller.close()
            self.patroller = replacement
        else:
            self.patroller.config = new
        if new.slurm != self.config.slurm or new.node != self.config.node:
            self.patroller.card_jobs = card_jobs_for(new, self.replay_dir)
        if new.jsonl_path != self.config.jsonl_path and self.sink is not None:
            self.sink.close()
        self.config = new
        self.stats.interval_seconds = new.interval_seconds
        self.exposition.user_labels = new.metrics_user_labels
        if self.sink is None or self.sink.path != new.jsonl_path:
            self.sink = self._make_sink()
        log.info("config_reloaded", source=new.source)
        return True

    # ---------------------------------------------------------------------- loop
    def publish(self, report: PatrolReport) -> None:
        """Write the report to every sink, then act on it in Slurm (a drain always
        follows a patrol already on disk), write those decisions, then render the
        exposition."""
        self._write_jsonl(report.jsonl_lines())
        if self.config.state_path is not None:
            try:
                write_state(self.config.state_path, report, self.config.interval_seconds)
            except OSError as exc:  # logged once per episode, like the JSONL sink
                self._state_failures.failed(self.config.state_path, exc)
                self.stats.state_write_errors = self._state_failures.errors
            else:
                self._state_failures.succeeded(self.config.state_path)
            if self.patroller.reboot_history.last:  # a card critical in this boot
                try:
                    self.patroller.reboot_history = sync_history(
                        history_path(self.config.state_path),
                        self.patroller.reboot_history,
                        self._history_now(),
                    )
                    st = history_path(self.config.state_path).stat()
                    self._history_stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
                except OSError as exc:
                    self._state_failures.failed(history_path(self.config.state_path), exc)
        events = self.drain_policy.on_report(report, self.config)  # JSONL event lines
        if self.config.slurm.enabled and self.config.slurm.admin_comment and report.event_lines:
            self.admin_commenter.on_events(
                [json.loads(line) for line in report.event_lines],
                self.config.slurm,
                self.config.slurm.slurm_node(self.config.node),
            )
        drains = self.config.slurm.enabled and self.config.slurm.drain.enabled
        self.stats.drain_breaker_open = self.drain_policy.breaker_open if drains else None
        if events:
            self._write_jsonl(events)
        self.patrols += 1
        self.last_report = report
        body = self.exposition.update(report, self.patrols)
        if self.config.textfile_path is not None:
            self._write_textfile(self.config.textfile_path, body)

    def _write_jsonl(self, lines) -> None:
        if self.sink is not None:
            self.sink.write_lines(tuple(lines))
            self.stats.jsonl_write_errors = self.sink.write_errors
            self.stats.jsonl_lines_written = self.sink.lines_written

    def _write_textfile(self, path: Path, body: bytes) -> None:
        """node_exporter textfile: the same bytes as /metrics, via ``.*.tmp`` + rename."""
        try:
            write_atomic(path, body, make_parents=True)
        except OSError as exc:  # logged once per episode, like the JSONL sink
            self._textfile_failures.failed(path, exc)
            self.stats.textfile_write_errors = self._textfile_failures.errors
        else:
            self._textfile_failures.succeeded(path)

    def _patrol_budget(self) -> float:
        """Seconds one patrol may take: slowest collector timeout + margin + slack."""
        timeouts = [c.timeout_seconds for c in self.config.collectors if c.enabled]
        slurm = self.config.slurm  # GRES read, drain query and update: one scontrol each
        scontrol = 3 * slurm.timeout_seconds if slurm.enabled else 0.0
        return (
            max(timeouts, default=0.0)
            + HANG_MARGIN_SECONDS
            + self.watchdog_slack_seconds
            + scontrol
        )

    def patrol_once(self) -> PatrolReport:
        self._reread_history()
        report = self.patroller.run()
        self.publish(report)
        return report

    def _history_now(self) -> float:
        """The time the reboot history ages by (seconds since the epoch): the earlier of
        the wall clock and this run's start advanced by ``CLOCK_BOOTTIME``. A step of
        the wall clock ahead (a bad time source; 31 days ahead for one patrol forgot
        every boot a fault was seen in, and the card that should be ``replace_card`` was
        reset again) ages nothing; a step back is taken, as the history's ``last`` times
        are never moved back (:meth:`hetpatrol.actions.reboot_history.RebootHistory.
        decay`)."""
        wall, steady = self._history_base
        return min(time.time(), wall + (_steady() - steady))

    def _reread_history(self) -> None:
        """Read the reboot-survival history again when another process (``hetpatrol
        history clear``) replaced the file since this daemon last read or wrote it: the
        next verdict follows the operator's clear."""
        if self.config.state_path is None:
            return
        path = history_path(self.config.state_path)
        try:
            st = path.stat()
        except OSError:
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != getattr(self, "_history_stamp", stamp):
            self.patroller.reboot_history = read_history(
                path, self._history_now(), self.config.actions.reboot_survival
            )
        self._history_stamp = stamp

    def restore_escalation(self) -> None:
        """Go on from the escalation counts the last daemon wrote in the state file (a
        restart must not reset "the second double-bit error in 24 h"); events older than
        a rule's window are dropped, never replayed. The same for the kept card fault
        events with their jobs (older than ``actions.fault_events.max_age_seconds``
        dropped; entries of the wrong types dropped and logged,
        ``state_fault_events_dropped``). A missing or damaged file: none.

        The file is read as it is written (:func:`~hetpatrol.exporters.state.write_atomic`
        replaces only a regular file of root or this user): a symbolic link at it is not
        followed, a file of another user or one group or others may write is not
        believed, one over 64 MiB or not JSON is not read; each is logged
        (``state_restore_refused``) and nothing is restored from it."""
        if self.config.state_path is None:
            return
        try:
            # never another user's file (made first in a sticky directory), nor one
            # others may write
            own = own_file_check(self.config.state_path)

            def verify(st: os.stat_result) -> None:
                own(st)
                _own_state_file(st)

            doc = read_state(self.config.state_path, verify=verify)
        except FileNotFoundError:
            doc = {}
        except UnsafePath as exc:
            log.warning("state_refused", path=str(self.config.state_path), error=str(exc))
            doc = {}
        except (OSError, ValueError) as exc:
            log.warning(
                "state_restore_refused",
                path=str(self.config.state_path),
                error="a symbolic link: not followed"
                if isinstance(exc, OSError) and exc.errno == errno.ELOOP
                else (exc.strerror if isinstance(exc, OSError) else None) or str(exc),
                action="starting without the kept counts and fault events",
            )
            doc = {}
        if "stopped" in doc:  # a daemon runs again: the last one's stop mark is not true
            try:
                clear_stopped(self.config.state_path, doc)
            except OSError as exc:
                log.warning(
                    "state_stop_mark_not_cleared", path=str(self.config.state_path), error=str(exc)
                )
        self.patroller.escalation = Escalation.from_dict(
            doc.get("escalation"), time.time(), self.config.actions.escalation
        )
        # the card fault events with their jobs: the next events go on from them
        faults = FaultLog.from_state(
            doc, time.time(), self.config.actions.fault_events, boot=boot_clock()
        )
        if faults.dropped:
            log.warning(
                "state_fault_events_dropped",
                path=str(self.config.state_path),
                dropped=faults.dropped,
                reason="not card fault events (damaged or foreign state file)",
            )
        self.patroller.fault_log = faults
        if self.patroller.boot_root is not None:  # the same boot: its patrols go on
            info = read_boot(self.patroller.boot_root)
            # the patrols-in-a-row counts go on only from a verdict `check` calls fresh
            fresh = bool(doc) and not verdict_age(doc)[1]
            self.patroller.boot.restore(doc.get("boot"), info, streaks=fresh)
            boot = doc.get("boot")
            if (
                info.boot_id is not None
                and isinstance(boot, dict)
                and boot.get("boot_id") == info.boot_id
            ):  # and the cards it listed: one gone while no daemon ran is card_missing
                self.patroller.restore_cards(doc.get("cards") or [])
        # the history ages on this run's clock, from the one the state file was written on
        # when it is this boot's (a clock step since then ages nothing: _history_now)
        now = time.time()
        step = restart_step(doc, now, boot_clock())
        self._history_base = (now - step, _steady())
        self.patroller.reboot_history = read_history(
            history_path(self.config.state_path),
            self._history_now(),
            self.config.actions.reboot_survival,
        )

    def run(self) -> int:
        """Serve metrics and patrol until stopped. Returns the process exit code (0).

        Raises ``OSError`` when the metrics address cannot be bound, or when another
        daemon already writes the same JSONL log or state file (see :func:`claim_path`);
        :class:`~hetpatrol.safe_files.UnsafePath` when the directory of the JSONL log,
        state file or textfile is one another user owns or can write, or a symlink or
        another user's file sits at one of them or at their lock files.
        """
        claims = (claim_path(p) for p in (self.config.jsonl_path, self.config.state_path) if p)
        self._claims = [fd for fd in claims if fd is not None]
        if self.config.textfile_path is not None:  # refused at start, like the other two
            try:
                make_directories(self.config.textfile_path.parent, self.config.textfile_path)
            except UnsafePath:
                raise
            except OSError:  # read-only, missing rights: counted where it is written
                pass
        self.restore_escalation()
        if self.config.listen:
            host, port = parse_listen(self.config.listen)
            try:
                self.server = MetricsServer(host, port, self.exposition)
            except OSError as exc:
                raise OSError(
                    exc.errno, f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
                ) from exc
            self.server.start()
            log.info("metrics_listening", address=f"{host}:{self.server.port}")
        log.info(
            "started",
            node=self.config.node,
            interval_seconds=self.config.interval_seconds,
            collectors=",".join(self._collector_names()),
            replay=str(self.replay_dir or ""),
            jsonl=str(self.config.jsonl_path or ""),
            state=str(self.config.state_path or ""),
            config=str(self.config_path or "bundled"),
        )
        epoch = time.monotonic()
        slot = 0
        scheduled = self.config.interval_seconds
        self.watchdog.alive_for(self._patrol_budget())
        self.watchdog.start()
        try:
            while True:
                self.watchdog.alive_for(self._patrol_budget())
                report = self.patrol_once()
                if self.patrols == 1:
                    log.info(
                        "first_patrol",
                        health=report.health,
                        cards=len(report.cards),
                        seconds=round(report.duration_seconds, 3),
                    )
                    self.notifier.ready(self._status_line(report))
                elif report.changes:
                    self.notifier.status(self._status_line(report))
                if report.changes:
                    log.info(
                        "patrol_changes",
                        seq=report.seq,
                        health=report.health,
                        changes=", ".join(describe_change(c) for c in report.changes),
                    )
                interval = self.config.interval_seconds
                if interval != scheduled:  # a reload changed it: a new schedule from here
                    epoch, slot, scheduled = time.monotonic() - report.duration_seconds, 0, interval
                slot += 1
                now = time.monotonic()
                due = epoch + slot * interval
                if now > due:
                    missed = int((now - due) // interval) + 1
                    if report.duration_seconds >= interval:
                        log.warning(
                            "patrol_overran",
                            seq=report.seq,
                            missed_slots=missed,
                            seconds=round(report.duration_seconds, 3),
                        )
                    else:  # the time went elsewhere: a reload's config check, a suspend
                        log.info("patrol_slots_skipped", seq=report.seq, missed_slots=missed)
                    slot += missed
                    due = epoch + slot * interval
                if self._wait_until(due):
                    break
            self._mark_stopped()  # a clean stop only: not on an exception
        finally:
            self.shutdown()
        return 0

    @staticmethod
    def _status_line(report: PatrolReport) -> str:
        return f"patrol {report.seq}: {report.health}, {len(report.cards)} cards"

    def _reload_at(self) -> float:
        """When the pending reload runs (monotonic): :data:`RELOAD_QUIET_SECONDS` after
        the latest SIGHUP, at the latest :data:`RELOAD_MAX_DEFER_SECONDS` after the first
        one not yet reloaded for."""
        return min(
            self._reload_last + RELOAD_QUIET_SECONDS,
            self._reload_first + RELOAD_MAX_DEFER_SECONDS,
        )

    def _wait_until(self, due: float) -> bool:
        """Sleep until ``due``; handle SIGHUP reloads. True when a stop was requested.

        A stop request is never lost to a reload, and a storm of SIGHUPs cannot starve
        the patrols: once ``due`` has passed the patrol runs, and a pending reload waits
        for the next sleep. SIGHUPs coalesce (:meth:`_reload_at`): a storm of them is
        one reload once it is over, and one that arrives during a reload makes one more
        after it (the file may have changed after the reload read it), never none.
        """
        while True:
            if self._stopping():
                return True
            now = time.monotonic()
            if now >= due:
                return False
            wake = due
            if self._reload:
                wake = min(due, self._reload_at())
                if wake <= now:
                    self._reload = False
                    self.notifier.reloading()
                    self.watchdog.alive_for(self._patrol_budget())
                    self.reload()
                    self.notifier.ready(
                        self._status_line(self.last_report) if self.last_report else None
                    )
                    continue
            self.watchdog.alive_until(max(due, now) + self._patrol_budget())
            self._wake.wait(wake - now)

    def shutdown(self) -> None:
        self.notifier.stopping()
        self.watchdog.stop()
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.patroller.close()
        if self.sink is not None:
            self.sink.close()
        log.info("stopped", patrols=self.patrols)
        self.notifier.close()
        self._wake.close()
        for fd in getattr(self, "_claims", ()):
            os.close(fd)
        self._claims = []


class _Wakeup:
    """A self-pipe: :meth:`poke` from a signal handler or any thread ends a
    :meth:`wait`. Unlike ``threading.Event.set``, poking takes no lock, so a handler
    that interrupts the main thread inside a wait cannot deadlock on it."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def poke(self) -> None:
        try:
            os.write(self._w, b"\0")
        except (BlockingIOError, OSError):  # full: a wake is already pending (or closed)
            pass

    def wait(self, timeout: float) -> None:
        """Return after ``timeout`` seconds, or at once when poked (pokes are consumed)."""
        try:
            select.select([self._r], [], [], max(0.0, timeout))
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError, ValueError):  # drained (or closed at shutdown)
            pass

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._r = self._w = -1


def claim_path(path: Path) -> int | None:
    """Take ``.<name>.lock`` beside ``path`` (``flock``, held while the returned file
    descriptor stays open; the kernel drops it when the process dies, even by SIGKILL).

    Two daemons writing one JSONL log or state file would interleave their patrols and
    flip the verdict ``check`` reads between them. Raises ``OSError`` (EBUSY) naming
    the other daemon's pid when it holds the claim;
    :class:`~hetpatrol.safe_files.UnsafePath` when the directory or the lock file is not
    safe to write (a symlink, another user's file or directory: see
    :mod:`hetpatrol.safe_files`); None (logged) when the lock file
    cannot be made at all (a read-only directory: writing the file fails too, and that
    is counted where it happens).
    """
    lock = path.parent / f".{path.name}.lock"
    try:
        # O_NOFOLLOW, in a directory only root and this user can change: a link planted
        # there would have this daemon truncate someone else's file to its pid
        fd = open_for_lock(lock, 0o644)
    except UnsafePath as exc:
        raise UnsafePath(path, f"its lock {lock}: {exc.strerror}") from None
    except OSError as exc:  # a read-only or full directory: the sink counts its errors
        log.warning("claim_failed", path=str(lock), error=exc.strerror or str(exc))
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise OSError(
            errno.EBUSY, f"another hetpatrol daemon (pid {other}) already writes {path}"
        ) from None
    try:  # the pid is for the other daemon's message; the lock is what counts
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    return fd


def _steady() -> float:
    """Seconds on ``CLOCK_BOOTTIME`` (never stepped, counts a suspend), else the
    monotonic clock."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()
