"""Running vendor tools: a real hanging process is killed with its whole process group."""

from __future__ import annotations

import os
import time
import tracemalloc

import psutil
import pytest

from hetpatrol.tool import ReplayTool, replay_file_name, run_tool


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_output_and_exit_code(tmp_path):
    exe = script(tmp_path, "tool", "echo out; echo err >&2; exit 3\n")
    res = run_tool([exe], 5)
    assert (res.stdout, res.stderr, res.returncode, res.hung) == ("out\n", "err\n", 3, False)


def test_non_utf8_output_is_kept_not_fatal(tmp_path):
    exe = script(tmp_path, "tool", "printf 'NPU \\377\\376 ok\\n'\n")
    assert run_tool([exe], 5).stdout == "NPU \ufffd\ufffd ok\n"


def test_missing_program_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        run_tool([str(tmp_path / "npu-smi")], 1)


def test_hung_tool_and_its_children_are_killed(tmp_path):
    pidfile = tmp_path / "child.pid"
    # ignores SIGTERM, spawns a grandchild that also sleeps, then hangs
    exe = script(
        tmp_path, "hang", f"trap '' TERM\nsleep 300 &\necho $! > {pidfile}\necho partial\nwait\n"
    )
    t0 = time.monotonic()
    res = run_tool([exe], 0.5)
    assert time.monotonic() - t0 < 30  # killed at 0.5 s, not left to the grandchild's 300 s
    assert res.hung and res.returncode is None
    assert res.stdout == "partial\n"
    child = int(pidfile.read_text())
    if not sleeper_gone(child, 5):
        pytest.fail(f"the grandchild {child} survived")


