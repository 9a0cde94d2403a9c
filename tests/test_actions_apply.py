"""One patrol's actions: findings -> card action with escalation, record fields, the
drain reason text, and the actions: config section."""

from __future__ import annotations

import pytest

from hetpatrol.actions import apply, settings
from hetpatrol.actions.escalation import Escalation
from hetpatrol.actions.vocabulary import (
    ISOLATE_CARD,
    NONE,
    REBOOT_NODE,
    REPLACE_CARD,
    RESET_CARD,
    WATCH,
    ActionVerdict,
)
from hetpatrol.collectors.ascend_detail import parse_health
from hetpatrol.schema import Finding
from tests.conftest import samples_dir

T0 = 1_800_000_000.0


def _sample_codes() -> tuple[str, ...]:
    text = (
        samples_dir("ascend")
        / "npu-smi-info-t-health-i0-c0_910A_Alarm_errcodes-multiline_v23.0.7.txt"
    ).read_text()
    return parse_health(text).codes


def test_recorded_npu_smi_health_codes_give_reset_card():
    # Error Code: A4025021 (NotHandleFault) 8C03A000 (RestartNPU) 8C084E00 (FreeRestartNPU)
    codes = _sample_codes()
    assert codes == ("A4025021", "8C03A000", "8C084E00")
    f = Finding("ascend_fault_code", "critical", "m", value={c: "x" for c in codes})
    card, per = apply.judge_card([f])
    assert (card.action, card.code) == (RESET_CARD, "ascend:8C03A000")
    assert apply.state_keys([f], {"8C03A000": "RestartNPU"}) == {
        "check:ascend_fault_code",
        "ascend:A4025021",
        "ascend:8C03A000",
        "ascend:8C084E00",
        "ascend_level:RestartNPU",
    }


def test_escalation_raises_the_card_action():
    esc = Escalation()
    ident = "uuid:GPU-1"
    findings = [Finding("xid", "critical", "m", value={"48": 1})]
    esc.observe_event(ident, apply.kernel_event_key(48, None), T0, T0)
    card, per = apply.judge_card(findings, identity=ident, escalation=esc, now=T0)
    assert card.action == RESET_CARD and [p.action for p in per] == [RESET_CARD]
    esc.observe_event(ident, "xid:48", T0 + 100, T0 + 100)
    card, per = apply.judge_card(findings, identity=ident, escalation=esc, now=T0 + 100)
    assert (card.action, card.source, card.code) == (REPLACE_CARD, "escalation", "xid48_repeat")
    assert [p.action for p in per] == [RESET_CARD]  # the finding keeps its own action


def test_a_code_that_stays_up_is_one_occurrence_one_that_returns_is_two():
    esc = Escalation()
    npu = "serial:S1"
    for t in range(0, 600, 10):  # 80E01801 up for 10 minutes of patrols
        esc.observe_present(npu, {"ascend:80E01801"}, T0 + t)
    assert esc.actions(npu, T0 + 600) == []
    esc.observe_present(npu, set(), T0 + 610)  # clears
    assert esc.observe_present(npu, {"ascend:80E01801"}, T0 + 620) == ["ascend:80E01801"]
    assert [v.action for v in esc.actions(npu, T0 + 620)] == [ISOLATE_CARD]


def test_hung_collector_lasting_escalates_through_state_keys():
    esc = Escalation()
    hung = [Finding("collector_hung", "unknown", "nvidia: no answer in 30 s")]
    for t in (0, 300, 601):
        esc.observe_present("node", apply.state_keys(hung, {}), T0 + t)
    card, _ = apply.judge_card(hung, identity="node", escalation=esc, now=T0 + 601, levels={})
    assert card.action == REBOOT_NODE


def test_overrides_and_no_findings():
    f = Finding("temperature", "critical", "m")
    assert (
        apply.judge_card([f], overrides={"check:temperature": WATCH}, levels={})[0].action == WATCH
    )
    assert apply.judge_card([], levels={})[0].action == NONE


