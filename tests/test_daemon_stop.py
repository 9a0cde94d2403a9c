"""A clean stop (systemctl stop: SIGTERM) marks the state file ``stopped``: ``status``
and ``check`` say the daemon was stopped at T and the verdict is from then, the Prolog
does not refuse jobs for the verdict's age, a restarting daemon clears the mark. A
daemon that dies (SIGKILL) leaves no mark: its verdict only goes stale, as before."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import HETPATROL, NODES, replay_run_argv
from test_end_to_end import free_port, wait_for

from hetpatrol.healthcheck import check, stopped_mark, utc_text
from hetpatrol.slurm.jobguard import EXIT_FAIL, EXIT_PASS, Allocation, decide
from tests import slurm_cluster as cluster

UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def start(tmp_path, scenario="healthy-mixed"):
    state = tmp_path / "state.json"
    argv = replay_run_argv(
        scenario, free_port(), tmp_path / "patrol.jsonl", 0.3, "--state-path", str(state)
    )
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: state.exists() or proc.poll() is not None)
    except BaseException:
        proc.kill()
        raise
    assert proc.poll() is None, proc.communicate()[1]
    return proc, state


def stop(proc, sig=signal.SIGTERM) -> str:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    return err


def cli(*args: str, env=None) -> subprocess.CompletedProcess:
    # `hetpatrol prolog` is dispatched by the installed script's entry (hetpatrol.entry)
    argv = [sys.executable, "-m", "hetpatrol.entry"] if args[0] == "prolog" else HETPATROL
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=30, env=env)


def test_sigterm_marks_the_state_file_and_check_and_status_say_so(tmp_path):
    proc, state = start(tmp_path)
    try:
        assert cli("check", "--state-path", str(state)).returncode == 0
        sent = time.time()
    finally:
        err = stop(proc)
    assert proc.returncode == 0, err
    assert "state_marked_stopped" in err
    doc = json.loads(state.read_text())
    at, reason = stopped_mark(doc)
    assert reason == "SIGTERM" and sent - 1 <= at <= time.time()
    assert doc["stopped"]["pid"] == proc.pid
    # the verdict is the last patrol's, kept as written: the JSONL log's last patrol
    patrols = [json.loads(x) for x in (tmp_path / "patrol.jsonl").read_text().splitlines()]
    last = [p for p in patrols if p["kind"] == "patrol"][-1]
    assert (doc["seq"], doc["health"], len(doc["cards"])) == (last["seq"], "ok", 16)

    res = cli("check", "--state-path", str(state))
    assert res.returncode == 3, res.stdout
    assert res.stdout.startswith(
        f"HETPATROL UNKNOWN - the hetpatrol daemon was stopped at {utc_text(at)} (SIGTERM); "
        f"its last verdict, OK: {doc['node']}: 16 ok (patrol {doc['seq']}, "
    ), res.stdout

    res = cli("status", "--state-path", str(state), "--color", "never")
    assert res.returncode == 3, res.stderr
    assert (
        f"STOPPED: the daemon was stopped at {utc_text(at)} (SIGTERM), the verdict is from then"
        in res.stdout
    )
    assert "STALE" not in res.stdout
    js = json.loads(cli("status", "--state-path", str(state), "--json").stdout)
    assert js["stopped"]["reason"] == "SIGTERM"


def test_a_restart_clears_the_mark_and_sigint_is_a_clean_stop_too(tmp_path):
    proc, state = start(tmp_path)
    stop(proc)
    stopped_at, reason = stopped_mark(json.loads(state.read_text()))
    assert reason == "SIGTERM"
    proc, state = start(tmp_path)
    try:  # the new daemon clears the mark at start, its first patrol writes a verdict
        wait_for(lambda: json.loads(state.read_text())["finished"] > stopped_at, proc=proc)
        assert "stopped" not in json.loads(state.read_text())
        res = cli("check", "--state-path", str(state))
        assert res.returncode == 0 and res.stdout.startswith("HETPATROL OK - "), res.stdout
    finally:
        err = stop(proc, signal.SIGINT)
    assert proc.returncode == 0, err
    assert stopped_mark(json.loads(state.read_text()))[1] == "SIGINT"


def test_a_daemon_that_dies_before_its_first_patrol_leaves_no_stop_mark(tmp_path):
    """The mark said "no patrol follows" until the next daemon's first patrol wrote a
    file: one that started and died before (its first patrol hung on a GPU, a crash in
    NVML, killed) left the old mark, so check said "stopped" and the Prolog judged jobs
    by that verdict, of any age, for the rest of the boot. A starting daemon clears it:
    its silence then makes the verdict stale, as any dead daemon's."""
    proc, state = start(tmp_path)
    stop(proc)
    stopped_doc = json.loads(state.read_text())
    assert stopped_mark(stopped_doc) is not None
    replay = tmp_path / "hang"
    shutil.copytree(NODES / "healthy-mixed", replay)
    (replay / "scenario.yaml").write_text(
        "node: mixed-ok-01\nnvml:\n  gpus:\n    0: {hang_seconds: 60}\n"
    )
    argv = replay_run_argv(
        "healthy-mixed", free_port(), tmp_path / "patrol.jsonl", 0.3, "--state-path", str(state)
    )
    argv[argv.index("--replay") + 1] = str(replay)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:  # the first patrol waits 10 s for the hung GPU (collectors' timeout_seconds)
        doc = wait_for(
            lambda: (d := json.loads(state.read_text())) and "stopped" not in d and d,
            timeout=60,
            proc=proc,
        )
        # cleared at start, before the first patrol: the last verdict, kept (not a new one
        # that the first patrol wrote, however long this daemon took to start)
        assert doc["finished"] == stopped_doc["finished"], doc["finished"]
        assert doc["health"] == "ok" and "cards" in doc
    finally:
        proc.kill()
        err = proc.communicate(timeout=30)[1]
    assert "state_stop_mark_not_cleared" not in err, err
    env = {"SLURM_JOB_GPUS": "0", "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"}
    time.sleep(0.6)
    res = cli("prolog", "--state-path", str(state), "--max-age", "0.5", "--no-set-reason", env=env)
    assert res.returncode == EXIT_FAIL and "hetpatrol: stale verdict" in res.stdout, res.stdout
    code, line = check(state, max_age=0.5)
    assert code == 3 and "stale verdict" in line, line


