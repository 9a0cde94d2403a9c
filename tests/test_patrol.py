"""The patrol engine: bounded collectors, carried-forward cards, recovery hysteresis."""

from __future__ import annotations

import datetime
import json
import time

import jsonschema
import pytest
from fakes import Scripted, make_patroller, waited_out

from hetpatrol.schema import jsonl_json_schema


def test_report_lines_validate_against_schema(base_config):
    p = make_patroller(base_config, {"ascend": Scripted()})
    report = p.run()
    schema = jsonl_json_schema()
    for line in report.jsonl_lines():
        assert line.endswith("\n")
        jsonschema.validate(json.loads(line), schema)
    summary = json.loads(report.patrol_line)
    assert summary["seq"] == 1
    assert summary["cards"] == {"ok": 1, "warning": 0, "critical": 0, "unknown": 0}
    assert summary["collectors"]["ascend"]["state"] == "ok"
    assert report.exit_code == 0


def test_failed_collector_keeps_cards_as_unknown_with_raw_text(base_config):
    c = Scripted()
    c.temps = [40.0, 41.0]
    p = make_patroller(base_config, {"ascend": c})
    assert p.run().health == "ok"
    c.mode = "fail"
    report = p.run()
    assert [r.health for r in report.cards] == ["unknown", "unknown"]
    assert {f.check for r in report.cards for f in r.findings} == {"collector_failed"}
    status = report.collectors[0]
    assert (status.state, status.up) == ("failed", False)
    assert "-8005" in status.error
    assert status.raw == "dcmi module initialize failed. ret is -8005\n"
    assert report.exit_code == 3


def test_failure_on_first_patrol_is_never_zero_cards_ok(base_config):
    c = Scripted()
    c.mode = "fail"
    report = make_patroller(base_config, {"ascend": c}).run()
    assert report.cards == ()
    assert report.health == "unknown"
    assert [f.check for f in report.node_findings] == ["collector_failed"]


def test_plugin_exception_stops_only_its_own_collector(base_config):
    bad, good = Scripted(), Scripted(vendor="nvidia")
    bad.mode = "raise"
    report = make_patroller(base_config, {"ascend": bad, "nvidia": good}).run()
    states = {s.name: s.state for s in report.collectors}
    assert states == {"ascend": "failed", "nvidia": "ok"}
    assert "RuntimeError: plugin bug" in report.collectors[0].error
    assert [r.vendor for r in report.cards] == ["nvidia"]


def test_stuck_collector_does_not_block_patrol_and_is_not_called_twice(base_config):
    c = Scripted()
    p = make_patroller(base_config, {"ascend": c}, timeout=0.3)
    p.run()
    c.mode = "block"
    t0 = time.monotonic()
    report = p.run()
    elapsed = time.monotonic() - t0
    # bounded by the deadline (0.3 s timeout + the hang margin), not by the stuck call's 30 s
    assert elapsed < waited_out(0.3) + 5, elapsed
    assert report.collectors[0].state == "hung"
    assert report.cards[0].health == "unknown"
    assert report.cards[0].findings[0].check == "collector_hung"
    calls = c.calls
    report = p.run()  # still stuck: no second call into it
    assert c.calls == calls
    assert "still stuck" in report.collectors[0].error
    c.mode = "ok"
    c.release.set()  # the stuck call returns when its worker next runs: wait for that
    deadline = time.monotonic() + 10
    while (report := p.run()).collectors[0].state == "hung":
        assert "still stuck" in report.collectors[0].error and c.calls == calls
        assert time.monotonic() < deadline, "the released call never returned"
        time.sleep(0.05)
    assert c.calls == calls + 1  # recovered: one new call is made
    assert report.collectors[0].state == "ok"


