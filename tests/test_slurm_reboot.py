"""reboot_node through Slurm (``slurm.drain.reboot``): ``scontrol reboot ASAP
nextstate=DOWN reason="hetpatrol: ..."``, never over an admin's reason, counted by the
breaker, and ``State=RESUME`` only after healthy patrols of the new boot.

The tests marked ``slurm`` run a real slurmctld/slurmd (tests/slurm_cluster.py) whose
``RebootProgram`` is a stand-in: it stops slurmd and starts it again in a new time
namespace whose boot clock starts at zero (``unshare --time --boottime``), so slurmd
reports a boot time after the request, as after a real reboot. slurmctld takes a
re-registration with the old boot time as no reboot at all (the node stays
``REBOOT_ISSUED`` until ``ResumeTimeout``; seen on 22.05.8). slurm.conf(5),
RebootProgram: "Program to be executed on each compute node to reboot it. Invoked on
each node once it becomes idle after the command "scontrol reboot" ... A node will be
marked DOWN if it doesn't reboot within ResumeTimeout."
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import replace

import pytest
import slurm_cluster as cluster
from test_scontrol_helper import call, serving

from hetpatrol.actions.apply import judge_card
from hetpatrol.patrol import PatrolReport
from hetpatrol.schema import CardRecord, Finding
from hetpatrol.slurm.breaker import parse_sinfo, recent_drains_of_ours
from hetpatrol.slurm.drain import DrainPolicy, boot_epoch
from hetpatrol.slurm.gres import find_node
from hetpatrol.slurm.settings import BreakerSettings, DrainSettings, SlurmSettings
from hetpatrol.slurm.states import rebooted_by_us
from hetpatrol.tool import ToolOutput

REASON = "hetpatrol: reboot_node nvidia/3 vendor_health vendor health 'gpu_is_lost'"

STANDIN = """#!/bin/sh
# RebootProgram stand-in (tests/test_slurm_reboot.py): "reboot" = restart slurmd with a
# boot clock that starts now. The first call only starts the second in a session of its
# own and returns: slurmd kills what is left in the program's process group once it
# exits (run_command() in Slurm's src/common/run_command.c).
root="{root}"
if [ -z "$HP_STANDIN" ]; then
  HP_STANDIN=1 setsid "$0" </dev/null >>"$root/log/standin.out" 2>&1 &
  exit 0
