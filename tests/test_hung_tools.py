"""Hung driver evidence (hetpatrol.hung_tools): a vendor tool in uninterruptible sleep for
hung_tool_patrols patrols is named, with its wait channel, in a collector_hung finding
that feeds the escalation to reboot_node. Replayed: the Ascend-only node ascend-a3-only
with a recorded /proc/<pid>/stat and wchan of an npu-smi stuck in the driver."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

from conftest import NODES

from hetpatrol.actions import findings as action_findings
from hetpatrol.actions.apply import state_keys
from hetpatrol.actions.escalation import Escalation
from hetpatrol.config import load_config
from hetpatrol.hung_tools import HungToolWatch, StuckTask, parse_stat, scan
from hetpatrol.patrol import NODE_IDENTITY, Patroller

# /proc/<pid>/stat as this Linux host writes it (`cat /proc/self/stat`, kernel 6.x), comm
# and state changed to an npu-smi in D state; field 22 (starttime) 414313
STAT = (
    "4242 (npu-smi) D 4240 4240 13239 0 -1 4194304 101 0 0 0 0 0 0 0 20 0 1 0 414313 "
    "3133440 418 18446744073709551615 94344309153792 94344309173673 140728304344800 0 0 0 "
    "0 0 0 0 0 0 17 0 0 0 0 0 0 94344309189680 94344309191296 94344617861120 "
    "140728304347862 140728304347882 140728304347882 140728304349163 0\n"
)
# a kernel symbol as /proc/<pid>/wchan prints it (no newline); the name is composed (the
# mutex a task in D state waits on, as the call traces of hung tasks show: __mutex_lock)
WCHAN = "__mutex_lock.constprop.0"


def stuck_replay(tmp_path, state="D"):
    replay = tmp_path / "a3"
    shutil.copytree(NODES / "ascend-a3-only", replay)
    proc = replay / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "stat").write_text(STAT.replace(") D ", f") {state} "))
    (proc / "wchan").write_text(WCHAN)
    (proc / "status").write_text(status(0))
    # another user's long-running program, also in D: not a vendor tool, never named
    other = replay / "proc" / "5000"
    other.mkdir()
    (other / "stat").write_text(STAT.replace("4242 (npu-smi)", "5000 (rsync)"))
    return replay


def status(uid):
    """The ``Uid:``/``Gid:`` lines of ``/proc/<pid>/status`` (real, effective, saved, fs)."""
    return f"Name:\tnpu-smi\nState:\tD (disk sleep)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"


def config():
    base = load_config(NODES / "mixed-three-vendor" / "hetpatrol.yaml")
    return replace(base, node="a3-01", jsonl_path=None, state_path=None, hung_tool_patrols=3)


def hung(report):
    return [f for f in report.node_findings if f.check == "collector_hung"]


def test_parse_stat_reads_state_and_starttime_even_with_parentheses_in_comm():
    assert parse_stat(STAT) == ("npu-smi", "D", 414313)
    odd = STAT.replace("(npu-smi)", "(a) b (c))")
    assert parse_stat(odd) == ("a) b (c)", "D", 414313)
    assert parse_stat("garbled") is None
    with open("/proc/self/stat") as f:
        mine = parse_stat(f.read())
    assert mine is not None and mine[1] in "RS"


def test_a_vendor_tool_stuck_for_n_patrols_is_named_with_its_wait_channel(tmp_path):
    p = Patroller(config(), replay_dir=stuck_replay(tmp_path))
    try:
        reports = [p.run() for _ in range(3)]
    finally:
        p.close()
    assert hung(reports[0]) == [] and hung(reports[1]) == []  # 1 and 2 of 3 patrols
    (f,) = hung(reports[2])
    assert f.severity == "unknown"
    assert "npu-smi pid 4242 in D state for 3 patrols (wchan __mutex_lock.constprop.0)" in (
        f.message
    )
    assert "rsync" not in f.message
    assert f.value == {
        "stuck": [
            {
                "pid": 4242,
                "comm": "npu-smi",
                "state": "D",
                "wchan": WCHAN,
                "collector": "ascend",
                "patrols": 3,
            }
        ]
    }
    # it feeds the escalation: check:collector_hung lasting 600 s -> reboot_node
    levels = action_findings.bundled_levels()
    keys = state_keys([f], levels)
    assert "check:collector_hung" in keys
    esc = Escalation()
    esc.observe_present(NODE_IDENTITY, keys, 1000.0)
    esc.observe_present(NODE_IDENTITY, keys, 1601.0)
    assert [v.action for v in esc.actions(NODE_IDENTITY, 1601.0)] == ["reboot_node"]


def test_a_tool_that_sleeps_interruptibly_is_no_evidence(tmp_path):
    p = Patroller(config(), replay_dir=stuck_replay(tmp_path, state="S"))
    try:
        reports = [p.run() for _ in range(4)]
    finally:
        p.close()
    assert not any(hung(r) for r in reports)


def test_the_count_is_per_process_and_starts_again_for_a_new_one(tmp_path):
    root = stuck_replay(tmp_path)
    programs = {"npu-smi": "ascend"}
    w = HungToolWatch(2)
    assert w.observe(scan(root, programs, {})) == []
    (t,) = w.observe(scan(root, programs, {}))
    assert t == StuckTask(4242, "npu-smi", WCHAN, "ascend", 2)
    # the pid reused by a new process (another starttime): counted from 1 again
    stat = root / "proc/4242/stat"
    stat.write_text(STAT.replace(" 414313 ", " 999999 "))
    assert w.observe(scan(root, programs, {})) == []
    # a hidden wait channel ("0" under kptr_restrict) is said as hidden
    (root / "proc/4242/wchan").write_text("0")
    (t,) = w.observe(scan(root, programs, {}))
    assert t.wchan is None and "wchan hidden" in t.describe()
    os.unlink(stat)  # the process ended between two patrols
    assert w.observe(scan(root, programs, {})) == []


def test_a_users_program_named_like_a_vendor_tool_in_d_state_is_no_evidence(tmp_path):
    """A Slurm user names a process ``npu-smi`` (``prctl(PR_SET_NAME)`` or a binary of
    that name) and keeps it in D state without any driver fault: a ``vfork()`` parent
    waits in ``kernel_clone`` in state D until its child exits (seen on this host, an
    unprivileged process); a read on the user's own FUSE mount waits in D too. The comm
    is text the user chose: it must never name a wedged driver, or feed
    check:collector_hung lasting -> reboot_node (a user could drain the node)."""
    root = stuck_replay(tmp_path)
    fake = root / "proc" / "6000"
    fake.mkdir()
    (fake / "stat").write_text(STAT.replace("4242 (npu-smi)", "6000 (npu-smi)"))
    (fake / "wchan").write_text("kernel_clone")
    (fake / "status").write_text(status(1000))
    # a setuid program the user ran: effective uid root, real uid still the user's
    suid = root / "proc" / "6001"
    suid.mkdir()
    (suid / "stat").write_text(STAT.replace("4242 (npu-smi)", "6001 (npu-smi)"))
    (suid / "status").write_text(status(1000).replace("Uid:\t1000\t1000", "Uid:\t1000\t0"))
    # and one whose status cannot be read (gone, hidden): its owner is unknown
    (root / "proc" / "6002").mkdir()
    (root / "proc" / "6002" / "stat").write_text(STAT.replace("4242 (npu-smi)", "6002 (npu-smi)"))
    found = [t.pid for _key, t in scan(root, {"npu-smi": "ascend"}, {})]
    assert found == [4242]  # root's npu-smi only
    os.unlink(root / "proc/4242/stat")  # only the users' fakes are left
    p = Patroller(config(), replay_dir=root)
    try:
        reports = [p.run() for _ in range(4)]
    finally:
        p.close()
    assert not any(hung(r) for r in reports)
