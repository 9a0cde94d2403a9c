"""Slurm's GRES IDX on a GPU in MIG mode counts MIG devices (one per ``MultipleFiles=``
line), and the job -> card mapping (hetpatrol.slurm.jobguard.match_devices, used by the
Prolog, the Epilog and hetpatrol.slurm.card_jobs) follows it: a job on MIG device k holds
MIG device k's GPU. The card records are the recorded MIG scenario
(fixtures/nodes/mig-a100: one A100 80GB, minor 1, four 1g.20gb MIG devices, GI 3-6 / CI 0,
nvidia-caps 165/166 ... 192/193); where two GPUs are needed the second is that GPU again
as index 1 (minor 2, its own UUIDs and nvidia-caps), composed here."""

from __future__ import annotations

import copy
import json
import shutil
import time

import pytest
from test_actions_jobguard import _prolog_script, _wait_file, card, state
from test_partitions import _mig_cards

from hetpatrol.schema import CardRecord
from hetpatrol.slurm.card_jobs import card_jobs
from hetpatrol.slurm.jobguard import Allocation, decide, match_cards, match_devices

NOW = 1_800_000_000.0
MIG0_UUID = "MIG-4b6b5a0c-3b5e-5b2a-9d1e-6a0f0e3c1a01"  # fixtures/nodes/mig-a100/scenario.yaml


def mig_gpu(action: str = "none") -> dict:
    """The recorded MIG GPU as the daemon's state file has it (``CardRecord.to_dict``)."""
    (rec,) = _mig_cards()
    rec.gres, rec.action = "gpu", action
    return rec.to_dict()


def second_gpu(action: str = "none") -> dict:
    """The recorded GPU again as index 1: minor 2, its nvidia-caps 300 + 2i, UUIDs ...b1."""
    c = mig_gpu(action)
    c["index"], c["device_number"] = 1, 2
    c["uuid"] = "GPU-513536b6-7d19-9063-b049-1e69664bb2b1"
    for p in c["partitions"]:
        p["uuid"] = p["uuid"][:-2] + f"b{p['index']}"
        p["device_files"] = [
            f"/dev/nvidia-caps/nvidia-cap{300 + 2 * p['index'] + k}" for k in (0, 1)
        ]
    return c


def test_the_recorded_mig_gpu_has_four_mig_devices_in_the_state():
    c = mig_gpu()
    assert [(p["kind"], p["index"], p["profile"]) for p in c["partitions"]] == [
        ("mig", i, "1g.20gb") for i in range(4)
    ]
    assert c["partitions"][3]["device_files"] == [
        "/dev/nvidia-caps/nvidia-cap192",
        "/dev/nvidia-caps/nvidia-cap193",
    ]


def test_a_job_on_mig_device_3_holds_the_gpu_and_the_prolog_refuses_a_bad_one():
    """IDX 3 is the GPU's fourth MIG device (four lines, one index each): a reset_card on
    the GPU refuses the job. Before: IDX 3 was "the 4th gpu card", none, and the job ran."""
    doc = state([mig_gpu("reset_card")])
    d = decide(doc, Allocation({"gpu": frozenset({3})}), now=NOW)
    assert (d.exit_code, d.reason, d.cards, d.unmatched) == (
        1,
        "hetpatrol: reset_card nvidia/0",
        ("nvidia/0",),
        (),
    )
    ok = decide(state([mig_gpu()]), Allocation({"gpu": frozenset({2, 3})}), now=NOW)
    assert ok.ok and ok.reason.startswith("job cards ok: nvidia/0 mig 2, nvidia/0 mig 3 ("), ok


def test_two_mig_gpus_idx_1_is_the_first_gpus_second_mig_device():
    """gres-conf's lines: GPU 0's MIG devices are IDX 0-3, GPU 1's IDX 4-7. A job on IDX 1
    while GPU 1 needs a reset runs (before: IDX 1 was GPU 1, the job was refused); one on
    IDX 5 is refused (before: no card 5, let through)."""
    cards = [mig_gpu(), second_gpu("reset_card")]
    d = decide(state(cards), Allocation({"gpu": frozenset({1})}), now=NOW)
    assert d.ok and d.cards == ("nvidia/0",) and "nvidia/0 mig 1 (" in d.reason, d
    d = decide(state(cards), Allocation({"gpu": frozenset({5})}), now=NOW)
    assert (d.exit_code, d.reason, d.cards) == (1, "hetpatrol: reset_card nvidia/1", ("nvidia/1",))
    devices, missing = match_devices(cards, Allocation({"gpu": frozenset({0, 4, 7, 8})}))
    assert [(c["index"], p["index"]) for c, p in devices] == [(0, 0), (1, 0), (1, 3)]
    assert missing == ["gpu IDX 8"]


