"""Escalation over time: frequency and duration rules, state that survives a restart."""

from __future__ import annotations

import json

import pytest

from hetpatrol.actions import escalation
from hetpatrol.actions.escalation import (
    DurationRule,
    Escalation,
    EscalationRules,
    FrequencyRule,
    card_identity,
)
from hetpatrol.actions.vocabulary import ISOLATE_CARD, REBOOT_NODE, REPLACE_CARD, RESET_CARD

T0 = 1_800_000_000.0
DAY = 86400.0
GPU = "uuid:GPU-6a1b2c3d-0000-1111-2222-333344445555"


def actions(esc: Escalation, ident: str, now: float) -> list[tuple[str, str]]:
    esc.decay(now)
    return [(v.action, v.code) for v in esc.actions(ident, now)]


def test_second_double_bit_ecc_error_within_a_day_means_replace_card():
    esc = Escalation()
    assert esc.observe_event(GPU, "xid:48", T0, T0)
    assert actions(esc, GPU, T0 + 1) == []
    assert esc.observe_event(GPU, "xid:48", T0 + 20 * 3600, T0 + 20 * 3600)
    assert actions(esc, GPU, T0 + 20 * 3600) == [(REPLACE_CARD, "xid48_repeat")]
    # replace_card holds: no release window (an operator clears it)
    assert actions(esc, GPU, T0 + 30 * DAY) == [(REPLACE_CARD, "xid48_repeat")]
    esc.clear(GPU, "xid48_repeat")
    assert actions(esc, GPU, T0 + 30 * DAY) == []


def test_two_faults_more_than_a_window_apart_do_not_escalate():
    esc = Escalation()
    esc.observe_event(GPU, "xid:48", T0, T0)
    esc.observe_event(GPU, "xid:48", T0 + DAY + 1, T0 + DAY + 1)
    assert actions(esc, GPU, T0 + DAY + 1) == []


def test_the_same_record_read_again_counts_once_and_stale_records_not_at_all():
    esc = Escalation()
    assert esc.observe_event(GPU, "xid:48", T0, T0 + 5)
    assert not esc.observe_event(GPU, "xid:48", T0, T0 + 60)  # the next patrol sees it again
    assert actions(esc, GPU, T0 + 60) == []
    # a ring-buffer record from two days ago read at start: older than the window
    assert not esc.observe_event(GPU, "xid:48", T0 - 2 * DAY, T0 + 60)
    assert actions(esc, GPU, T0 + 60) == []
    # an XID no rule names is not kept
    assert not esc.observe_event(GPU, "xid:13", T0, T0)
    assert esc.to_dict()["cards"][GPU]["events"] == {"xid:48": [T0]}


def test_counts_are_per_card_identity():
    other = "uuid:GPU-ffffffff-0000-1111-2222-333344445555"
    esc = Escalation()
    esc.observe_event(GPU, "xid:48", T0, T0)
    esc.observe_event(other, "xid:48", T0 + 10, T0 + 10)
    assert actions(esc, GPU, T0 + 10) == []
    assert actions(esc, other, T0 + 10) == []


def test_state_survives_a_restart_without_replaying_stale_events():
    esc = Escalation()
    esc.observe_event(GPU, "xid:48", T0, T0)
    doc = json.loads(json.dumps(esc.to_dict()))  # through the state file
    assert doc["schema"] == "hetpatrol.escalation/1"
    # restarted 2 h later: the first DBE still counts
    back = Escalation.from_dict(doc, T0 + 7200)
    back.observe_event(GPU, "xid:48", T0 + 7200, T0 + 7200)
    assert actions(back, GPU, T0 + 7200) == [(REPLACE_CARD, "xid48_repeat")]
    # restarted 2 days later: the old event has decayed, nothing is replayed
    late = Escalation.from_dict(doc, T0 + 2 * DAY)
    assert late.identities() == []
    late.observe_event(GPU, "xid:48", T0 + 2 * DAY, T0 + 2 * DAY)
    assert actions(late, GPU, T0 + 2 * DAY) == []


