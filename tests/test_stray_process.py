"""stray_process (a process holding card memory outside the card's Slurm job, for N
patrols) and the card -> jobs map from ``squeue --json`` that it and the fault events'
``jobs`` use.

Recordings: fixtures/slurm/squeue-json-22.05-hostile.json (slurmctld 22.05.8, job 1
RUNNING on hp-gpu01 with ``gpu:a100:1(IDX:0),ascend:910b:1(IDX:0)``; its name, comment
and work directory forge ``GRES=ascend:910b:1(IDX:3)``). Processes: the pids and memory
of ../shared/vendor-samples/nvidia/nvidia-smi-query-compute-apps_H200_590.48.01_load.csv
(10291 memhog 2566 MiB, 10293 memhog 1542 MiB, 10309 gpu_burn 28234 MiB).
"""

from __future__ import annotations

import json
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


def test_card_jobs_runs_squeue_beside_scontrol_and_caches():
    calls = []

    def runner(argv, timeout):
        calls.append(list(argv))
        return ToolOutput(tuple(argv), SQUEUE, "", 0, False, 0.01)

    clock = [0.0]
    cj = CardJobs(
        ["env", "SLURM_CONF=/x", "/usr/bin/scontrol"],
        "hp-gpu01",
        runner=runner,
        clock=lambda: clock[0],
    )
    cs = cards()
    cj.refresh(cs)
    assert calls == [["env", "SLURM_CONF=/x", "/usr/bin/squeue", "--json"]]
    assert cj.jobs_of(cs[0]) == frozenset({"1"}) and cj.jobs_of(cs[1]) == frozenset()
    clock[0] = 30
    cj.refresh(cs)
    assert len(calls) == 1  # cached for 60 s
    assert cj.jobs_of(CardRecord("nvidia", 0)) is None  # not one of this patrol's cards


def test_jobs_on_fault_events():
    from types import SimpleNamespace

    from hetpatrol.patrol import Patroller

    card = _gpu0(ProcessInfo(10309, "./gpu_burn", 28234 * MIB, "alice", "5"))
    fake = SimpleNamespace(card_jobs=SimpleNamespace(jobs_of=lambda c: frozenset({"1"})))
    events = [{"event": "xid", "xid": 79, "uuid": "GPU-0"}, {"event": "xid", "bus_id": "x"}]
    Patroller._jobs_on_events(fake, [card], events)
    assert events[0]["jobs"] == ["1", "5"]
    assert events[1]["jobs"] is None
    json.dumps(events)


# ------------------------------------------------------------------ real slurmctld
slurm_cluster = cluster.slurm_cluster
slurm_node = cluster.slurm_node


@pytest.mark.slurm
def test_real_squeue_names_the_job_of_each_card(slurm_node):
    """A running job with ``--gres=gpu:a100:2,ascend:910b:1`` on the real slurmctld:
    CardJobs (real ``squeue --json`` beside the configured scontrol) gives it GPU 0 and
    1 and NPU 0, nothing else; after the job, no card has a job."""
    import time

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
                "sleep 30",
            )
            .stdout.strip()
            .split(";")[0]
        )
        try:
            deadline = time.monotonic() + 30
            cj = CardJobs(c.scontrol_argv, c.node, cache_seconds=0)
            while True:
                cj.refresh(cs)
                if cj.error is None and cj.jobs_of(cs[0]):
                    break
                assert time.monotonic() < deadline, f"job never on GPU 0: {cj.error}"
                time.sleep(0.3)
            held = [(r.vendor, r.index) for r in cs if cj.jobs_of(r) == frozenset({job})]
            assert held == [("nvidia", 0), ("nvidia", 1), ("ascend", 0)]
        finally:
            c.run("scancel", job, check=False)
        deadline = time.monotonic() + 30
        while any(cj.jobs_of(r) for r in cs):
            assert time.monotonic() < deadline, "the cancelled job still holds cards"
            time.sleep(0.3)
            cj.refresh(cs)


