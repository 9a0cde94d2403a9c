"""`hetpatrol epilog`: after a job, one quick patrol of the cards it held.

The daemon's state is the healthy H100 node (fixtures/nodes/healthy-mixed); the epilog's
patrol reads fixtures/nodes/xid-79, the same GPUs after GPU 6 (0000:cb:00.0) fell off
the bus during the job: XID 79 and "fallen off the bus" in the kernel log, NVML GpuIsLost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import slurm_cluster as cluster
from conftest import HETPATROL, NODES

from hetpatrol.config import load_config
from hetpatrol.exporters.state import write_state
from hetpatrol.patrol import Patroller
from hetpatrol.slurm.epilog import run_epilog


def _patrol(scenario: str):
    patroller = Patroller(replace(load_config(), node="n1"), replay_dir=NODES / scenario)
    try:
        return patroller.run()
    finally:
        patroller.close()


@pytest.fixture
def state(tmp_path):
    path = tmp_path / "state.json"
    write_state(path, _patrol("healthy-mixed"), 10.0)
    return path


# the session's Slurm cluster and the per-test "node idle, no reason" fixture
slurm_cluster = cluster.slurm_cluster
slurm_node = cluster.slurm_node


def _env(gpus: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "42",
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_GPUS": gpus,
        "ASCEND_VISIBLE_DEVICES": "",
    }


def test_a_card_the_job_broke_drains_the_node_with_hetpatrols_reason(state):
    calls = []

    def scontrol(argv, timeout):
        calls.append(list(argv))
        return ""

    code, line = run_epilog(
        _env("6"), state, lambda: _patrol("xid-79"), runner=scontrol, scontrol="sc"
    )
    assert code == 0  # drained with hetpatrol's reason: a non-zero Epilog would replace it
    assert line.startswith("hetpatrol: ") and " nvidia/6 " in f"{line} "
    assert calls == [["sc", "update", "NodeName=n1", "State=DRAIN", f"Reason={line}"]]


def test_healthy_cards_of_the_job_pass(state):
    def scontrol(argv, timeout):  # never called: the environment names the GPUs
        raise AssertionError(argv)

    code, line = run_epilog(_env("0,1"), state, lambda: _patrol("xid-79"), runner=scontrol)
    assert (code, line) == (0, "hetpatrol epilog: nvidia/0, nvidia/1 fine after the job")


def test_no_state_file_or_no_card_is_no_drain(tmp_path, state):
    code, line = run_epilog(_env("6"), tmp_path / "none.json", lambda: [])
    assert code == 0 and "no state file" in line
    env = {
        "SLURM_JOB_ID": "42",
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_GPUS": "",
        "ASCEND_VISIBLE_DEVICES": "",
    }
    code, line = run_epilog(env, state, lambda: _patrol("xid-79"), runner=lambda a, t: "")
    assert code == 0


def test_the_command_with_a_stand_in_scontrol(tmp_path, state):
    log = tmp_path / "scontrol.log"
    tool = tmp_path / "scontrol"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    tool.chmod(0o755)
    env = {**os.environ, **_env("6")}
    argv = [*HETPATROL, "epilog", "--replay", str(NODES / "xid-79"), "--state-path", str(state)]
    run = subprocess.run(
        [*argv, "--scontrol", str(tool)], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("hetpatrol: ") and "nvidia/6" in run.stdout
    assert log.read_text().startswith("update NodeName=n1 State=DRAIN Reason=hetpatrol: ")
    env = {**os.environ, **_env("3")}
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout) == (0, "hetpatrol epilog: nvidia/3 fine after the job\n")


def test_a_usage_error_of_the_prolog_lets_the_job_through():
    run = subprocess.run(
        [*HETPATROL[:2], "hetpatrol.entry", "prolog", "--bogus"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0
    assert "unrecognized arguments: --bogus: job let through" in run.stderr


@pytest.mark.parametrize("timeout", ["inf", "nan", "-1", "0", "abc"])
def test_a_bad_timeout_is_a_usage_error(tmp_path, timeout):
    """``--timeout inf`` was an OverflowError traceback (exit 1, which Slurm answers with
    an "Epilog error" drain) and ``nan`` exit 78; now the prolog's rule: a usage error."""
    run = subprocess.run(
        [*HETPATROL, "epilog", "--state-path", str(tmp_path / "s.json"), "--timeout", timeout],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 64, run.stderr
    assert f"argument --timeout: {timeout!r}: a positive number of seconds" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.slurm
def test_real_slurmd_epilog_drains_after_a_job_that_broke_a_gpu(slurm_node, tmp_path):
    """slurmd runs `hetpatrol epilog` as Epilog. The daemon's verdict was the healthy H100
    node; after the job the patrol (fixtures/nodes/xid-79) finds GPU 6 fallen off the bus.
    This test cluster's GPUs are plain files, so slurmd gives the Epilog no SLURM_JOB_GPUS
    and the finished job's record keeps no IDX: the epilog looks at every card, and the
    node is drained with hetpatrol's reason (the per-IDX choice is tested above)."""
    import shutil
    import time

    c = slurm_node
    state = tmp_path / "state.json"
    patroller = Patroller(replace(load_config(), node=c.node), replay_dir=NODES / "healthy-mixed")
    try:
        write_state(state, patroller.run(), 3600.0)
    finally:
        patroller.close()
    out = tmp_path / "epilog.out"
    argv = [sys.executable, "-m", "hetpatrol.cli", "epilog", "--replay", str(NODES / "xid-79")]
    argv += ["--state-path", str(state), "--scontrol", shutil.which("scontrol") or "scontrol"]
    script = "#!/bin/sh\n" + " ".join(f"'{a}'" for a in argv) + f" >> {out} 2>&1\n"

    with c.explain(), c.install_hook("epilog", script):
        c.run("sbatch", "--gres=gpu:2", "-o", "/dev/null", "--wrap", "true")
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        last = out.read_text().strip().splitlines()[-1]
        assert last.startswith("hetpatrol: reboot_node nvidia/6 "), last
        c.wait_for(lambda line: "drain" in line.split(" ")[1], what="node drained")
        # the job completes (the node no longer "draining"): the reason stays hetpatrol's
        c.wait_for(lambda line: line.split(" ")[1] == "drained", what="job done")
        assert c.reason().startswith("hetpatrol: reboot_node nvidia/6 ")
    c.run("scancel", "--user=root", check=False)


# ------------------------------------------- a card no longer listed: one judgment
def _npu_tables(tmp_path):
    """(replay dir, the recorded healthy 8 x 910B4 table, its lines): NPU 5 is bus
    0000:02:00.0 (fixtures/nodes/healthy-mixed/npu-smi-info.txt, lines 22-23, its
    process line 44)."""
    import shutil

    node = tmp_path / "npu"
    node.mkdir(parents=True)
    table = node / "npu-smi-info.txt"
    shutil.copy(NODES / "healthy-mixed" / "npu-smi-info.txt", table)
    text = table.read_text()
    lines = text.splitlines(keepends=True)
    assert lines[21].startswith("| 5     910B4") and "0000:02:00.0" in lines[22]
    assert lines[43].startswith("| No running processes found in NPU 5 ")
    return node, text, lines


def _ascend_patroller(node):
    config = replace(load_config(), node="n1", collectors=load_config().collectors[1:])
    return Patroller(config, replay_dir=node)


def _npu_epilog(tmp_path, damaged_text):
    """The daemon's state from the healthy table; then the daemon's next patrol and the
    Epilog's (a job held NPU 5) both read ``damaged_text``: (daemon's report, epilog's
    exit code and line, the scontrol calls)."""
    node, text, _ = _npu_tables(tmp_path)
    table = node / "npu-smi-info.txt"
    daemon = _ascend_patroller(node)
    try:
        state = tmp_path / "state.json"
        write_state(state, daemon.run(), 10.0)
        table.write_text(damaged_text)
        report = daemon.run()
        after = tmp_path / "after.json"
        write_state(after, report, 10.0)
    finally:
        daemon.close()
    # the Prolog of the next job (NPU 0), on the daemon's verdict of that patrol
    from hetpatrol.slurm import jobguard

    prolog = jobguard.guard({"ASCEND_VISIBLE_DEVICES": "0"}, after, runner=None)
    calls = []

    def scontrol(argv, timeout):
        calls.append(list(argv))
        return ""

    def epilog_patrol():
        p = _ascend_patroller(node)
        try:
            return p.run()
        finally:
            p.close()

    env = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1", "ASCEND_VISIBLE_DEVICES": "5"}
    code, line = run_epilog(env, state, epilog_patrol, runner=scontrol, scontrol="sc")
    return report, code, line, calls, prolog


def test_damaged_npu_smi_output_the_daemon_calls_unknown_drains_nothing(tmp_path):
    """NPU 5's row garbled ("| X     910B4"): the daemon's card_missing is unknown
    (action watch), so the Epilog, judging the same input, does not drain
    ("reboot_node ascend/5/0 ... no longer listed" before)."""
    _, text, _ = _npu_tables(tmp_path / "t")
    garbled = text.replace("| 5     910B4", "| X     910B4")
    report, code, line, calls, prolog = _npu_epilog(tmp_path, garbled)
    assert [
        (f.check, f.severity, f.action) for f in report.node_findings if f.check != "pci_census"
    ] == [("card_missing", "unknown", "watch")]
    assert (code, calls) == (0, [])
    assert line == (
        "hetpatrol epilog: no card to drain for; ascend/5/0 no longer listed (this output "
        "was damaged: not counted; watch): not drained"
    )
    assert prolog.ok and prolog.reason.startswith("job cards ok: ascend/0/0"), prolog


def test_an_npu_gone_after_the_job_drains_only_when_the_daemons_rule_does(tmp_path):
    """NPU 5 gone from both tables (output otherwise whole). One patrol's short list is
    no proof: the Epilog's own read after a daemon that still listed it is "1 of 3
    patrols", action watch, no drain. After two daemon patrols that counted it (state
    file ``boot.missing_cards``, the same boot) the Epilog's read is the third: the
    daemon's rule says critical (reboot_node), and the Epilog drains with that reason;
    so does the daemon on its own third patrol, and the Prolog refuses the next job."""
    import shutil

    from hetpatrol.replay import scenario_boots
    from hetpatrol.slurm import jobguard

    node, _, lines = _npu_tables(tmp_path / "t")
    boot1, _ = scenario_boots(NODES / "reboot-links-late")  # a boot id and btime
    shutil.copytree(boot1 / "proc", node / "proc")
    table = node / "npu-smi-info.txt"
    states = []
    daemon = _ascend_patroller(node)
    try:
        for n in range(3):
            if n == 1:  # gone from both tables, as when the driver no longer sees it
                table.write_text("".join(lines[:21] + lines[24:43] + lines[45:]))
            report = daemon.run()
            states.append(tmp_path / f"state{n}.json")
            write_state(states[-1], report, 60.0)
        assert [
            (f.check, f.severity, f.action) for f in report.node_findings if f.check != "pci_census"
        ] == [("card_missing", "warning", "watch")]  # the daemon's 2 of 3
        assert "ascend/5/0 (0000:02:00.0) 2 of 3 patrols" in report.node_findings[0].message
        third = daemon.run()
        states.append(tmp_path / "state3.json")
        write_state(states[-1], third, 60.0)
    finally:
        daemon.close()
    env = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1", "ASCEND_VISIBLE_DEVICES": "5"}

    def epilog(state):
        calls = []

        def scontrol(argv, timeout):
            calls.append(list(argv))
            return ""

        def patrol():
            p = _ascend_patroller(node)
            try:
                return p.run()
            finally:
                p.close()

        code, line = run_epilog(env, state, patrol, runner=scontrol, scontrol="sc")
        return code, line, calls

    # (60 s patrols: a fresh verdict for 190 s, however loaded the machine running this)
    # the daemon listed NPU 5 at its last patrol: the Epilog's read is the first
    code, line, calls = epilog(states[0])
    assert (code, calls) == (0, [])
    assert line == (
        "hetpatrol epilog: no card to drain for; ascend/5/0 no longer listed (1 of 3 "
        "patrols; watch): not drained"
    )
    # the daemon counted it in 2 patrols of this boot (it is no card line of the state
    # file any more: the Epilog finds it among boot.missing_cards): the Epilog's is the third
    code, line, calls = epilog(states[2])
    assert code == 0 and line.startswith("hetpatrol: reboot_node ascend/5/0 "), line
    assert calls == [["sc", "update", "NodeName=n1", "State=DRAIN", f"Reason={line}"]]
    # hostile trial (h34g): the same count frozen in the state file of a daemon gone
    # since (stale: written an hour ago on both clocks; or its stop marked): no patrols
    # in a row with the Epilog's read, which is one short list: before, a drain
    frozen = json.loads(states[2].read_text())
    frozen["finished"] -= 3600
    frozen["finished_boot"] -= 3600
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(frozen))
    stopped = tmp_path / "stopped.json"
    stopped.write_text(
        json.dumps(
            {**json.loads(states[2].read_text()), "stopped": {"at": 1.0, "reason": "SIGTERM"}}
        )
    )
    for state in (stale, stopped):
        code, line, calls = epilog(state)
        assert (code, calls) == (0, []), line
        assert line == (
            "hetpatrol epilog: no card to drain for; ascend/5/0 no longer listed (1 of 3 "
            "patrols; watch): not drained"
        )
    # the daemon's own third patrol: critical, and the Prolog refuses the next job
    assert [
        (f.check, f.severity, f.action) for f in third.node_findings if f.check != "pci_census"
    ] == [("card_missing", "critical", "reboot_node")]
    prolog = jobguard.guard({"ASCEND_VISIBLE_DEVICES": "0"}, states[3], runner=None)
    assert prolog.reason.startswith("hetpatrol: reboot_node node card_missing"), prolog
    assert prolog.exit_code == 1
    # the Prolog let the job through on the daemon's warning of the patrol before
    assert jobguard.guard({"ASCEND_VISIBLE_DEVICES": "0"}, states[2], runner=None).ok