def test_card_jobs_maps_a_mig_jobs_idx_to_its_gpu():
    """card_jobs (stray_process, fault-to-job) on squeue --json records of a real 22.05
    (fixtures/slurm/squeue-json-22.05-hostile.json, job 1 given gpu:1g.20gb IDX 1 and
    IDX 5 here): IDX 1 is GPU 0's, IDX 5 GPU 1's; before, IDX 1 was GPU 1 and IDX 5 none."""
    from test_actions_jobguard import REAL_SQUEUE

    recs = [CardRecord(**_record_fields(c)) for c in (mig_gpu(), second_gpu())]
    doc = json.loads(REAL_SQUEUE)
    job = doc["jobs"][0]
    job["job_state"] = "RUNNING"
    two = copy.deepcopy(job)
    job["gres_detail"] = ["gpu:1g.20gb:1(IDX:1)"]
    two["job_id"], two["gres_detail"] = 77, ["gpu:1g.20gb:1(IDX:5)"]
    doc["jobs"] = [job, two]
    by_card, error = card_jobs(json.dumps(doc), "hp-gpu01", recs)
    assert error is None
    assert by_card == {0: frozenset({str(job["job_id"])}), 1: frozenset({"77"})}


def _record_fields(c: dict) -> dict:
    from hetpatrol.schema import PartitionInfo

    keep = ("vendor", "index", "chip", "gres", "uuid", "device_number")
    return {k: c[k] for k in keep} | {
        "partitions": [PartitionInfo(**p) for p in c["partitions"]],
    }


def test_mig_profiles_that_differ_leave_the_idx_unmatched_never_a_card_picked():
    """On a real 22.05 slurmd, gres.conf's 3g.40gb line first and slurm.conf's
    Gres=gpu:1g.20gb:4,gpu:3g.40gb:1 made the 3g.40gb device IDX 4; Gres= the other way
    round, IDX 0 (tests/test_mig_gres_idx.py, the real test below): the order of several
    types is slurm.conf's, which the state does not hold. Before: IDX 0 -> GPU 0."""
    gpu = mig_gpu("reset_card")
    gpu["partitions"][0]["profile"] = "3g.40gb"
    d = decide(state([gpu]), Allocation({"gpu": frozenset({0})}), now=NOW)
    assert d.ok and d.cards == ()
    assert d.unmatched == (
        "gpu IDX 0 (not mapped: GRES types 1g.20gb, 3g.40gb: Slurm orders them by "
        "slurm.conf's Gres= types (_merge_gres), not known here)",
    )
    # a whole GPU beside a MIG GPU: two types as well
    whole = card("nvidia", 1, "gpu", action="reset_card")
    _held, missing = match_cards([mig_gpu(), whole], Allocation({"gpu": frozenset({4})}))
    assert missing == [
        "gpu IDX 4 (not mapped: GRES types 1g.20gb, nvidia/1 (a whole GPU): Slurm orders "
        "them by slurm.conf's Gres= types (_merge_gres), not known here)"
    ]


def test_a_mig_device_without_its_device_files_leaves_the_idx_unmatched():
    gpu = mig_gpu("reset_card")
    gpu["partitions"][1]["device_files"] = []  # mig-minors unreadable: gres-conf writes no line
    held, missing = match_cards([gpu], Allocation({"gpu": frozenset({3})}))
    assert held == []
    assert missing == [
        "gpu IDX 3 (not mapped: nvidia/0 mig 1 has no MIG profile or device files (no "
        "gres.conf line): Slurm's IDX of the others is not known)"
    ]


def test_mig_uuids_name_the_mig_device_and_win_over_the_idx():
    """AutoDetect=nvml puts the MIG device's UUID in the Prolog's CUDA_VISIBLE_DEVICES
    (gres_common_epilog_set_env: unique_id): it names the device exactly; its IDX order is
    AutoDetect's sort, so the IDX of that GRES is not mapped then."""
    cards = [mig_gpu(), second_gpu("reset_card")]
    alloc = Allocation({"gpu": frozenset({4})}, uuids=frozenset({MIG0_UUID.lower()}))
    devices, missing = match_devices(cards, alloc)
    assert [(c["index"], p["index"]) for c, p in devices] == [(0, 0)] and missing == []
    # the older form MIG-GPU-<gpu uuid>/<GI>/<CI> (_nvml_use_mig_uuid false): GI 6 = mig 3
    old = Allocation(uuids=frozenset({"mig-gpu-513536b6-7d19-9063-b049-1e69664bb2b1/6/0"}))
    d = decide(state(cards), old, now=NOW)
    assert (d.exit_code, d.reason) == (1, "hetpatrol: reset_card nvidia/1")