def sleeper_gone(pid: int, seconds: float) -> bool:
    """Whether the ``sleep`` at ``pid`` is gone within ``seconds``: reaped (its parent died
    with it, so init reaped it at once), a zombie, or the pid already reused by another
    program. A killed child may be any of these by the time a loaded machine looks."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE or proc.name() != "sleep":
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def test_a_hung_tools_child_in_a_session_of_its_own_is_killed_too(tmp_path):
    """``setsid`` takes the child out of the tool's process group: killpg alone would
    leave it running (and holding the output pipe).

    The child writes its own pid (``$$`` of the shell that then execs ``sleep``), so the
    pid is the sleeper's whether or not ``setsid`` forked. Once killed, the child may be
    reaped at once (its parent died with it) or linger as a zombie: both are gone; a
    ``sleep`` still sleeping after 5 s is the failure."""
    pidfile = tmp_path / "child.pid"
    exe = script(
        tmp_path,
        "hang",
        f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' &\nsleep 300\n",
    )
    res = run_tool([exe], 3)  # time for the script to write the pid on a loaded machine
    assert res.hung
    pid = int(pidfile.read_text())
    if not sleeper_gone(pid, 5):
        pytest.fail(f"the setsid child {pid} survived")


def test_no_children_or_zombies_after_many_hung_runs(tmp_path):
    exe = script(tmp_path, "hang", "sleep 300 & sleep 300\n")
    me = psutil.Process(os.getpid())
    before = {p.pid for p in me.children(recursive=True)}  # e.g. a session's test cluster
    for _ in range(100):
        assert run_tool([exe], 0.01).hung
    assert [p for p in me.children(recursive=True) if p.pid not in before] == []


def test_replay_tool_file_names(tmp_path):
    (tmp_path / "npu-smi-info.txt").write_text("table\n")
    (tmp_path / "npu-smi_info_-t_health_-i_0.txt").write_text("health\n")
    tool = ReplayTool(tmp_path)
    assert tool.run(["/usr/local/bin/npu-smi", "info"], 1).stdout == "table\n"
    assert tool.run(["npu-smi", "info", "-t", "health", "-i", "0"], 1).stdout == "health\n"
    assert (
        replay_file_name(["hccn_tool", "-i", "0", "-link", "-g"]) == "hccn_tool_-i_0_-link_-g.txt"
    )
    with pytest.raises(FileNotFoundError):
        tool.run(["nvidia-smi"], 1)


def test_runaway_output_is_capped_flagged_and_the_tool_killed(tmp_path):
    """A tool printing ~50 MB (2 GB in the field drove RSS to 5.9 GB): only the cap is
    kept, the result says it was cut, the tool is killed, memory stays bounded."""
    from hetpatrol.tool import STDOUT_CAP

    exe = script(
        tmp_path,
        "flood",
        "head -c 500000 /dev/zero | tr '\\0' e >&2\n"
        "head -c 50000000 /dev/zero | tr '\\0' x\necho done\n",
    )
    t0 = time.monotonic()
    tracemalloc.start()
    try:
        res = run_tool([exe], 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < 15  # killed at the cap, not run to the timeout
    assert res.truncated and not res.hung and res.returncode == -9  # SIGKILL
    assert (len(res.stdout), len(res.stderr)) == (STDOUT_CAP, 500000)
    assert res.stdout[:10] == "x" * 10 and "done" not in res.stdout
    # Python's own allocations (every thread), not RSS, which the allocator keeps: the
    # kept buffer and its decoded text, not the 50 MB (x2 decoded) an uncapped read holds
    assert peak < 3 * STDOUT_CAP, peak
    small = run_tool([script(tmp_path, "ok", "echo hi\n")], 5)
    assert not small.truncated and small.stdout == "hi\n"


def test_ascend_collector_turns_a_cut_output_into_an_error(tmp_path):
    from hetpatrol.collector import CollectorError
    from hetpatrol.collectors.ascend import RAW_KEEP, AscendCollector

    exe = script(tmp_path, "npu-smi", "yes '| NPU garbage |' | head -c 40000000\n")
    collector = AscendCollector({})
    collector.runner = lambda argv, timeout: run_tool(argv, timeout, stdout_cap=1 << 20)
    collector.command = [exe, "info"]
    with pytest.raises(CollectorError, match="cut") as exc:
        collector.collect()
    assert exc.value.raw and len(exc.value.raw) <= RAW_KEEP
    assert exc.value.raw.startswith("| NPU garbage |")


def test_not_executable_raises_permission_error(tmp_path):
    path = tmp_path / "npu-smi"
    path.write_text("#!/bin/sh\necho never\n")
    path.chmod(0o644)
    with pytest.raises(PermissionError):
        run_tool([str(path)], 1)


def test_a_child_holding_the_output_pipe_after_the_tool_exits_is_killed(tmp_path):
    """The tool exits at once, its background child keeps stdout open: the tool's answer
    and exit code are kept at its exit, not "hung" at the timeout (a collector_hung each
    patrol, escalated to a node reboot after 10 minutes), and the child (in the group)
    is killed."""
    pidfile = tmp_path / "child.pid"
    # $! is the sleeper's own pid (a background command in a script forks once) and is
    # written before the tool exits
    exe = script(tmp_path, "tool", f"sleep 300 &\necho $! > {pidfile}\necho done\nexit 4\n")
    t0 = time.monotonic()
    res = run_tool([exe], 30)
    assert time.monotonic() - t0 < 30  # ended at the tool's exit, not at the timeout
    assert (res.stdout, res.hung, res.returncode, res.truncated) == ("done\n", False, 4, False)
    pid = int(pidfile.read_text())
    if not sleeper_gone(pid, 5):
        pytest.fail(f"the child {pid} holding the pipe survived")


def test_a_daemon_in_a_session_of_its_own_holding_stderr_does_not_make_the_tool_hung(tmp_path):
    """``setsid`` + exit: the daemon is out of the group and orphaned (out of reach, left
    to the unit's cgroup); the run still ends at the tool's exit with its answer."""
    pidfile = tmp_path / "child.pid"
    exe = script(tmp_path, "tool", f"setsid sleep 300 >&2 &\necho $! > {pidfile}\necho ok\n")
    t0 = time.monotonic()
    res = run_tool([exe], 30)
    try:
        assert time.monotonic() - t0 < 30  # ended at the tool's exit, not at the timeout
        assert (res.stdout, res.hung, res.returncode) == ("ok\n", False, 0)
    finally:
        try:  # the escapee, left running by design; never a program that reused its pid
            escapee = psutil.Process(int(pidfile.read_text()))
            if escapee.name() == "sleep":
                escapee.kill()
        except psutil.Error:
            pass