fi
sleep 2
pid=$(cat "$root/run/slurmd.pid")
kill -TERM "$pid"
# gone, or a zombie its parent (the test harness) has not reaped yet
while [ -e "/proc/$pid" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status"; do
  sleep 0.1
done
# the host's uptime: a slurmd already "rebooted" runs (and runs this) in a time namespace
# whose offsets are relative to the host's clocks (time_namespaces(7))
off=$(awk '$1 == "boottime" {{print $2}}' /proc/self/timens_offsets 2>/dev/null)
up=$(( $(cut -d. -f1 /proc/uptime) - ${{off:-0}} ))
exec unshare --fork --time --boottime "-$up" slurmd -D -N {node} -f "$root/slurm.conf"
"""


def report(health: str, started: float, seq: int = 1) -> PatrolReport:
    cards = ()
    if health == "critical":  # a lost GPU: reboot_node (NVML GPU_IS_LOST, catalog XID 79)
        lost = CardRecord(vendor="nvidia", index=3, health="critical")
        lost.findings.append(Finding("vendor_health", "critical", "GPU is lost", "gpu_is_lost"))
        verdict, per = judge_card(lost.findings)
        lost.action, lost.action_source, lost.action_code, lost.action_reason = verdict
        lost.findings[0].action = per[0].action
        cards = (lost,)
    return PatrolReport(
        seq=seq,
        node="host07",
        started=started,
        finished=started + 1,
        cards=cards,
        collectors=(),
        node_findings=(),
        changes=(),
        health=health,
    )


def settings(node: str, scontrol, sinfo=("sinfo",), **drain) -> SlurmSettings:
    return SlurmSettings(
        enabled=True,
        node_name=node,
        scontrol=tuple(scontrol),
        gres_conf=None,
        drain=DrainSettings(
            **(
                {
                    "enabled": True,
                    "reboot": True,
                    "resume_after_patrols": 2,
                    "breaker": BreakerSettings(sinfo=tuple(sinfo)),
                }
                | drain
            )
        ),
    )


# ------------------------------------------------------------------ scripted scontrol
class FakeSlurm:
    def __init__(self, state="IDLE", reason=None):
        self.state, self.reason = state, reason
        self.runs: list[list[str]] = []

    def __call__(self, argv, timeout):
        args = list(argv)[1:]
        if args[:2] == ["show", "node"]:
            line = f"NodeName=gpu07 State={self.state} BootTime=2026-12-01T20:27:32 Weight=1"
            if self.reason:
                line += f" Reason={self.reason} [root@2026-12-01T20:27:33]"
            return ToolOutput(tuple(argv), line + "\n", "", 0, False, 0.01)
        self.runs.append(args)
        return ToolOutput(tuple(argv), "", "", 0, False, 0.01)


def test_reboot_is_opt_in_and_takes_the_drain_rules(base_config):
    slurm = FakeSlurm()
    off = replace(base_config, node="host07", slurm=settings("gpu07", ["scontrol"], reboot=False))
    DrainPolicy(slurm).on_report(report("critical", 0.0), off)
    assert slurm.runs[0][:3] == ["update", "NodeName=gpu07", "State=DRAIN"]  # off: a drain

    slurm = FakeSlurm()
    on = replace(off, slurm=settings("gpu07", ["scontrol"]))
    on = replace(
        on,
        slurm=replace(
            on.slurm, drain=replace(on.slurm.drain, breaker=BreakerSettings(enabled=False))
        ),
    )
    (event,) = [json.loads(x) for x in DrainPolicy(slurm).on_report(report("critical", 0.0), on)]
    assert slurm.runs == [["reboot", "ASAP", "nextstate=DOWN", f"reason={REASON}", "gpu07"]]
    assert event["event"] == "reboot" and event["reason"] == REASON

    # an admin's drain: no reboot over it
    slurm = FakeSlurm("IDLE+DRAIN", "admin: DIMM swap")
    (event,) = [json.loads(x) for x in DrainPolicy(slurm).on_report(report("critical", 0.0), on)]
    assert event["event"] == "drain_skipped" and slurm.runs == []


def test_resume_waits_for_healthy_patrols_of_the_new_boot(base_config):
    done = f"{REASON} : reboot issued : reboot complete"
    slurm = FakeSlurm("DOWN", done)
    cfg = replace(base_config, node="host07", slurm=settings("gpu07", ["scontrol"]))
    policy = DrainPolicy(slurm)
    boot = boot_epoch(
        find_node("NodeName=gpu07 State=DOWN BootTime=2026-12-01T20:27:32\n", "gpu07")
    )
    assert boot is not None
    out = policy.on_report(report("ok", boot - 60, 1), cfg)
    assert out == []  # one healthy patrol of two
    (skip,) = [json.loads(x) for x in policy.on_report(report("ok", boot - 30, 2), cfg)]
    assert skip["event"] == "resume_skipped"
    assert "waiting for 2 healthy patrols of the new boot" in skip["detail"]
    assert policy.on_report(report("ok", boot + 5, 3), cfg) == []  # one of the two is old
    (event,) = [json.loads(x) for x in policy.on_report(report("ok", boot + 35, 4), cfg)]
    assert event["event"] == "resume" and slurm.runs == [
        ["update", "NodeName=gpu07", "State=RESUME"]
    ]
    # a DOWN of anyone else's is never resumed
    slurm = FakeSlurm("DOWN", "admin: PSU : reboot complete")
    policy = DrainPolicy(slurm)
    for seq in range(3):
        policy.on_report(report("ok", boot + 100 + seq, seq), cfg)
    assert slurm.runs == []


def test_healthy_patrols_during_our_reboot_still_resume_after_it(base_config):
    """Hostile trial (h34g): the new boot's daemon is healthy while slurmd has not
    registered yet and the node reads DOWN+REBOOT_ISSUED+NOT_RESPONDING with our reason
    and no DRAIN flag (an admin's UNDRAIN during the reboot: seen on slurmctld 22.05,
    test below). That is no drain of ours to resume, but the reboot's ": reboot
    complete" is: before, the daemon stopped asking and left the node DOWN."""
    fake = FakeSlurm("DOWN+REBOOT_ISSUED+NOT_RESPONDING", f"{REASON} : reboot issued")
    cfg = replace(base_config, node="host07", slurm=settings("gpu07", ["scontrol"]))
    policy = DrainPolicy(runner=fake)
    boot = boot_epoch(find_node(fake(["scontrol", "show", "node"], 1).stdout, "gpu07"))
    for seq in range(3):
        assert policy.on_report(report("ok", boot + 10 + seq, seq), cfg) == []
    fake.state, fake.reason = "DOWN", f"{REASON} : reboot issued : reboot complete"
    events = [json.loads(x) for x in policy.on_report(report("ok", boot + 20, 4), cfg)]
    assert [e["event"] for e in events] == ["resume"]
    assert fake.runs == [["update", "NodeName=gpu07", "State=RESUME"]]


def test_the_breaker_counts_rebooting_and_rebooted_nodes():
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 10))
    rows = parse_sinfo(
        # the sinfo %T words of a node in each step, as slurmctld 22.05.8 printed them
        f"n1|reboot|{stamp}|hetpatrol: reboot_node a\n"
        f"n2|reboot^|{stamp}|hetpatrol: reboot_node b : reboot issued\n"
        f"n3|down|{stamp}|hetpatrol: reboot_node c : reboot issued : reboot complete\n"
        f"n4|down|{stamp}|admin: PSU\n"
        f"n5|idle|{stamp}|hetpatrol: stale\n"
    )
    assert sorted(recent_drains_of_ours(rows, now, 600)) == ["n1", "n2", "n3"]


