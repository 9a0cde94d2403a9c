"""Card -> process -> user -> Slurm job on /proc trees built in a temp dir, one per cgroup
layout Slurm uses; and the bounded per-(card, job, user) memory metric."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from hetpatrol.exporters.prometheus import process_memory_metric
from hetpatrol.processes import enrich, job_from_cgroup, lookup
from hetpatrol.schema import CardRecord, ProcessInfo

ROOT_NAME = pwd.getpwuid(0).pw_name


def _unnamed_uid() -> int:
    for uid in range(54321, 65000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError("no free uid")


def make_proc(root: Path, pid: int, cgroup: str, uid: int = 0, environ: dict | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text(
        f"Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\n"
        f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
    )
    (d / "cgroup").write_text(cgroup)
    if environ is not None:
        (d / "environ").write_bytes(
            b"\x00".join(f"{k}={v}".encode() for k, v in environ.items()) + b"\x00"
        )


V1 = (  # a task of uid 1000's job 1234 under task/cgroup on cgroup v1
    "12:pids:/slurm/uid_1000/job_1234/step_0/task_0\n"
    "11:memory:/slurm/uid_1000/job_1234/step_0/task_0\n"
    "10:devices:/slurm/uid_1000/job_1234/step_0\n"
    "1:name=systemd:/system.slice/slurmd.service\n"
)


def name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@pytest.mark.parametrize(
    "cgroup, uid, environ, job",
    [
        # cgroup v2, Slurm up to 25.11
        ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", 0, None, "4242"),
        ("0::/system.slice/slurmstepd.scope/job_4243/step_batch/user/task_0\n", 0, None, "4243"),
        ("0::/system.slice/slurmstepd.scope/job_7/step_extern/user/task_special\n", 0, None, "7"),
        # v2 with several slurmd on one host (<node>_slurmstepd.scope)
        ("0::/system.slice/gpu07_slurmstepd.scope/job_77/step_extern/user/task_0\n", 0, None, "77"),
        # cgroup v1: the uid in the path is the process's own
        (V1, 1000, None, "1234"),
        ("4:memory:/slurm_gpu07/uid_0/job_88/step_0/task_1\n", 0, None, "88"),
        # 26.05: the job directory is the SLUID, reported as such: the environment's
        # SLURM_JOB_ID is the process's own text, never read
        (
            "0::/system.slice/slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_0\n",
            0,
            {"SLURM_JOB_ID": "9001", "SLURM_JOB_SLUID": "s5K1KKYAYG5D00"},
            "s5K1KKYAYG5D00",
        ),
        # slurmstepd itself (its own scope, a step's "slurm" part), processes outside jobs
        ("0::/system.slice/slurmstepd.scope/system\n", 0, None, None),
        ("0::/system.slice/slurmstepd.scope/job_5/step_0/slurm\n", 0, None, None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", 0, None, None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", 0, {"HOME": "/root"}, None),
        # outside Slurm's cgroups: a SLURM_JOB_ID the process set itself credits no job
        ("0::/system.slice/slurmd.service\n", 0, {"PATH": "/bin", "SLURM_JOB_ID": "555"}, None),
        # the cgroup's job id, whatever the environment says
        (
            "0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0\n",
            0,
            {"SLURM_JOB_ID": "13"},
            "12",
        ),
    ],
)
def test_job_from_each_cgroup_layout(tmp_path, cgroup, uid, environ, job):
    make_proc(tmp_path, 4711, cgroup, uid=uid, environ=environ)
    assert lookup(4711, tmp_path) == (name_of(uid), job)


def test_user_from_status_uid(tmp_path):
    uid = _unnamed_uid()
    make_proc(tmp_path, 10, "0::/\n", uid=uid)
    assert lookup(10, tmp_path) == (str(uid), None)  # no passwd entry: the number


def test_vanished_and_unreadable_pids_keep_their_pid(tmp_path):
    make_proc(tmp_path, 20, V1, uid=1000)
    (tmp_path / "21").mkdir()  # exited between listing and reading: empty directory
    procs = [
        ProcessInfo(pid=20, memory_bytes=1 << 30),
        ProcessInfo(pid=21, memory_bytes=2 << 30),
        ProcessInfo(pid=99999, name="gone", memory_bytes=3 << 30),
        ProcessInfo(pid=30, user="bob", job_id="7"),  # already known: left alone
    ]
    enrich(procs, proc_root=tmp_path)
    assert [(p.pid, p.user, p.job_id) for p in procs] == [
        (20, name_of(1000), "1234"),
        (21, None, None),
        (99999, None, None),
        (30, "bob", "7"),
    ]
    assert procs[2].name == "gone" and procs[2].memory_bytes == 3 << 30


def test_real_proc_for_this_process():
    user, _job = lookup(os.getpid())
    assert user == pwd.getpwuid(os.getuid()).pw_name


def test_job_from_cgroup_text_only():
    assert job_from_cgroup("") is None
    assert job_from_cgroup("0::/system.slice/slurmstepd.scope/job_/step_0\n") is None


def test_process_memory_metric_is_bounded_per_card():
    rec = CardRecord(vendor="nvidia", index=0, card_type="a100", uuid="GPU-1")
    gib = 1 << 30
    for i in range(7):  # 7 (job, user) pairs: top 5 kept, 2 summed into "other"
        rec.processes.append(
            ProcessInfo(pid=100 + i, user=f"u{i}", job_id=str(i), memory_bytes=(i + 1) * gib)
        )
    rec.processes.append(ProcessInfo(pid=200, user="u6", job_id="6", memory_bytes=gib))  # same job
    rec.processes.append(ProcessInfo(pid=201, memory_bytes=None))  # memory not reported
    rec.processes.append(ProcessInfo(pid=202, memory_bytes=gib // 2))  # no job, no user
    unread = CardRecord(vendor="nvidia", index=1, read_ok=False)
    unread.processes.append(ProcessInfo(pid=300, memory_bytes=gib))
    fam = process_memory_metric([rec, unread])
    got = {(s.labels["slurm_job"], s.labels["user"]): s.value for s in fam.samples}
    assert got == {
        ("6", "u6"): 8 * gib,
        ("5", "u5"): 6 * gib,
        ("4", "u4"): 5 * gib,
        ("3", "u3"): 4 * gib,
        ("2", "u2"): 3 * gib,
        ("other", "other"): 2 * gib + gib + gib // 2,
    }
    assert all(s.labels["uuid"] == "GPU-1" for s in fam.samples)
    assert fam.name == "hetpatrol_card_process_memory_bytes"


def test_init_and_kernel_threads_are_never_attributed(tmp_path):
    """pid 1 (init, owned by root), kthreadd (pid 2) and a kernel thread (PPid 2, or
    ``Kthread: 1``) get no user and no job: a tool naming them answers from another pid
    namespace, and root's init is no one's card usage. A root daemon outside any job
    (pid 900) keeps user root and no job."""
    make_proc(tmp_path, 1, "0::/init.scope\n")
    make_proc(tmp_path, 2, "0::/\n")
    for pid, extra in ((57, "PPid:\t2\n"), (58, "PPid:\t0\nKthread:\t1\n")):
        make_proc(tmp_path, pid, "0::/\n")
        status = tmp_path / str(pid) / "status"
        status.write_text(status.read_text() + extra)
    make_proc(tmp_path, 900, "0::/system.slice/nvidia-persistenced.service\n")
    make_proc(
        tmp_path, 4242, "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", uid=0
    )
    procs = [ProcessInfo(pid=p, memory_bytes=1 << 20) for p in (1, 2, 57, 58, 900, 4242)]
    enrich(procs, tmp_path)
    assert [(p.pid, p.user, p.job_id) for p in procs] == [
        (1, None, None),
        (2, None, None),
        (57, None, None),
        (58, None, None),
        (900, ROOT_NAME, None),
        (4242, ROOT_NAME, "4242"),
    ]
    # the real /proc of this host: init and kthreadd are not attributed either
    assert lookup(1) == (None, None)
    assert lookup(2) == (None, None)


# ---------------------------- cgroups a user made, named like Slurm's (issue 21, item 5)
USER_MADE = "0::/user.slice/user-1000.slice/user@1000.service"  # systemd delegates it to uid 1000


@pytest.mark.parametrize(
    "cgroup, uid",
    [
        # uid 1000's own cgroups (systemd-run --user --scope, or mkdir in the delegated
        # subtree), with Slurm's names in them: never someone else's job
        (f"{USER_MADE}/app.slice/slurmstepd.scope/job_999/step_0/user/task_0\n", 1000),
        (f"{USER_MADE}/system.slice/slurmstepd.scope/job_999/step_0/user/task_0\n", 1000),
        (f"{USER_MADE}/app.slice/gpu07_slurmstepd.scope/job_999/step_0/user/task_0\n", 1000),
        (f"{USER_MADE}/system.slice/slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_0\n", 1000),
        ("0::/user.slice/system.slice/slurmstepd.scope/job_999/step_0/user/task_0\n", 1000),
        # cgroup v1: Slurm's tree only at the hierarchy's root, and for the owner's uid
        ("4:memory:/user.slice/user-1000.slice/slurm/uid_1000/job_999/step_0/task_0\n", 1000),
        ("4:memory:/slurm/uid_2000/job_999/step_0/task_0\n", 1000),  # someone else's uid
        ("4:memory:/slurm/uid_1000/job_999\n", 1000),  # no step: not where tasks live
        # a v1 path on the unified line, a v2 path on a v1 line
        ("0::/slurm/uid_1000/job_999/step_0/task_0\n", 1000),
        ("4:memory:/system.slice/slurmstepd.scope/job_999/step_0/user/task_0\n", 1000),
        # not Slurm's names
        ("0::/system.slice/slurmstepd.scope/job_999x/step_0/user/task_0\n", 1000),
        ("0::/system.slice/xslurmstepd.scope/job_999/step_0/user/task_0\n", 1000),
        ("0::/system.slice/slurmstepd.scope.d/job_999/step_0/user/task_0\n", 1000),
        ("garbage:/system.slice/slurmstepd.scope/job_999/step_0/user/task_0\n", 1000),
        ("/system.slice/slurmstepd.scope/job_999/step_0/user/task_0\n", 1000),
    ],
)
def test_a_cgroup_named_like_slurms_elsewhere_credits_no_job(tmp_path, cgroup, uid):
    make_proc(tmp_path, 4711, cgroup, uid=uid)
    assert lookup(4711, tmp_path) == (name_of(uid), None)


def test_the_v1_uid_must_be_the_processes_own(tmp_path):
    make_proc(tmp_path, 30, V1, uid=1000)
    make_proc(tmp_path, 31, V1, uid=1001)  # another user's process in uid 1000's tree
    assert lookup(30, tmp_path)[1] == "1234"
    assert lookup(31, tmp_path)[1] is None
    assert job_from_cgroup(V1) is None  # owner unknown: no job


def test_hybrid_hierarchy_v1_job_beside_a_user_unified_line(tmp_path):
    text = "0::/user.slice/user-1000.slice/session-4.scope\n" + V1
    make_proc(tmp_path, 40, text, uid=1000)
    assert lookup(40, tmp_path)[1] == "1234"


def test_the_stepd_scope_sits_under_pid_1s_cgroup_directory(tmp_path):
    """Slurm (cgroup_v2.c, _get_init_cg_path) puts system.slice/slurmstepd.scope under
    the directory of pid 1's cgroup: the root on a host, the container's own directory
    when slurmd runs in one; the same names elsewhere are not Slurm's."""
    container = "/docker.slice/docker-8f3c.scope"
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "cgroup").write_text(f"0::{container}/init.scope\n")
    inside = f"0::{container}/system.slice/slurmstepd.scope/job_3/step_0/user/task_0\n"
    make_proc(tmp_path, 50, inside, uid=1000)
    assert lookup(50, tmp_path)[1] == "3"
    make_proc(tmp_path, 51, "0::/system.slice/slurmstepd.scope/job_4/step_0/user/task_0\n")
    assert lookup(51, tmp_path)[1] is None  # not under this Slurm's root
    (tmp_path / "1" / "cgroup").write_text("0::/init.scope\n")  # a host: the root
    assert lookup(51, tmp_path)[1] == "4"
    assert lookup(50, tmp_path)[1] is None


