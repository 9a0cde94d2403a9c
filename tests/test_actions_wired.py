"""The actions in the patrol's output: records, JSONL, state file, /metrics, and the
escalation counts that survive a daemon restart (read back from the state file)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

from conftest import NODES

from hetpatrol.actions.escalation import Escalation
from hetpatrol.config import load_config
from hetpatrol.daemon import Daemon
from hetpatrol.exporters.prometheus import Exposition
from hetpatrol.exporters.state import read_state
from hetpatrol.patrol import Patroller

GPU6 = "GPU-d7051dd7-616a-cb6a-4aaf-7901dc199334"  # xid-79's GPU 6 (0000:cb:00.0)


def _once(scenario: str, config=None):
    patroller = Patroller(config or load_config(), replay_dir=NODES / scenario)
    try:
        return patroller.run()
    finally:
        patroller.close()


def test_every_card_finding_and_the_node_carry_their_action():
    report = _once("sick-mixed")
    by = {(c.vendor, c.index): c for c in report.cards}
    assert (by["nvidia", 1].action, by["nvidia", 1].action_code) == (
        "reset_card",
        "check:remapped_rows_pending",
    )
    assert by["nvidia", 3].action == "reboot_node"  # GPU lost: fell off the bus
    assert by["ascend", 5].action == "watch"  # Alarm: the codes carry the action
    assert by["nvidia", 0].action == "none"
    assert [f.action for f in by["nvidia", 1].findings] == ["reset_card"]
    assert report.action == "reboot_node"
    patrol = json.loads(report.patrol_line)
    assert patrol["action"] == "reboot_node"
    card = json.loads(report.card_lines[1])
    assert (card["action"], card["findings"][0]["action"]) == ("reset_card", "reset_card")


def test_metrics_have_one_action_series_per_card_and_the_counts():
    text = Exposition(("nvidia", "ascend")).update(_once("sick-mixed")).decode()
    lines = [x for x in text.splitlines() if x.startswith("hetpatrol_card_action{")]
    assert len(lines) == 12
    assert (
        'hetpatrol_card_action{action="reset_card",card_type="a100",index="1",'
        'uuid="GPU-31a005b2-0756-4b05-30d1-3494a65b19d7",vendor="nvidia"} 1.0'
    ) in lines
    counts = {
        x.split('"')[1]: float(x.rsplit(" ", 1)[1])
        for x in text.splitlines()
        if x.startswith("hetpatrol_cards_by_action{")
    }
    assert counts == {
        "none": 9.0,
        "watch": 1.0,
        "restart_job": 0.0,
        "reset_card": 1.0,
        "reboot_node": 1.0,
        "isolate_card": 0.0,
        "replace_card": 0.0,
    }


def test_an_override_changes_the_action(tmp_path):
    path = tmp_path / "c.yaml"
    text = (NODES.parent.parent / "config" / "hetpatrol.yaml").read_text()
    text = text.replace(
        "  overrides: {}\n", '  overrides: {"check:remapped_rows_pending": watch}\n'
    )
    path.write_text(text)
    report = _once("sick-mixed", load_config(path))
    by = {(c.vendor, c.index): c for c in report.cards}
    assert by["nvidia", 1].action == "watch"


def test_the_xid_counts_survive_a_restart_through_the_state_file(tmp_path):
    state = tmp_path / "state.json"
    config = replace(load_config(), state_path=state, jsonl_path=None, listen=None, node="xid79-01")
    first = Daemon(config, replay_dir=NODES / "xid-79")
    try:
        report = first.patrol_once()
    finally:
        first.shutdown()
    doc = read_state(state)
    counted = doc["escalation"]
    assert f"uuid:{GPU6}" in json.dumps(counted)  # XID 79 on GPU 6, by its UUID
    assert doc["action"] == report.action == "reboot_node"

    second = Daemon(config, replay_dir=NODES / "healthy-mixed")
    try:
        second.restore_escalation()
        esc = second.patroller.escalation
        assert esc.to_dict() == Escalation.from_dict(counted, time.time()).to_dict()
        # a second XID 79 on the same card within 24 h: NVIDIA's catalog says a
        # recurring Xid takes the investigatory action: isolate the card
        later = time.time() + 60  # another XID 79 record, a minute later
        assert esc.observe_event(f"uuid:{GPU6}", "xid:79", later, later)
        assert [v.action for v in esc.actions(f"uuid:{GPU6}", later)] == ["isolate_card"]
    finally:
        second.shutdown()