def test_recovery_needs_consecutive_good_patrols(base_config):
    c = Scripted()
    c.temps = [95.0]
    p = make_patroller(base_config, {"ascend": c}, recovery=3)
    r1 = p.run()
    assert r1.cards[0].health == "critical"
    c.temps = [40.0]
    r2, r3, r4 = p.run(), p.run(), p.run()
    assert [r.cards[0].health for r in (r2, r3, r4)] == ["critical", "critical", "ok"]
    assert r2.cards[0].findings[0].check == "recovering"
    assert r2.cards[0].findings[0].message.startswith("good for 1 of 3")
    changes = [json.loads(r.patrol_line)["changes"] for r in (r1, r2, r3, r4)]
    assert changes[0][-1] == {
        "card": "ascend/0/0",
        "uuid": None,
        "bus_id": None,
        "from": None,
        "to": "critical",
    }
    assert changes[1] == [] and changes[2] == []
    assert changes[3] == [
        {"card": "ascend/0/0", "uuid": None, "bus_id": None, "from": "critical", "to": "ok"}
    ]


def test_flapping_card_does_not_flap(base_config):
    c = Scripted()
    p = make_patroller(base_config, {"ascend": c}, recovery=2)
    seen = []
    for temp in (95.0, 40.0, 95.0, 40.0, 95.0, 40.0, 40.0):
        c.temps = [temp]
        seen.append(p.run().cards[0].health)
    assert seen == ["critical"] * 6 + ["ok"]


def test_vanished_card_is_a_change(base_config):
    c = Scripted()
    c.temps = [40.0, 40.0]
    p = make_patroller(base_config, {"ascend": c})
    p.run()
    c.temps = [40.0]
    report = p.run()
    assert {
        "card": "ascend/1/0",
        "uuid": None,
        "bus_id": None,
        "from": "ok",
        "to": None,
    } in report.changes


def test_a_patrol_that_finds_no_card_is_not_ok(base_config, tmp_path):
    from hetpatrol.patrol import Patroller

    report = Patroller(base_config, replay_dir=tmp_path).run()  # an empty replay dir
    assert report.cards == ()
    # (and the census info: an empty replay dir has no PCI census either)
    assert [f.check for f in report.node_findings if f.check != "pci_census"] == ["no_cards"]
    assert report.health == "unknown" and report.exit_code == 3


def test_an_npu_gone_from_npu_smi_is_a_card_missing_finding(tmp_path):
    """NPU 5 (bus 0000:02:00.0) listed, then gone: the node is not ok (it went straight
    to ok, 7 cards): a warning for 2 patrols, critical at the third in a row
    (missing_patrols 3); a row garbled so it cannot be read makes it unknown, not
    critical, and counts nothing; listed again, the finding goes."""
    import shutil
    from dataclasses import replace

    from conftest import NODES

    from hetpatrol.config import load_config
    from hetpatrol.patrol import Patroller

    node = tmp_path / "node"
    node.mkdir()
    table = node / "npu-smi-info.txt"
    shutil.copy(NODES / "healthy-mixed" / "npu-smi-info.txt", table)
    text = table.read_text()
    lines = text.splitlines(keepends=True)
    assert lines[21].startswith("| 5     910B4") and "0000:02:00.0" in lines[22]
    config = replace(load_config(), node="n", collectors=load_config().collectors[1:])
    patroller = Patroller(config, replay_dir=node)
    try:
        assert patroller.run().health == "ok"
        assert lines[43].startswith("| No running processes found in NPU 5 ")
        # gone from both tables, as when the driver no longer sees it
        table.write_text("".join(lines[:21] + lines[24:43] + lines[45:]))
        for n in (1, 2):
            report = patroller.run()
            assert (report.health, report.action, len(report.cards)) == ("warning", "watch", 7)
            (f,) = [f for f in report.node_findings if f.check != "pci_census"]  # no census
            assert (f.check, f.severity, f.value) == ("card_missing", "warning", 1)
            assert f.message.startswith(
                "ascend: 1 card(s) listed before no longer listed: ascend/5/0 (0000:02:00.0) "
                f"{n} of 3 patrols; critical (action reboot_node) only after 3 patrols in a row"
            ), f.message
        report = patroller.run()
        assert (report.health, len(report.cards)) == ("critical", 7)
        found = [f for f in report.node_findings if f.check != "pci_census"]
        assert [(f.check, f.severity, f.message, f.value) for f in found] == [
            (
                "card_missing",
                "critical",
                "ascend: 1 card(s) listed before no longer listed: ascend/5/0 (0000:02:00.0) "
                "not listed in 3 patrols in a row (missing_patrols 3)",
                1,
            )
        ]
        table.write_text(text.replace("| 5     910B4", "| X     910B4"))  # garbled
        report = patroller.run()
        assert [(f.check, f.severity) for f in report.node_findings if f.check != "pci_census"] == [
            ("card_missing", "unknown")
        ]
        assert report.health == "unknown"
        # the damaged patrol kept the count, it did not add to it
        ((key, entry),) = report.node_checks["boot"]["missing_cards"].items()
        assert (key, entry["patrols"], entry["bus_id"]) == (
            "bus:0000:02:00.0/chip 0",
            3,
            "0000:02:00.0",
        )
        table.write_text(text)
        # listed again: held as it was until listed recovery_patrols (3) times in a row
        for n in (1, 2):
            report = patroller.run()
            found = [(f.check, f.severity, f.message) for f in report.node_findings]
            assert [x for x in found if x[0] != "pci_census"] == [
                (
                    "card_missing",
                    "unknown",
                    "ascend: 1 card(s) listed again, held until listed 3 patrols in a row: "
                    f"ascend/5/0 (0000:02:00.0) {n} of 3",
                )
            ]
        report = patroller.run()
        rest = tuple(f for f in report.node_findings if f.check != "pci_census")
        assert (rest, len(report.cards)) == ((), 8)
    finally:
        patroller.close()


