"""Slurm's GRES IDX on a GPU in MIG mode counts MIG devices (one per ``MultipleFiles=``
line), and the job -> card mapping (hetpatrol.slurm.jobguard.match_devices, used by the
Prolog, the Epilog and hetpatrol.slurm.card_jobs) follows it: a job on MIG device k holds
MIG device k's GPU. The card records are the recorded MIG scenario
(fixtures/nodes/mig-a100: one A100 80GB, minor 1, four 1g.20gb MIG devices, GI 3-6 / CI 0,
nvidia-caps 165/166 ... 192/193); where two GPUs are needed the second is that GPU again
as index 1 (minor 2, its own UUIDs and nvidia-caps), composed here."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from test_actions_jobguard import JOB_ENV, _prolog_script, _wait_file, card, state
from test_partitions import _mig_cards

from hetpatrol.schema import CardRecord
from hetpatrol.slurm.card_jobs import card_jobs
from hetpatrol.slurm.jobguard import (
    Allocation,
    decide,
    match_cards,
    match_devices,
    parse_job_env,
)

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


def prolog_env(idx: str, cuda: str) -> Allocation:
    """The allocation of a Prolog environment as slurmd 22.05 sets it on a MIG node
    (tests below: SLURM_JOB_GPUS the IDX, CUDA_VISIBLE_DEVICES the IDX again for
    gres.conf lines, the MIG UUID for AutoDetect's records)."""
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": idx, "CUDA_VISIBLE_DEVICES": cuda}
    return parse_job_env(env, JOB_ENV)


def test_a_job_on_mig_device_3_holds_the_gpu_and_the_prolog_refuses_a_bad_one():
    """The recorded GPU's four MIG devices are IDX 0-3 (one index per MultipleFiles=
    line; MIG 3 is GI 6, nvidia-cap192/193): a reset_card on the GPU refuses a job on
    IDX 3. Before: IDX 3 was "the 4th gpu card", none, and the job ran."""
    gpu = mig_gpu("reset_card")
    assert [(p["index"], p["profile"]) for p in gpu["partitions"]] == [
        (i, "1g.20gb") for i in range(4)
    ]
    assert gpu["partitions"][3]["device_files"][0] == "/dev/nvidia-caps/nvidia-cap192"
    d = decide(state([gpu]), Allocation({"gpu": frozenset({3})}), now=NOW)
    assert (d.exit_code, d.reason, d.cards, d.unmatched) == (
        1,
        "hetpatrol: reset_card nvidia/0",
        ("nvidia/0",),
        (),
    )
    ok = decide(state([mig_gpu()]), prolog_env("2,3", "2,3"), now=NOW)
    assert ok.ok and ok.reason.startswith("job cards ok: nvidia/0 mig 2, nvidia/0 mig 3 ("), ok


def test_two_mig_gpus_with_gres_conf_lines_number_gpu_by_gpu():
    """gres.conf lines (CUDA_VISIBLE_DEVICES numbers in the Prolog, as slurmd 22.05 sets
    it for them): GPU 0's MIG devices are IDX 0-3, GPU 1's IDX 4-7. A job on IDX 1 while
    GPU 1 needs a reset runs (before: IDX 1 was GPU 1, the job was refused); one on IDX 5
    is refused (before: no 6th card, let through)."""
    cards = [mig_gpu(), second_gpu("reset_card")]
    d = decide(state(cards), prolog_env("1", "1"), now=NOW)
    assert d.ok and d.cards == ("nvidia/0",) and "nvidia/0 mig 1 (" in d.reason, d
    d = decide(state(cards), prolog_env("5", "5"), now=NOW)
    assert (d.exit_code, d.reason, d.cards) == (1, "hetpatrol: reset_card nvidia/1", ("nvidia/1",))
    devices, missing = match_devices(cards, prolog_env("0,4,7,8", "0,4,7,8"))
    assert [(c["index"], p["index"]) for c, p in devices] == [(0, 0), (1, 0), (1, 3)]
    assert missing == ["gpu IDX 8"]


def test_two_mig_gpus_without_slurms_variable_are_not_mapped():
    """squeue --json alone (card_jobs; a Prolog without the variables) cannot tell
    gres.conf lines (GPU by GPU) from AutoDetect=nvml (22.05: IDX 1 is GPU 2's MIG 0,
    the real test below): the IDX stays unmatched. Before: IDX 1 -> GPU 1."""
    cards = [mig_gpu(), second_gpu("reset_card")]
    d = decide(state(cards), Allocation({"gpu": frozenset({1})}), now=NOW)
    assert d.ok and d.cards == ()
    assert d.unmatched == (
        "gpu IDX 1 (not mapped: 2 GPUs in MIG mode: gres.conf lines number their MIG "
        "devices GPU by GPU, AutoDetect=nvml MIG index by MIG index; which one this node "
        "has is not known here (Slurm's CUDA_VISIBLE_DEVICES in the Prolog tells))",
    )


def test_card_jobs_maps_a_mig_jobs_idx_to_its_gpu_and_leaves_unknown_what_it_cannot():
    """card_jobs (stray_process, fault-to-job) on squeue --json records of a real 22.05
    (fixtures/slurm/squeue-json-22.05-hostile.json, job 1 given gpu:1g.20gb IDX 3 here):
    the recorded GPU holds the job (before: no card, so the job's own process on it was
    stray). With two MIG GPUs the order is not known: both cards' jobs are unknown
    (absent: not judged), never "none"."""
    from test_actions_jobguard import REAL_SQUEUE

    doc = json.loads(REAL_SQUEUE)
    job = doc["jobs"][0]
    job["job_state"], job["gres_detail"] = "RUNNING", ["gpu:1g.20gb:1(IDX:3)"]
    one = [CardRecord(**_record_fields(mig_gpu()))]
    assert card_jobs(json.dumps(doc), "hp-gpu01", one) == (
        {0: frozenset({str(job["job_id"])})},
        None,
    )
    two = one + [CardRecord(**_record_fields(second_gpu()))]
    by_card, error = card_jobs(json.dumps(doc), "hp-gpu01", two)
    assert by_card == {}
    assert error.startswith(f"job {job['job_id']}: gpu IDX not mapped to cards: 2 GPUs in MIG")


def _record_fields(c: dict) -> dict:
    from hetpatrol.schema import PartitionInfo

    keep = ("vendor", "index", "chip", "gres", "uuid", "device_number")
    return {k: c[k] for k in keep} | {
        "partitions": [PartitionInfo(**p) for p in c["partitions"]],
    }


def test_mig_profiles_that_differ_leave_the_idx_unmatched_never_a_card_picked():
    """On a real 22.05 slurmd, gres.conf's 3g.40gb line first and slurm.conf's
    Gres=gpu:1g.20gb:4,gpu:3g.40gb:1 made the 3g.40gb device IDX 4; Gres= the other way
    round, IDX 0 (Slurm's _merge_gres, see docs/slurm.md): the order of several types is
    the registered Gres=, and a state without its gres_order (tests/test_gres_order.py)
    leaves the IDX unmatched. Before: IDX 0 -> GPU 0."""
    gpu = mig_gpu("reset_card")
    gpu["partitions"][0]["profile"] = "3g.40gb"
    d = decide(state([gpu]), prolog_env("0", "0"), now=NOW)
    assert d.ok and d.cards == ()
    assert d.unmatched == (
        "gpu IDX 0 (not mapped: GRES types 1g.20gb, 3g.40gb: Slurm orders them by the "
        "node's registered Gres= types (_merge_gres), not in the state)",
    )
    # a whole GPU beside a MIG GPU: two types as well
    whole = card("nvidia", 1, "gpu", action="reset_card")
    _held, missing = match_cards([mig_gpu(), whole], prolog_env("4", "4"))
    assert missing == [
        "gpu IDX 4 (not mapped: GRES types 1g.20gb, nvidia/1 (a whole GPU): Slurm orders "
        "them by the node's registered Gres= types (_merge_gres), not in the state)"
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


def test_mig_devices_out_of_nvidia_caps_order_need_slurms_variable():
    """25.11's AutoDetect sorts one GPU's MIG devices by their files (nvidia-cap number),
    gres.conf lines and 22.05 by MIG index: where the two differ, squeue alone cannot
    tell; the Prolog's numbers can."""
    gpu = mig_gpu("reset_card")
    first, last = gpu["partitions"][0], gpu["partitions"][3]
    first["device_files"], last["device_files"] = last["device_files"], first["device_files"]
    _held, missing = match_cards([gpu], Allocation({"gpu": frozenset({0})}))
    assert missing == [
        "gpu IDX 0 (not mapped: nvidia/0: MIG index order is not its nvidia-caps order "
        "(AutoDetect=nvml sorts by the files): Slurm's IDX order is not known)"
    ]
    devices, missing = match_devices([gpu], prolog_env("0", "0"))
    assert [(c["index"], p["index"]) for c, p in devices] == [(0, 0)] and missing == []


def test_mig_uuids_name_the_mig_device_and_win_over_the_idx():
    """AutoDetect=nvml puts the MIG device's UUID in the Prolog's CUDA_VISIBLE_DEVICES
    (gres_common_epilog_set_env: unique_id; seen on slurmd 22.05 below): it names the
    device exactly, its IDX order being AutoDetect's sort: the UUID wins over the IDX
    (here they disagree on purpose: IDX 4 would be GPU 1's MIG 0 by gres.conf lines)."""
    cards = [mig_gpu(), second_gpu("reset_card")]
    devices, missing = match_devices(cards, prolog_env("4", MIG0_UUID))
    assert [(c["index"], p["index"]) for c, p in devices] == [(0, 0)] and missing == []
    # the older form MIG-GPU-<gpu uuid>/<GI>/<CI> (_nvml_use_mig_uuid false): GI 6 = mig 3
    old = prolog_env("7", "MIG-GPU-513536b6-7d19-9063-b049-1e69664bb2b1/6/0")
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


def _fake_gpus(cards: list[dict], dev) -> str:
    """Slurm's fake_gpus.conf (read by gres/gpu instead of NVML, src/plugins/gres/gpu/
    gres_gpu.c ``_get_system_gpu_list_fake``: ``<type>|<cpus>|<cpu range>|<links>|<files>
    |<unique_id>|<flags>``) holding the records AutoDetect=nvml makes of ``cards``' MIG
    devices (``_handle_mig``/``gpu_p_get_system_gpu_list``, gpu_nvml.c 22.05: type
    ``nvidia_a100_<slices>g.<GiB>gb``, links ``gres_links_create_empty(j, mig_count)``,
    files the GPU's and its nvidia-caps, unique_id the MIG UUID, the NVML env flag), GPUs
    in NVML order."""
    out = []
    for c in cards:
        parts = c["partitions"]
        for j, p in enumerate(parts):
            links = ",".join("-1" if i == j else "0" for i in range(len(parts)))
            files = ",".join(
                f"{dev}/{f.removeprefix('/dev/')}"
                for f in (f"/dev/nvidia{c['device_number']}", *p["device_files"])
            )
            out.append(f"nvidia_a100_1g.20gb|1|0|{links}|{files}|{p['uuid']}|nvidia_gpu_env")
    return "\n".join(out) + "\n"


def _mig_conf_lines(cards: list[dict], dev) -> str:
    """gres-conf's lines for ``cards`` (one ``MultipleFiles=`` line per MIG device, GPUs
    by index, MIG devices by MIG index; the node name left to the harness)."""
    out = []
    for c in cards:
        for p in c["partitions"]:
            files = ",".join(
                f"{dev}/{f.removeprefix('/dev/')}"
                for f in (f"/dev/nvidia{c['device_number']}", *p["device_files"])
            )
            out.append(f"NodeName={{node}} Name=gpu Type={p['profile']} MultipleFiles={files}")
    return "\n".join(out) + "\n"


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize("records", ["autodetect", "gres.conf lines"])
def test_real_idx_of_two_mig_gpus_and_the_prolog_follows_slurms_order(records, tmp_path):
    """A real 22.05 slurmd with two GPUs in MIG mode (the recorded GPU, minor 1, and its
    copy, minor 2; device files made as character devices, so slurmd sets the Prolog's
    variables), their MIG devices given to Slurm either as AutoDetect's records (Slurm's
    fake_gpus.conf standing in for NVML) or as gres-conf's lines. Three jobs take IDX
    0-2; then GPU 2 needs a reset and a fourth job is given IDX 3.

    - AutoDetect numbers MIG index by MIG index: IDX 0 GPU 1 MIG 0, IDX 1 GPU 2 MIG 0,
      IDX 2 GPU 1 MIG 1, IDX 3 GPU 2 MIG 1 (the Prolog's SLURM_JOB_GPUS and the MIG UUID
      in its CUDA_VISIBLE_DEVICES say so): the fourth job is refused, through its UUID.
    - gres.conf lines number GPU by GPU, CUDA_VISIBLE_DEVICES is the IDX: IDX 3 is GPU
      1's MIG 3, the fourth job runs.

    (Before: IDX 3 matched no card, the job ran either way.)"""
    import os

    from slurm_cluster import BINARIES, start_cluster

    missing = [b for b in (*BINARIES, "squeue") if shutil.which(b) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(f"not installed: {missing}" if missing else "needs root (mknod)")
    cards = [mig_gpu(), second_gpu()]
    auto = records == "autodetect"

    def devices(cluster) -> None:  # character devices, and AutoDetect's records
        dev = cluster.root / "dev"
        (dev / "nvidia-caps").mkdir()
        for c in cards:
            files = [f"/dev/nvidia{c['device_number']}"]
            files += [f for p in c["partitions"] for f in p["device_files"]]
            for f in files:
                path = dev / f.removeprefix("/dev/")
                path.unlink(missing_ok=True)
                minor = int(f.rsplit("p", 1)[-1]) if "cap" in f else c["device_number"]
                os.mknod(path, 0o600 | 0o020000, os.makedev(195, minor))  # S_IFCHR
        if auto:
            (cluster.root / "fake_gpus.conf").write_text(_fake_gpus(cards, dev))

    c = start_cluster(
        gres_conf_text="# AutoDetect's records: fake_gpus.conf\n"
        if auto
        else _mig_conf_lines(cards, "{dev}"),
        node_gres="gpu:1g.20gb:8",
        after_munge=devices,
        node="hp-migauto" if auto else "hp-miglines",
        overrides={"SelectTypeParameters": "CR_Core"},
        extra_conf="PartitionName=share Nodes=ALL OverSubscribe=FORCE:8 State=UP\n",
    )
    out, env_out = tmp_path / "guard.out", tmp_path / "env.out"
    doc = state(cards, finished=time.time(), interval=3600)
    doc["node"] = c.node
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(doc))
    hook = _prolog_script(state_path, out, tmp_path).replace(
        "exec ",
        f'echo "$SLURM_JOB_GPUS $CUDA_VISIBLE_DEVICES" >> {env_out}\nexec ',
    )
    uuid = {(g["index"], p["index"]): p["uuid"] for g in cards for p in g["partitions"]}
    try:
        with c.explain(), c.install_hook("prolog", hook):
            for _ in range(3):
                c.run("sbatch", "-p", "share", "--gres=gpu:1", "-o", "/dev/null",
                      "--wrap", "sleep 300")  # fmt: skip
                assert _wait_file(out).startswith("job cards ok: "), out.read_text()
                out.unlink()
            want = [f"{i} {uuid[(i % 2, i // 2)] if auto else i}" for i in range(3)]
            assert sorted(env_out.read_text().split("\n")[:3]) == want
            doc["cards"] = [mig_gpu(), second_gpu("reset_card")]
            state_path.write_text(json.dumps(doc))
            c.run("sbatch", "-p", "share", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true")
            said = _wait_file(out)
            assert env_out.read_text().split("\n")[3] == f"3 {uuid[(1, 1)] if auto else 3}"
            if auto:
                assert said.strip() == "hetpatrol: reset_card nvidia/1", said
                c.wait_for(lambda line: "drain" in line.split(" ")[1], what="node drained")
            else:
                assert said.startswith("job cards ok: nvidia/0 mig 3 (patrol 42"), said
        c.run("scancel", "--user=root", check=False)
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)


def test_gres_conf_check_says_mig_lines_out_of_the_cards_order(base_config):
    """The mapping above takes gres-conf's order; a gres.conf whose MIG lines are in
    another order would give a job's IDX to another MIG device: --check says so."""
    from hetpatrol.slurm.gres_conf import build_plan, check_gres_conf

    plan = build_plan(_mig_cards(), base_config, "mig-a100-01", None)
    lines = [line for line, _cards in plan.lines()]
    assert check_gres_conf(plan, "\n".join(lines) + "\n", "gres.conf") == []
    swapped = [lines[0], lines[2], lines[1], lines[3]]
    (diff,) = check_gres_conf(plan, "\n".join(swapped) + "\n", "gres.conf")
    assert diff.where == "gres.conf:3"
    assert diff.message == (
        "gpu: the MIG lines are not in the cards' order (GPU by index, MIG devices by MIG "
        "index; nvidia/0/mig1 is out of place): Slurm numbers a job's IDX in line order, "
        "and hetpatrol maps an IDX to MIG devices in the cards' order"
    )
    assert diff.fix.endswith(lines[1])


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize(
    ("gres", "idx"), [("gpu:1g.20gb:4,gpu:3g.40gb:1", 4), ("gpu:3g.40gb:1,gpu:1g.20gb:4", 0)]
)
def test_real_slurm_orders_several_types_by_slurm_conf_gres(gres, idx, tmp_path):
    """gres.conf with GPU 0's 3g.40gb line first, then GPU 1's four 1g.20gb lines (the
    recorded GPU as GPU 1; GPU 0's nvidia-caps 30/31 composed): the real 22.05 gives the
    3g.40gb device IDX 4 when slurm.conf says Gres=gpu:1g.20gb:4,gpu:3g.40gb:1 and IDX 0
    the other way round (_merge_gres). Without the state's gres_order hetpatrol leaves
    that IDX unmatched, never a card picked (before: IDX 0 -> GPU 0, IDX 4 -> none); with
    the order the real GRES check writes (the registered Gres= and the cluster's
    gres.conf) squeue's IDX alone maps it to GPU 0's MIG device."""
    from slurm_cluster import BINARIES, start_cluster

    from hetpatrol.slurm.jobguard import parse_squeue_json

    missing = [b for b in (*BINARIES, "squeue") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"not installed: {missing}")
    big = second_gpu("reset_card")
    big["index"], big["device_number"] = 0, 0
    big["partitions"] = big["partitions"][:1]
    big["partitions"][0].update(profile="3g.40gb", slices=3, memory_size_mib=40192, device_files=[
        "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"])  # fmt: skip
    small = mig_gpu()
    small["index"] = 1
    cards = [big, small]

    def caps(cluster) -> None:
        (cluster.root / "dev" / "nvidia-caps").mkdir()
        for g in cards:
            for p in g["partitions"]:
                for f in p["device_files"]:
                    (cluster.root / "dev" / f.removeprefix("/dev/")).touch()

    c = start_cluster(
        gres_conf_text=_mig_conf_lines(cards, "{dev}"),
        node_gres=gres,
        after_munge=caps,
        node="hp-migtypes",
    )
    try:
        with c.explain():
            job = c.run("sbatch", "--parsable", "--gres=gpu:3g.40gb:1", "-o", "/dev/null",
                        "--wrap", "sleep 300").stdout.strip()  # fmt: skip
            deadline = time.monotonic() + 30
            while True:  # pending until slurmctld schedules it: gres_detail is [] then
                text = c.run("squeue", "--json").stdout
                (record,) = [j for j in json.loads(text)["jobs"] if str(j["job_id"]) == job]
                if record["gres_detail"] or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert record["gres_detail"] == [f"gpu:3g.40gb:1(IDX:{idx})"]
            alloc = parse_squeue_json(text, job, c.node)
            held, unmatched = match_cards(cards, alloc)
            assert held == [] and len(unmatched) == 1, unmatched
            assert unmatched[0].startswith(f"gpu IDX {idx} (not mapped: GRES types 1g.20gb, ")
            order = _real_order(c, cards)
            devices, unmatched = match_devices(cards, alloc, order)
            assert [(g["index"], p["index"]) for g, p in devices] == [(0, 0)] and not unmatched
        c.run("scancel", "--user=root", check=False)
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)


def _real_order(cluster, cards: list[dict]) -> dict:
    """The state's gres_order as the daemon's GRES check writes it for ``cards`` (state
    card lines) on the real ``cluster``: its registered Gres= and its gres.conf."""
    from dataclasses import replace

    from hetpatrol.collector import CollectorStatus
    from hetpatrol.config import load_config
    from hetpatrol.schema import PartitionInfo
    from hetpatrol.slurm.inventory import GresCheck
    from hetpatrol.slurm.settings import SlurmSettings

    keep = ("vendor", "index", "chip", "gres", "uuid", "device_number", "model", "health")
    recs = [
        CardRecord(
            **{k: c.get(k) for k in keep}, partitions=[PartitionInfo(**p) for p in c["partitions"]]
        )
        for c in cards
    ]
    settings = SlurmSettings(
        enabled=True,
        node_name=cluster.node,
        gres_conf=cluster.gres_conf,
        scontrol=tuple(cluster.scontrol_argv),
    )
    config = replace(load_config(), node=cluster.node, slurm=settings)
    result = GresCheck().run(recs, [CollectorStatus("nvidia", "ok", len(recs), 0.1)], config)
    return result.data["order"]