@pytest.mark.slurm
def test_real_squeue_is_read_again_for_a_job_newer_than_the_cache(slurm_node):
    """On the real slurmctld: CardJobs reads squeue with no job running (cache 1 h);
    a job then starts with GPU 0, and a process in its cgroup shows up on GPU 0: the
    next refresh reads squeue again and gives GPU 0 that job, so its process is not
    judged stray against the read from before it."""
    import time

    c = slurm_node
    cs = [CardRecord("nvidia", i, gres="gpu", uuid=f"GPU-{i}") for i in range(8)]
    cj = CardJobs(c.scontrol_argv, c.node, cache_seconds=3600)
    with c.explain():
        cj.refresh(cs)
        assert cj.error is None and not any(cj.jobs_of(r) for r in cs)
        job = (
            c.run(
                "sbatch", "--parsable", "--gres=gpu:a100:1", "-o", "/dev/null", "--wrap", "sleep 30"
            )
            .stdout.strip()
            .split(";")[0]
        )
        try:
            deadline = time.monotonic() + 30
            while "RUNNING" not in c.run("squeue", "-h", "-j", job, "-o", "%T").stdout:
                assert time.monotonic() < deadline, "job never ran"
                time.sleep(0.2)
            cs = [CardRecord("nvidia", i, gres="gpu", uuid=f"GPU-{i}") for i in range(8)]
            cs[0].processes = [ProcessInfo(30001, "train", 4096 * MIB, "root", job)]
            cj.refresh(cs)
            assert cj.jobs_of(cs[0]) == frozenset({job})
            watch = StrayWatch()
            for _ in range(3):
                watch.observe(cs, cj.jobs_of, StraySettings(patrols=1))
            assert [f for f in cs[0].findings if f.check == "stray_process"] == []
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
        refresh=lambda cards: None, error=None, jobs_of=lambda card: frozenset({"1"})
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


def test_a_job_newer_than_the_cached_squeue_read_is_read_not_called_stray():
    """``squeue --json`` is read at most once a minute (``cache_seconds``), the patrol
    runs every 10 s: a job that starts on a card just after a read had its processes
    (in its own cgroup, job 2) judged against the old allocation (no job on the card)
    for up to six patrols, and ``patrols: 3`` of them made a stray_process finding at
    every such job start (a drain where a site maps it to one). A process in a job the
    last read did not list makes that read old: squeue is read again, once."""
    calls = []
    later = json.loads(SQUEUE)
    job2 = json.loads(json.dumps(later["jobs"][0]))
    job2.update(job_id=2, gres_detail=["gpu:a100:1(IDX:1)"])
    later["jobs"] = [later["jobs"][0], job2]
    answers = [SQUEUE, json.dumps(later)]

    def runner(argv, timeout):
        calls.append(list(argv))
        return ToolOutput(tuple(argv), answers[min(len(calls), 2) - 1], "", 0, False, 0.01)

    clock = [0.0]
    cj = CardJobs(["/usr/bin/scontrol"], "hp-gpu01", runner=runner, clock=lambda: clock[0])
    watch = StrayWatch()
    settings = StraySettings(patrols=3)
    found = []
    for n in range(4):
        clock[0] = 1.0 + 10 * n  # inside the first read's minute
        cs = cards()
        if n > 0:  # job 2 started on GPU 1 after the first read
            cs[1].processes = [ProcessInfo(20001, "train", 4096 * MIB, "carol", "2")]
        cj.refresh(cs)
        watch.observe(cs, cj.jobs_of, settings)
        found += [f for c in cs for f in c.findings if f.check == "stray_process"]
    assert found == []
    assert len(calls) == 2  # one more read, for the job it did not know
    assert cj.jobs_of(cs[1]) == frozenset({"2"})
    # an escaped process (no job) is no reason to read again: it is stray
    for n in range(3):
        clock[0] = 45.0 + n
        cs = cards()
        cs[1].processes = [ProcessInfo(20002, "left", 4096 * MIB, "carol", None)]
        cj.refresh(cs)
        watch.observe(cs, cj.jobs_of, settings)
    assert len(calls) == 2
    assert [f.check for f in cs[1].findings] == ["stray_process"]  # outside job 2
