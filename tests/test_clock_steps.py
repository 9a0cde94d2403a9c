"""Steps of the wall clock (NTP after a bad RTC, an operator's ``date -s``): a +2 h step
must not turn a critical GPU back to ok, a -3 h step must not make it critical again,
the prolog must not refuse every job right after either, the drain breaker must not
count a reason set in the future as recent, escalation timers must not jump.

Each test steps an injected wall clock while the monotonic clock goes on as it would;
expected values are the rules' own (window 3600 s, 10 s patrols, 600 s breaker window).
"""

from __future__ import annotations

import datetime as dt
import json

from hetpatrol.actions.escalation import (
    DurationRule,
    Escalation,
    EscalationRules,
    FrequencyRule,
)
from hetpatrol.actions.vocabulary import ISOLATE_CARD
from hetpatrol.checks.kernel_events import KernelLogRules, apply_kernel_log
from hetpatrol.exporters.state import boot_clock, state_document
from hetpatrol.healthcheck import verdict_age
from hetpatrol.kernel_log import KernelEvent, KernelLog, ReadResult, TextLogReader
from hetpatrol.schema import CardRecord
from hetpatrol.slurm.breaker import hold_reason, parse_sinfo
from hetpatrol.slurm.jobguard import Allocation, decide
from hetpatrol.slurm.settings import BreakerSettings

WALL = 1_800_000_000.0
HOUR = 3600.0


