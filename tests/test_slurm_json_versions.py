"""hetpatrol's Slurm readers on real outputs of newer Slurm (23.02 to 25.05) and under
``PrivateData=jobs``.

Recordings (fixtures/slurm/README.md has each source): the job and node documents of
real slurmctld 23.02.8, 23.11.10, 24.05.3, 24.11.5, 25.05.0rc1 and 25.05.4 through
slurmrestd (data_parser v0.0.39 to v0.0.43: the same job and node serializers as
``squeue --json`` / ``scontrol --json show node`` of those releases), and the real
Debian 22.05.8 daemons of tests/slurm_cluster.py run with ``PrivateData=jobs``.

Every expected value below is read off the recordings: the job id, its ``gres_detail``
strings and its host list (``job_resources``).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import slurm_cluster as cluster

from hetpatrol.cluster.slurm_nodes import parse_nodes_json
from hetpatrol.schema import CardRecord
from hetpatrol.slurm.card_jobs import (
    CardJobs,
    card_jobs,
    lists_other_users,
    private_jobs,
    slurm_user_uid,
)
from hetpatrol.slurm.job_gres import (
    _job_nodes,
    ask_job,
    gres_detail_indices,
    parse_show_job_detail,
    parse_squeue_json,
    run_scontrol,
)
from hetpatrol.tool import ToolOutput

SLURM = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"


def doc(name: str) -> dict:
    return json.loads((SLURM / name).read_text())


# file, its Slurm release (meta), the job, its hosts in order, gres_detail per host as
# recorded, the indexes each host's entry gives
RECORDED = [
    (
        "job-json-23.02.8-v0.0.39-running.json",
        "23.02.8",
        310,
        [f"cn{n:03d}" for n in range(52, 68)],  # "cn[052-067]", allocated_nodes[i]
        {},
    ),
    ("job-json-23.11.10-v0.0.40-running.json", "23.11.10", 760, ["cn4"], {}),
    (
        "job-json-24.05.3-v0.0.41-gpus-multi-nodes.json",
        "24.05.3",
        11,
        ["gpu1", "gpu2"],  # gpu:h100:4(IDX:0-3) on each
        {"gpu": frozenset({0, 1, 2, 3})},
    ),
    (
        "job-json-24.11.5-v0.0.42-gpus-per-node.json",
        "24.11.5",
        6377,
        ["ia1", "ia2"],  # gpu:h100:1(IDX:0),gpu:h200:0(IDX:) on each
        {"gpu": frozenset({0})},
    ),
    (
        "job-json-24.11.5-v0.0.42-gpus-multi-types.json",
        "24.11.5",
        6356,
        ["ia1"],  # gpu:h100:1(IDX:0),gpu:h200:1(IDX:2)
        {"gpu": frozenset({0, 2})},
    ),
    (
        "job-json-25.05.0rc1-v0.0.41-gpus-multi-nodes.json",
        "25.05.0-0rc1",
        18,
        ["ia1", "ia2"],  # gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5) on each
        {"gpu": frozenset({0, 1, 2, 3, 4, 5})},
    ),
    (
        "job-json-25.05.4-v0.0.43-gpus-per-node.json",
        "25.05.4",
        4744,
        ["gpu1", "gpu2"],  # gpu:h100:1(IDX:0) on each
        {"gpu": frozenset({0})},
    ),
]


def release(d: dict) -> str:
    meta = d["meta"]
    return (meta.get("slurm") or meta.get("Slurm"))["release"]


@pytest.mark.parametrize(("name", "version", "job", "hosts", "held"), RECORDED)
def test_each_recorded_job_reads_its_own_indexes_on_each_of_its_hosts(
    name, version, job, hosts, held
):
    d = doc(name)
    assert release(d) == version
    text = json.dumps(d)
    (record,) = d["jobs"]
    assert _job_nodes(record) == hosts
    for host in hosts:
        a = parse_squeue_json(text, str(job), host)
        assert a.errors == () and a.by_gres == held, host
    # a host the job is not on, another job id: nothing of this job
    assert parse_squeue_json(text, str(job), "cn999").by_gres == {}
    assert "0 records of job" in parse_squeue_json(text, str(job + 1), hosts[0]).errors[0]


def test_the_whole_queue_reader_credits_each_card_to_its_own_job_only():
    """The fault path's reader on a queue of two real 24.11.5 records: job 6356 holds
    IDX 0 and 2 on ia1 (``gpu:h100:1(IDX:0),gpu:h200:1(IDX:2)``), job 6377 holds IDX 0
    on ia1 and on ia2 (``gpu:h100:1(IDX:0),gpu:h200:0(IDX:)``); ``job_state`` is
    ``["RUNNING"]`` (a list from v0.0.40)."""
    a = doc("job-json-24.11.5-v0.0.42-gpus-multi-types.json")
    b = doc("job-json-24.11.5-v0.0.42-gpus-per-node.json")
    assert [j["job_state"] for j in a["jobs"] + b["jobs"]] == [["RUNNING"], ["RUNNING"]]
    queue = json.dumps({**a, "jobs": a["jobs"] + b["jobs"]})
    cs = [CardRecord("nvidia", i, gres="gpu", uuid=f"GPU-{i}") for i in range(6)]
    held, error = card_jobs(queue, "ia1", cs)
    assert error is None
    assert held == {
        0: {"6356", "6377"},
        1: frozenset(),
        2: {"6356"},
        3: frozenset(),
        4: frozenset(),
        5: frozenset(),
    }
    held, error = card_jobs(queue, "ia2", cs)
    assert error is None and held[0] == {"6377"} and not any(held[i] for i in range(1, 6))


def test_v0_0_41_hosts_are_named_twice_and_must_agree():
    """From data_parser v0.0.41 (24.05) ``job_resources.nodes`` is an object: ``list``
    (``gpu[1-2]``) and ``allocation[i].name`` (``gpu1``, ``gpu2``), recorded in
    24.05.3. Swapped names make the reading unknown; names alone are enough."""
    d = doc("job-json-24.05.3-v0.0.41-gpus-multi-nodes.json")
    nodes = d["jobs"][0]["job_resources"]["nodes"]
    assert nodes["list"] == "gpu[1-2]"
    assert [n["name"] for n in nodes["allocation"]] == ["gpu1", "gpu2"]
    swapped = copy.deepcopy(d)
    alloc = swapped["jobs"][0]["job_resources"]["nodes"]["allocation"]
    alloc[0]["name"], alloc[1]["name"] = "gpu2", "gpu1"
    a = parse_squeue_json(json.dumps(swapped), "11", "gpu1")
    assert a.by_gres == {} and "nodes.allocation differ" in a.errors[0]
    no_list = copy.deepcopy(d)
    del no_list["jobs"][0]["job_resources"]["nodes"]["list"]
    assert parse_squeue_json(json.dumps(no_list), "11", "gpu2").by_gres == {
        "gpu": frozenset({0, 1, 2, 3})
    }


def test_a_number_object_where_a_plain_number_was_is_no_job_id():
    """The ``{"set", "infinite", "number"}`` objects (recorded from 23.02.8 on:
    ``array_job_id``, ``priority``) wrap none of the fields read; a ``job_id`` given
    as one (no release does) is no job id: unknown, no traceback."""
    d = doc("job-json-23.11.10-v0.0.40-running.json")
    (record,) = d["jobs"]
    assert record["priority"] == {"set": True, "infinite": False, "number": 181}
    assert isinstance(record["job_id"], int)
    record["job_id"] = {"set": True, "infinite": False, "number": 760}
    a = parse_squeue_json(json.dumps(d), "760", "cn4")
    assert a.by_gres == {} and "0 records of job '760'" in a.errors[0]


@pytest.mark.parametrize(
    ("detail", "held", "said"),
    [
        # the forms gres_ctld_job_build_details() prints (src/slurmctld/gres_ctld.c;
        # gres_stepmgr_job_build_details(), src/stepmgr/gres_stepmgr.c, from 24.05)
        ("gpu:a100:2(IDX:0-1)", {"gpu": {0, 1}}, None),
        ("gpu:1(IDX:0)", {"gpu": {0}}, None),  # untyped: no ":TYPE"
        ("gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)", {"gpu": {0, 1, 2, 3, 4, 5}}, None),
        ("gpu:h100:1(IDX:0),gpu:h200:0(IDX:)", {"gpu": {0}}, None),  # 24.11.5
        # a MIG profile as its type (gres/gpu:a100_3g.20gb of
        # ../shared/vendor-samples/slurm/sacct-alloctres-gpu-types.txt): IDX counts MIG
        # devices (docs/slurm.md), read as any type
        ("gpu:a100_3g.20gb:1(IDX:3)", {"gpu": {3}}, None),
        ("gpu(CNT:0)", {"gpu": set()}, None),
        ("shard:2(0/4,2/4)", {"shard": {1}}, None),  # _build_shared_gres_details()
        # held with no device bitmap: which cards is not known
        ("gpu(CNT:2)", {}, "2 held with no device index"),
        ("gpu:a100:1(IDX:0),gpu:v100(CNT:1)", {}, "held with no device index"),
        ("ascend:910b:1", {}, "no (IDX:...) part"),
        ("gpu:2(S:0-1)", {}, "no IDX, CNT nor shared-device list"),
        ("gpu:1(IDX:zero)", {}, "IDX not readable"),
    ],
)
def test_gres_detail_forms(detail, held, said):
    by: dict[str, set[int]] = {}
    errors: list[str] = []
    gres_detail_indices(detail, by, errors)
    assert by == held
    assert (said in errors[0]) if said else errors == []


def test_a_forged_gres_item_with_terminal_escapes_is_said_without_them():
    """Hostile trial (h35c): job 7's name copies Slurm's per-node block (the recorded
    22.05 answer) with the real reading and one more item whose parenthesis holds
    terminal escapes. The blocks agree for the node, so the answer's errors are kept and
    go into ``card_jobs_unread``'s message: the escapes were in it raw."""
    text = (SLURM / "scontrol-show-job-d-22.05-copied-block.txt").read_text()
    real = "     Nodes=hp-gpu01 CPU_IDs=0 Mem=1 GRES=ascend:910b:1(IDX:0)"
    assert real in text
    forged = real + ",x:1(\x1b]2;pwned\x07\x1b[2J),y(CNT:\x1b[31m1)"
    text = text.replace("     Nodes=hp-gpu01 CPU_IDs=0 Mem=1 GRES=ascend:910b:4(IDX:4-7)", forged)
    a = parse_show_job_detail(text, "7", "hp-gpu01")
    assert a.by_gres == {"ascend": frozenset({0})}
    said = "; ".join(a.errors)
    assert "is no IDX, CNT nor shared-device list" in said and "held with no device" in said
    assert all(ch.isprintable() for ch in said), said


