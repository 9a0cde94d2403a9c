"""The drain / resume policy against a scripted scontrol: every rule, every state, dry run,
event lines (schema), once-per-episode logging, and the daemon wiring."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import jsonschema
import pytest
from conftest import samples_dir
from fakes import Scripted, make_patroller

from hetpatrol.actions.apply import judge_card
from hetpatrol.daemon import Daemon
from hetpatrol.patrol import PatrolReport
from hetpatrol.schema import CardRecord, Finding, jsonl_json_schema
from hetpatrol.slurm.drain import REASON_MAX, DrainPolicy, drain_needs, drain_reason
from hetpatrol.slurm.settings import DrainSettings, SlurmSettings
from hetpatrol.tool import ToolOutput

VALIDATOR = jsonschema.Draft202012Validator(jsonl_json_schema())
NODE = "gpu07"


class FakeSlurm:
    """scontrol for one node: ``show node -o``, ``update ... State=DRAIN|UNDRAIN``."""

    def __init__(self, state: str = "IDLE", reason: str | None = None, user: str = "root"):
        self.state, self.reason, self.user = state, reason, user
        self.calls: list[list[str]] = []
        self.updates: list[list[str]] = []
        self.fail_updates = False
        self.hang = False
        self.text: str | None = None  # a recorded answer instead of the scripted one

    def __call__(self, argv, timeout):
        argv = list(argv)
        self.calls.append(argv)
        if self.hang:
            return ToolOutput(tuple(argv), "", "", None, True, timeout)
        args = argv[argv.index("scontrol") + 1 :] if "scontrol" in argv else argv[1:]
        if args[:2] == ["show", "node"]:
            if self.text is not None:
                return ToolOutput(tuple(argv), self.text, "", 0, False, 0.01)
            line = f"NodeName={NODE} Arch=x86_64 Gres=gpu:a100:8 State={self.state} Weight=1"
            if self.reason:
                line += f" Reason={self.reason} [{self.user}@2026-11-29T10:00:00]"
            return ToolOutput(tuple(argv), line + "\n", "", 0, False, 0.01)
        assert args[0] == "update" and args[1] == f"NodeName={NODE}", args
        self.updates.append(args)
        if self.fail_updates:
            return ToolOutput(tuple(argv), "", "slurm_update error: Access denied", 1, False, 0.01)
        if args[2] == "State=DRAIN":
            self.state = self.state.split("+")[0] + "+DRAIN"
            self.reason = args[3].removeprefix("Reason=")
        elif args[2] == "State=UNDRAIN":
            self.state, self.reason = self.state.split("+")[0], None
        return ToolOutput(tuple(argv), "", "", 0, False, 0.01)


def settings(**drain) -> SlurmSettings:
    return SlurmSettings(
        enabled=True,
        node_name=NODE,
        scontrol=("sudo", "-n", "scontrol"),
        gres_conf=None,
        drain=DrainSettings(**({"enabled": True, "resume_after_patrols": 3} | drain)),
    )


@pytest.fixture
def config(base_config):
    return replace(base_config, node="host07", slurm=settings())


def report(health: str, seq: int = 1, cards=(), findings=()) -> PatrolReport:
    """A report as the patrol builds it, actions included (hetpatrol.actions.apply)."""
    if health == "critical" and not cards and not findings:
        lost = CardRecord(vendor="nvidia", index=3, health="critical")
        lost.findings.append(Finding("vendor_health", "critical", "GPU is lost", "gpu_is_lost"))
        cards = (lost,)
    for rec in cards:
        verdict, per = judge_card(rec.findings)
        rec.action, rec.action_source, rec.action_code, rec.action_reason = verdict
        for f, v in zip(rec.findings, per, strict=True):
            f.action = v.action
    for f, v in zip(findings, judge_card(findings)[1], strict=True):
        f.action = v.action
    return PatrolReport(
        seq=seq,
        node="host07",
        started=0.0,
        finished=1.0,
        cards=tuple(cards),
        collectors=(),
        node_findings=tuple(findings),
        changes=(),
        health=health,
    )


def decode(lines: list[str]) -> list[dict]:
    out = [json.loads(line) for line in lines]
    for event in out:
        VALIDATOR.validate(event)
    return out


def test_off_by_default(base_config):
    slurm = FakeSlurm()
    assert DrainPolicy(slurm).on_report(report("critical"), base_config) == []
    gres_only = replace(base_config, slurm=replace(settings(), drain=DrainSettings()))
    assert DrainPolicy(slurm).on_report(report("critical"), gres_only) == []
    assert slurm.calls == []


def test_critical_drains_through_the_argv_prefix(config):
    slurm = FakeSlurm()
    policy = DrainPolicy(slurm)
    (event,) = decode(policy.on_report(report("critical"), config))
    assert slurm.updates == [
        [
            "update",
            f"NodeName={NODE}",
            "State=DRAIN",
            "Reason=hetpatrol: reboot_node nvidia/3 vendor_health vendor health 'gpu_is_lost'",
        ]
    ]
    assert slurm.calls[0] == ["sudo", "-n", "scontrol", "show", "node", "-o", NODE]
    assert slurm.calls[1][:3] == ["sudo", "-n", "scontrol"]
    assert event["kind"] == "event" and event["schema"] == "hetpatrol.event/1"
    assert event["event"] == "drain" and event["dry_run"] is False
    assert (
        event["reason"]
        == "hetpatrol: reboot_node nvidia/3 vendor_health vendor health 'gpu_is_lost'"
    )
    assert (event["node"], event["slurm_node"], event["slurm_state"]) == ("host07", NODE, "IDLE")
    assert event["command"] == slurm.calls[1]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event["ts"])
    # still critical, drained by us already: nothing run, nothing logged
    assert policy.on_report(report("critical", 2), config) == []
    assert len(slurm.updates) == 1
    assert policy.counts["drain"] == 1


@pytest.mark.parametrize(
    "reason, user",
    [
        ("admin: DIMM swap", "root"),
        ("Not responding", "slurm"),
        ("hetpatrol-like but not ours", "root"),
    ],
)
def test_foreign_reason_is_never_replaced_nor_resumed(config, reason, user):
    slurm = FakeSlurm("IDLE+DRAIN", reason, user)
    policy = DrainPolicy(slurm)
    (event,) = decode(policy.on_report(report("critical"), config))
    assert event["event"] == "drain_skipped"
    assert event["slurm_reason"] == reason and reason in event["detail"]
    assert f"by {user}" in event["detail"]
    assert policy.on_report(report("critical", 2), config) == []  # logged once per episode
    for seq in range(3, 10):
        assert policy.on_report(report("ok", seq), config) == []
    assert slurm.updates == [] and slurm.reason == reason
    assert len(slurm.calls) == 3  # two looks while critical, one to see it is not ours


def test_slurm_own_gres_drain_from_the_recording_is_left_alone(config):
    name = "scontrol-show-node.slurm24.05.idle-drain-gres-count-mismatch.txt"
    slurm = FakeSlurm()
    slurm.text = (samples_dir("slurm") / name).read_text()
    cfg = replace(config, slurm=replace(config.slurm, node_name="devhost-102-68"))
    (event,) = decode(DrainPolicy(slurm).on_report(report("critical"), cfg))
    assert event["event"] == "drain_skipped"
    assert event["slurm_reason"] == "gres/gpu count reported lower than configured (0 < 1)"
    assert event["slurm_state"] == "IDLE+DRAIN"
    assert slurm.updates == []


@pytest.mark.parametrize(
    "state",
    [
        "IDLE+REBOOT_ISSUED",  # sinfo "boot"
        "IDLE+REBOOT_REQUESTED",  # "@"
        "IDLE+POWERING_UP",  # "#"
        "IDLE+RESERVED",  # "resv"
        "IDLE+FAIL",  # "fail"
        "ALLOCATED+MAINTENANCE",  # "maint"
        "IDLE+NOT_RESPONDING",  # "*"
        "DOWN",
        "FUTURE",
        "IDLE+CLOUD+POWERED_DOWN",
        "IDLE+INVALID_REG",
        "MIXED+POWER_DOWN",
        "IDLE+DYNAMIC_FUTURE",
        "INVALID",
        "IDLE+PLANNED+MAINTENANCE",
    ],
)
def test_states_not_understood_are_skipped_and_said(config, state):
    slurm = FakeSlurm(state)
    (event,) = decode(DrainPolicy(slurm).on_report(report("critical"), config))
    assert event["event"] == "drain_skipped"
    assert event["slurm_state"] == state
    assert f"Slurm state {state} is not one hetpatrol acts on" in event["detail"]
    assert slurm.updates == []


@pytest.mark.parametrize(
    "state",
    [
        "IDLE",
        "ALLOCATED",
        "MIXED",
        "MIXED+COMPLETING",
        "MIXED+PLANNED",  # backfill earmarked the node for a pending job
        "IDLE+PLANNED",
        "ALLOCATED+PLANNED",
        "IDLE+CLOUD",
        "IDLE+DYNAMIC_NORM",
    ],
)
def test_states_understood_are_drained(config, state):
    slurm = FakeSlurm(state)
    (event,) = decode(DrainPolicy(slurm).on_report(report("critical"), config))
    assert event["event"] == "drain" and slurm.state.endswith("+DRAIN")


def test_resume_only_after_n_consecutive_healthy_patrols(config):
    slurm = FakeSlurm()
    policy = DrainPolicy(slurm)
    policy.on_report(report("critical", 1), config)
    assert policy.on_report(report("ok", 2), config) == []
    assert policy.on_report(report("warning", 3), config) == []  # warning counts as healthy
    assert policy.on_report(report("unknown", 4), config) == []  # a hung tool: start over
    assert policy.on_report(report("ok", 5), config) == []
    assert policy.on_report(report("ok", 6), config) == []
    assert slurm.state == "IDLE+DRAIN"
    (event,) = decode(policy.on_report(report("ok", 7), config))
    assert event["event"] == "resume"
    assert event["reason"] == "healthy for 3 consecutive patrols"
    assert (
        event["slurm_reason"]
        == "hetpatrol: reboot_node nvidia/3 vendor_health vendor health 'gpu_is_lost'"
    )
    assert slurm.updates[-1] == ["update", f"NodeName={NODE}", "State=UNDRAIN"]
    assert (slurm.state, slurm.reason) == ("IDLE", None)
    calls = len(slurm.calls)
    for seq in range(8, 20):
        assert policy.on_report(report("ok", seq), config) == []
    assert len(slurm.calls) == calls  # nothing of ours left: no scontrol per patrol


def test_a_drain_of_ours_from_before_a_restart_is_resumed(config):
    slurm = FakeSlurm("MIXED+DRAIN", "hetpatrol: temperature ascend/2/0")
    policy = DrainPolicy(slurm)
    for seq in (1, 2):
        assert policy.on_report(report("ok", seq), config) == []
    (event,) = decode(policy.on_report(report("ok", 3), config))
    assert event["event"] == "resume" and slurm.state == "MIXED"


def test_resume_skipped_in_a_state_not_understood(config):
    slurm = FakeSlurm("IDLE+DRAIN+REBOOT_REQUESTED", "hetpatrol: vendor_health nvidia/3")
    policy = DrainPolicy(slurm)
    for seq in (1, 2):
        policy.on_report(report("ok", seq), config)
    (event,) = decode(policy.on_report(report("ok", 3), config))
    assert event["event"] == "resume_skipped"
    assert "REBOOT_REQUESTED" in event["detail"]
    assert slurm.updates == []


def test_dry_run_logs_every_decision_and_runs_no_update(config):
    cfg = replace(config, slurm=settings(dry_run=True, resume_after_patrols=2))
    slurm = FakeSlurm()
    policy = DrainPolicy(slurm)
    (drain,) = decode(policy.on_report(report("critical", 1), cfg))
    assert (drain["event"], drain["dry_run"]) == ("drain", True)
    assert (
        drain["command"][-1]
        == "Reason=hetpatrol: reboot_node nvidia/3 vendor_health vendor health 'gpu_is_lost'"
    )
    assert policy.on_report(report("critical", 2), cfg) == []  # once per episode
    assert policy.on_report(report("ok", 3), cfg) == []
    (resume,) = decode(policy.on_report(report("ok", 4), cfg))
    assert (resume["event"], resume["dry_run"]) == ("resume", True)
    assert (
        "hetpatrol: reboot_node nvidia/3 vendor_health vendor health 'gpu_is_lost'"
        in resume["detail"]
    )
    (again,) = decode(policy.on_report(report("critical", 5), cfg))  # a new episode
    assert again["event"] == "drain"
    assert slurm.updates == [] and slurm.state == "IDLE"


def test_failures_are_logged_once_and_retried(config):
    slurm = FakeSlurm()
    slurm.fail_updates = True
    policy = DrainPolicy(slurm)
    (event,) = decode(policy.on_report(report("critical", 1), config))
    assert event["event"] == "drain_failed" and "Access denied" in event["detail"]
    assert policy.on_report(report("critical", 2), config) == []
    assert len(slurm.updates) == 2  # tried again, not logged again
    slurm.fail_updates = False
    (event,) = decode(policy.on_report(report("critical", 3), config))
    assert event["event"] == "drain"

    slurm = FakeSlurm()
    slurm.hang = True
    (event,) = decode(DrainPolicy(slurm).on_report(report("critical"), config))
    assert event["event"] == "drain_skipped" and "did not answer" in event["detail"]

    missing = DrainPolicy(lambda argv, timeout: (_ for _ in ()).throw(FileNotFoundError(2, "x")))
    (event,) = decode(missing.on_report(report("critical"), config))
    assert event["event"] == "drain_skipped" and "cannot run sudo" in event["detail"]


def test_drain_reason_names_the_action_the_card_and_why_and_is_bounded():
    cards = []
    for i in range(20):  # an NPU in Alarm: the error codes carry the action, not the word
        rec = CardRecord(vendor="ascend", index=200 + i, chip=0, health="critical")
        rec.findings.append(Finding("vendor_health", "critical", "Alarm", "Alarm"))
        cards.append(rec)
    pending = CardRecord(vendor="nvidia", index=1, health="critical")
    pending.findings.append(Finding("remapped_rows_pending", "critical", "rows pending"))
    lost = CardRecord(vendor="nvidia", index=3, health="critical")
    lost.findings.append(Finding("vendor_health", "critical", "GPU is lost", "gpu_is_lost"))
    gres = Finding(
        "gres_mismatch",
        "critical",
        "gpu:a100: Slurm has 8 registered, 6 healthy on the node (6 found)",
        value=6,
        threshold=8,
    )
    r = report("critical", cards=[pending, lost, *cards], findings=[gres])
    # the highest action first, the rest counted; Alarm (watch) and gres (watch) drain nothing
    assert drain_reason(r) == (
        "hetpatrol: reboot_node nvidia/3 vendor_health vendor health 'gpu_is_lost' (+1 more)"
    )
    only_watch = report("critical", cards=cards, findings=[gres])
    assert drain_needs(only_watch) == []
    long = CardRecord(vendor="nvidia", index=5, health="critical")
    long.findings.append(Finding("remapped_rows_pending", "critical", "x" * 500))
    assert len(drain_reason(report("critical", cards=[long, pending]))) <= REASON_MAX


def test_daemon_writes_event_lines_after_the_patrol_lines(base_config, tmp_path):
    slurm = FakeSlurm()
    config = replace(
        base_config,
        node="host07",
        listen=None,
        jsonl_path=tmp_path / "p.jsonl",
        state_path=None,
        slurm=settings(),
    )
    daemon = Daemon(config)
    daemon.patroller.close()
    scripted = Scripted("ascend")
    scripted.temps = [40.0, 99.0]
    daemon.patroller = make_patroller(config, {"ascend": scripted})
    daemon.patroller.config = config
    daemon.drain_policy.runner = slurm
    try:
        daemon.patrol_once()
    finally:
        daemon.shutdown()
    lines = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["card", "card", "patrol", "event"]
    assert (
        lines[-1]["reason"]
        == "hetpatrol: isolate_card ascend/1/0 temperature temperature 99 C >= critical level 90 C"
    )
    body = daemon.exposition.body.decode()
    assert 'hetpatrol_slurm_events_total{event="drain"} 1.0' in body
    assert 'hetpatrol_slurm_events_total{event="drain_skipped"} 0.0' in body


def test_drain_is_decided_only_after_the_sinks_wrote_the_patrol(base_config, tmp_path):
    """A drain names a patrol an operator can read: when scontrol is asked, the patrol
    line and the state file of that patrol are already on disk (#11)."""
    seen: list[tuple[list[str], dict | None]] = []

    class Watching(FakeSlurm):
        def __call__(self, argv, timeout):
            jsonl = tmp_path / "p.jsonl"
            text = jsonl.read_text() if jsonl.exists() else ""
            kinds = [json.loads(x)["kind"] for x in text.splitlines()]
            state = tmp_path / "state.json"
            seen.append((kinds, json.loads(state.read_text()) if state.exists() else None))
            return super().__call__(argv, timeout)

    config = replace(
        base_config,
        node="host07",
        listen=None,
        jsonl_path=tmp_path / "p.jsonl",
        state_path=tmp_path / "state.json",
        slurm=settings(),
    )
    daemon = Daemon(config)
    daemon.patroller.close()
    scripted = Scripted("ascend")
    scripted.temps = [40.0, 99.0]
    daemon.patroller = make_patroller(config, {"ascend": scripted})
    daemon.patroller.config = config
    daemon.drain_policy.runner = Watching()
    try:
        daemon.patrol_once()
    finally:
        daemon.shutdown()
    assert seen, "scontrol was never asked"
    kinds, state = seen[0]
    assert kinds == ["card", "card", "patrol"]
    assert state is not None and state["health"] == "critical"


# ------------------------------------------------ the state table (#10 item 6)
def test_unknown_states_and_flags_are_skipped_and_said_once(config):
    """A flag this table does not know (a newer Slurm; ``?`` for a bit 22.05 cannot
    name) is never acted on; said once, again only when the state changes."""
    slurm = FakeSlurm("MIXED+PLANNED+SOMETHING_NEW")
    policy = DrainPolicy(slurm)
    (event,) = decode(policy.on_report(report("critical", 1), config))
    assert event["event"] == "drain_skipped"
    assert event["detail"] == (
        "Slurm state MIXED+PLANNED+SOMETHING_NEW is not one hetpatrol acts on "
        "(unknown to hetpatrol: SOMETHING_NEW)"
    )
    assert policy.on_report(report("critical", 2), config) == []
    slurm.state = "IDLE+?"
    (event,) = decode(policy.on_report(report("critical", 3), config))
    assert "unknown to hetpatrol: ?" in event["detail"]
    slurm.state = "WEIRD+COMPLETING+FAIL"
    (event,) = decode(policy.on_report(report("critical", 4), config))
    assert event["detail"].endswith("(no drain in FAIL; unknown to hetpatrol: WEIRD)")
    assert slurm.updates == []


def test_planned_node_is_resumed(config):
    slurm = FakeSlurm("MIXED+DRAIN+PLANNED", "hetpatrol: vendor_health nvidia/3")
    policy = DrainPolicy(slurm)
    for seq in (1, 2):
        assert policy.on_report(report("ok", seq), config) == []
    (event,) = decode(policy.on_report(report("ok", 3), config))
    assert event["event"] == "resume"


def test_drain_flag_without_a_reason_is_not_ours(config):
    """Drained by someone, no reason: never re-drained (it would then read as ours and
    be resumed), said once; never resumed either."""
    slurm = FakeSlurm("IDLE+DRAIN")
    policy = DrainPolicy(slurm)
    (event,) = decode(policy.on_report(report("critical", 1), config))
    assert event["event"] == "drain_skipped"
    assert event["detail"] == (
        "node is drained without a reason, so not by hetpatrol; left untouched"
    )
    for seq in range(2, 6):
        assert policy.on_report(report("critical", seq), config) == []
    for seq in range(6, 12):
        assert policy.on_report(report("ok", seq), config) == []
    assert slurm.updates == [] and slurm.state == "IDLE+DRAIN"


def test_resume_skipped_is_said_once_per_change(config):
    slurm = FakeSlurm("IDLE+DRAIN+REBOOT_REQUESTED", "hetpatrol: vendor_health nvidia/3")
    policy = DrainPolicy(slurm)
    said = []
    for seq in range(1, 10):
        said += decode(policy.on_report(report("ok", seq), config))
    assert [e["event"] for e in said] == ["resume_skipped"]
    slurm.state = "IDLE+DRAIN+MAINTENANCE"  # another reason not to: said again
    (event,) = decode(policy.on_report(report("ok", 10), config))
    assert event["event"] == "resume_skipped" and "MAINTENANCE" in event["detail"]
    assert policy.on_report(report("ok", 11), config) == []
    slurm.state = "IDLE+DRAIN"
    (event,) = decode(policy.on_report(report("ok", 12), config))
    assert event["event"] == "resume" and slurm.updates[-1][-1] == "State=UNDRAIN"


def test_readme_state_table_is_the_code_table():
    """docs/slurm.md's "Slurm node states" table says what hetpatrol.slurm.states does."""
    from conftest import REPO

    from hetpatrol.slurm.states import BASE_STATES, FLAGS

    text = (REPO / "docs" / "slurm.md").read_text()
    rows = re.findall(r"^\| `([A-Z_?]+)` \| (base|flag) \| (yes|no) \| (yes|no) \|", text, re.M)
    table = {**BASE_STATES, **FLAGS}
    assert {name for name, *_ in rows} == set(table)
    for name, kind, drain, resume in rows:
        assert (kind == "base") == (name in BASE_STATES), name
        assert (table[name].drain, table[name].resume) == (drain == "yes", resume == "yes"), name


def _table():
    from hetpatrol.slurm.states import BASE_STATES, FLAGS

    rows = [(base, rule) for base, rule in BASE_STATES.items()]
    rows += [(f"IDLE+{flag}", rule) for flag, rule in FLAGS.items() if flag != "DRAIN"]
    return rows


@pytest.mark.parametrize(("state", "rule"), _table(), ids=[s for s, _ in _table()])
def test_every_row_of_the_state_table(config, state, rule):
    """Each base state and flag, as the policy acts on it: drain from the state, and
    resume of our own drain in it (state+DRAIN)."""
    slurm = FakeSlurm(state)
    (event,) = decode(DrainPolicy(slurm).on_report(report("critical"), config))
    assert event["event"] == ("drain" if rule.drain else "drain_skipped"), event
    base, _, flags = state.partition("+")
    slurm = FakeSlurm("+".join(filter(None, [base, "DRAIN", flags])), "hetpatrol: x")
    policy = DrainPolicy(slurm)
    events = []
    for seq in range(1, 4):
        events += decode(policy.on_report(report("ok", seq), config))
    assert [e["event"] for e in events] == ["resume" if rule.resume else "resume_skipped"]


# sinfo(1) "NODE STATE CODES" (22.05), each mark read off the man page: what it means,
# and whether a node in IDLE with it may be drained (its flag's row of the state table)
SINFO_MARKS = [
    ("*", "NOT_RESPONDING", False),  # not responding
    ("~", "POWERED_DOWN", False),  # powered off
    ("#", "POWERING_UP", False),  # being powered up or configured
    ("!", "POWER_DOWN", False),  # pending power down
    ("%", "POWERING_DOWN", False),  # being powered down
    ("$", "MAINTENANCE", False),  # in a maintenance reservation
    ("@", "REBOOT_REQUESTED", False),  # pending reboot
    ("^", "REBOOT_ISSUED", False),  # reboot issued
    ("-", "PLANNED", True),  # planned by the backfill scheduler
]


@pytest.mark.parametrize(("mark", "flag", "drain"), SINFO_MARKS, ids=[m for m, *_ in SINFO_MARKS])
def test_a_compact_state_mark_is_its_flag_never_stripped(config, mark, flag, drain):
    """``IDLE~`` is a powered-off node, not an idle one: the mark is read as its flag and
    the flag's rule decides (also after a flag word, and for a resume)."""
    from hetpatrol.slurm.gres import STATE_MARKS, NodeInfo

    assert STATE_MARKS[mark] == flag
    assert NodeInfo("n", f"IDLE{mark}").flags == {flag}
    assert NodeInfo("n", f"IDLE{mark}").base_state == "IDLE"
    slurm = FakeSlurm(f"IDLE{mark}")
    (event,) = decode(DrainPolicy(slurm).on_report(report("critical"), config))
    assert event["event"] == ("drain" if drain else "drain_skipped"), event
    assert drain or (slurm.updates == [] and flag in event["detail"]), event
    slurm = FakeSlurm(f"IDLE+DRAIN{mark}", "hetpatrol: x")
    policy = DrainPolicy(slurm)
    events = []
    for seq in range(1, 4):
        events += decode(policy.on_report(report("ok", seq), config))
    assert [e["event"] for e in events] == ["resume" if drain else "resume_skipped"]


@pytest.mark.parametrize("state", ["IDLE&", "IDLE?", "IDLE+DRAIN&", "IDLE=", "IDLE~&"])
def test_a_mark_hetpatrol_does_not_know_means_hands_off(config, state):
    slurm = FakeSlurm(state)
    (event,) = decode(DrainPolicy(slurm).on_report(report("critical"), config))
    assert event["event"] == "drain_skipped" and slurm.updates == [], event
    assert "unknown to hetpatrol" in event["detail"], event


def test_docs_mark_table_is_the_code_table():
    """docs/slurm.md's mark table says what hetpatrol.slurm.gres.STATE_MARKS does."""
    from conftest import REPO

    from hetpatrol.slurm.gres import STATE_MARKS

    text = (REPO / "docs" / "slurm.md").read_text()
    rows = re.findall(r"^\| `(.)` \| `([A-Z_]+)` \|", text, re.M)
    assert dict(rows) == STATE_MARKS == {m: f for m, f, _ in SINFO_MARKS}