def _drains_and_resumes(reports, resume_after=3):
    """Drains and resumes the drain policy would make of these patrols: a patrol with a
    drain action drains (hetpatrol.slurm.drain.drain_needs), ``resume_after`` healthy
    (ok or warning) patrols in a row resume (DrainPolicy._decide's rule)."""
    from hetpatrol.slurm.drain import drain_needs

    drains = resumes = healthy = 0
    drained = False
    for report in reports:
        if drain_needs(report):
            healthy = 0
            drains += not drained
            drained = True
        elif report.health in ("ok", "warning"):
            healthy += 1
            if drained and healthy >= resume_after:
                resumes, drained = resumes + 1, False
        else:
            healthy = 0
    return drains, resumes


def test_a_card_that_drops_out_for_one_patrol_now_and_then_never_drains(base_config):
    """A GPU that vanishes one patrol in five (the hostile trial's flapping card): each
    drop is one ambiguous answer, a warning "1 of 3 patrols" (watch), never critical,
    never a drain; listed again the warning ends (no hold of a warning), and the repeat
    rule (``card_missing_repeat``) counts no such drop: GPU-a is never isolated."""
    c = _ByUuid()
    p = make_patroller(base_config, {"nvidia": c}, recovery=3)
    every = list(c.cards)
    reports = []
    for n in range(1, 41):
        c.cards = [x for x in every if x[0] != "GPU-a"] if n % 5 == 0 else list(every)
        report = p.run()
        reports.append(report)
        if n % 5 == 0:
            (f,) = report.node_findings
            assert (f.check, f.severity, f.action) == ("card_missing", "warning", "watch")
            assert "nvidia/0 1 of 3 patrols" in f.message
        else:
            assert report.node_findings == ()
            assert [(r.uuid, r.action) for r in report.cards][0] == ("GPU-a", "none")
    assert [r.health for r in reports] == ["warning" if n % 5 == 0 else "ok" for n in range(1, 41)]
    assert _drains_and_resumes(reports) == (0, 0)