def test_recorded_node_documents_read_by_field():
    """``scontrol --json show node``'s shape (slurmrestd's node object of the same
    release): 23.02.8 cn001 (``state`` ``["ALLOCATED"]``, ``gres`` ``""``), 24.11.5 ia1
    (``gpu:h100:2,gpu:h200:4``, used ``gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)``)."""
    (old,) = parse_nodes_json((SLURM / "node-json-23.02.8-v0.0.39-allocated.json").read_text())
    assert (old.name, old.state, old.flags, old.partitions) == (
        "cn001",
        "ALLOCATED",
        frozenset(),
        ("batch",),
    )
    assert old.gres == () and old.gres_used == () and old.reason is None
    nodes = parse_nodes_json(
        (SLURM / "node-json-24.11.5-v0.0.42-gpus-model-allocated.json").read_text()
    )
    assert nodes.unreadable == []
    (new,) = nodes
    assert (new.name, new.state, new.partitions, new.address) == (
        "ia1",
        "ALLOCATED",
        ("standard",),
        "ia1",
    )
    assert [(g.label, g.count) for g in new.gres] == [("gpu:h100", 2), ("gpu:h200", 4)]
    assert [(g.label, g.count) for g in new.gres_used] == [("gpu:h100", 2), ("gpu:h200", 4)]