def test_an_escalation_is_kept_across_a_restart():
    esc = Escalation()
    esc.observe_event(GPU, "xid:48", T0, T0)
    esc.observe_event(GPU, "xid:48", T0 + 60, T0 + 60)
    back = Escalation.from_dict(json.loads(json.dumps(esc.to_dict())), T0 + 3 * DAY)
    assert actions(back, GPU, T0 + 3 * DAY) == [(REPLACE_CARD, "xid48_repeat")]


@pytest.mark.parametrize(
    "doc",
    [
        None,
        [],
        {"schema": "other"},
        {"schema": "hetpatrol.escalation/1", "cards": 3},
        # a card's parts of the wrong type (a damaged or hand-edited state file): an
        # AttributeError out of the daemon's start before, on every restart
        {"schema": "hetpatrol.escalation/1", "cards": {"uuid:A": {"events": [1]}}},
        {"schema": "hetpatrol.escalation/1", "cards": {"uuid:A": {"escalated": True}}},
        {"schema": "hetpatrol.escalation/1", "cards": {"uuid:A": {"conditions": "x"}}},
    ],
)
def test_a_damaged_state_gives_an_empty_one(doc):
    assert Escalation.from_dict(doc, T0).identities() == []


def test_malformed_entries_are_dropped():
    doc = {
        "schema": "hetpatrol.escalation/1",
        "cards": {
            GPU: {
                "events": {"xid:48": [T0, "x", float("nan"), True], "xid:79": "no"},
                "escalated": {
                    "gone_rule": {"since": T0, "last": T0},
                    "xid48_repeat": {"since": "x"},
                },
                "conditions": {"check:collector_hung": {"since": None}},
            },
            "bad": 5,
        },
    }
    back = Escalation.from_dict(doc, T0 + 10)
    assert back.to_dict()["cards"] == {
        GPU: {"events": {"xid:48": [T0]}, "escalated": {}, "conditions": {}, "present": []}
    }


def test_mindcluster_81078603_five_a_day_then_released_after_two_days():
    # faultCustomization.json: 81078603, TimeWindow 86400, Times 5, ManuallySeparateNPU,
    # ReleaseTimeWindow 172800
    npu = "serial:033JLL10N8000123"
    esc = Escalation()
    for i in range(4):
        esc.observe_event(npu, "ascend:81078603", T0 + i * 3600, T0 + i * 3600)
    assert actions(esc, npu, T0 + 4 * 3600) == []
    esc.observe_event(npu, "ascend:81078603", T0 + 5 * 3600, T0 + 5 * 3600)
    assert actions(esc, npu, T0 + 5 * 3600) == [(ISOLATE_CARD, "ascend_81078603")]
    assert actions(esc, npu, T0 + 5 * 3600 + 2 * DAY - 1) == [(ISOLATE_CARD, "ascend_81078603")]
    assert actions(esc, npu, T0 + 5 * 3600 + 2 * DAY) == []
    assert esc.identities() == []


def test_mindcluster_twice_a_day_codes():
    npu = "serial:033JLL10N8000124"
    esc = Escalation()
    esc.observe_event(npu, "ascend:80E01801", T0, T0)
    esc.observe_event(npu, "ascend:80E01801", T0 + 100, T0 + 100)
    assert actions(esc, npu, T0 + 100) == [(ISOLATE_CARD, "ascend_twice_a_day")]


def test_duration_rule_hung_collector_for_ten_minutes_means_reboot():
    node = "node"
    esc = Escalation()
    esc.observe_conditions(node, {"check:collector_hung"}, T0)
    esc.observe_conditions(node, {"check:collector_hung"}, T0 + 600)
    assert actions(esc, node, T0 + 600) == []  # exactly T: not yet longer than T
    esc.observe_conditions(node, {"check:collector_hung"}, T0 + 601)
    assert actions(esc, node, T0 + 601) == [(REBOOT_NODE, "collector_hung_lasting")]
    # one good patrol (recover_seconds 0) ends it
    esc.observe_conditions(node, set(), T0 + 610)
    assert actions(esc, node, T0 + 610) == []
    esc.observe_conditions(node, {"check:collector_hung"}, T0 + 620)
    assert actions(esc, node, T0 + 900) == []  # the timer started again at T0 + 620