def test_no_card_read_says_what_it_could_not_read(state):
    """npu-smi fails after the job (fixtures/nodes/ascend-dcmi-error: DCMI -8005) and the
    replay has no nvidia-smi: no held card is judged. The line names the cards and each
    collector's state and error (not an empty "fine"); exit 0, no drain."""

    def scontrol(argv, timeout):  # never called: no drain from what was not read
        raise AssertionError(argv)

    env = {**_env("1"), "ASCEND_VISIBLE_DEVICES": "5"}
    code, line = run_epilog(env, state, lambda: _patrol("ascend-dcmi-error"), runner=scontrol)
    assert code == 0
    assert line == (
        "hetpatrol epilog: no card of the job could be read: nvidia/1 (nvidia: absent: no "
        f"nvidia-smi-q.xml in {NODES / 'ascend-dcmi-error'}); ascend/5/0 (ascend: failed: "
        "npu-smi info failed: DCMI return code -8005: DrvMngGetConsoleLogLevel failed. "
        "(g_conLogLevel=3); dcmi module initialize failed. ret is -8005)"
    )
    # a card read fine beside one that was not: both said
    code, line = run_epilog(env, state, lambda: _patrol("xid-79"), runner=scontrol)
    assert code == 0
    assert line.startswith(
        "hetpatrol epilog: nvidia/1 fine after the job; not read: ascend/5/0 (ascend: absent: "
    ), line