# /proc/<pid>/cgroup as slurmd 22.05.8 (Debian 12 package 22.05.8-4+deb12u3) made it:
# ProctrackType=proctrack/cgroup, TaskPlugin=task/cgroup, cgroup.conf CgroupPlugin=
# cgroup/v1 + ConstrainCores=yes, NodeName hp-gpu01, a root job 734001 (`sbatch --wrap
# "sleep 300 & srun sleep 300; wait"`), in a container with the v1 controllers and an
# empty cgroup2 at /sys/fs/cgroup/unified; recorded by the real-daemon test in
# tests/test_stray_process.py. Debian builds Slurm with MULTIPLE_SLURMD: the prepend is
# /slurm_<NodeName> (src/common/cgroup.c) even with one slurmd; steps have no task_ level
# in freezer/cpuset (src/plugins/cgroup/v1/xcgroup.c, xcgroup_create_hierarchy).
_REAL_22_05_V1 = (
    "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:{freezer}\n5:devices:/\n"
    "4:memory:/process_api/65aeb37a384eade2374e50b22ec4a69f\n3:cpuset:{cpuset}\n"
    "2:cpuacct:/\n1:cpu:/\n0::/\n"
)
_JOB = "/slurm_hp-gpu01/uid_0/job_734001"


@pytest.mark.parametrize(
    "freezer, cpuset, job",
    [
        (f"{_JOB}/step_batch", f"{_JOB}/step_batch", "734001"),  # the batch script's sleep
        (f"{_JOB}/step_0", f"{_JOB}/step_0", "734001"),  # srun's sleep
        # slurmstepd [734001.batch]: the job level in freezer, its step in cpuset
        (_JOB, f"{_JOB}/step_batch", "734001"),
        # a process the test started beside the job: Slurm's tree nowhere
        ("/", "/", None),
    ],
)
def test_the_cgroups_real_slurmd_22_05_makes_on_v1(tmp_path, freezer, cpuset, job):
    text = _REAL_22_05_V1.format(freezer=freezer, cpuset=cpuset)
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "cgroup").write_text(_REAL_22_05_V1.format(freezer="/", cpuset="/"))
    make_proc(tmp_path, 17093, text, uid=0)
    assert lookup(17093, tmp_path) == (ROOT_NAME, job)
    make_proc(tmp_path, 17094, text, uid=1000)  # another uid in uid_0's tree: no job
    assert lookup(17094, tmp_path)[1] is None
