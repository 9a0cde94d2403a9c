"""Running vendor tools: a real hanging process is killed with its whole process group."""

from __future__ import annotations

import os
import time

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
    assert time.monotonic() - t0 < 3
    assert res.hung and res.returncode is None
    assert res.stdout == "partial\n"
    child = int(pidfile.read_text())
    time.sleep(0.1)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"


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