# ------------------------------------------------------------------ PrivateData=jobs
#: recorded on the real 22.05.8 daemons with PrivateData=jobs, as uid 65534 (nobody):
#: its config, and its squeue --json while root's job 1 ran (fixtures/slurm/README.md)
PRIVATE_CONFIG = (SLURM / "scontrol-show-config-22.05-privatedata-jobs.txt").read_text()
PRIVATE_QUEUE = (SLURM / "squeue-json-22.05-privatedata-nobody.json").read_text()


def test_private_data_read_from_the_recorded_config():
    assert private_jobs(PRIVATE_CONFIG) == {"jobs"}
    assert slurm_user_uid(PRIVATE_CONFIG) == 0
    assert json.loads(PRIVATE_QUEUE)["jobs"] == []  # root's running job left out
    assert not lists_other_users(PRIVATE_QUEUE, 65534)
    full = (SLURM / "squeue-json-22.05-hostile.json").read_text()  # root's jobs (uid 0)
    assert lists_other_users(full, 65534) and not lists_other_users(full, 0)


class Replay:
    """scontrol / squeue answering as slurmctld 22.05.8 did with PrivateData=jobs."""

    def __init__(self, queue: str):
        self.queue, self.calls = queue, []

    def __call__(self, argv, timeout):
        argv = list(argv)
        self.calls.append(argv)
        if argv[-2:] == ["show", "config"]:
            text = PRIVATE_CONFIG
        elif argv[-1] == "--version":
            text = "slurm-wlm 22.05.8\n"
        else:
            assert argv[-1] == "--json", argv
            text = self.queue
        return ToolOutput(tuple(argv), text, "", 0, False, 0.01)