def test_a_killed_daemon_leaves_no_mark_its_verdict_goes_stale(tmp_path):
    proc, state = start(tmp_path)
    stop(proc, signal.SIGKILL)
    doc = json.loads(state.read_text())
    assert "stopped" not in doc
    code, line = check(state, max_age=0.5, now=doc["finished"] + 5)
    assert code == 3 and "stale verdict" in line and "is the hetpatrol daemon running?" in line


def test_the_prolog_does_not_refuse_jobs_for_a_stopped_daemons_age(tmp_path):
    """Stopped for an upgrade: the verdict ages past the limit and no job is refused
    for it (a crashed daemon's stale verdict still refuses: the fleet of a stopped
    service is not drained, a silent one is)."""
    proc, state = start(tmp_path)
    stop(proc)
    time.sleep(0.6)
    env = {"SLURM_JOB_GPUS": "0", "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"}
    args = ("prolog", "--state-path", str(state), "--max-age", "0.5", "--no-set-reason")
    res = cli(*args, env=env)
    assert res.returncode == EXIT_PASS, res.stdout + res.stderr
    assert re.fullmatch(
        rf"job cards ok: nvidia/0 \(patrol \d+, \d+ s ago\); hetpatrol stopped at {UTC} "
        r"\(SIGTERM\): judged by its last verdict\n",
        res.stdout,
    ), res.stdout
    doc = json.loads(state.read_text())
    del doc["stopped"]  # the same verdict from a daemon that died
    state.write_text(json.dumps(doc))
    res = cli(*args, env=env)
    assert res.returncode == EXIT_FAIL and "hetpatrol: stale verdict" in res.stdout, res.stdout


def test_a_stopped_daemons_verdict_still_refuses_a_card_it_found_broken(tmp_path):
    """GPU 6 fell off the bus (XID 79: reboot_node) and then the service was stopped:
    stopping it repaired nothing, a job on the node is refused in this boot. The same
    file read in a later boot (a reboot resets the cards) lets the job through."""
    proc, state = start(tmp_path, "xid-79")
    try:
        wait_for(lambda: json.loads(state.read_text())["health"] == "critical", proc=proc)
    finally:
        stop(proc)
    doc = json.loads(state.read_text())
    assert stopped_mark(doc) is not None
    now = doc["stopped"]["at"] + 3600  # an hour later: stale by any limit
    this_boot = (doc["boot_id"], doc["finished_boot"] + 3600)
    job = Allocation(by_gres={"gpu": frozenset({3})})
    refused = decide(doc, job, now=now, boot=this_boot)
    assert refused.exit_code == EXIT_FAIL
    assert refused.reason.startswith("hetpatrol: reboot_node nvidia/6 "), refused.reason
    later_boot = ("another-boot-id", 50.0)
    passed = decide(doc, job, now=now, boot=later_boot)
    assert passed.exit_code == EXIT_PASS
    assert re.fullmatch(
        rf"hetpatrol stopped at {UTC} \(SIGTERM\), its last verdict not of this boot: "
        "job let through",
        passed.reason,
    ), passed.reason
    del doc["stopped"]  # without the mark: stale, refused as before
    assert decide(doc, job, now=now, boot=this_boot).exit_code == EXIT_FAIL