def test_reboot_complete_is_slurms_word():
    line = "NodeName=a State=DOWN Reason=hetpatrol: x : reboot issued : reboot complete [root@t]\n"
    assert rebooted_by_us(find_node(line, "a")) is None
    assert rebooted_by_us(find_node(line.replace("DOWN", "DOWN+DRAIN"), "a")) is not None


# ------------------------------------------------------------------ real slurmctld
@pytest.fixture
def reboot_cluster():
    """A cluster of its own per test: a second stand-in reboot under a slurmd the first
    one started does not come back (its own process tree), so each test reboots once
    after start."""
    missing = [b for b in (*cluster.BINARIES, "unshare") if shutil.which(b) is None]
    if missing:
        cluster._fail_or_skip(f"not installed: {', '.join(missing)}")
    if os.geteuid() != 0:
        cluster._fail_or_skip("the Slurm test cluster runs SlurmUser=root: run as root")
    try:
        c = cluster.start_cluster(
            overrides={"RebootProgram": "{root}/reboot-standin", "ResumeTimeout": "120"}
        )
    except RuntimeError as exc:
        pytest.fail(str(exc))
    script = c.root / "reboot-standin"
    script.write_text(STANDIN.format(root=c.root, node=c.node))
    script.chmod(0o755)
    try:
        yield c
    finally:
        c.stop()
        _kill_started_under(c.root)
        shutil.rmtree(c.root, ignore_errors=True)


def _kill_started_under(root) -> None:
    """SIGKILL, by pid, every process whose command line names this cluster's temporary
    directory (the slurmd the stand-in started, a stand-in still waiting)."""
    mark = str(root).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if mark in f.read():
                    os.kill(int(entry), signal.SIGKILL)
        except OSError:
            continue


def _node(c) -> str:
    return c.scontrol("show", "node", "-o", c.node)


