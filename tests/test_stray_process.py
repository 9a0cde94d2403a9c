"""stray_process (a process holding card memory outside the card's Slurm job, for N
patrols) and the card -> jobs map that it and the fault events' ``jobs`` use: the
node's jobs from Slurm's own cgroup directories, one single-job query each (``scontrol
-d show job`` on 22.05, ``squeue --json --jobs=`` from 23.02.3), never the whole queue
per patrol.

Recordings: fixtures/slurm/squeue-json-22.05-hostile.json (slurmctld 22.05.8, job 1
RUNNING on hp-gpu01 with ``gpu:a100:1(IDX:0),ascend:910b:1(IDX:0)``; its name, comment
and work directory forge ``GRES=ascend:910b:1(IDX:3)``). Processes: the pids and memory
of ../shared/vendor-samples/nvidia/nvidia-smi-query-compute-apps_H200_590.48.01_load.csv
(10291 memhog 2566 MiB, 10293 memhog 1542 MiB, 10309 gpu_burn 28234 MiB).
fixtures/slurm/scontrol-show-config-22.05-{linuxproc,cgroup}.txt: ProctrackType.
fixtures/slurm/scontrol-show-job-d-22.05-{hostile,copied-block}.txt: one job's record.

On the real daemons: the session cluster (proctrack/linuxproc: its jobs have no cgroup,
nothing is asked per patrol and nothing judged) and a cluster of its own with Slurm's job
cgroups (proctrack/cgroup, cgroup v1, slurmctld at debug2 to count the RPCs), both
patrolled through an ``npu-smi info`` stand-in replaying fixtures/vendor-outputs/ascend/
npu-smi-info_910B3_8card_AICore-busy_procs_v24.1.rc2.1.txt (8 x 910B3, a ``python``
process per NPU) with the real pids.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest
import slurm_cluster as cluster

from hetpatrol.checks.stray_process import StraySettings, StrayWatch, build_top
from hetpatrol.schema import CardRecord, ProcessInfo
from hetpatrol.slurm.card_jobs import CardJobs, card_jobs
from hetpatrol.tool import ToolOutput

REPO = Path(__file__).resolve().parent.parent
SQUEUE = (REPO / "fixtures" / "slurm" / "squeue-json-22.05-hostile.json").read_text()
MIB = 1024 * 1024
# scontrol show config of the same daemons, ProctrackType linuxproc and cgroup
SHOW_CONFIG = {
    name: (REPO / "fixtures" / "slurm" / f"scontrol-show-config-22.05-{name}.txt").read_text()
    for name in ("linuxproc", "cgroup")
}


def cards():
    out = [CardRecord("nvidia", i, gres="gpu", uuid=f"GPU-{i}") for i in range(2)]
    out += [CardRecord("ascend", i, gres="ascend", bus_id=f"0000:c{i}:00.0") for i in range(4)]
    return out


def test_card_jobs_from_the_recorded_squeue_json():
    cs = cards()
    jobs, error = card_jobs(SQUEUE, "hp-gpu01", cs)
    assert error is None
    assert [jobs[i] for i in range(len(cs))] == [
        frozenset({"1"}),  # gpu IDX 0
        frozenset(),
        frozenset({"1"}),  # ascend IDX 0
        frozenset(),
        frozenset(),
        frozenset(),  # ascend 3: only the job's name and comment say so
    ]
    # another node holds none of job 1's cards; pending jobs hold nothing
    other, _ = card_jobs(SQUEUE, "hp-gpu02", cs)
    assert all(v == frozenset() for v in other.values())
    assert card_jobs("not json", "hp-gpu01", cs)[1] == "squeue --json: not JSON (JSONDecodeError)"


def _gpu0(*procs):
    return CardRecord("nvidia", 0, gres="gpu", uuid="GPU-0", processes=list(procs))


def test_stray_for_n_patrols_then_cleared():
    settings = build_top({"stray_process": {"patrols": 2}})
    watch = StrayWatch()

    def patrol(jobs, *procs):
        rec = _gpu0(*procs)
        watch.observe([rec], lambda _c: jobs, settings)
        return [f for f in rec.findings if f.check == "stray_process"]

    in_job = ProcessInfo(10309, "./gpu_burn", 28234 * MIB, "alice", "1")
    escaped = ProcessInfo(10291, "/root/tools/memhog", 2566 * MIB, "bob", None)
    other_job = ProcessInfo(10293, "/root/tools/memhog", 1542 * MIB, "bob", "7")
    job1 = frozenset({"1"})
    assert patrol(job1, in_job, escaped, other_job) == []  # first patrol: 1 of 2
    found = patrol(job1, in_job, escaped, other_job)
    assert [f.value["pid"] for f in found] == [10291, 10293]
    assert found[0].severity == "warning"
    assert found[0].value == {
        "pid": 10291,
        "user": "bob",
        "memory_bytes": 2566 * MIB,
        "job_id": None,
        "card_jobs": ["1"],
    }
    assert "pid 10291 (bob, no Slurm job) holds 2566 MiB on a card allocated to job 1" in (
        found[0].message
    )
    # the escaped process goes: its finding goes, the other stays
    assert [f.value["pid"] for f in patrol(job1, in_job, other_job)] == [10293]
    # a card with no job: every process holding memory is stray (after 2 patrols again)
    assert patrol(frozenset(), in_job) == []
    (f,) = patrol(frozenset(), in_job)
    assert "on a card with no job" in f.message
    # allocation unknown: nothing judged, counts kept
    assert patrol(None, in_job) == []
    assert watch.seen == {("uuid:GPU-0", 10309): 2}


def test_small_memory_and_off():
    watch = StrayWatch()
    tiny = ProcessInfo(1234, "x", 512 * 1024, "bob", None)  # below min_memory_bytes
    for _ in range(5):
        rec = _gpu0(tiny)
        watch.observe([rec], lambda _c: frozenset(), StraySettings(patrols=1))
        assert rec.findings == []
    rec = _gpu0(ProcessInfo(1, "x", 10 * MIB, "bob", None))
    watch.observe([rec], lambda _c: frozenset(), StraySettings(enabled=False, patrols=1))
    assert rec.findings == []


# --------------------------------------------- which jobs, then one query per job
#: recorded ``scontrol -d show job`` of slurmctld 22.05.8 (fixtures/slurm/README.md):
#: job 5 (Slurm's block: gpu IDX 0, ascend IDX 0-2; forged lines of another shape in its
#: name, work directory and comment) and job 7 (ascend IDX 0; an exact copy of Slurm's
#: block saying IDX 4-7 in its name and comment)
SHOW_JOB = {
    name: (REPO / "fixtures" / "slurm" / f"scontrol-show-job-d-22.05-{name}.txt").read_text()
    for name in ("hostile", "copied-block")
}
V22, V23 = "slurm-wlm 22.05.8\n", "slurm 23.11.4\n"


class Slurm:
    """A stand-in for scontrol/squeue recording every argv: ``show config`` (the
    recorded ProctrackType), ``--version``, ``-d show job ID`` (``jobs[ID]``, else
    scontrol's "Invalid job id specified", exit 1) and ``squeue --json [--jobs=ID]``
    (the recorded 22.05 queue, or its record ID)."""

    def __init__(self, jobs=None, proctrack="cgroup", version=V22):
        self.jobs, self.proctrack, self.version = dict(jobs or {}), proctrack, version
        self.calls: list[list[str]] = []

    def __call__(self, argv, timeout):
        argv = list(argv)
        self.calls.append(argv)

        def said(text, rc=0, err=""):
            return ToolOutput(tuple(argv), text, err, rc, False, 0.01)

        if argv[-2:] == ["show", "config"]:
            return said(SHOW_CONFIG[self.proctrack])
        if argv[-1] == "--version":
            return said(self.version)
        if argv[-4:-1] == ["-d", "show", "job"]:
            if argv[-1] in self.jobs:
                return said(self.jobs[argv[-1]])
            return said("", 1, "slurm_load_jobs error: Invalid job id specified\n")
        if argv[-1].startswith("--jobs="):
            doc = json.loads(SQUEUE)
            doc["jobs"] = [j for j in doc["jobs"] if f"--jobs={j['job_id']}" == argv[-1]]
            return said(json.dumps(doc))
        assert argv[-1] == "--json", argv
        return said(SQUEUE)

    def queue_wide(self):
        """The calls that ask slurmctld for the whole queue."""
        return [c for c in self.calls if c[-1] == "--json"]


def job_cgroup(root: Path, node: str, uid: int, job: str) -> Path:
    """Slurm's v1 job directories (freezer and cpuset) as the real slurmd 22.05 makes
    them (tests/test_stray_process.py's real-slurmd test records the layout)."""
    for controller in ("freezer", "cpuset"):
        (root / controller / f"slurm_{node}" / f"uid_{uid}" / f"job_{job}" / "step_0").mkdir(
            parents=True, exist_ok=True
        )
    return root / "freezer" / f"slurm_{node}" / f"uid_{uid}" / f"job_{job}"


def drop_cgroup(root: Path, node: str, uid: int, job: str) -> None:
    import shutil

    for controller in ("freezer", "cpuset"):
        shutil.rmtree(root / controller / f"slurm_{node}" / f"uid_{uid}" / f"job_{job}")


def test_the_nodes_jobs_come_from_slurms_own_cgroup_directories(tmp_path):
    """v1 ``<controller>/slurm[_<node>]/uid_<u>/job_<id>`` and v2 ``system.slice/
    [<node>_]slurmstepd.scope/job_<id>`` under pid 1's cgroup; a directory of that name
    anywhere else (deeper, in a user's delegated subtree, another node's prepend) is no
    job of this node."""
    from hetpatrol.slurm.card_jobs import local_slurm_jobs

    v1 = tmp_path / "v1"
    job_cgroup(v1, "hp-gpu01", 1000, "5")
    (v1 / "freezer" / "slurm" / "uid_0" / "job_6").mkdir(parents=True)  # no MULTIPLE_SLURMD
    (v1 / "freezer" / "slurm_hp-gpu01" / "uid_1000" / "job_5" / "job_9").mkdir()  # deeper
    (v1 / "freezer" / "slurm_hp-gpu02" / "uid_0" / "job_10").mkdir(parents=True)  # other node
    (v1 / "freezer" / "user" / "slurm" / "uid_0" / "job_11").mkdir(parents=True)
    (v1 / "freezer" / "slurm_hp-gpu01" / "uidx" / "job_12").mkdir(parents=True)
    jobs = local_slurm_jobs("hp-gpu01", v1)
    assert sorted(jobs) == ["5", "6"]
    assert jobs["5"] == os.stat(v1 / "cpuset" / "slurm_hp-gpu01" / "uid_1000" / "job_5").st_ino

    v2, proc = tmp_path / "v2", tmp_path / "proc"
    (v2 / "cgroup.controllers").parent.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu memory pids\n")
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "cgroup").write_text("0::/docker.slice/docker-1.scope/init.scope\n")
    inside = v2 / "docker.slice" / "docker-1.scope" / "system.slice"
    (inside / "slurmstepd.scope" / "job_21" / "step_0" / "user" / "task_0").mkdir(parents=True)
    (inside / "hp-gpu01_slurmstepd.scope" / "job_22").mkdir(parents=True)
    (v2 / "system.slice" / "slurmstepd.scope" / "job_23").mkdir(parents=True)  # not pid 1's
    user = v2 / "user.slice" / "user-1000.slice" / "user@1000.service"
    (user / "system.slice" / "slurmstepd.scope" / "job_24").mkdir(parents=True)
    assert sorted(local_slurm_jobs("hp-gpu01", v2, proc)) == ["21", "22"]
    assert local_slurm_jobs("hp-gpu01", tmp_path / "none") == {}


def test_card_jobs_asks_each_job_of_the_node_once_never_the_queue(tmp_path):
    """Slurm 22.05 (``squeue --json`` is the whole queue whatever --jobs= says): the node's
    job 5 comes from its cgroup directory and is asked once with ``scontrol -d show job
    5`` (one REQUEST_JOB_INFO_SINGLE); ten more patrols ask nothing; its directory gone,
    it is forgotten; a new directory of the same id (a requeued job back on the node) is
    asked again. No argv is ever a queue-wide ``squeue --json``."""
    slurm = Slurm({"5": SHOW_JOB["hostile"]})
    clock = [0.0]
    cj = CardJobs(
        ["env", "SLURM_CONF=/x", "/usr/bin/sinfo"],
        "hp-gpu01",
        runner=slurm,
        clock=lambda: clock[0],
        cgroup_root=tmp_path,
    )
    cs = cards()
    job_cgroup(tmp_path, "hp-gpu01", 1000, "5")
    cj.refresh(cs)
    prefix = ["env", "SLURM_CONF=/x", "/usr/bin/scontrol"]
    assert slurm.calls == [
        [*prefix, "show", "config"],
        [*prefix, "--version"],
        [*prefix, "-d", "show", "job", "5"],
    ]
    # Slurm's own block: gpu IDX 0, ascend IDX 0-2 (the forged IDX 3 / 4-7 not taken)
    assert [cj.jobs_of(c) for c in cs] == [{"5"}, set(), {"5"}, {"5"}, {"5"}, set()]
    assert cj.error is None and cj.stray_jobs_of(cs[0]) == {"5"}
    for n in range(10):
        clock[0] = 10.0 * (n + 1)
        cs = cards()
        cs[2].processes = [ProcessInfo(30001, "train", 4096 * MIB, "alice", "5")]
        cj.refresh(cs)
        assert cj.jobs_of(cs[2]) == {"5"}
    assert len(slurm.calls) == 3 and cj.queries == 1
    drop_cgroup(tmp_path, "hp-gpu01", 1000, "5")
    cj.refresh(cards())
    assert all(cj.jobs_of(c) == set() for c in cj._cards) and len(slurm.calls) == 3
    job_cgroup(tmp_path, "hp-gpu01", 1000, "5")  # requeued, here again
    cj.refresh(cards())
    assert slurm.calls[3:] == [[*prefix, "-d", "show", "job", "5"]]
    assert slurm.queue_wide() == [] and not any("squeue" in a for c in slurm.calls for a in c)


def test_from_slurm_23_02_3_the_query_is_squeue_json_for_the_one_job(tmp_path):
    """From 23.02.3 squeue --json keeps --jobs= (squeue(1): "filtering arguments are
    still used"): the one query is ``squeue --json --jobs=ID``, read by job_id."""
    slurm = Slurm(version=V23)
    cj = CardJobs(["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, cgroup_root=tmp_path)
    job_cgroup(tmp_path, "hp-gpu01", 0, "1")
    cs = cards()
    cj.refresh(cs)
    cj.refresh(cs)
    assert slurm.calls[2:] == [["/usr/bin/squeue", "--json", "--jobs=1"]]
    # the recorded record of job 1: gpu IDX 0, ascend IDX 0 (its name's IDX:3 not taken)
    assert [cj.jobs_of(c) for c in cs] == [{"1"}, set(), {"1"}, set(), set(), set()]


def test_a_job_started_between_patrols_is_asked_at_the_next_one(tmp_path):
    """No cache by age: a job whose directory appears is asked at the next patrol, so its
    process (in its cgroup) is never judged against the allocation before it; a process
    in no job is stray and is no reason to ask anything."""
    job8 = SHOW_JOB["hostile"].replace("JobId=5 ", "JobId=8 ", 1)
    job8 = job8.replace("GRES=gpu:a100:1(IDX:0),ascend:910b:3(IDX:0-2)", "GRES=gpu:a100:1(IDX:1)")
    slurm = Slurm({"5": SHOW_JOB["hostile"], "8": job8})
    cj = CardJobs(["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, cgroup_root=tmp_path)
    job_cgroup(tmp_path, "hp-gpu01", 1000, "5")
    watch, settings = StrayWatch(), StraySettings(patrols=3)
    found = []
    for n in range(4):
        cs = cards()
        if n > 0:  # job 8 started on GPU 1 after the first patrol
            job_cgroup(tmp_path, "hp-gpu01", 1001, "8")
            cs[1].processes = [ProcessInfo(20001, "train", 4096 * MIB, "carol", "8")]
        cj.refresh(cs)
        watch.observe(cs, cj.stray_jobs_of, settings)
        found += [f for c in cs for f in c.findings if f.check == "stray_process"]
    assert found == []
    assert [c[-1] for c in slurm.calls[2:]] == ["5", "8"]
    assert cj.jobs_of(cs[1]) == {"8"}
    for _ in range(3):
        cs = cards()
        cs[1].processes = [ProcessInfo(20002, "left", 4096 * MIB, "carol", None)]
        cj.refresh(cs)
        watch.observe(cs, cj.stray_jobs_of, settings)
    assert len(slurm.calls) == 4
    assert [f.check for f in cs[1].findings] == ["stray_process"]  # outside job 8


def test_a_forged_block_in_a_jobs_name_credits_no_card_and_strays_no_one_else(tmp_path):
    """22.05's text path: alice's job 7 holds ascend IDX 0 and its name and comment hold
    an exact copy of Slurm's block saying IDX 4-7 (recorded). Bob's job 8 holds ascend
    IDX 4. Job 7's readings differ, so its allocation is unknown (named in ``error``),
    never the forged one: no card is credited to job 7, bob's process in job 8 on his
    card is not stray, the card alice's job-7 process is on is not judged, and a
    process outside any job on a card job 7 claims is stray as on any free card; the
    finding is ``watch`` (nothing drained)."""
    from hetpatrol.actions.findings import finding_action

    job8 = SHOW_JOB["hostile"].replace("JobId=5 ", "JobId=8 ", 1)
    job8 = job8.replace(
        "GRES=gpu:a100:1(IDX:0),ascend:910b:3(IDX:0-2)", "GRES=ascend:910b:1(IDX:4)"
    )
    slurm = Slurm({"7": SHOW_JOB["copied-block"], "8": job8})
    cj = CardJobs(["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, cgroup_root=tmp_path)
    job_cgroup(tmp_path, "hp-gpu01", 1000, "7")
    job_cgroup(tmp_path, "hp-gpu01", 1001, "8")

    def eight_npus():
        cs = [CardRecord("ascend", i, gres="ascend", bus_id=f"0000:c{i}:00.0") for i in range(8)]
        cs[0].processes = [ProcessInfo(40001, "train", 4096 * MIB, "alice", "7")]
        cs[4].processes = [ProcessInfo(40002, "train", 4096 * MIB, "bob", "8")]
        cs[5].processes = [ProcessInfo(40003, "left", 4096 * MIB, "carol", None)]
        return cs

    watch, settings = StrayWatch(), StraySettings(patrols=2)
    for _ in range(2):
        cs = eight_npus()
        cj.refresh(cs)
        watch.observe(cs, cj.stray_jobs_of, settings)
    assert [cj.jobs_of(c) for c in cs] == [None, set(), set(), set(), {"8"}, set(), set(), set()]
    assert "job 7: scontrol show job -d: 3 per-node blocks that differ" in cj.error
    stray = {c.index: f for c in cs for f in c.findings if f.check == "stray_process"}
    assert sorted(stray) == [5]
    assert stray[5].value["pid"] == 40003 and stray[5].value["card_jobs"] == []
    assert finding_action(stray[5]).action == "watch"
    assert slurm.queue_wide() == []


def test_an_arrays_own_id_is_asked_for_its_own_record(tmp_path):
    """``scontrol -d show job 1`` for an array's own id answers every record of the array
    (recorded on 22.05: task 1 pending as JobId=1, task 0 running as JobId=2 with ascend
    IDX 0): the blocks disagree, so ``1_1`` (the id and task of the first line, Slurm's
    own prefix before the name) is asked for that record alone, and job 1 holds no card
    here (task 0's IDX 0 is job 2's). A job that is no array is never asked twice."""
    from hetpatrol.slurm.job_gres import array_task_query, ask_job

    array = {
        n: (REPO / "fixtures" / "slurm" / f"scontrol-show-job-d-22.05-array-{n}.txt").read_text()
        for n in ("1", "1_1")
    }
    assert array_task_query(array["1"], "1") == "1_1"
    assert array_task_query(array["1_1"], "1") is None  # one record
    assert array_task_query(SHOW_JOB["copied-block"], "7") is None  # no array
    slurm = Slurm({"1": array["1"], "1_1": array["1_1"], "7": SHOW_JOB["copied-block"]})
    cj = CardJobs(["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, cgroup_root=tmp_path)
    job_cgroup(tmp_path, "hp-gpu01", 0, "1")
    cs = cards()
    cj.refresh(cs)
    assert [c[-1] for c in slurm.calls[2:]] == ["1", "1_1"]
    assert cj.error is None and all(cj.jobs_of(c) == set() for c in cs)
    # the Prolog's / TaskProlog's ask_job the same way
    said = []

    def run(argv, timeout):
        said.append(argv[-1])
        return V22 if argv[-1] == "--version" else slurm(argv, timeout).stdout

    alloc = ask_job("/usr/bin/scontrol", "1", "hp-gpu01", timeout=5, runner=run)
    assert (alloc.errors, said) == ((), ["--version", "1", "1_1"])
    said.clear()
    alloc = ask_job("/usr/bin/scontrol", "7", "hp-gpu01", timeout=5, runner=run)
    assert "differ" in alloc.errors[0] and said == ["--version", "7"]


def test_a_mig_jobs_idx_that_cannot_be_mapped_leaves_those_cards_unknown(tmp_path):
    """The MIG rule of match_cards / unmapped_gres holds on the single-job answers too:
    job 1 given ``gpu:1g.20gb:1(IDX:3)`` (its recorded 22.05 record, the IDX changed, as
    tests/test_mig_gres_idx.py does) is on the recorded MIG GPU; with two GPUs in MIG mode
    Slurm's order is not known, so both cards' jobs are unknown (not judged), never
    "none", and the job is still asked once."""
    from test_mig_gres_idx import _record_fields, mig_gpu, second_gpu

    doc = json.loads(SQUEUE)
    doc["jobs"] = [dict(doc["jobs"][0], gres_detail=["gpu:1g.20gb:1(IDX:3)"])]

    class Mig(Slurm):
        def __call__(self, argv, timeout):
            if list(argv)[-1] == "--jobs=1":
                self.calls.append(list(argv))
                return ToolOutput(tuple(argv), json.dumps(doc), "", 0, False, 0.01)
            return super().__call__(argv, timeout)

    slurm = Mig(version=V23)
    cj = CardJobs(["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, cgroup_root=tmp_path)
    job_cgroup(tmp_path, "hp-gpu01", 0, "1")
    one = [CardRecord(**_record_fields(mig_gpu()))]
    cj.refresh(one)
    assert cj.jobs_of(one[0]) == {"1"} and cj.error is None
    two = [CardRecord(**_record_fields(mig_gpu())), CardRecord(**_record_fields(second_gpu()))]
    cj.refresh(two)
    assert [cj.jobs_of(c) for c in two] == [None, None]
    assert cj.error.startswith("job 1: gpu IDX not mapped to cards: 2 GPUs in MIG")
    assert [c[-1] for c in slurm.calls[2:]] == ["--jobs=1"]


@pytest.mark.parametrize(
    "config, proctrack",
    [
        ("linuxproc", "proctrack/linuxproc"),
        (None, None),  # scontrol show config failed
        ("Configuration data as of 2026-12-01T22:50:00\n", None),  # no such line
    ],
)
def test_without_job_cgroups_nothing_is_asked_per_patrol_nor_judged(config, proctrack, tmp_path):
    """ProctrackType from the recorded ``scontrol show config`` of real 22.05 daemons:
    without proctrack/cgroup there is no local job list, so no per-patrol query at all
    (whatever directories lie around) and stray_process is not judged on any card
    (``stray_note`` says why); a card fault event asks the whole queue, at most once per
    ``fault_read_seconds``, and names the card's job from it."""

    class Config(Slurm):
        def __call__(self, argv, timeout):
            if list(argv)[-2:] == ["show", "config"] and config != "linuxproc":
                self.calls.append(list(argv))
                rc = 1 if config is None else 0
                return ToolOutput(tuple(argv), config or "", "slurm_load_ctl_conf", rc, False, 0.0)
            return super().__call__(argv, timeout)

    slurm = Config(proctrack="linuxproc")
    clock = [0.0]
    cj = CardJobs(
        ["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, clock=lambda: clock[0], cgroup_root=tmp_path
    )
    job_cgroup(tmp_path, "hp-gpu01", 0, "1")
    for n in range(5):
        clock[0] = 10.0 * n
        cs = cards()
        cj.refresh(cs)
        assert cj.proctrack == proctrack
        assert all(cj.jobs_of(c) is None and cj.stray_jobs_of(c) is None for c in cs)
    assert all(c[-2:] == ["show", "config"] or c[-1] == "--version" for c in slurm.calls)
    assert "stray_process is not judged" in cj.stray_note
    assert (proctrack or "ProctrackType unknown") in cj.stray_note
    # a fault event on GPU 0: one whole-queue read names job 1
    assert cj.fault_jobs_of(cs[0]) == {"1"} and cj.fault_jobs_of(cs[1]) == set()
    assert len(slurm.queue_wide()) == 1
    clock[0] = 100.0
    cs = cards()
    cj.refresh(cs)
    assert cj.fault_jobs_of(cs[0]) is None  # within fault_read_seconds: not read again
    assert len(slurm.queue_wide()) == 1
    clock[0] = 700.0
    cs = cards()
    cj.refresh(cs)
    assert cj.fault_jobs_of(cs[0]) == {"1"} and len(slurm.queue_wide()) == 2


def test_a_failed_query_is_asked_again_after_retry_seconds(tmp_path):
    """A job slurmctld did not answer for (here: scontrol's "Invalid job id") is named in
    ``error``, the card its process is on is not judged, and it is asked again only
    after ``retry_seconds``."""
    slurm = Slurm({})
    clock = [0.0]
    cj = CardJobs(
        ["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, clock=lambda: clock[0], cgroup_root=tmp_path
    )
    job_cgroup(tmp_path, "hp-gpu01", 0, "5")
    for t in (0.0, 10.0, 59.0, 61.0):
        clock[0] = t
        cs = cards()
        cs[0].processes = [ProcessInfo(1, "x", 4096 * MIB, "root", "5")]
        cj.refresh(cs)
    assert [c[-1] for c in slurm.calls[2:]] == ["5", "5"]
    assert cj.error == (
        "job 5: /usr/bin/scontrol exited 1: slurm_load_jobs error: Invalid job id specified"
    )
    assert cj.jobs_of(cs[0]) is None and cj.jobs_of(cs[1]) == set()


def test_a_refused_answer_is_asked_again_ever_later_never_each_minute(tmp_path):
    """Hostile trial (h34g): job 7's name copies Slurm's per-node block (the recorded
    22.05 answer): its answer is read and refused, and saying the same each time it was
    asked again every ``retry_seconds`` for the job's life (61 single-job RPCs in an hour
    of 60 s patrols, per job). Now 60, 120, 240 ... s after each refused answer: 6 in
    the hour; the cards stay unknown throughout; a job renamed (a readable answer)
    is taken at the next ask."""
    slurm = Slurm({"7": SHOW_JOB["copied-block"]})
    clock = [0.0]
    cj = CardJobs(
        ["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, clock=lambda: clock[0], cgroup_root=tmp_path
    )
    job_cgroup(tmp_path, "hp-gpu01", 1000, "7")

    def asked():
        return [c for c in slurm.calls if c[-4:-1] == ["-d", "show", "job"]]

    for minute in range(61):
        clock[0] = 60.0 * minute
        cs = cards()
        cs[0].processes = [ProcessInfo(40001, "train", 4096 * MIB, "alice", "7")]
        cj.refresh(cs)
        assert cj.jobs_of(cs[0]) is None
    assert len(asked()) == 6  # at 0, 60, 180, 420, 900, 1860 s
    assert "job 7" in (cj.error or "")
    slurm.jobs["7"] = SHOW_JOB["hostile"].replace("JobId=5 ", "JobId=7 ", 1)
    clock[0] = 1860.0 + 1920.0
    cs = cards()
    cj.refresh(cs)
    assert len(asked()) == 7 and cj.jobs_of(cs[0]) == {"7"}


def test_a_job_slurmctld_will_not_show_is_asked_ever_later_never_each_minute(tmp_path):
    """Hostile trial (h35c): under ``PrivateData=jobs`` the daemon (uid 65534) is
    answered "Invalid job id specified" for every other user's job (the real 22.05
    slurmctld's answer, tests/test_slurm_json_versions.py). That answer says the same
    each time, yet it was asked again every ``retry_seconds`` for the job's life: a user
    with 100 one-core jobs on a node cost slurmctld 100 single-job RPCs a minute from
    that node. Now it backs off as a refused answer does (6 in an hour); the cards stay
    unknown. No answer at all (the controller not reached) is still asked every
    ``retry_seconds``."""
    private = SHOW_CONFIG["cgroup"].replace("PrivateData             = none",
                                            "PrivateData             = jobs")  # fmt: skip
    assert private != SHOW_CONFIG["cgroup"]
    for unreachable, expected in ((False, 6), (True, 61)):
        slurm = Slurm({})
        base = slurm.__call__

        def runner(argv, timeout, base=base, unreachable=unreachable, slurm=slurm):
            argv = list(argv)
            if argv[-2:] == ["show", "config"]:
                return ToolOutput(tuple(argv), private, "", 0, False, 0.01)
            if unreachable and argv[-4:-1] == ["-d", "show", "job"]:
                slurm.calls.append(argv)
                err = "slurm_load_jobs error: Unable to contact slurm controller\n"
                return ToolOutput(tuple(argv), "", err, 1, False, 0.01)
            return base(argv, timeout)

        clock = [0.0]
        root = tmp_path / str(unreachable)
        cj = CardJobs(["/usr/bin/scontrol"], "hp-gpu01", runner=runner, uid=65534,
                      clock=lambda c=clock: c[0], cgroup_root=root)  # fmt: skip
        job_cgroup(root, "hp-gpu01", 1000, "7")
        for minute in range(61):
            clock[0] = 60.0 * minute
            cs = cards()
            cj.refresh(cs)
            assert cj.listed and cj.jobs_of(cs[0]) is None
        asked = [c for c in slurm.calls if c[-4:-1] == ["-d", "show", "job"]]
        assert len(asked) == expected, (unreachable, len(asked))
        assert "job 7: /usr/bin/scontrol exited 1: slurm_load_jobs error: " in (cj.error or "")


def test_jobs_on_fault_events():
    from types import SimpleNamespace

    from hetpatrol.patrol import Patroller

    card = _gpu0(ProcessInfo(10309, "./gpu_burn", 28234 * MIB, "alice", "5"))
    jobs = SimpleNamespace(jobs_of=lambda c: frozenset({"1"}))
    fake = SimpleNamespace(card_jobs=jobs, _jobs_before=[], jobs_known_since=None)
    events = [{"event": "xid", "xid": 79, "uuid": "GPU-0"}, {"event": "xid", "bus_id": "x"}]
    Patroller._jobs_on_events(fake, [card], events)
    assert events[0]["jobs"] == ["1", "5"]
    assert events[1]["jobs"] is None
    json.dumps(events)


@pytest.mark.parametrize("proctrack", ["linuxproc", "cgroup"])
def test_a_fault_on_a_card_whose_jobs_could_not_be_read_names_none_as_unknown(proctrack, tmp_path):
    """Hostile trial (h35c): job 7's name copies Slurm's block (the recorded 22.05
    answer), so its answer is refused and the node's cards may be its. A fault on any
    card without another known job then said ``jobs: []``, "none on the card" for
    ``ledger faults``: a user who forged the name had the faults of the card their job
    wore out credited to no job, and nothing said why. Now ``jobs`` is null with
    ``jobs_unknown`` (kept so in the state file). Job 7 renamed (its answer read: ascend
    IDX 0-2, gpu IDX 0): GPU 1's fault says ``[]`` again, NPU 0's names job 7."""
    from types import SimpleNamespace

    from hetpatrol.actions.fault_events import kept_event
    from hetpatrol.patrol import JOBS_UNREAD, Patroller

    slurm = Slurm({"7": SHOW_JOB["copied-block"]}, proctrack=proctrack)
    cj = CardJobs(["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, cgroup_root=tmp_path)
    cj.spool_jobs = lambda: {"7": 1}  # job 7's step socket in SlurmdSpoolDir
    if proctrack == "cgroup":
        job_cgroup(tmp_path, "hp-gpu01", 1000, "7")
    cs = cards()

    def faults():
        cj.refresh(cs)
        fake = SimpleNamespace(card_jobs=cj, _jobs_before=[], jobs_known_since=None)
        events = [
            {"event": "xid", "xid": 79, "uuid": cs[1].uuid},
            {"event": "kernel", "reason": "fallen_off_bus", "bus_id": cs[2].bus_id},
        ]
        Patroller._jobs_on_events(fake, cs, events)
        return events

    events = faults()
    assert "job 7" in (cj.error or "")
    assert [(e["jobs"], e.get("jobs_unknown")) for e in events] == [(None, JOBS_UNREAD)] * 2
    ts = {"ts": "2026-12-02T02:00:00.000Z", "severity": "critical"}
    assert kept_event({**events[0], **ts})["jobs_unknown"] == JOBS_UNREAD
    slurm.jobs["7"] = SHOW_JOB["hostile"].replace("JobId=5 ", "JobId=7 ", 1)
    cj._jobs.clear()  # asked again now (the refused answer's backoff is its own test)
    events = faults()
    assert [(e["jobs"], e.get("jobs_unknown")) for e in events] == [([], None), (["7"], None)]


def test_a_fault_on_a_card_no_longer_listed_names_its_last_patrols_jobs():
    """GPU 0 held by job 9 in the last patrol, gone from this patrol's list when its
    fault is read: the event names job 9 (not null); a card of neither patrol: null."""
    from types import SimpleNamespace

    from hetpatrol.patrol import Patroller

    card = _gpu0()
    jobs = SimpleNamespace(jobs_of=lambda c: frozenset())
    fake = SimpleNamespace(
        card_jobs=jobs, _jobs_before=[(card, frozenset({"9"}))], jobs_known_since=None
    )
    events = [{"event": "xid", "xid": 79, "uuid": "GPU-0"}, {"event": "xid", "bus_id": "x"}]
    Patroller._jobs_on_events(fake, [], events)
    assert events[0]["jobs"] == ["9"]
    assert events[1]["jobs"] is None
    assert fake._jobs_before == []  # this patrol listed no card


# ------------------------------------------------------------------ real slurmctld
slurm_cluster = cluster.slurm_cluster
slurm_node = cluster.slurm_node


@pytest.mark.slurm
def test_real_squeue_names_the_job_of_each_card_for_a_fault_event(slurm_node):
    """The session cluster runs proctrack/linuxproc: no job cgroup, so no local job list
    and nothing asked per patrol (jobs unknown). A card fault event reads the real
    ``squeue --json`` once: a running job with ``--gres=gpu:a100:2,ascend:910b:1`` holds
    GPU 0 and 1 and NPU 0, nothing else."""

    c = slurm_node
    cs = [CardRecord("nvidia", i, gres="gpu", uuid=f"GPU-{i}") for i in range(8)]
    cs += [CardRecord("ascend", i, gres="ascend", chip=0) for i in range(8)]
    with c.explain():
        job = (
            c.run(
                "sbatch",
                "--parsable",
                "--gres=gpu:a100:2,ascend:910b:1",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 300",  # cancelled below; runs longer than the wait's ceiling
            )
            .stdout.strip()
            .split(";")[0]
        )
        try:
            deadline = time.monotonic() + 60
            cj = CardJobs(c.scontrol_argv, c.node, fault_read_seconds=0)
            while True:
                cj.refresh(cs)
                assert cj.proctrack == "proctrack/linuxproc" and cj.version is not None
                assert all(cj.jobs_of(r) is None for r in cs) and cj.queries == 0
                if cj.fault_jobs_of(cs[0]) and cj.error is None:
                    break
                assert time.monotonic() < deadline, f"job never on GPU 0: {cj.error}"
                time.sleep(0.3)
            held = [(r.vendor, r.index) for r in cs if cj.fault_jobs_of(r) == frozenset({job})]
            assert held == [("nvidia", 0), ("nvidia", 1), ("ascend", 0)]
        finally:
            c.run("scancel", job, check=False)


def test_the_patrol_writes_stray_process_with_action_watch(base_config):
    """Wired through the Patroller: a card's job from ``card_jobs``, a process of
    another user outside it, three patrols -> a watch finding on that card's line."""
    from types import SimpleNamespace

    from fakes import Scripted, make_patroller

    class WithProcess(Scripted):
        def collect(self):
            result = super().collect()
            result.records[0].processes = [ProcessInfo(10291, "memhog", 2566 * MIB, "bob")]
            return result

    p = make_patroller(base_config, {"scripted": WithProcess()})
    p.card_jobs = SimpleNamespace(
        refresh=lambda cards: None,
        error=None,
        jobs_of=lambda card: frozenset({"1"}),
        stray_jobs_of=lambda card: frozenset({"1"}),
        stray_note=None,
    )
    try:
        lines = [p.run().card_lines[0] for _ in range(3)]
    finally:
        p.close()
    first, last = json.loads(lines[0]), json.loads(lines[2])
    assert [f["check"] for f in first["findings"]] == []
    (f,) = [f for f in last["findings"] if f["check"] == "stray_process"]
    assert (f["severity"], f["action"], f["value"]["pid"]) == ("warning", "watch", 10291)
    assert last["action"] == "watch"
    import jsonschema

    from hetpatrol.schema import jsonl_json_schema

    jsonschema.Draft202012Validator(jsonl_json_schema()).validate(last)


# ------------------------------------------- real slurmd, its own job cgroups (v1)
# The session cluster runs proctrack/linuxproc: its jobs have no cgroup. This one runs
# ProctrackType=proctrack/cgroup (slurm.conf(5): "Uses linux cgroups to constrain and
# track processes"; "see man cgroup.conf") with TaskPlugin=task/cgroup, and a
# cgroup.conf beside slurm.conf (cgroup.conf(5), 22.05: "always located in the same
# directory as the slurm.conf"): CgroupPlugin=cgroup/v1 (the legacy per-controller
# hierarchies this machine mounts; Slurm 22.05's cgroup/v2 plugin stops a hybrid host
# with "fatal: Hybrid mode is not supported", src/plugins/cgroup/v2/cgroup_v2.c) and
# ConstrainCores=yes (the cpuset controller: a second line of the job's layout).
# ConstrainDevices stays off: the GRES File= are plain files here, not device nodes.
# (cgroup.conf(5) of 22.05.8: https://manpages.ubuntu.com/manpages/lunar/en/man5/
# cgroup.conf.5.html; "Hybrid mode ... is not supported": https://slurm.schedmd.com/
# cgroups.html)
CGROUP_CONF = """# written by tests/test_stray_process.py (cgroup.conf(5), Slurm 22.05)
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=yes
"""
#: the v1 controllers slurmd uses with the settings above: freezer (proctrack/cgroup,
#: g_cg_name[CG_TRACK]) and cpuset (ConstrainCores), src/plugins/cgroup/v1/cgroup_v1.c
CGROUP_V1_CONTROLLERS = ("freezer", "cpuset")
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: npu-smi 24.1.rc2.1, 8 x 910B3, one `python` process per NPU (SOURCES.md beside it)
NPU_SMI = REPO / "fixtures" / "vendor-outputs" / "ascend"
NPU_SMI = NPU_SMI / "npu-smi-info_910B3_8card_AICore-busy_procs_v24.1.rc2.1.txt"
#: its Process memory(MB) column, NPU 0 to 7 (read off the file)
RECORDED_MIB = dict(enumerate([54601, 54603, 54561, 54603, 54819, 54560, 54653, 54561]))


def cgroup_v1_unusable() -> str | None:
    """Why Slurm's cgroup/v1 job hierarchies cannot be made on this machine (each
    controller of :data:`CGROUP_V1_CONTROLLERS` mounted under /sys/fs/cgroup, a
    directory made and removed in it), or None when they can."""
    for name in CGROUP_V1_CONTROLLERS:
        base = CGROUP_ROOT / name
        if not (base / "cgroup.procs").is_file():
            return f"no cgroup v1 {name} hierarchy mounted at {base} (Slurm's cgroup/v1)"
        probe = base / f"hetpatrol-probe-{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            return f"cannot create a cgroup in {base}: {exc}"
    return None


def _remove_cgroups(node: str) -> None:
    """rmdir what Slurm left of this cluster's own ``/slurm_<node>`` trees (empty
    directories only: a cgroup with a process in it stays, EBUSY)."""
    for name in CGROUP_V1_CONTROLLERS:
        top = CGROUP_ROOT / name / f"slurm_{node}"
        if not top.is_dir():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


@pytest.fixture(scope="module")
def cgroup_cluster():
    """A cluster of its own (NodeName ``hp-cg<pid>``, so its cgroups are apart from any
    other run's) with Slurm's job cgroups; skipped only where cgroups cannot be made."""
    import secrets
    import shutil

    missing = [b for b in cluster.BINARIES if shutil.which(b) is None]
    if missing:
        cluster._fail_or_skip(f"not installed: {', '.join(missing)} (Debian: slurmd)")
    if os.geteuid() != 0:
        cluster._fail_or_skip("the Slurm test cluster runs SlurmUser=root: run as root")
    why = cgroup_v1_unusable()
    if why is not None:
        pytest.skip(f"Slurm's job cgroups cannot be created on this machine: {why}")
    node = f"hp-cg{os.getpid()}"
    try:
        c = cluster.start_cluster(
            overrides={
                "ProctrackType": "proctrack/cgroup",
                "TaskPlugin": "task/cgroup",
                # job ids of their own: a build without MULTIPLE_SLURMD puts every
                # cluster's jobs under /slurm/uid_<uid>/ (src/common/cgroup.c)
                "FirstJobId": str(100_000 + secrets.randbelow(50_000_000)),
                # each RPC slurmctld processes is logged: what the daemon asks
                "SlurmctldDebug": "debug2",
            },
            cgroup_conf=CGROUP_CONF,
            node=node,
        )
    except RuntimeError as exc:  # the daemons' own logs are in the message
        pytest.fail(str(exc))
    try:
        yield c
    finally:
        c.stop()
        _remove_cgroups(node)
        shutil.rmtree(c.root, ignore_errors=True)


def replayed_npu_smi(pids: dict[int, int]) -> str:
    """The recorded ``npu-smi info`` with each process row's pid replaced: NPU n's row
    gets ``pids[n]``; the row of an NPU not in ``pids`` becomes npu-smi's own "No
    running processes found in NPU n" row (as fixtures/nodes/sick-mixed records it)."""
    out = []
    for line in NPU_SMI.read_text().splitlines():
        cells = line.split("|")
        # | NPU Chip | Process id | Process name | Process memory(MB) |
        if len(cells) == 6 and cells[2].strip().isdigit() and cells[1].split()[0].isdigit():
            npu = int(cells[1].split()[0])
            if npu in pids:
                cells[2] = f" {pids[npu]}".ljust(len(cells[2]))
                line = "|".join(cells)
            else:
                text = f"| No running processes found in NPU {npu}"
                line = text.ljust(len(line) - 1) + "|"
        out.append(line)
    return "\n".join(out) + "\n"


def _job_pids(c, job: str, steps: int = 2, timeout: float = 60) -> dict[str, int]:
    """``{step: pid}`` of the job's ``sleep`` processes from ``scontrol listpids`` (the
    pids Slurm's proctrack plugin tracks) once ``steps`` steps run one."""
    deadline = time.monotonic() + timeout
    found: dict[str, int] = {}
    while len(found) < steps:
        # a job slurmd could not launch (its cgroups, say) ends or is held at once:
        # fail then, the daemons' logs printed by explain()
        state = c.run("squeue", "-h", "-j", job, "-o", "%T %r", check=False).stdout.strip()
        if state.split(" ")[0] not in ("PENDING", "CONFIGURING", "RUNNING"):
            raise AssertionError(f"job {job} is {state or 'gone'}, its sleeps never ran")
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} never ran its sleeps: {state}, listpids {found}")
        time.sleep(0.3)
        out = c.run("scontrol", "listpids", job, check=False).stdout
        for line in out.splitlines()[1:]:
            pid, _job, step = line.split()[:3]
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                    found[step] = int(pid)
    return found


def _cgroup_paths(pid: int) -> dict[str, str]:
    """controller -> path of ``/proc/<pid>/cgroup`` (``""`` for the unified line)."""
    out = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _hid, controllers, path = line.split(":", 2)
        out[controllers] = path
    return out


def _stray_config(c, tmp_path: Path, tool: Path):
    """Only the Ascend plugin (``npu-smi info`` = ``tool``, no detail commands), Slurm on
    for cluster ``c`` (squeue beside its sinfo), stray after 2 patrols, no kernel log
    or PCI census (this host's, not the replayed node's)."""
    import shutil
    from dataclasses import replace

    from hetpatrol.config import CollectorConfig, load_config
    from hetpatrol.slurm.settings import BreakerSettings, DrainSettings, SlurmSettings

    base = load_config()
    return replace(
        base,
        node="cgroup-node",
        listen=None,
        jsonl_path=tmp_path / "patrol.jsonl",
        state_path=tmp_path / "state.json",
        collectors=(CollectorConfig("ascend", options={"command": [str(tool)], "detail": False}),),
        top={
            **base.top,
            "stray_process": replace(base.top["stray_process"], patrols=2),
            "kernel_events": replace(base.top["kernel_events"], enabled=False),
            "pci_census": replace(base.top["pci_census"], enabled=False),
        },
        slurm=SlurmSettings(
            enabled=True,
            node_name=c.node,
            scontrol=tuple(c.scontrol_argv),
            timeout_seconds=30,
            gres_conf=c.gres_conf,
            drain=DrainSettings(
                enabled=False,
                breaker=BreakerSettings(
                    sinfo=("env", f"SLURM_CONF={c.conf}", shutil.which("sinfo") or "sinfo")
                ),
            ),
        ),
    )


@pytest.mark.slurm
@pytest.mark.slow
def test_stray_process_on_real_slurm_job_cgroups(cgroup_cluster, tmp_path):
    """A real job of user ``nobody`` (``--gres=ascend:910b:3``: its batch script's
    ``sleep`` and its ``srun sleep``) in the cgroups slurmstepd made for it; an
    ``npu-smi info`` stand-in replaying a recorded process table with the real pids.
    The job's processes on its cards are not stray; a ``sleep`` of the same user outside
    the job on one of its NPUs and a root ``sleep`` on an NPU with no job are, after 2
    patrols; each finding goes with its process."""
    import pwd
    import subprocess

    from hetpatrol.daemon import Daemon
    from hetpatrol.processes import job_from_cgroup

    c = cgroup_cluster
    table = tmp_path / "npu-smi-info.txt"
    table.write_text(replayed_npu_smi({}))
    tool = tmp_path / "npu-smi"  # the stand-in: prints this patrol's table
    tool.write_text(f"#!/bin/sh\nexec cat '{table}'\n")
    tool.chmod(0o755)
    user = pwd.getpwnam("nobody")
    strays: list[subprocess.Popen] = []
    daemon = None
    job = None

    def patrol():
        report = daemon.patrol_once()
        recs = {r.index: r for r in report.cards if r.vendor == "ascend"}
        assert sorted(recs) == list(range(8))
        found = {i: [f for f in r.findings if f.check == "stray_process"] for i, r in recs.items()}
        return recs, {i: fs for i, fs in found.items() if fs}

    with c.explain():
        try:
            out = c.run(
                *("runuser", "-u", user.pw_name, "--", "sbatch", "--chdir=/tmp"),
                "--parsable",
                "--gres=ascend:910b:3",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 300 & srun sleep 300; wait",
            ).stdout
            job = out.strip().split(";")[0]
            pids = _job_pids(c, job)
            # Slurm's own layout (src/plugins/cgroup/v1/xcgroup.c,
            # xcgroup_create_hierarchy: "%s/uid_%u", "%s/job_%u", "%s/step_%s" under
            # the prepend of xcgroup_create_slurm_cg: "/slurm", or "/slurm_%n" in a
            # MULTIPLE_SLURMD build such as Debian's, src/common/cgroup.c)
            prepends = {"/slurm", f"/slurm_{c.node}"}
            for step, pid in pids.items():
                text = Path(f"/proc/{pid}/cgroup").read_text()
                print(f"job {job} step {step} pid {pid} /proc/{pid}/cgroup:\n{text}")
                paths = _cgroup_paths(pid)
                for controller in CGROUP_V1_CONTROLLERS:
                    prefix, _, rest = paths[controller].partition("/uid_")
                    assert prefix in prepends, paths
                    assert rest == f"{user.pw_uid}/job_{job}/step_{step}", paths
                assert job_from_cgroup(text, uid=user.pw_uid) == job
                assert job_from_cgroup(text, uid=0) is None  # uid_<n> is the owner's
            # the job's user cannot add a job directory of its own where the daemon
            # lists the node's jobs (root's uid_<n>), and one it may make deeper (in its
            # step's cgroup) is not listed
            from hetpatrol.slurm.card_jobs import local_slurm_jobs

            top = CGROUP_ROOT / "freezer" / f"slurm_{c.node}" / f"uid_{user.pw_uid}"
            as_nobody = ("setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}")
            fake = subprocess.run(
                [*as_nobody, "--clear-groups", "mkdir", str(top / "job_99")],
                capture_output=True,
                text=True,
            )
            assert fake.returncode != 0 and "Permission denied" in fake.stderr, fake
            deeper = top / f"job_{job}" / "step_batch" / "job_98"
            made = subprocess.run(
                [*as_nobody, "--clear-groups", "mkdir", str(deeper)], capture_output=True
            )
            try:
                listed = local_slurm_jobs(c.node)
                assert job in listed and not {"98", "99"} & set(listed), listed
            finally:
                if made.returncode == 0:
                    deeper.rmdir()

            log = c.root / "log" / "slurmctld.log"
            seen = len(log.read_text())
            daemon = Daemon(_stray_config(c, tmp_path, tool))
            recs, found = patrol()  # no process yet: which NPUs the job holds
            jobs = {i: daemon.patroller.card_jobs.jobs_of(r) for i, r in recs.items()}
            held = sorted(i for i, js in jobs.items() if js == frozenset({job}))
            free = sorted(i for i, js in jobs.items() if js == frozenset())
            assert len(held) == 3 and len(free) == 5, jobs
            in_job = {held[0]: pids["batch"], held[1]: pids["0"]}
            escaped, no_job = held[2], free[0]
            # the job's user, outside the job (a setsid + nohup leftover); root's
            as_user = ("setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}")
            strays = [
                subprocess.Popen([*as_user, "--clear-groups", "sleep", "300"]),
                subprocess.Popen(["sleep", "300"]),
            ]
            table.write_text(
                replayed_npu_smi({**in_job, escaped: strays[0].pid, no_job: strays[1].pid})
            )
            recs, found = patrol()
            assert found == {}  # 1 of 2 patrols
            # the job's processes, credited to the job from their real cgroups
            for npu, pid in in_job.items():
                (proc,) = recs[npu].processes
                assert (proc.pid, proc.job_id, proc.user) == (pid, job, "nobody")
                assert proc.memory_bytes == RECORDED_MIB[npu] * MIB
            (outside,) = recs[escaped].processes
            assert (outside.pid, outside.job_id, outside.user) == (strays[0].pid, None, "nobody")

            recs, found = patrol()
            assert sorted(found) == sorted([escaped, no_job]), found
            (f,) = found[escaped]
            assert (f.severity, f.value["pid"], f.value["job_id"]) == (
                "warning",
                strays[0].pid,
                None,
            )
            assert f.value["card_jobs"] == [job]
            assert (
                f"pid {strays[0].pid} (nobody, no Slurm job) holds {RECORDED_MIB[escaped]} "
                f"MiB on a card allocated to job {job} for 2 patrols"
            ) in f.message
            (g,) = found[no_job]
            assert (g.value["pid"], g.value["card_jobs"]) == (strays[1].pid, [])
            assert (
                f"pid {strays[1].pid} (root, no Slurm job) holds {RECORDED_MIB[no_job]} "
                "MiB on a card with no job for 2 patrols"
            ) in g.message
            lines = [json.loads(x) for x in (tmp_path / "patrol.jsonl").read_text().splitlines()]
            card_lines = [x for x in lines if x["kind"] == "card" and x["index"] == escaped]
            assert card_lines[-1]["action"] == "watch"

            # the escaped process goes: npu-smi lists it no more, and its finding goes
            strays[0].kill()
            strays[0].wait(timeout=10)
            table.write_text(replayed_npu_smi({**in_job, no_job: strays[1].pid}))
            recs, found = patrol()
            assert sorted(found) == [no_job]
            assert "for 3 patrols" in found[no_job][0].message
            strays[1].kill()
            strays[1].wait(timeout=10)
            table.write_text(replayed_npu_smi(in_job))
            recs, found = patrol()
            assert found == {}
            assert daemon.patroller.stray_watch.seen == {}
            # fault to job: an event on the NPU the job holds with no process of it now
            event = {"event": "kernel", "vendor": "ascend", "index": escaped}
            event["chip"] = recs[escaped].chip
            daemon.patroller._jobs_on_events(list(recs.values()), [event])
            assert event["jobs"] == [job]
            # five patrols of a node running a GRES job: slurmctld was asked for that
            # one job once (REQUEST_JOB_INFO_SINGLE), never for the queue
            rpcs = log.read_text()[seen:]
            print(f"slurmctld RPCs during the patrols:\n{rpcs[-3000:]}")
            assert "Processing RPC: REQUEST_JOB_INFO from" not in rpcs
            assert rpcs.count("Processing RPC: REQUEST_JOB_INFO_SINGLE from") == 1
            assert daemon.patroller.card_jobs.queries == 1
        finally:
            if daemon is not None:
                daemon.shutdown()
            for p in strays:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)
            if job:
                c.run("scancel", job, check=False)
        # slurmstepd removes the job's cgroups when the job ends (cgroup_v1.c,
        # cgroup_p_step_destroy)
        gone = [
            CGROUP_ROOT / n / pre.lstrip("/") / f"uid_{user.pw_uid}" / f"job_{job}"
            for n in CGROUP_V1_CONTROLLERS
            for pre in prepends
        ]
        deadline = time.monotonic() + 60
        while any(p.exists() for p in gone):
            assert time.monotonic() < deadline, f"job cgroups left: {gone}"
            time.sleep(0.2)


@pytest.mark.slurm
@pytest.mark.slow
def test_no_cgroup_tracking_asks_nothing_per_patrol_and_judges_no_process(slurm_node, tmp_path):
    """The session cluster runs ProctrackType=proctrack/linuxproc: its job's ``sleep``
    is in no Slurm cgroup, so neither which jobs run here nor whether a process is in
    its job can be told without the whole queue. Nothing is asked per patrol, no card
    is judged (a root ``sleep`` on a free NPU neither), and an ``info`` node finding
    names the ProctrackType, read from the real ``scontrol show config``."""
    import subprocess

    from hetpatrol.daemon import Daemon
    from hetpatrol.processes import job_from_cgroup

    c = slurm_node
    table = tmp_path / "npu-smi-info.txt"
    table.write_text(replayed_npu_smi({}))
    tool = tmp_path / "npu-smi"
    tool.write_text(f"#!/bin/sh\nexec cat '{table}'\n")
    tool.chmod(0o755)
    daemon = stray = job = None
    with c.explain():
        try:
            out = c.run(
                "sbatch",
                "--parsable",
                "--gres=ascend:910b:1",
                "-o",
                "/dev/null",
                "--wrap",
                "exec sleep 300",
            ).stdout
            job = out.strip().split(";")[0]
            pid = _job_pids(c, job, steps=1)["batch"]
            assert job_from_cgroup(Path(f"/proc/{pid}/cgroup").read_text(), uid=0) is None
            daemon = Daemon(_stray_config(c, tmp_path, tool))
            stray = subprocess.Popen(["sleep", "300"])
            table.write_text(replayed_npu_smi({0: pid, 1: stray.pid}))
            for _ in range(3):
                report = daemon.patrol_once()
            recs = {r.index: r for r in report.cards if r.vendor == "ascend"}
            (proc,) = recs[0].processes
            assert (proc.pid, proc.job_id) == (pid, None)
            cj = daemon.patroller.card_jobs
            assert all(cj.jobs_of(r) is None for r in recs.values()) and cj.queries == 0
            found = [f for r in recs.values() for f in r.findings if f.check == "stray_process"]
            assert found == []
            (note,) = [f for f in report.node_findings if f.check == "stray_process_unjudged"]
            assert note.severity == "info"
            assert "ProctrackType=proctrack/linuxproc" in note.message
            assert "stray_process is not judged" in note.message
        finally:
            if daemon is not None:
                daemon.shutdown()
            if stray is not None:
                stray.kill()
                stray.wait(timeout=10)
            if job:
                c.run("scancel", job, check=False)


def test_a_process_whose_owner_cannot_be_read_is_not_judged_stray():
    """The owner and cgroup of a card's process come from ``/proc/<pid>`` (status,
    cgroup). Where the daemon cannot read them (``/proc`` mounted ``hidepid=2``, as many
    HPC sites do, for the unprivileged ``hetpatrol`` user; a pid gone between the vendor's
    list and the lookup) ``user`` and ``job_id`` are both None: that is no proof the
    process is outside its card's job, and calling it stray would put a stray_process on
    every busy card of the fleet (and drain them all where a site maps it to a drain).
    It is said instead, as an ``info`` ``stray_process_unjudged`` finding. A 26.05 SLUID
    cgroup directory (``s5K1KKYAYG5D00``) cannot be compared with squeue's numeric job
    ids either: not judged."""
    from hetpatrol.actions.findings import finding_action

    settings = StraySettings(patrols=2)
    watch = StrayWatch()
    unread = ProcessInfo(10309, "./gpu_burn", 28234 * MIB, None, None)
    sluid = ProcessInfo(10291, "memhog", 2566 * MIB, "alice", "s5K1KKYAYG5D00")
    job1 = frozenset({"1"})
    found = []
    for _ in range(3):
        rec = _gpu0(unread, sluid)
        watch.observe([rec], lambda _c: job1, settings)
        found.append(rec.findings)
    assert all(f.check != "stray_process" for fs in found for f in fs)
    assert found[0] == []  # 1 of 2 patrols
    (note,) = found[2]
    assert (note.check, note.severity) == ("stray_process_unjudged", "info")
    assert "pid 10309" in note.message and "pid 10291" in note.message
    assert note.value == {"pids": [10291, 10309]}
    assert finding_action(note).action == "none"
    # the process read as it is (the same pid, now readable, outside job 1): stray
    escaped = ProcessInfo(10309, "./gpu_burn", 28234 * MIB, "bob", None)
    for _ in range(2):
        rec = _gpu0(escaped)
        watch.observe([rec], lambda _c: job1, settings)
    assert [f.check for f in rec.findings] == ["stray_process"]