def test_duration_rule_recover_timeout():
    # faultCustomization.json FaultDuration: 81078603, FaultTimeout 20, RecoverTimeout 60
    npu = "bus:0000:c1:00.0"
    esc = Escalation()
    esc.observe_conditions(npu, {"ascend:81078603"}, T0)
    esc.observe_conditions(npu, {"ascend:81078603"}, T0 + 21)
    assert actions(esc, npu, T0 + 21) == [(ISOLATE_CARD, "ascend_81078603_lasting")]
    esc.observe_conditions(npu, set(), T0 + 30)  # gone for 30 s < 60 s: not recovered
    esc.observe_conditions(npu, {"ascend:81078603"}, T0 + 60)
    assert actions(esc, npu, T0 + 60) == [(ISOLATE_CARD, "ascend_81078603_lasting")]
    esc.observe_conditions(npu, set(), T0 + 70)
    esc.observe_conditions(npu, set(), T0 + 130)  # gone 60 s: recovered
    assert actions(esc, npu, T0 + 130) == []
    assert esc.identities() == []


def test_a_condition_timer_survives_a_restart():
    esc = Escalation()
    esc.observe_conditions("node", {"check:collector_hung"}, T0)
    back = Escalation.from_dict(json.loads(json.dumps(esc.to_dict())), T0 + 700)
    back.observe_conditions("node", {"check:collector_hung"}, T0 + 700)
    assert actions(back, "node", T0 + 700) == [(REBOOT_NODE, "collector_hung_lasting")]


def test_card_identity_prefers_uuid_then_serial_then_bus_id():
    assert card_identity({"uuid": "GPU-1", "serial": "S", "bus_id": "0000:07:00.0"}) == "uuid:GPU-1"
    assert card_identity({"uuid": None, "serial": "S1", "bus_id": "X"}) == "serial:S1"
    assert card_identity({"serial": "N/A", "bus_id": "0000:0A:00.0"}) == "bus:0000:0a:00.0"
    assert card_identity({"vendor": "ascend", "index": 2, "chip": 1}) == "pos:ascend/2/1"


def test_rules_from_config():
    rules = escalation.rules_from_config(
        {
            "frequency": [
                {
                    "name": "r",
                    "keys": ["xid:13"],
                    "times": 3,
                    "window_seconds": 60,
                    "action": "Reset-Card",
                }
            ]
        }
    )
    assert rules.frequency == (
        FrequencyRule("r", frozenset({"xid:13"}), 3, 60.0, RESET_CARD, source="config"),
    )
    assert rules.duration == escalation.default_duration_rules()
    with pytest.raises(ValueError, match="missing or has a bad field"):
        escalation.rules_from_config({"frequency": [{"name": "r"}]})
    with pytest.raises(ValueError, match="not an action word"):
        escalation.rules_from_config(
            {"duration": [{"name": "d", "keys": [], "fault_seconds": 1, "action": "panic"}]}
        )
    with pytest.raises(ValueError, match="times >= 1"):
        FrequencyRule("r", frozenset(), 0, 60, RESET_CARD)
    with pytest.raises(ValueError, match="durations"):
        DurationRule("d", frozenset(), -1, RESET_CARD)


def test_every_default_rule_cites_its_source():
    rules = EscalationRules()
    for rule in rules.frequency + rules.duration:
        assert rule.source, rule.name


def test_the_vendors_rules_come_from_their_plugins_the_core_keeps_its_own_keys():
    """The XID and Ascend rules are declared in the plugins' fault tables
    (``VendorInfo.actions``); the core's defaults name only ``check:`` / ``card:`` keys,
    and the defaults are the plugins' rules then the core's."""
    from hetpatrol.collectors import ascend_actions, nvidia_actions

    for rule in escalation.CORE_FREQUENCY_RULES + escalation.CORE_DURATION_RULES:
        assert all(k.startswith(("check:", "card:")) for k in rule.keys), rule.name
    frequency, duration = escalation.vendor_rules()
    assert frequency == ascend_actions.FREQUENCY_RULES + nvidia_actions.FREQUENCY_RULES
    assert duration == ascend_actions.DURATION_RULES
    rules = EscalationRules()
    assert rules.frequency == frequency + escalation.CORE_FREQUENCY_RULES
    assert rules.duration == duration + escalation.CORE_DURATION_RULES
    names = {r.name for r in rules.frequency}
    assert {"xid48_repeat", "xid149_repeat", "ascend_twice_a_day", "card_missing_repeat"} <= names
    (twice,) = [r for r in ascend_actions.FREQUENCY_RULES if r.name == "ascend_twice_a_day"]
    # faultCustomization.json's FaultFrequency row lists 41 codes, first 80C98000
    assert len(twice.keys) == 41 and "ascend:80C98000" in twice.keys