def test_hidden_jobs_make_the_cards_unknown_never_none(tmp_path):
    """As uid 65534 (the daemon runs ``User=hetpatrol``) the recorded queue is empty
    though root's job holds GPU 0 and 1: every card's jobs are unknown (None), and the
    reason is the patrol's ``card_jobs_unread`` note. As root the same config hides
    nothing. A queue listing another user's job shows this reader sees them (an
    operator): then it is read as usual."""
    cs = [CardRecord("nvidia", i, gres="gpu", uuid=f"GPU-{i}") for i in range(2)]
    slurm = Replay(PRIVATE_QUEUE)
    cj = CardJobs(["/usr/bin/scontrol"], "hp-gpu01", runner=slurm, uid=65534, cgroup_root=tmp_path)
    cj.refresh(cs)
    assert "PrivateData=jobs (scontrol show config) hides other users' jobs from uid 65534" in (
        cj.error or ""
    )
    assert cj.fault_jobs_of(cs[0]) is None and cj.fault_jobs_of(cs[1]) is None
    assert cj.error == cj.private_note

    root = CardJobs(["/usr/bin/scontrol"], "hp-gpu01", runner=Replay(PRIVATE_QUEUE), uid=0,
                    cgroup_root=tmp_path)  # fmt: skip
    root.refresh(cs)
    assert root.private_note is None and root.error is None
    assert root.fault_jobs_of(cs[0]) == frozenset()  # the queue is empty: read as it is

    full = (SLURM / "squeue-json-22.05-hostile.json").read_text()  # root's job 1 on GPU 0
    op = CardJobs(["/usr/bin/scontrol"], "hp-gpu01", runner=Replay(full), uid=65534,
                  cgroup_root=tmp_path)  # fmt: skip
    op.refresh(cs)
    assert op.private_note is not None
    assert op.fault_jobs_of(cs[0]) == {"1"} and op.private_note is None and op.error is None


