"""Reboot survival (hetpatrol.actions.reboot_history): the same critical fault on the same
card in boot after boot escalates to replace_card; the history lives in the state
directory; `hetpatrol history clear` forgets a card with an audit line. Driven over the
three boots of fixtures/nodes/fault-survives-reboots."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import jsonschema
import pytest
from conftest import NODES

from hetpatrol.actions.reboot_history import RebootHistory, SurvivalRule
from hetpatrol.cli import main
from hetpatrol.config import load_config
from hetpatrol.daemon import Daemon
from hetpatrol.exporters import PRIVATE_FILE_MODE
from hetpatrol.exporters.history_file import history_path, read_history, write_history
from hetpatrol.replay import scenario_boots
from hetpatrol.schema import event_json_schema

SURVIVES = NODES / "fault-survives-reboots"
# GPU 2 of healthy-mixed's nvidia-smi-q.xml (bus 00000000:4C:00.0), whose link 7 is down
GPU2 = "GPU-6d33bd6a-6eac-013c-9c16-a880cab1362b"
BOOTS = [
    "5d2e8f10-7c3b-4a96-b1e4-0f6a9c2d3e71",
    "c81f4a29-6e0d-4b57-a3c2-7d9e1b5f0a84",
    "e4b07d63-1a9c-4f28-8e5b-2c6d0f9a7b15",
]


def config_for(tmp_path):
    return replace(
        load_config(SURVIVES / "hetpatrol.yaml"),
        state_path=tmp_path / "state" / "state.json",
        jsonl_path=tmp_path / "state" / "patrol.jsonl",
    )


def run_boot(config, n: int, patrols: int = 5):
    """Boot ``n`` (1-based): a fresh daemon, as after a reboot, going on from the state
    directory; ``patrols`` patrols (the grace is 4: patrol 5 is past it)."""
    d = Daemon(config, replay_dir=scenario_boots(SURVIVES)[n - 1])
    try:
        d.restore_escalation()
        return [d.patrol_once() for _ in range(patrols)]
    finally:
        d.shutdown()


def gpu2(report):
    return next(c for c in report.cards if c.uuid == GPU2)


def test_a_fault_that_survives_two_reboots_ends_at_replace_card(tmp_path):
    config = config_for(tmp_path)
    path = history_path(config.state_path)
    for n in (1, 2):
        reports = run_boot(config, n)
        card = gpu2(reports[0])  # within the grace: warning, watch
        assert card.health == "warning" and card.action == "watch"
        card = gpu2(reports[-1])
        assert card.health == "critical"
        assert card.action == "reset_card"  # the finding's own action: a reboot may fix it
        assert card.action_source == "finding"
        history = read_history(path, reports[-1].finished)
        assert history.cards[f"uuid:{GPU2}"]["nvlink_down"]["boots"] == BOOTS[:n]
    reports = run_boot(config, 3)
    card = gpu2(reports[-1])
    assert card.action == "replace_card"
    assert card.action_source == "reboot_history"
    assert card.action_code == "nvlink_down"
    assert "seen in 3 boots" in card.action_reason and "survived 2 reboot" in card.action_reason
    assert reports[-1].action == "replace_card"
    # the node view says why under the card: its finding's message says only "reset the
    # GPU", which reads as the wrong action beside replace_card
    from hetpatrol.cli import format_table

    lines = format_table(reports[-1], width=80).splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("      action replace_card: "))
    assert lines[at] == (
        "      action replace_card: nvlink_down seen in 3 boots: it survived 2 reboot(s)"
    )
    assert lines[at - 1].strip().endswith("reset the GPU")  # nvlink_down's message above
    # only the card whose fault survived: the other GPUs never had one
    others = [c for c in reports[-1].cards if c.vendor == "nvidia" and c.uuid != GPU2]
    assert len(others) == 7 and {c.action for c in others} == {"none"}
    doc = json.loads(path.read_text())
    assert list(doc["cards"]) == [f"uuid:{GPU2}"]
    assert path.stat().st_mode & 0o777 == PRIVATE_FILE_MODE  # as the state file


def test_a_fault_seen_in_the_grace_only_is_no_history(tmp_path):
    """Links still training (warning in the grace) are not a fault that survived."""
    config = config_for(tmp_path)
    for n in (1, 2, 3):
        run_boot(config, n, patrols=2)
    assert read_history(history_path(config.state_path), 0.0).cards == {}


def test_history_clear_forgets_the_card_with_an_audit_line(tmp_path, capsys):
    config = config_for(tmp_path)
    for n in (1, 2):
        run_boot(config, n)
    cfg = tmp_path / "h.yaml"
    cfg.write_text(
        f"state_path: {config.state_path}\njsonl: {{path: {config.jsonl_path}}}\n"
        "node: survives-01\n"
    )
    assert main(["history", "--config", str(cfg), "show"]) == 0
    assert f"uuid:{GPU2}  nvlink_down  seen in 2 boot(s)" in capsys.readouterr().out
    assert main(["history", "--config", str(cfg), "clear", "--card", "GPU-nope"]) == 1
    # by bus id, as nvidia-smi prints it: the card's identity is its UUID, its bus id
    # (0000:4c:00.0, kept beside it) names it too
    assert main(["history", "--config", str(cfg), "clear", "--card", "0000:4C:00.0"]) == 0
    assert read_history(history_path(config.state_path), 0.0).cards == {}
    lines = [json.loads(x) for x in config.jsonl_path.read_text().splitlines()]
    audit = [x for x in lines if x.get("event") == "history_clear"]
    assert len(audit) == 1
    jsonschema.validate(audit[0], event_json_schema())
    assert audit[0]["card"] == "0000:4C:00.0" and audit[0]["node"] == "survives-01"
    assert audit[0]["cleared"][f"uuid:{GPU2}"]["nvlink_down"]["boots"] == BOOTS[:2]
    assert isinstance(audit[0]["operator"]["uid"], int)
    # boot 3 after the clear: the fault counts from this boot again, no replace_card
    card = gpu2(run_boot(config, 3)[-1])
    assert card.action == "reset_card"


def test_a_clear_while_the_daemon_runs_is_followed_and_not_overwritten(tmp_path):
    config = config_for(tmp_path)
    run_boot(config, 1)
    run_boot(config, 2)
    path = history_path(config.state_path)
    d = Daemon(config, replay_dir=scenario_boots(SURVIVES)[2])
    try:
        d.restore_escalation()
        reports = [d.patrol_once() for _ in range(5)]
        assert gpu2(reports[-1]).action == "replace_card"
        on_disk = read_history(path, 0.0)
        on_disk.clear(GPU2)  # the operator's command, between two patrols
        write_history(path, on_disk)
        # the daemon reads the cleared file again before its next verdict
        assert gpu2(d.patrol_once()).action == "reset_card"
    finally:
        d.shutdown()
    # and its write kept the clear: only this boot is in the history now
    assert read_history(path, 0.0).cards[f"uuid:{GPU2}"]["nvlink_down"]["boots"] == BOOTS[2:]


def test_history_unit_rules():
    h = RebootHistory(SurvivalRule(reboots=2, window_seconds=100.0))
    h.observe([("uuid:A", {"xid"}), ("uuid:B", set())], "b1", 10.0)
    h.observe([("uuid:A", {"xid"})], "b1", 11.0)  # same boot: counted once
    h.observe([("uuid:A", {"xid"})], "b2", 20.0)
    assert h.verdict("uuid:A") is None  # 1 reboot survived of 2
    h.observe([("uuid:A", {"xid"})], "b3", 30.0)
    assert h.verdict("uuid:A").action == "replace_card"
    assert h.verdict("uuid:B") is None
    # another family on another card does not add to A's
    h.observe([("uuid:A", {"nvlink_down"})], "b4", 31.0)
    assert h.cards["uuid:A"]["nvlink_down"]["boots"] == ["b4"]
    # round trip, then the window forgets what was last seen too long ago
    again = RebootHistory.from_dict(h.to_dict(), 40.0, h.rule)
    assert again.cards == h.cards
    assert RebootHistory.from_dict(h.to_dict(), 200.0, h.rule).cards == {}
    # a damaged or foreign document is an empty history
    assert RebootHistory.from_dict({"schema": "x"}, 1.0).cards == {}
    bad = {"schema": "hetpatrol.reboot_history/1", "cards": {"uuid:A": {"xid": {"boots": 3}}}}
    assert RebootHistory.from_dict(bad, 1.0).cards == {}
    # clear by bus id, written as nvidia-smi prints it
    h.cards["bus:0000:4c:00.0"] = {"xid": {"boots": ["b1"], "first": 1.0, "last": 1.0}}
    assert h.clear("0000:4C:00.0") == ["bus:0000:4c:00.0"]
    # switched off: nothing kept, nothing raised
    off = RebootHistory(SurvivalRule(enabled=False))
    off.observe([("uuid:A", {"xid"})], "b1", 1.0)
    assert off.cards == {} and off.verdict("uuid:A") is None


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="os.chown to another uid needs root")
def test_another_users_files_in_a_shared_state_directory_are_not_believed(tmp_path):
    """A state path in a sticky directory (``/tmp``, which :mod:`hetpatrol.safe_files`
    accepts for the daemon's own files) lets any user make the names there first. The
    writers refuse another user's file; the readers believed it: a forged
    ``reboot-history.json`` made GPU 2 ``replace_card`` (a drain) in its first boot, a
    forged ``state.json`` set the boot's patrol count past the post-boot grace, and
    another user's ``reboot-history.json.lock`` was opened and locked (a user holding
    that flock stops every patrol). Each is now refused, said in the log."""
    import time

    from hetpatrol.exporters.history_file import locked
    from hetpatrol.logs import capture_logs
    from hetpatrol.safe_files import UnsafePath

    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    config = replace(
        load_config(SURVIVES / "hetpatrol.yaml"),
        state_path=shared / "state.json",
        jsonl_path=shared / "patrol.jsonl",
    )
    now = time.time()
    forged = {
        "schema": "hetpatrol.reboot_history/1",
        "cards": {
            f"uuid:{GPU2}": {
                "nvlink_down": {"boots": ["a", "b", "c"], "first": now - 60, "last": now - 60}
            }
        },
    }
    planted = history_path(config.state_path)
    planted.write_text(json.dumps(forged))
    os.chown(planted, NOBODY, NOBODY)
    state = {
        "schema": "hetpatrol.state/1",
        "boot": {"boot_id": BOOTS[0], "patrols": 1000, "learned_links": {}},
    }
    config.state_path.write_text(json.dumps(state))
    os.chown(config.state_path, NOBODY, NOBODY)
    d = Daemon(config, replay_dir=scenario_boots(SURVIVES)[0])
    try:
        with capture_logs() as events:
            d.restore_escalation()
        assert d.patroller.boot.patrols == 0  # the forged count is not taken
        assert d.patroller.reboot_history.cards == {}
        refused = {e["event"] for e in events}
        assert {"state_refused", "history_refused"} <= refused, refused
        reports = [d.patrol_once() for _ in range(5)]
    finally:
        d.shutdown()
    assert gpu2(reports[0]).action == "watch"  # in the grace: the forged count is not taken
    assert gpu2(reports[-1]).action == "reset_card"  # not replace_card
    lock = shared / "reboot-history.json.lock"
    lock.unlink(missing_ok=True)
    lock.write_text("")
    os.chown(lock, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match="owned by uid 65534"), locked(planted):
        pass


def test_a_clear_whose_audit_line_cannot_be_written_clears_nothing(tmp_path, capsys):
    """The audit line is the record of who forgot a card's faults: when the JSONL log
    cannot take it (a symlink at its path, planted or left), the history was cleared
    all the same and the command failed after the fact (the clear done, no audit line).
    Now the log is opened, by :mod:`hetpatrol.safe_files`' rules, before anything is
    cleared: refused, exit 73, the history kept."""
    config = config_for(tmp_path)
    run_boot(config, 1)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    config.jsonl_path.unlink()
    config.jsonl_path.symlink_to(victim)
    cfg = tmp_path / "h.yaml"
    cfg.write_text(
        f"state_path: {config.state_path}\njsonl: {{path: {config.jsonl_path}}}\n"
        "node: survives-01\n"
    )
    capsys.readouterr()
    code = main(["history", "--config", str(cfg), "clear", "--card", GPU2])
    err = capsys.readouterr().err
    assert code == 73, err
    assert "symbolic link" in err
    assert f"uuid:{GPU2}" in read_history(history_path(config.state_path), 0.0).cards
    assert victim.read_text() == "keep\n"


def test_a_clock_behind_at_boot_does_not_wipe_the_history(tmp_path):
    """A node whose RTC lost its time boots in the past (here 26 years back) until NTP
    steps the clock. The fault back in that boot was written with the wrong time as the
    family's ``last``, and the history read in that boot lowered every ``last`` to
    ``now``: once the clock was right again, 26 years "since last seen" forgot the two
    earlier boots and the card went back to reset_card instead of replace_card. A
    stored ``last`` is never moved back now, and a clock behind the stored times ages
    nothing."""
    from hetpatrol.exporters.history_file import sync_history

    path = tmp_path / "reboot-history.json"
    t = 1_796_000_000.0  # 2026-12
    before = RebootHistory(SurvivalRule())
    before.observe([("uuid:A", {"nvlink_down"})], "b1", t - 7200)
    before.observe([("uuid:A", {"nvlink_down"})], "b2", t - 3600)
    write_history(path, before)
    behind = t - 26 * 365 * 86400.0  # the RTC's idea of now in boot 3
    h = read_history(path, behind)
    h.observe([("uuid:A", {"nvlink_down"})], "b3", behind)
    h = sync_history(path, h, behind)
    assert h.verdict("uuid:A").action == "replace_card"
    # NTP steps the clock to the right time; the fault is still there
    h.observe([("uuid:A", {"nvlink_down"})], "b3", t + 10)
    h = sync_history(path, h, t + 10)
    assert h.cards["uuid:A"]["nvlink_down"]["boots"] == ["b1", "b2", "b3"]
    assert h.verdict("uuid:A").action == "replace_card"
    on_disk = read_history(path, t + 20).cards["uuid:A"]["nvlink_down"]
    assert on_disk["boots"] == ["b1", "b2", "b3"] and on_disk["last"] == t - 3600


def test_a_clock_step_ahead_during_the_boot_does_not_wipe_the_history(tmp_path, monkeypatch):
    """Hostile trial (h34g): boots 1 and 2 saw GPU 2's nvlink_down; in boot 3 the wall
    clock is stepped 31 days ahead (a bad time source) after the daemon started. The
    history read at the next critical patrol forgot both earlier boots (31 days "since
    last seen"), and the card went back to reset_card. It ages on the run's own clock
    now (the earlier of the wall clock and the start advanced by CLOCK_BOOTTIME)."""
    import time

    import hetpatrol.daemon as daemon_module
    import hetpatrol.patrol as patrol_module

    class Ahead:
        def __getattr__(self, name):
            return getattr(time, name)

        def time(self):
            return time.time() + 31 * 86400

    config = config_for(tmp_path)
    path = history_path(config.state_path)
    for n in (1, 2):
        run_boot(config, n)
    d = Daemon(config, replay_dir=scenario_boots(SURVIVES)[2])
    try:
        d.restore_escalation()
        for _ in range(2):
            d.patrol_once()
        for module in (daemon_module, patrol_module):
            monkeypatch.setattr(module, "time", Ahead())
        reports = [d.patrol_once() for _ in range(3)]
    finally:
        monkeypatch.undo()
        d.shutdown()
    assert gpu2(reports[-1]).action == "replace_card"
    assert read_history(path, time.time()).cards[f"uuid:{GPU2}"]["nvlink_down"]["boots"] == BOOTS


def test_a_restart_in_the_same_boot_after_a_clock_step_does_not_wipe_the_history(tmp_path):
    """The same step while no daemon ran: the state file of this boot says when it was
    written on both clocks, so the restarted daemon ages the history from that (a state
    file of another boot has no such link)."""
    import time

    from hetpatrol.exporters.state import boot_clock

    config = config_for(tmp_path)
    path = history_path(config.state_path)
    for n in (1, 2):
        run_boot(config, n)
    # the wall clock is now 31 days ahead of the one boots 1 and 2 (and the state file,
    # a minute ago on CLOCK_BOOTTIME) were written on: their times, moved back by as much
    ahead = 31 * 86400
    state = json.loads(config.state_path.read_text())
    boot = boot_clock()
    assert boot is not None and state["boot_id"] == boot[0]
    state["finished"] = time.time() - ahead - 60
    state["finished_boot"] = boot[1] - 60
    config.state_path.write_text(json.dumps(state))
    doc = json.loads(path.read_text())
    for family in doc["cards"][f"uuid:{GPU2}"].values():
        family["first"] -= ahead
        family["last"] -= ahead
    path.write_text(json.dumps(doc))
    reports = run_boot(config, 3)
    assert gpu2(reports[-1]).action == "replace_card"
    assert read_history(path, time.time()).cards[f"uuid:{GPU2}"]["nvlink_down"]["boots"] == BOOTS


def test_a_damaged_history_file_is_said_not_read_silently_as_empty(tmp_path, capsys):
    """A history file that is a symlink, not JSON, nested too deep, larger than the
    bound or of another schema reads as no history, as before, but ``hetpatrol history
    show`` (and the daemon) now says why on stderr instead of "no card" alone."""
    config = config_for(tmp_path)
    path = history_path(config.state_path)
    path.parent.mkdir(parents=True)
    cfg = tmp_path / "h.yaml"
    cfg.write_text(f"state_path: {config.state_path}\nnode: survives-01\n")
    cases = {
        "not JSON": b"{torn",
        "nested too deep": b"[" * 100000,
        "not a hetpatrol.reboot_history/1 document": b'{"schema": "other"}',
        "a symbolic link": None,
    }
    for why, data in cases.items():
        path.unlink(missing_ok=True)
        if data is None:
            (tmp_path / "elsewhere.json").write_text("{}")
            path.symlink_to(tmp_path / "elsewhere.json")
        else:
            path.write_bytes(data)
        capsys.readouterr()
        assert main(["history", "--config", str(cfg), "show"]) == 0
        out, err = capsys.readouterr()
        assert "no card in" in out
        assert why.split()[0] in err and "history_" in err, (why, err)
    path.unlink()
    capsys.readouterr()
    assert main(["history", "--config", str(cfg), "show"]) == 0
    assert capsys.readouterr().err == ""  # no history yet: nothing to say


@pytest.mark.parametrize("last", [1e300, 1e308, -1e300, 2.6e11])
def test_a_history_time_no_clock_writes_is_dropped_and_show_says_no_traceback(
    tmp_path, capsys, last
):
    """Hostile trial (h34g): a damaged entry whose ``last`` is finite but beyond any date
    (1e300) made ``history show`` end in an OverflowError traceback and the family never
    decayed. Such an entry is now malformed: dropped, the others kept."""
    config = config_for(tmp_path)
    path = history_path(config.state_path)
    path.parent.mkdir(parents=True)
    cfg = tmp_path / "h.yaml"
    cfg.write_text(f"state_path: {config.state_path}\nnode: survives-01\n")
    good = {"boots": ["b1", "b2"], "first": 1.8e9, "last": 1.8e9}
    doc = {
        "schema": "hetpatrol.reboot_history/1",
        "cards": {"uuid:GPU-a": {"nvlink_down": good, "xid": {**good, "last": last}}},
    }
    path.write_text(json.dumps(doc))
    os.chmod(path, PRIVATE_FILE_MODE)
    history = read_history(path, 1.8e9 + 60)
    assert list(history.cards) == ["uuid:GPU-a"]
    assert list(history.cards["uuid:GPU-a"]) == ["nvlink_down"]
    assert main(["history", "--config", str(cfg), "show"]) == 0
    out = capsys.readouterr().out
    assert out == "uuid:GPU-a  nvlink_down  seen in 2 boot(s), last 2027-01-15T08:00:00.000Z\n"


def test_a_clear_writes_its_audit_line_to_that_state_directorys_log(tmp_path, capsys):
    """``history --state-path S clear`` wrote its audit line into the bundled config's
    ``$XDG_STATE_HOME/hetpatrol/patrol.jsonl``, another daemon's log, whatever ``S`` was.
    The line goes to the log of the daemon whose state is changed: ``--jsonl-path``, or
    the log of the ``--config`` whose ``state_path`` it is; a ``--state-path`` with no log
    known to be its own is refused (exit 64), nothing cleared, nothing written."""
    config = config_for(tmp_path)
    run_boot(config, 1)
    other_log = tmp_path / "xdg-state" / "hetpatrol" / "patrol.jsonl"  # the bundled one
    state = str(config.state_path)

    def audits(path):
        if not path.exists():
            return []
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        return [x for x in lines if x.get("event") == "history_clear"]

    capsys.readouterr()
    assert main(["history", "--state-path", state, "clear", "--card", GPU2]) == 64
    err = capsys.readouterr().err
    assert "--jsonl-path" in err and "nothing cleared" in err, err
    assert f"uuid:{GPU2}" in read_history(history_path(config.state_path), 0.0).cards
    assert audits(other_log) == [] and audits(config.jsonl_path) == []
    # a config whose state_path is another: its log is not this state's either
    cfg = tmp_path / "other.yaml"
    cfg.write_text(f"state_path: {tmp_path}/elsewhere/state.json\njsonl: {{path: {other_log}}}\n")
    args = ["history", "--config", str(cfg), "--state-path", state, "clear", "--card", GPU2]
    assert main(args) == 64
    assert f"uuid:{GPU2}" in read_history(history_path(config.state_path), 0.0).cards
    # named: the line is in that log, none in the other daemon's
    log = ["--jsonl-path", str(config.jsonl_path)]
    assert main(["history", "--state-path", state, *log, "clear", "--card", GPU2]) == 0
    assert read_history(history_path(config.state_path), 0.0).cards == {}
    assert [a["card"] for a in audits(config.jsonl_path)] == [GPU2]
    assert audits(other_log) == []


def test_the_audit_line_names_the_node_of_the_daemon_whose_state_it_changes(tmp_path, capsys):
    """The new-user trial's ``history --state-path S --jsonl-path L clear`` wrote
    ``"node":"vm"`` (the host name, the bundled config's node) while the daemon of that
    state ran as ``survives-01`` (its config's ``node``; a ``--node`` or a replay's
    scenario would name it too). The line names the node the state file being changed
    says its daemon is; a state file without a usable name leaves the config's."""
    import socket

    config = replace(config_for(tmp_path), node="rack7-gpu03")  # the daemon's --node
    run_boot(config, 1)
    state, log = str(config.state_path), str(config.jsonl_path)

    def audit_nodes():
        lines = [json.loads(x) for x in config.jsonl_path.read_text().splitlines()]
        return [x["node"] for x in lines if x.get("event") == "history_clear"]

    args = ["history", "--state-path", state, "--jsonl-path", log, "clear", "--card", GPU2]
    assert main(args) == 0, capsys.readouterr().err
    assert audit_nodes() == ["rack7-gpu03"]
    # its own config, whose node: is survives-01: the daemon ran as rack7-gpu03 still
    run_boot(config, 2)
    cfg = tmp_path / "h.yaml"
    cfg.write_text(f"state_path: {state}\njsonl: {{path: {log}}}\nnode: survives-01\n")
    assert main(["history", "--config", str(cfg), "clear", "--card", GPU2]) == 0
    assert audit_nodes() == ["rack7-gpu03", "rack7-gpu03"]
    # a state file whose node is no node name (forged, damaged): the config's own node
    run_boot(config, 3)
    doc = json.loads(config.state_path.read_text())
    config.state_path.write_text(json.dumps({**doc, "node": "evil\x1b[2J node"}))
    assert main(args) == 0
    assert audit_nodes()[-1] == socket.gethostname().split(".")[0]  # the bundled config's


def test_the_history_options_are_taken_after_the_subcommand_too(tmp_path, capsys):
    """``history show --state-path P`` exited 64 "unrecognized arguments": the options of
    ``history`` are taken before or after ``show`` / ``clear``, and one given before is
    kept when the subcommand names none."""
    config = config_for(tmp_path)
    run_boot(config, 1)
    state = str(config.state_path)
    capsys.readouterr()
    assert main(["history", "show", "--state-path", state]) == 0
    assert f"uuid:{GPU2}  nvlink_down  seen in 1 boot(s)" in capsys.readouterr().out
    assert main(["history", "--state-path", state, "show", "--json"]) == 0
    assert f"uuid:{GPU2}" in json.loads(capsys.readouterr().out)["cards"]
    log = str(config.jsonl_path)
    args = ["history", "--state-path", state, "clear", "--card", GPU2, "--jsonl-path", log]
    assert main(args) == 0
    assert read_history(history_path(config.state_path), 0.0).cards == {}
    assert '"event":"history_clear"' in config.jsonl_path.read_text()


def test_a_clear_while_another_holds_the_lock_gives_up_and_clears_nothing(
    tmp_path, capsys, monkeypatch
):
    """A daemon stopped while holding the history lock (SIGSTOP, a debugger) held up
    ``history clear`` for ever; and a clear stopped while holding it would hold up every
    patrol's history write. The lock is waited for a bounded time: then the clear says
    so, exits 75 (EX_TEMPFAIL) and clears nothing."""
    import subprocess
    import sys

    from hetpatrol.exporters import history_file

    config = config_for(tmp_path)
    run_boot(config, 1)
    path = history_path(config.state_path)
    lock = f"{path}.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         f"fd = os.open({lock!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(history_file, "LOCK_WAIT_SECONDS", 0.5)
        monkeypatch.setattr(history_file.locked, "__defaults__", (history_file.LOCK_WAIT_SECONDS,))
        cfg = tmp_path / "h.yaml"
        cfg.write_text(
            f"state_path: {config.state_path}\njsonl: {{path: {config.jsonl_path}}}\n"
            "node: survives-01\n"
        )
        capsys.readouterr()
        code = main(["history", "--config", str(cfg), "clear", "--card", GPU2])
        err = capsys.readouterr().err
        assert code == 75, err
        assert "held by another process for more than 0.5 s" in err and "nothing cleared" in err
        assert f"uuid:{GPU2}" in read_history(path, 0.0).cards
        lines = [json.loads(x) for x in config.jsonl_path.read_text().splitlines()]
        assert [x for x in lines if x.get("event") == "history_clear"] == []
    finally:
        holder.kill()
        holder.wait()
    # the lock free again: the same clear goes through
    assert main(["history", "--config", str(cfg), "clear", "--card", GPU2]) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="os.chown to another uid needs root")
def test_a_clear_run_as_root_in_the_daemons_directory_says_to_run_it_as_that_user(tmp_path, capsys):
    """Hostile trial (h35c), a confused operator: ``sudo hetpatrol history clear`` where
    the daemon's StateDirectory is its user's (``hetpatrol``, the unit's ``User=``). Root
    is refused there (that user could point a name in it anywhere root writes): exit 73
    with "owned by uid ..., not root or this user" alone, which named no way out. It
    now says to run the clear as that user; nothing is cleared."""
    import pwd

    config = config_for(tmp_path)
    run_boot(config, 1)
    state = config.state_path.parent
    owner = next((u for u in ("hetpatrol", "nobody") if _user(u)), None)
    if owner is None:
        pytest.skip("no hetpatrol or nobody user")
    user = pwd.getpwnam(owner)
    for p in (state, *state.iterdir(), config.jsonl_path.parent, config.jsonl_path):
        os.chown(p, user.pw_uid, user.pw_gid)
    cfg = tmp_path / "h.yaml"
    cfg.write_text(
        f"state_path: {config.state_path}\njsonl: {{path: {config.jsonl_path}}}\n"
        "node: survives-01\n"
    )
    before = history_path(config.state_path).read_bytes()
    assert main(["history", "--config", str(cfg), "clear", "--card", GPU2]) == 73
    err = capsys.readouterr().err
    assert "nothing cleared" in err, err
    assert f"run it as that user, e.g. sudo -u {owner} hetpatrol history clear" in err, err
    assert history_path(config.state_path).read_bytes() == before


def _user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