NPU = "serial:033SDH10N2000021"
CODE = "ascend:81078603"


def test_ascend_release_time_window_is_timed_from_the_recovery_not_the_escalation():
    """MindCluster (Ascend/mind-cluster component/ascend-device-plugin/pkg/common/
    fault_code.go, handleFrequencyFault): an upgraded fault is released once
    ``lastRecoverTime >= lastFaultTime`` and ``now - lastRecoverTime >
    ReleaseTimeWindow`` (172800 s for 81078603): a fault still present is never
    released, however long ago it was escalated or last occurred."""
    esc = Escalation()
    t = T0
    for _ in range(5):  # five occurrences in the day: isolate_card
        esc.observe_present(NPU, {CODE}, t)
        esc.observe_present(NPU, set(), t + 10)
        t += 600
    esc.observe_present(NPU, {CODE}, t)  # a sixth, and it stays up
    assert ("isolate_card", "ascend_81078603") in actions(esc, NPU, t)
    for day in range(1, 4):  # three days present: two days after escalation and last
        esc.observe_present(NPU, {CODE}, t + day * DAY)  # occurrence, still held
        assert ("isolate_card", "ascend_81078603") in actions(esc, NPU, t + day * DAY)
    cleared = t + 3 * DAY + 60
    esc.observe_present(NPU, set(), cleared)  # recovered: the window starts here
    assert ("isolate_card", "ascend_81078603") in actions(esc, NPU, cleared + 2 * DAY - 60)
    assert ("isolate_card", "ascend_81078603") not in actions(esc, NPU, cleared + 2 * DAY)
    # the recovery survives a restart
    again = Escalation()
    for i in range(5):
        again.observe_present(NPU, {CODE}, T0 + 600 * i)
        again.observe_present(NPU, set(), T0 + 600 * i + 10)
    doc = json.loads(json.dumps(again.to_dict()))
    back = Escalation.from_dict(doc, T0 + 3000)
    assert ("isolate_card", "ascend_81078603") in actions(back, NPU, T0 + 3000)
    assert actions(back, NPU, T0 + 2410 + 2 * DAY) == []


def test_ascend_recover_timeout_is_timed_from_the_fault_going_away():
    """MindCluster FaultDuration (fault_code.go, GetFaultTypeFromFaultDuration): the
    upgrade is removed once ``FaultRecoverDurationTime > RecoverTimeout``: the time the
    fault has been recovered, not since it started. 81078603 lasting: FaultTimeout 20,
    RecoverTimeout 60."""
    esc = Escalation()
    esc.observe_present(NPU, {CODE}, T0)
    esc.observe_present(NPU, {CODE}, T0 + 1000)  # up for 1000 s: lasting, isolate
    assert ("isolate_card", "ascend_81078603_lasting") in actions(esc, NPU, T0 + 1000)
    esc.observe_present(NPU, set(), T0 + 1010)  # gone: the 60 s start now
    esc.observe_present(NPU, set(), T0 + 1040)  # 30 s gone (1040 s after the start)
    esc.observe_present(NPU, {CODE}, T0 + 1050)  # back within 60 s: the same fault
    assert ("isolate_card", "ascend_81078603_lasting") in actions(esc, NPU, T0 + 1050)
    esc.observe_present(NPU, set(), T0 + 1060)
    esc.observe_present(NPU, set(), T0 + 1120)  # 60 s gone: over
    esc.observe_present(NPU, {CODE}, T0 + 1130)  # a new fault: 0 s, not lasting
    assert ("isolate_card", "ascend_81078603_lasting") not in actions(esc, NPU, T0 + 1130)