def test_under_job_cgroups_a_hidden_job_leaves_every_card_it_may_hold_unknown(tmp_path):
    """Composed: the recorded proctrack/cgroup config with its ``PrivateData = none``
    line replaced by the recorded ``PrivateData = jobs`` one. Job 1's cgroup is on the
    node; its query answers as the real 22.05 slurmctld did for uid 65534 (exit 1,
    "Invalid job id specified"). No card is "no job" (any may be job 1's), and the
    reason names PrivateData. As root the same failure leaves only the cards of job 1's
    processes unknown (as before)."""
    from test_stray_process import SHOW_CONFIG, job_cgroup

    line = next(x for x in PRIVATE_CONFIG.splitlines() if x.startswith("PrivateData "))
    config = SHOW_CONFIG["cgroup"].replace("PrivateData             = none", line)
    assert line in config

    def slurm(argv, timeout):
        argv = list(argv)
        if argv[-2:] == ["show", "config"]:
            return ToolOutput(tuple(argv), config, "", 0, False, 0.01)
        if argv[-1] == "--version":
            return ToolOutput(tuple(argv), "slurm-wlm 22.05.8\n", "", 0, False, 0.01)
        assert argv[-4:] == ["-d", "show", "job", "1"], argv
        err = "slurm_load_jobs error: Invalid job id specified\n"
        return ToolOutput(tuple(argv), "", err, 1, False, 0.01)

    job_cgroup(tmp_path, "hp-gpu01", 0, "1")
    cs = [CardRecord("nvidia", i, gres="gpu", uuid=f"GPU-{i}") for i in range(2)]
    hidden = CardJobs(["/usr/bin/scontrol"], "hp-gpu01", runner=slurm, uid=65534,
                      cgroup_root=tmp_path)  # fmt: skip
    hidden.refresh(cs)
    assert hidden.listed and [hidden.jobs_of(c) for c in cs] == [None, None]
    assert "job 1: /usr/bin/scontrol exited 1: slurm_load_jobs error: Invalid job id" in (
        hidden.error or ""
    )
    assert "PrivateData=jobs (scontrol show config) hides" in hidden.error
    root = CardJobs(["/usr/bin/scontrol"], "hp-gpu01", runner=slurm, uid=0, cgroup_root=tmp_path)
    root.refresh(cs)
    assert [root.jobs_of(c) for c in cs] == [frozenset(), frozenset()]
    assert "PrivateData" not in (root.error or "")


# ---------------------------------------------------------------- real slurmctld
def _running(c: cluster.SlurmCluster, job: str) -> None:
    deadline = time.monotonic() + 30
    while "JobState=RUNNING" not in c.scontrol("show", "job", job):
        assert time.monotonic() < deadline, c.scontrol("show", "job", job) + c.logs(1500)
        time.sleep(0.2)