class Clocks:
    """A wall clock that can be stepped and a monotonic clock that cannot."""

    def __init__(self, wall: float = WALL, mono: float = 5000.0):
        self.wall, self.mono = wall, mono

    def tick(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds

    def step(self, seconds: float) -> None:
        self.wall += seconds


class OneRecord:
    """A kernel log whose first read returns one record, then nothing."""

    path = "/dev/kmsg"

    def __init__(self, event: KernelEvent, when: float | None, *, boot_clock: bool):
        self.items = [(event, when)]
        self.boot_clock = boot_clock

    def read(self) -> ReadResult:
        items, self.items = self.items, []
        return ReadResult(events=items, boot_clock=self.boot_clock)

    def close(self) -> None:
        pass


XID79 = KernelEvent(
    kind="xid",
    bus_id="0000:9b:00.0",
    raw="NVRM: Xid (PCI:0000:9b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
    message="GPU has fallen off the bus.",
    xid=79,
)


def _health(snap) -> str:
    cards = [CardRecord(vendor="nvidia", index=0, bus_id="0000:9b:00.0", health="ok")]
    apply_kernel_log(snap, cards, KernelLogRules(), node="n", seq=1, ts_format=str)
    return cards[0].health


def _kmsg_log(clocks: Clocks) -> KernelLog:
    # a /dev/kmsg record stamped with this boot's monotonic seconds, read at once
    event = XID79.__class__(**{**XID79.__dict__, "clock": ("boot", clocks.mono)})
    reader = OneRecord(event, clocks.wall, boot_clock=True)
    return KernelLog(
        reader, window_seconds=HOUR, clock=lambda: clocks.wall, monotonic=lambda: clocks.mono
    )


def test_a_forward_step_keeps_a_critical_gpu_critical():
    clocks = Clocks()
    log = _kmsg_log(clocks)
    assert _health(log.poll()) == "critical"
    clocks.tick(60)
    clocks.step(2 * HOUR)  # +2 h: the fault is a minute old, not two hours
    assert _health(log.poll()) == "critical"
    clocks.tick(HOUR)  # an hour of real time later it has aged out
    assert _health(log.poll()) == "ok"


def test_a_backward_step_does_not_bring_an_old_fault_back():
    clocks = Clocks()
    log = _kmsg_log(clocks)
    assert _health(log.poll()) == "critical"
    clocks.tick(HOUR + 60)
    assert _health(log.poll()) == "ok"
    clocks.step(-3 * HOUR)  # the wall clock now says the fault happened 2 h from now
    assert _health(log.poll()) == "ok"
    assert log.poll().window == ()


def test_a_recorded_log_is_timed_on_the_monotonic_clock_too(tmp_path):
    """A kernel log file (no boot stamps of this boot): the window is timed from the
    read, on the monotonic clock."""
    path = tmp_path / "kmsg.txt"
    path.write_text(XID79.raw + "\n")
    clocks = Clocks()
    log = KernelLog(
        TextLogReader(path),
        window_seconds=HOUR,
        clock=lambda: clocks.wall,
        monotonic=lambda: clocks.mono,
        replay=True,  # a replay's kmsg.txt: its records stand for the present
    )
    assert _health(log.poll()) == "critical"
    clocks.tick(10)
    clocks.step(2 * HOUR)
    assert _health(log.poll()) == "critical"
    clocks.step(-5 * HOUR)
    clocks.tick(HOUR)
    assert _health(log.poll()) == "ok"


# ------------------------------------------------------------------ the drain breaker


def _sinfo(minutes_ago: dict[str, float], now: float) -> str:
    lines = ["self|idle|Unknown|none"]
    for i in range(1, 10):
        name = f"n{i:02d}"
        if name in minutes_ago:
            when = dt.datetime.fromtimestamp(now - 60 * minutes_ago[name])
            lines.append(f"{name}|drained|{when:%Y-%m-%dT%H:%M:%S}|hetpatrol: xid 79 nvidia/3")
        else:
            lines.append(f"{name}|idle|Unknown|none")
    return "\n".join(lines) + "\n"


def test_the_breaker_does_not_count_a_reason_set_in_the_future():
    b = BreakerSettings()
    now = dt.datetime(2026, 12, 1, 8, 0, 0).timestamp()
    # set three hours from now (a clock stepped back on slurmctld or here): not recent
    assert hold_reason(parse_sinfo(_sinfo({"n01": -180}, now)), "self", now, b) is None
    # half a minute ahead (the two clocks differ a little): recent
    assert hold_reason(parse_sinfo(_sinfo({"n01": -0.5}, now)), "self", now, b) is not None
    assert hold_reason(parse_sinfo(_sinfo({"n01": 2}, now)), "self", now, b) is not None


# ------------------------------------------------------------------ escalation timers


def _rules() -> EscalationRules:
    return EscalationRules(
        frequency=(
            FrequencyRule("twice", frozenset({"ascend:81078603"}), 2, 86400.0, ISOLATE_CARD, 600.0),
        ),
        duration=(DurationRule("lasting", frozenset({"check:x"}), 60.0, ISOLATE_CARD, 120.0),),
    )


def test_a_forward_step_does_not_make_a_condition_look_lasting():
    clocks = Clocks()
    esc = Escalation(_rules())
    esc.note_clock(clocks.wall, clocks.mono)
    esc.observe_present("uuid:a", {"check:x"}, clocks.wall)
    clocks.tick(10)
    clocks.step(2 * HOUR)
    assert esc.note_clock(clocks.wall, clocks.mono) == 2 * HOUR
    esc.observe_present("uuid:a", {"check:x"}, clocks.wall)
    assert esc.actions("uuid:a", clocks.wall) == []  # 10 s, not 2 h
    clocks.tick(60)
    esc.note_clock(clocks.wall, clocks.mono)
    esc.observe_present("uuid:a", {"check:x"}, clocks.wall)
    assert [v.code for v in esc.actions("uuid:a", clocks.wall)] == ["lasting"]


def test_a_backward_step_does_not_hold_a_released_escalation_longer():
    clocks = Clocks()
    esc = Escalation(_rules())
    for _ in range(2):  # the code comes up twice: isolate, released 600 s after recovery
        esc.note_clock(clocks.wall, clocks.mono)
        esc.observe_present("uuid:a", {"ascend:81078603"}, clocks.wall)
        clocks.tick(10)
        esc.note_clock(clocks.wall, clocks.mono)
        esc.observe_present("uuid:a", set(), clocks.wall)
        clocks.tick(10)
    assert [v.code for v in esc.actions("uuid:a", clocks.wall)] == ["twice"]
    clocks.step(-3 * HOUR)
    clocks.tick(600)
    esc.note_clock(clocks.wall, clocks.mono)
    esc.observe_present("uuid:a", set(), clocks.wall)
    esc.decay(clocks.wall)
    assert esc.actions("uuid:a", clocks.wall) == []


def test_stored_times_in_the_future_are_never_recent_after_a_restart():
    esc = Escalation(_rules())
    esc.observe_present("uuid:a", {"ascend:81078603"}, WALL)
    esc.observe_present("uuid:a", {"check:x"}, WALL)
    doc = json.loads(json.dumps(esc.to_dict()))
    # the daemon restarts after the clock was stepped back three hours
    back = Escalation.from_dict(doc, WALL - 3 * HOUR, _rules())
    assert back.to_dict()["cards"]["uuid:a"]["events"] == {}  # one occurrence, not "now"
    cond = back.to_dict()["cards"]["uuid:a"]["conditions"]["check:x"]
    assert cond["since"] == WALL - 3 * HOUR  # the condition's timer starts again
    # one more occurrence after the restart does not make two within the window
    assert back.observe_event("uuid:a", "ascend:81078603", WALL - 3 * HOUR, WALL - 3 * HOUR)
    assert back.actions("uuid:a", WALL - 3 * HOUR) == []
    # an occurrence stamped beyond the slack after now is refused
    assert not back.observe_event("uuid:a", "ascend:81078603", WALL, WALL - 3 * HOUR)
    # a minute ahead is a step too (the slack is for a record's wall time derived anew)
    ahead = Escalation.from_dict(doc, WALL - 60, _rules())
    assert ahead.to_dict()["cards"]["uuid:a"]["events"] == {}
    assert not ahead.observe_event("uuid:a", "ascend:81078603", WALL, WALL - 60)


# ------------------------------------------------------------------ staleness


class _Report:
    node, seq, health, exit_code = "n1", 7, "critical", 2
    collectors = node_findings = card_lines = ()
    action, escalation = "reset_card", None

    def __init__(self, finished: float):
        self.finished = finished


def test_a_fresh_verdict_stays_fresh_across_a_step():
    boot = boot_clock()
    assert boot is not None, "this test needs /proc/sys/kernel/random/boot_id"
    import time

    doc = state_document(_Report(time.time()), 10.0)
    assert doc["boot_id"] == boot[0]
    for step in (2 * HOUR, -3 * HOUR):
        age, stale = verdict_age(doc, time.time() + step, boot=boot_clock())
        assert age < 5 and not stale, step
        # the prolog: the critical node's jobs are judged by the verdict, not refused
        # as stale (the job holds no card here: it passes)
        got = decide(doc, Allocation(), now=time.time() + step, boot=boot_clock())
        assert got.ok and "stale" not in got.reason, got
    # without this boot's stamp the wall clock decides (as before): stale both ways
    for step in (2 * HOUR, -3 * HOUR):
        assert verdict_age(doc, time.time() + step)[1] is True
    # a stamp of another boot is not used
    other = {**doc, "boot_id": "0" * 36}
    assert verdict_age(other, time.time() + 2 * HOUR, boot=boot_clock())[1] is True


def test_an_old_verdict_is_stale_on_the_boot_clock_whatever_the_wall_says():
    import time

    boot = boot_clock()
    assert boot is not None
    doc = state_document(_Report(time.time() - 600), 10.0)
    age, stale = verdict_age(doc, time.time() - 3 * HOUR, boot=boot_clock())
    assert 595 < age < 610 and stale
    future = {**doc, "finished_boot": boot[1] + 100}  # after now on this boot: forged
    assert verdict_age(future, time.time(), boot=boot_clock())[1] is True


def test_the_prolog_reads_the_state_file_on_the_boot_clock(tmp_path):
    """The prolog as slurmd runs it (its own clock, the state file on disk): a verdict
    written a second ago, whose wall time is three hours ahead of the stepped-back
    clock, is fresh; the same file without this boot's stamp is stale."""
    import time

    from hetpatrol.slurm.jobguard import guard

    boot = boot_clock()
    assert boot is not None
    doc = state_document(_Report(time.time()), 10.0)
    doc["finished"] += 3 * HOUR  # written before the clock was stepped back 3 h
    doc["health"], doc["exit_code"], doc["action"] = "ok", 0, "none"
    path = tmp_path / "state.json"
    path.write_text(json.dumps(doc))
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}
    got = guard(env, path)
    assert got.ok and "stale" not in got.reason, got
    del doc["boot_id"], doc["finished_boot"]
    path.write_text(json.dumps(doc))
    got = guard(env, path)
    assert not got.ok and "stale verdict" in got.reason, got