# ------------------------------------------------------ the real slurmctld/slurmd
def _mig_lines(node: str) -> tuple[str, str]:
    """gres-conf's lines for the recorded MIG GPU (paths under the harness's {dev}), and
    its Gres=."""
    from hetpatrol.config import load_config
    from hetpatrol.slurm.gres_conf import build_plan

    plan = build_plan(_mig_cards(), load_config(), node, None)
    lines = [line.replace("/dev/", "{dev}/") for line, _cards in plan.lines()]
    gres = plan.slurm_conf()[1].split("Gres=", 1)[1].split()[0]
    return "\n".join(lines) + "\n", gres


@pytest.mark.slow
@pytest.mark.slurm
def test_real_slurm_gives_mig_idx_and_the_prolog_and_card_jobs_follow(tmp_path):
    """A real 22.05 cluster with gres-conf's four MIG lines for the recorded GPU
    (plain files, so no SLURM_JOB_GPUS: the Prolog reads squeue --json). Three jobs of
    gpu:1g.20gb:1 get IDX 0, 1, 2 and run (verdict ok); the GPU then needs a reset, and the
    fourth job, given IDX 3, is refused by the Prolog with hetpatrol's reason. card_jobs on
    the cluster's squeue --json puts the three running jobs on the GPU. (Before: IDX 1-3
    matched no card: the fourth job ran, card_jobs saw one job.)"""
    from slurm_cluster import BINARIES, start_cluster

    missing = [b for b in (*BINARIES, "squeue") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"not installed: {missing}")
    node = "hp-migidx"
    text, gres = _mig_lines(node)
    assert gres == "gpu:1g.20gb:4"

    def caps(cluster) -> None:  # the nvidia-caps files the lines name (plain files)
        (cluster.root / "dev" / "nvidia-caps").mkdir()
        for n in (165, 166, 174, 175, 183, 184, 192, 193):
            (cluster.root / "dev" / "nvidia-caps" / f"nvidia-cap{n}").touch()

    c = start_cluster(
        gres_conf_text=text,
        node_gres=gres,
        after_munge=caps,
        node=node,
        # jobs share the node's one CPU (GRES stay exclusive): IDX 0-2 busy, then IDX 3
        overrides={"SelectTypeParameters": "CR_Core"},
        extra_conf="PartitionName=share Nodes=ALL OverSubscribe=FORCE:8 State=UP\n",
    )
    out, state_path = tmp_path / "guard.out", tmp_path / "state.json"
    doc = state([mig_gpu()], finished=time.time(), interval=3600)
    doc["node"] = node
    state_path.write_text(json.dumps(doc))
    try:
        with c.explain(), c.install_hook("prolog", _prolog_script(state_path, out, tmp_path)):
            for _ in range(3):
                c.run("sbatch", "-p", "share", "--gres=gpu:1g.20gb:1", "-o", "/dev/null",
                      "--wrap", "sleep 300")  # fmt: skip
                said = _wait_file(out)  # no card blocks: squeue is not asked
                assert said.startswith("job cards ok: none held (patrol 42"), said
                out.unlink()
            jobs = json.loads(c.run("squeue", "--json").stdout)["jobs"]
            assert sorted(j["gres_detail"][0] for j in jobs) == [
                f"gpu:1g.20gb:1(IDX:{i})" for i in range(3)
            ]
            # card_jobs on the cluster's own answer: every running job is on the GPU
            recs = [CardRecord(**_record_fields(mig_gpu()))]
            by_card, error = card_jobs(c.run("squeue", "--json").stdout, node, recs)
            assert error is None and by_card == {0: frozenset(str(j["job_id"]) for j in jobs)}
            doc["cards"] = [mig_gpu("reset_card")]
            state_path.write_text(json.dumps(doc))
            c.run("sbatch", "-p", "share", "--gres=gpu:1g.20gb:1", "-o", "/dev/null",
                  "--wrap", "true")  # fmt: skip
            said = _wait_file(out)
            assert said.strip() == "hetpatrol: reset_card nvidia/0", said
            line = c.wait_for(lambda line: "drain" in line.split(" ")[1], what="node drained")
            assert c.reason().startswith("hetpatrol: reset_card nvidia/0"), line
            queue = json.loads(c.run("squeue", "--json").stdout)["jobs"]
            fourth = [j for j in queue if j["job_id"] not in {x["job_id"] for x in jobs}]
            assert len(fourth) == 1, queue
        c.run("scancel", "--user=root", check=False)
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)
