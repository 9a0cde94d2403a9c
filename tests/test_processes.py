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


V1 = (
    "12:pids:/slurm/uid_1000/job_1234/step_0/task_0\n"
    "11:memory:/slurm/uid_1000/job_1234/step_0/task_0\n"
    "10:devices:/slurm/uid_1000/job_1234/step_0\n"
    "1:name=systemd:/system.slice/slurmd.service\n"
)


@pytest.mark.parametrize(
    "cgroup, environ, job",
    [
        # cgroup v2, Slurm up to 25.11
        ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", None, "4242"),
        ("0::/system.slice/slurmstepd.scope/job_4243/step_batch/user/task_0\n", None, "4243"),
        # v2 with several slurmd on one host (<node>_slurmstepd.scope)
        ("0::/system.slice/gpu07_slurmstepd.scope/job_77/step_extern/user/task_0\n", None, "77"),
        # cgroup v1
        (V1, None, "1234"),
        ("4:memory:/slurm_gpu07/uid_0/job_88/step_0/task_1\n", None, "88"),
        # 26.05: the job directory is the SLUID; the environment gives the number
        (
            "0::/system.slice/slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_0\n",
            None,
            "s5K1KKYAYG5D00",
        ),
        (
            "0::/system.slice/slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_0\n",
            {"SLURM_JOB_ID": "9001", "SLURM_JOB_SLUID": "s5K1KKYAYG5D00"},
            "9001",
        ),
        # slurmstepd itself, and processes outside any job
        ("0::/system.slice/slurmstepd.scope/system\n", None, None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None, None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", {"HOME": "/root"}, None),
        # not in a job cgroup (e.g. proctrack/linuxproc): SLURM_JOB_ID from environ
        ("0::/system.slice/slurmd.service\n", {"PATH": "/bin", "SLURM_JOB_ID": "555"}, "555"),
        # a numeric job id in the cgroup wins over the environment
        ("0::/system.slice/slurmstepd.scope/job_12/step_0\n", {"SLURM_JOB_ID": "13"}, "12"),
    ],
)
def test_job_from_each_cgroup_layout(tmp_path, cgroup, environ, job):
    make_proc(tmp_path, 4711, cgroup, uid=0, environ=environ)
    assert lookup(4711, tmp_path) == (ROOT_NAME, job)


def test_user_from_status_uid(tmp_path):
    uid = _unnamed_uid()
    make_proc(tmp_path, 10, "0::/\n", uid=uid)
    assert lookup(10, tmp_path) == (str(uid), None)  # no passwd entry: the number


def test_vanished_and_unreadable_pids_keep_their_pid(tmp_path):
    make_proc(tmp_path, 20, V1)
    (tmp_path / "21").mkdir()  # exited between listing and reading: empty directory
    procs = [
        ProcessInfo(pid=20, memory_bytes=1 << 30),
        ProcessInfo(pid=21, memory_bytes=2 << 30),
        ProcessInfo(pid=99999, name="gone", memory_bytes=3 << 30),
        ProcessInfo(pid=30, user="bob", job_id="7"),  # already known: left alone
    ]
    enrich(procs, proc_root=tmp_path)
    assert [(p.pid, p.user, p.job_id) for p in procs] == [
        (20, ROOT_NAME, "1234"),
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