def test_action_fields_and_drain_reason():
    v = ActionVerdict(RESET_CARD, "nvidia_xid", "xid:79", "XID 79 ...: RESTART_BM")
    assert apply.action_fields(v) == {
        "action": RESET_CARD,
        "action_source": "nvidia_xid",
        "action_code": "xid:79",
        "action_reason": "XID 79 ...: RESTART_BM",
    }
    assert apply.drain_reason("nvidia/3", v, "x2 in the last 3600 s") == (
        "hetpatrol: reset_card nvidia/3 xid 79 x2 in the last 3600 s"
    )
    long = apply.drain_reason("nvidia/3", v, "y" * 500)
    assert len(long) == apply.REASON_MAX and long.endswith("...")
    assert "\n" not in apply.drain_reason("n", ActionVerdict(WATCH, "s", None, "a\nb"))


def test_drain_reason_is_printable_so_the_root_helper_takes_it():
    """A vendor's text with ESC, CR, DEL, C1 or bidi controls in a verdict's reason: the
    root helper refuses such an argument (it would reach slurmctld raw), so the reason
    must come without them or the drain never happens."""
    from hetpatrol.scontrol_helper import check_request

    hostile = "fan \x1b[31mfailed\r\x7f\x9b1m \u202eevil\u2028next\ttab"
    reason = apply.drain_reason("ascend/0", ActionVerdict(RESET_CARD, "s", None, hostile))
    assert reason == "hetpatrol: reset_card ascend/0 fan [31mfailed 1m evil next tab"
    argv = ["update", "NodeName=n1", "State=DRAIN", f"Reason={reason}"]
    assert check_request(argv, ["n1"]) == ("drain", "n1")


# ------------------------------------------------------------------ settings
def test_actions_section_defaults_and_parsing():
    assert settings.parse_actions_section(None) == settings.ActionSettings()
    s = settings.parse_actions_section(
        {
            "overrides": {
                "xid:13": "watch",
                "ascend:80e3a201": "Reset-Card",
                "check:temperature": "none",
            },
            "drain_on": ["reset_card", "replace_card"],
            "prolog": {"block_on": ["replace_card"], "timeout_seconds": 2},
        }
    )
    assert s.overrides == {
        "xid:13": WATCH,
        "ascend:80E3A201": RESET_CARD,
        "check:temperature": NONE,
    }
    assert s.drain_on == {RESET_CARD, REPLACE_CARD}
    assert s.block_on == {REPLACE_CARD}
    assert s.prolog_timeout_seconds == 2.0


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"overrides": {"xid:abc": "watch"}}, "is not xid:<n>"),
        ({"overrides": {"xid:13": "drain"}}, "actions.overrides.xid:13: not an action word"),
        ({"drain_on": ["critical"]}, "actions.drain_on: not an action word"),
        ({"colour": "red"}, "unknown key"),
        ({"prolog": {"timeout_seconds": 0}}, r"\(0, 60\]"),
        ({"escalation": {"frequency": [{"name": "x"}]}}, "escalation rule"),
    ],
)
def test_actions_section_errors(section, message):
    with pytest.raises(ValueError, match=message):
        settings.parse_actions_section(section)


def test_the_schema_accepts_what_the_parser_accepts():
    jsonschema = pytest.importorskip("jsonschema")
    doc = {
        "overrides": {
            "xid:13": "watch",
            "ascend:80E3A201": "reset_card",
            "kernel:fallen_off_bus": "reset_card",
        },
        "drain_on": ["reset_card"],
        "escalation": {
            "frequency": [
                {
                    "name": "r",
                    "keys": ["xid:48"],
                    "times": 2,
                    "window_seconds": 60,
                    "action": "replace_card",
                }
            ],
            "duration": [
                {
                    "name": "d",
                    "keys": ["check:collector_hung"],
                    "fault_seconds": 60,
                    "action": "reboot_node",
                }
            ],
        },
        "prolog": {"block_on": ["isolate_card"], "timeout_seconds": 5},
    }
    jsonschema.validate(doc, settings.ACTIONS_SCHEMA)
    settings.parse_actions_section(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"drain_on": ["critical"]}, settings.ACTIONS_SCHEMA)


def test_action_counts_cover_every_word():
    counts = apply.action_counts([RESET_CARD, NONE, NONE])
    assert counts == {
        "none": 2,
        "watch": 0,
        "restart_job": 0,
        "reset_card": 1,
        "reboot_node": 0,
        "isolate_card": 0,
        "replace_card": 0,
    }
    with pytest.raises(ValueError):
        apply.action_counts(["critical"])