def test_a_mark_no_daemon_writes_is_no_mark():
    base = {"finished": 1.0}
    assert stopped_mark(base) is None
    for bad in ("yes", {"at": "noon"}, {"at": float("nan")}, {"at": True}, []):
        assert stopped_mark({**base, "stopped": bad}) is None
    assert stopped_mark({**base, "stopped": {"at": 5, "reason": "SIGTERM\x1b[2J"}}) == (5.0, "?")
    assert stopped_mark({**base, "stopped": {"at": 5}}) == (5.0, "?")


slurm_cluster = cluster.slurm_cluster
slurm_node = cluster.slurm_node


@pytest.mark.slurm
def test_a_real_slurmd_runs_jobs_on_a_node_whose_daemon_was_stopped(slurm_node, tmp_path):
    """slurmd 22.05 runs ``hetpatrol prolog`` before each job: with the daemon stopped
    (SIGTERM) and its verdict past the limit, the job runs and the node is not drained;
    the same verdict without the mark (a daemon that died) fails the Prolog and slurmd
    drains the node with hetpatrol's reason."""
    c = slurm_node
    proc, state = start(tmp_path)
    stop(proc)
    out = tmp_path / "guard.out"
    py = tmp_path / "prolog.py"
    py.write_text(
        "import os, sys\n"
        "from hetpatrol.slurm.jobguard import prolog_main\n"
        f"w = lambda s: open({str(out)!r}, 'a').write(s)\n"
        f"sys.exit(prolog_main(os.environ, {str(state)!r}, max_age=0.5, "
        f"scontrol={shutil.which('scontrol')!r}, write=w))\n"
    )
    time.sleep(1.0)  # past --max-age: stale but for the mark
    with c.explain(), c.install_hook("prolog", f"#!/bin/sh\nexec {sys.executable} {py}\n"):
        job = c.run("sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true")
        said = wait_for(lambda: out.exists() and out.read_text().strip())
        assert said.startswith("job cards ok: ") and "hetpatrol stopped at " in said, said
        c.run("scontrol", "wait_job", job.stdout.strip().split(";")[0], check=False)
        line = c.wait_for(lambda line: line.split(" ")[1] == "idle", what="node idle")
        assert c.reason() == "none", line
        out.unlink()
        doc = json.loads(state.read_text())
        del doc["stopped"]
        state.write_text(json.dumps(doc))
        c.run("sbatch", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true")
        said = wait_for(lambda: out.exists() and out.read_text().strip())
        assert said.startswith("hetpatrol: stale verdict: last patrol "), said
        line = c.wait_for(lambda line: "drain" in line.split(" ")[1], what="node drained")
        assert c.reason().startswith("hetpatrol: stale verdict"), line
    c.run("scancel", "--user=root", check=False)


@pytest.mark.slurm
def test_a_real_slurmd_drains_nothing_for_a_stopped_daemons_health_check(slurm_cluster, tmp_path):
    """``check`` exits 3 at once for a stopped daemon: slurmd 22.05 runs it as
    HealthCheckProgram (every second here, from its start), logs ``health_check failed:
    rc:3``, registers the node and leaves it idle without a reason: slurmd drains
    nothing for a failing health check (slurm.conf(5) of 22.05, HealthCheckProgram: "Any
    action to be taken must be explicitly performed by the program"; hetpatrol's daemon
    drains by its own policy). Later Slurm releases run it "repeatedly until it returns
    an exit code of 0" before slurmd registers (upstream commit b31fa177): there a
    stopped daemon's node stays unregistered at slurmd's start, as with a stale verdict
    before the mark."""
    proc, state = start(tmp_path)  # (slurm_cluster: its checks that Slurm can run here)
    stop(proc)
    out = tmp_path / "healthcheck.out"
    script = tmp_path / "healthcheck"
    script.write_text(
        "#!/bin/sh\n"
        f"{sys.executable} -m hetpatrol.cli check --state-path {state} >> {out} 2>&1\n"
        f'rc=$?\necho "rc=$rc" >> {out}\nexit $rc\n'
    )
    script.chmod(0o755)
    c = cluster.start_cluster(
        overrides={
            "HealthCheckProgram": str(script),
            "HealthCheckInterval": "1",
            "HealthCheckNodeState": "ANY",
        },
        wait_idle=False,
    )
    try:
        with c.explain():
            wait_for(lambda: out.exists() and out.read_text().count("rc=3") >= 3, timeout=40)
            said = out.read_text()
            assert "HETPATROL UNKNOWN - the hetpatrol daemon was stopped at " in said, said
            line = c.wait_for(lambda line: line.split(" ")[1] == "idle", what="node idle")
            assert c.reason() == "none", line
            assert "rc=0" not in said
            # slurmd says so in its log, and registered the node all the same
            slurmd_log = (c.root / "log" / "slurmd.log").read_text(errors="replace")
            assert "error: health_check failed: rc:3" in slurmd_log, slurmd_log[-2000:]
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)