def _without_gpu6(tmp_path, with_xid: bool):
    """healthy-mixed without GPU 6 (0000:cb:00.0) in NVML's answer, with the kernel log
    of fixtures/nodes/xid-79 (XID 79 and "fallen off the bus" on that bus id) or none;
    the PCI census still holds it."""
    import shutil

    d = tmp_path / ("gone-xid" if with_xid else "gone")
    shutil.copytree(NODES / "healthy-mixed", d)
    xml = d / "nvidia-smi-q.xml"
    text = xml.read_text()
    start = text.index('    <gpu id="00000000:CB:00.0">')
    end = text.index("</gpu>", start) + len("</gpu>\n")
    xml.write_text(text[:start].replace("<attached_gpus>8<", "<attached_gpus>7<") + text[end:])
    if with_xid:
        shutil.copy(NODES / "xid-79" / "kmsg.txt", d / "kmsg.txt")
    return d


def test_a_gpu_gone_with_xid_79_on_its_bus_id_drains_at_once(state, tmp_path):
    """GPU 6 no longer listed after the job, with no count of the daemon (its state listed
    it): the Epilog's own kernel log has XID 79 on 0000:cb:00.0 in this boot, a second
    signal about the same card, so the daemon's rule says critical: the Epilog drains.
    Without that log it is 1 of 3 patrols: watch, no drain."""
    calls = []

    def scontrol(argv, timeout):
        calls.append(list(argv))
        return ""

    gone = _without_gpu6(tmp_path, with_xid=False)
    code, line = run_epilog(_env("6"), state, lambda: _patrol(gone), runner=scontrol)
    assert (code, calls) == (0, [])
    assert line == (
        "hetpatrol epilog: no card to drain for; nvidia/6 no longer listed (1 of 3 patrols; "
        "watch): not drained"
    )
    gone_xid = _without_gpu6(tmp_path, with_xid=True)
    code, line = run_epilog(_env("6"), state, lambda: _patrol(gone_xid), runner=scontrol)
    assert code == 0 and line.startswith("hetpatrol: reboot_node nvidia/6 "), line
    assert calls == [["scontrol", "update", "NodeName=n1", "State=DRAIN", f"Reason={line}"]]