def test_a_card_really_missing_now_and_then_is_held_by_identity_then_isolated(base_config):
    """A GPU gone for 3 patrols in a row (missing_patrols) every nine: critical at the
    third, so the node drains. Listed again it keeps its ``card_missing`` finding until
    ``recovery_patrols`` (3) patrols in a row list it, and really missing twice in a day
    it is isolated by its UUID (rule ``card_missing_repeat``: it counts the patrols that
    confirmed it, not the warnings before) until an operator clears it: two drains and
    one resume in 40 patrols. The hold follows the UUID: the GPUs after it move down one
    index while it is gone and no other card is held."""
    c = _ByUuid()
    p = make_patroller(base_config, {"nvidia": c}, recovery=3)
    every = list(c.cards)
    reports = []
    for n in range(1, 41):
        c.cards = [x for x in every if x[0] != "GPU-a"] if n % 9 >= 6 else list(every)
        report = p.run()
        reports.append(report)
        if n in (6, 7):
            (f,) = report.node_findings
            assert (f.severity, f.action) == ("warning", "watch")
            assert f"nvidia/0 {n - 5} of 3 patrols" in f.message
        if n == 8:
            (f,) = report.node_findings
            assert (f.check, f.severity, f.action) == ("card_missing", "critical", "reboot_node")
            assert "nvidia/0 not listed in 3 patrols in a row" in f.message
        if n == 9:  # back for one patrol: held, by its UUID, and named as held
            (f,) = report.node_findings
            assert (f.check, f.severity, f.action) == ("card_missing", "critical", "reboot_node")
            assert f.message == (
                "nvidia: 1 card(s) listed again, held until listed 3 patrols in a row: "
                "nvidia/0 1 of 3"
            )
            assert [(r.uuid, r.health, r.action) for r in report.cards] == [
                ("GPU-a", "ok", "none"),
                ("GPU-b", "ok", "none"),
                ("GPU-c", "ok", "none"),
            ]
        if n == 16:  # gone again, a warning: the first episode counted once, not thrice
            assert report.escalation["cards"]["uuid:GPU-a"]["events"] == {
                "card:missing": [pytest.approx(reports[7].finished, abs=5)]
            }
        if n == 18:  # really missing twice: GPU-a alone is isolated
            assert [(r.uuid, r.action) for r in report.cards] == [
                ("GPU-a", "isolate_card"),
                ("GPU-b", "none"),
                ("GPU-c", "none"),
            ]
            assert report.cards[0].action_code == "card_missing_repeat"
    verdicts = [r.health for r in reports]
    assert verdicts[:5] == ["ok"] * 5
    assert verdicts[5:11] == ["warning", "warning"] + ["critical"] * 3 + ["ok"]
    assert _drains_and_resumes(reports) == (2, 1)


def test_a_critical_node_finding_is_held_after_it_goes(base_config):
    """``nvml_driver`` (critical: reboot_node) raised once is held, said so, for
    ``recovery_patrols`` - 1 patrols after it goes, as a bad card is."""
    from hetpatrol.schema import Finding

    p = make_patroller(base_config, {"nvidia": _ByUuid()}, recovery=3)
    raised = [Finding("nvml_driver", "critical", "driver/library mismatch")]
    assert p._hold_node_findings(list(raised)) == raised
    for n in (1, 2):
        (held,) = p._hold_node_findings([])
        assert (held.check, held.severity, held.message) == (
            "nvml_driver",
            "critical",
            f"driver/library mismatch (not raised for {n} of 3 patrols: held)",
        )
    assert p._hold_node_findings([]) == []
    # in a patrol: the collector says it once, the node stays critical for two more
    from hetpatrol.collector import STATE_OK, CollectResult

    class Once(_ByUuid):
        def collect(self):
            res = super().collect()
            self.calls += 1
            found = list(raised) if self.calls == 1 else []
            return CollectResult(self.name, res.records, STATE_OK, node_findings=found)

    q = make_patroller(base_config, {"nvidia": Once()}, recovery=3)
    assert [q.run().health for _ in range(4)] == ["critical", "critical", "critical", "ok"]
    # raised as a warning: no longer critical, not held
    p._hold_node_findings(list(raised))
    warn = [Finding("nvml_driver", "warning", "x")]
    assert p._hold_node_findings(list(warn)) == warn


class _ByUuid(Scripted):
    """GPUs with UUIDs; ``cards`` lists (uuid, temperature) in enumeration order."""

    def __init__(self):
        super().__init__(vendor="nvidia")
        self.cards = [("GPU-a", 40.0), ("GPU-b", 40.0), ("GPU-c", 40.0)]

    def collect(self):
        from hetpatrol.collector import STATE_OK, CollectResult
        from hetpatrol.schema import CardRecord

        recs = [
            CardRecord(
                vendor="nvidia",
                index=i,
                uuid=uuid,
                model="NVIDIA A100-SXM4-80GB",
                card_type="a100",
                temperature_celsius=t,
            )
            for i, (uuid, t) in enumerate(self.cards)
        ]
        return CollectResult(self.name, recs, STATE_OK)