def _rebooted(c, timeout=60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = _node(c)
        if " State=DOWN " in out and "reboot complete" in out:
            return out
        time.sleep(0.2)
    raise AssertionError(f"no reboot complete: {_node(c)}\n{c.logs(3000)}")


@pytest.fixture
def rc(reboot_cluster):
    reboot_cluster.make_idle()
    yield reboot_cluster
    if " State=DOWN " in _node(reboot_cluster):
        reboot_cluster.scontrol("update", f"NodeName={reboot_cluster.node}", "State=RESUME")
    reboot_cluster.make_idle()


@pytest.mark.slurm
@pytest.mark.slow
def test_real_slurmctld_reboots_and_hetpatrol_resumes_after_the_new_boot(rc, base_config):
    sinfo = ["env", f"SLURM_CONF={rc.conf}", shutil.which("sinfo") or "sinfo"]
    cfg = replace(
        base_config, node="host07", slurm=settings(rc.node, rc.scontrol_argv, sinfo=sinfo)
    )
    policy = DrainPolicy()
    with rc.explain():
        (event,) = [json.loads(x) for x in policy.on_report(report("critical", time.time()), cfg)]
        assert event["event"] == "reboot", event
        assert event["command"][-5:] == [
            "reboot",
            "ASAP",
            "nextstate=DOWN",
            f"reason={REASON}",
            rc.node,
        ]
        line = _rebooted(rc)
        info = find_node(line, rc.node)
        assert info.state == "DOWN"
        assert info.reason == f"{REASON} : reboot issued : reboot complete"
        assert rc.state() == "down"  # takes no job until hetpatrol says so
        boot = boot_epoch(info)
        assert boot is not None and boot > event_epoch(event) - 2
        # healthy patrols that started before the new boot do not count
        policy.on_report(report("ok", boot - 20, 2), cfg)
        (skip,) = [json.loads(x) for x in policy.on_report(report("ok", boot - 10, 3), cfg)]
        assert skip["event"] == "resume_skipped"
        assert rc.state() == "down"
        now = max(time.time(), boot + 1)
        policy.on_report(report("ok", now, 4), cfg)
        (resume,) = [json.loads(x) for x in policy.on_report(report("ok", now + 1, 5), cfg)]
        assert resume["event"] == "resume", resume
        rc.wait_for(lambda s: s.split(" ")[1] == "idle", what="idle after the resume")
        assert rc.reason() == "none"


def event_epoch(event) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


@pytest.mark.slurm
@pytest.mark.slow
def test_real_slurmctld_helper_reboots_only_by_the_drain_rules(rc, tmp_path):
    scontrol = shutil.which("scontrol")
    node = rc.node
    reboot = ("reboot", "ASAP", "nextstate=DOWN", f"reason={REASON}", node)
    with rc.explain(), serving(tmp_path, scontrol, node=node, env=rc.env) as (path, _):
        # an admin's drain: the reboot is refused, the reason stays
        rc.admin_drain("admin: DIMM swap")
        res = call(path, *reboot)
        assert res.returncode == 2 and "node already has a reason set" in res.stderr
        assert rc.reason() == "admin: DIMM swap" and "REBOOT" not in _node(rc)
        rc.make_idle()
        # an admin's DOWN: RESUME refused
        rc.scontrol("update", f"NodeName={node}", "State=DOWN", "Reason=admin: PSU")
        res = call(path, "update", f"NodeName={node}", "State=RESUME")
        assert res.returncode == 2 and "not DOWN after hetpatrol's reboot" in res.stderr
        assert rc.state() == "down"
        rc.scontrol("update", f"NodeName={node}", "State=RESUME")
        rc.make_idle()
        # ours: the reboot runs, and RESUME is taken once Slurm says reboot complete
        res = call(path, *reboot)
        assert res.returncode == 0, res.stderr
        _rebooted(rc)
        res = call(path, "update", f"NodeName={node}", "State=RESUME")
        assert res.returncode == 0, res.stderr
        rc.wait_for(lambda s: s.split(" ")[1] == "idle", what="idle after RESUME")


@pytest.mark.slurm
@pytest.mark.slow
def test_real_slurmctld_an_admins_drain_during_our_pending_reboot_is_never_resumed(rc, base_config):
    """Hostile trial (h34g): hetpatrol asks for the reboot while a job runs (ASAP: DRAIN
    and REBOOT_REQUESTED, the reboot waits for the job); an admin drains the node with a
    reason of their own before the job ends. slurmctld reboots it (the admin's reason
    now carries ": reboot complete", slurmctld 22.05): the healthy patrols of the new
    boot must leave the node DOWN with the admin's reason (before, as after: held)."""
    sinfo = ["env", f"SLURM_CONF={rc.conf}", shutil.which("sinfo") or "sinfo"]
    cfg = replace(
        base_config, node="host07", slurm=settings(rc.node, rc.scontrol_argv, sinfo=sinfo)
    )
    policy = DrainPolicy()
    job = rc.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 300")
    job_id = job.stdout.strip().split(";")[0]
    try:
        _admin_drain_during_reboot(rc, cfg, policy, job_id)
    finally:
        rc.run("scancel", job_id, check=False)


def _admin_drain_during_reboot(rc, cfg, policy, job_id) -> None:
    with rc.explain():
        rc.wait_for(lambda s: s.split(" ")[1].startswith(("alloc", "mix")), what="the job running")
        (event,) = [json.loads(x) for x in policy.on_report(report("critical", time.time()), cfg)]
        assert event["event"] == "reboot", event
        assert "REBOOT_REQUESTED" in _node(rc)
        rc.scontrol("update", f"NodeName={rc.node}", "State=DRAIN", "Reason=admin: DIMM swap")
        # the critical patrols go on: nothing over the admin's reason
        second = [json.loads(x) for x in policy.on_report(report("critical", time.time(), 2), cfg)]
        assert all(e["event"] not in ("reboot", "drain") for e in second), second
        rc.run("scancel", job_id)
        line = _rebooted(rc)
        info = find_node(line, rc.node)
        assert info.reason.startswith("admin: DIMM swap"), info.reason
        boot = boot_epoch(info)
        now = max(time.time(), (boot or 0) + 1)
        events = []
        for seq in range(3, 8):
            events += [json.loads(x) for x in policy.on_report(report("ok", now + seq, seq), cfg)]
        assert all(e["event"] != "resume" for e in events), events
        assert rc.state() == "down" and rc.reason().startswith("admin: DIMM swap")


@pytest.mark.slurm
@pytest.mark.slow
def test_real_slurmctld_an_undrain_during_our_reboot_still_resumes_after_it(rc, base_config):
    """Hostile trial (h34g), on the real slurmctld 22.05: an admin's UNDRAIN while our
    reboot is issued leaves DOWN+REBOOT_ISSUED(+NOT_RESPONDING) with our reason and no
    DRAIN flag. The new boot's healthy patrols that read it before slurmd registers must
    not make the daemon give up: after ": reboot complete" it resumes (before, the node
    stayed DOWN)."""
    sinfo = ["env", f"SLURM_CONF={rc.conf}", shutil.which("sinfo") or "sinfo"]
    cfg = replace(
        base_config, node="host07", slurm=settings(rc.node, rc.scontrol_argv, sinfo=sinfo)
    )
    policy = DrainPolicy()
    with rc.explain():
        (event,) = [json.loads(x) for x in policy.on_report(report("critical", time.time()), cfg)]
        assert event["event"] == "reboot", event
        deadline = time.monotonic() + 30
        while "REBOOT_ISSUED" not in find_node(_node(rc), rc.node).state:
            assert time.monotonic() < deadline, _node(rc)
            time.sleep(0.05)
        rc.scontrol("update", f"NodeName={rc.node}", "State=UNDRAIN")
        info = find_node(_node(rc), rc.node)
        assert "REBOOT_ISSUED" in info.state and "DRAIN" not in info.flags, info.state
        assert info.reason.startswith(REASON), info.reason
        # the new boot's patrols before slurmd registered: healthy, nothing to resume yet
        for seq in (2, 3):
            assert all(
                json.loads(x)["event"] != "resume"
                for x in policy.on_report(report("ok", time.time(), seq), cfg)
            )
        line = _rebooted(rc)
        boot = boot_epoch(find_node(line, rc.node))
        assert boot is not None
        now = max(time.time(), boot + 1)
        events = []
        for seq in (4, 5):
            events += [json.loads(x) for x in policy.on_report(report("ok", now + seq, seq), cfg)]
        assert [e["event"] for e in events if e["event"] == "resume"] == ["resume"], events
        rc.wait_for(lambda s: s.split(" ")[1] == "idle", what="idle after the resume")