@pytest.mark.slurm
@pytest.mark.slow
def test_private_data_jobs_on_the_real_slurmctld():
    """slurmctld 22.05.8 with ``PrivateData=jobs``. Root's job (``--gres=gpu:a100:2,
    ascend:910b:1``: IDX gpu 0-1, ascend 0) read by each node-side reader:

    - as root (the Prolog and Epilog, SlurmdUser root): its indexes;
    - as uid 65534 (the daemon runs ``User=hetpatrol``): ``scontrol -d show job`` exits 1
      "Invalid job id specified", the whole queue leaves the job out: the job's cards
      are unknown with that reason, and the card map says unknown, never "no job";
    - the job's own user (the TaskProlog runs as the job's user): its own job's
      indexes."""
    if shutil.which("runuser") is None:
        cluster._fail_or_skip("runuser not installed (Debian: util-linux)")
    for b in cluster.BINARIES:
        if shutil.which(b) is None:
            cluster._fail_or_skip(f"not installed: {b} (Debian: slurmd)")
    if os.geteuid() != 0:
        cluster._fail_or_skip("the Slurm test cluster runs SlurmUser=root: run as root")
    c = cluster.start_cluster(overrides={"PrivateData": "jobs"})
    scontrol = shutil.which("scontrol") or "scontrol"
    as_nobody = ["runuser", "-u", "nobody", "--", "env", f"SLURM_CONF={c.conf}"]

    def runner(prefix):
        return lambda argv, timeout: run_scontrol([*prefix, *argv], timeout)

    cs = [CardRecord("nvidia", i, gres="gpu", uuid=f"GPU-{i}") for i in range(8)]
    try:
        with c.explain():
            assert "PrivateData             = jobs" in c.scontrol("show", "config")
            job = c.run(
                *("sbatch", "--parsable", "--gres=gpu:a100:2,ascend:910b:1"),
                *("-o", "/dev/null", "--wrap", "sleep 120"),
            ).stdout.strip()
            _running(c, job)
            root = ask_job(
                scontrol, job, c.node, timeout=30, runner=runner(["env", f"SLURM_CONF={c.conf}"])
            )
            assert root.errors == ()
            assert root.by_gres == {"gpu": frozenset({0, 1}), "ascend": frozenset({0})}

            other = ask_job(scontrol, job, c.node, timeout=30, runner=runner(as_nobody))
            assert other.by_gres == {}
            assert other.errors == (
                "scontrol show job -d: exit 1: slurm_load_jobs error: Invalid job id specified",
            )
            # the daemon's card map as uid 65534 (linuxproc: the fault path's queue read)
            cj = CardJobs([*as_nobody, scontrol], c.node, fault_read_seconds=0, uid=65534)
            cj.refresh(cs)
            assert cj.proctrack == "proctrack/linuxproc"
            assert "PrivateData=jobs" in cj.private_note and cj.error == cj.private_note
            assert [cj.fault_jobs_of(r) for r in cs] == [None] * 8
            # as root the same map names the job on GPU 0 and 1
            cr = CardJobs(c.scontrol_argv, c.node, fault_read_seconds=0)
            cr.refresh(cs)
            assert cr.private_note is None
            assert [r.index for r in cs if cr.fault_jobs_of(r) == {job}] == [0, 1]
            c.run("scancel", job)

            # the TaskProlog's reader, as the job's own user: its own job is shown
            own = subprocess.run(
                [*as_nobody, "sbatch", "--parsable", "--chdir=/tmp", "--gres=gpu:a100:1"]
                + ["-o", "/dev/null", "--wrap", "sleep 120"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert own.returncode == 0, own.stderr
            mine = own.stdout.strip()
            _running(c, mine)
            a = ask_job(scontrol, mine, c.node, timeout=30, runner=runner(as_nobody))
            assert a.errors == () and a.by_gres == {"gpu": frozenset({0})}
    finally:
        c.run("scancel", "--user=root", check=False)
        c.run("scancel", "--user=nobody", check=False)
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)


def test_recorded_24_05_node_text_read_by_the_fleet_reader():
    """``scontrol show node`` of 24.05.0rc1 (../shared/vendor-samples/slurm, multi-line):
    ``State=IDLE+DRAIN``, ``Gres=gpu:nvidia-rtx-3090:1``, ``Partitions=compute100`` and
    Slurm's own reason ``gres/gpu count reported lower than configured (0 < 1)
    [slurm@2024-12-19T11:03:34]``."""
    from conftest import samples_dir

    from hetpatrol.cluster.slurm_nodes import parse_nodes_text

    name = "scontrol-show-node.slurm24.05.idle-drain-gres-count-mismatch.txt"
    (node,) = parse_nodes_text((samples_dir("slurm") / name).read_text())
    assert (node.name, node.state, node.flags) == ("devhost-102-68", "IDLE", {"DRAIN"})
    assert [(g.label, g.count) for g in node.gres] == [("gpu:nvidia-rtx-3090", 1)]
    assert node.partitions == ("compute100",) and node.reason_user == "slurm"
    assert node.reason == "gres/gpu count reported lower than configured (0 < 1)"