def test_recovery_hold_and_changes_follow_the_uuid_not_the_index(base_config):
    """GPU-a is critical (95 C), then drops out of the enumeration: GPU-b moves to index
    0 and GPU-c to index 1. GPU-b keeps its own ok verdict (no hold inherited from
    index 0), and the change list names GPU-a going, not ``nvidia/2``."""
    c = _ByUuid()
    c.cards[0] = ("GPU-a", 95.0)
    p = make_patroller(base_config, {"nvidia": c}, recovery=3)
    assert [r.health for r in p.run().cards] == ["critical", "ok", "ok"]
    c.cards = [("GPU-b", 40.0), ("GPU-c", 40.0)]
    report = p.run()
    assert [(r.uuid, r.health) for r in report.cards] == [("GPU-b", "ok"), ("GPU-c", "ok")]
    assert report.changes == (
        {"card": "nvidia/0", "uuid": "GPU-a", "bus_id": None, "from": "critical", "to": None},
    )
    assert [(f.check, f.severity) for f in report.node_findings if f.check != "pci_census"] == [
        ("card_missing", "warning")  # 1 of 3 patrols
    ]


def test_a_card_read_in_part_gets_the_rest_of_its_identity_by_uuid(base_config):
    """GPU-b answers its UUID but nothing else (an error entry) after the enumeration
    moved it from index 1 to 0: its bus id and model come from the read of GPU-b, not
    from whatever card was at index 0 before."""
    from hetpatrol.collector import STATE_OK, CollectResult

    class Partial(_ByUuid):
        def collect(self):
            self.calls += 1
            result = super().collect()
            for i, rec in enumerate(result.records):
                rec.bus_id = f"0000:0{i + 1}:00.0" if self.calls == 1 else None
                if self.calls > 1:
                    rec.model = rec.card_type = rec.temperature_celsius = None
                    rec.add_error("nvmlDeviceGetPciInfo", "GpuIsLost")
            return CollectResult(self.name, result.records, STATE_OK)

    c = Partial()
    p = make_patroller(base_config, {"nvidia": c})
    first = p.run()
    assert [(r.uuid, r.bus_id) for r in first.cards] == [
        ("GPU-a", "0000:01:00.0"),
        ("GPU-b", "0000:02:00.0"),
        ("GPU-c", "0000:03:00.0"),
    ]
    c.cards = [("GPU-b", 40.0)]
    (rec,) = p.run().cards
    assert (rec.index, rec.uuid, rec.bus_id, rec.model, rec.card_type) == (
        0,
        "GPU-b",
        "0000:02:00.0",
        "NVIDIA A100-SXM4-80GB",
        "a100",
    )


def test_nvlink5_xids_the_catalog_ignores_do_not_escalate(base_config):
    """XID 149 twice a day isolates the card (catalog: NETIR_LINK_DOWN "REPORT_ISSUE (if
    seen >1 per day)"), but not when the decode of the line is IGNORE (NETIR_BER_EVENT,
    NETIR_LINK_EVT sub-code 38): those need no action, their repeats none either."""
    from hetpatrol.schema import CardRecord

    p = make_patroller(base_config, {"nvidia": _ByUuid()}, recovery=3)
    now = 1_800_000_000.0
    clock = {"wall": now}
    p.monotonic = lambda: clock["wall"] - now  # no step: it follows the wall times below
    card = CardRecord(vendor="nvidia", index=0, uuid="GPU-a", bus_id="0000:00:00.0")

    def event(t, action):
        ts = datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat()
        return {"xid": 149, "reason": None, "uuid": "GPU-a", "bus_id": "0000:00:00.0",
                "ts": ts, "in_window": True, "nvlink_action": action}  # fmt: skip

    def patrol(t, action):
        clock["wall"] = t
        p._assign_actions([card], [], [event(t, action)], t)

    patrol(now - 7200, "IGNORE")
    patrol(now, "IGNORE")
    assert card.action == "none"
    patrol(now + 10, "RESET_GPU")
    patrol(now + 20, "RESET_GPU")
    assert (card.action, card.action_code) == ("isolate_card", "xid149_repeat")
