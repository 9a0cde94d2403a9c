"""Slurm's GRES IDX on a node whose GPUs have several types (two GPU models; two MIG
profiles; a whole GPU beside MIG devices): slurmd numbers them type by type in the order
of the node's registered ``Gres=``, each type's gres.conf lines in file order
(``_merge_gres``, src/common/gres.c 22.05). The daemon writes that order into the state
file (:func:`hetpatrol.slurm.inventory.gres_order`, ``gres_order``) and the Prolog,
the Epilog and card_jobs map an IDX by it (:func:`hetpatrol.slurm.jobguard.
match_devices`).

The cards are recorded ones: the A100s of fixtures/nodes/sick-mixed, the H100s of
fixtures/nodes/healthy-mixed and the MIG GPU of fixtures/nodes/mig-a100 (four 1g.20gb
MIG devices, GI 3-6, nvidia-caps 165/166 ... 192/193), put side by side in one node
here (indices and minors renumbered). The 3g.40gb MIG device is composed from MIG 0 (3
slices, 40 GiB: NVIDIA's A100 80GB profile table)."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
from test_actions_jobguard import JOB_ENV, _prolog_script, _wait_file, state
from test_partitions import _mig_cards
from test_slurm_gres import FakeScontrol

from hetpatrol.collectors.nvidia import NvidiaCollector
from hetpatrol.collectors.nvml_replay import load_replay_nvml
from hetpatrol.exporters.state import state_document
from hetpatrol.schema import CardRecord, gres_json_schema
from hetpatrol.slurm.card_jobs import card_jobs
from hetpatrol.slurm.gres import GresEntry, parse_gres
from hetpatrol.slurm.inventory import GresCheck, gres_order
from hetpatrol.slurm.jobguard import Allocation, decide, match_devices, parse_job_env
from hetpatrol.slurm.settings import SlurmSettings

NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
NOW = 1_800_000_000.0


def _recorded(name: str) -> list[CardRecord]:
    d = NODES / name
    recs = NvidiaCollector(
        {}, replay_dir=d, nvml=load_replay_nvml(d / "nvidia-smi-q.xml")
    ).collect()
    for r in recs.records:
        r.health, r.gres = "ok", "gpu"
    return recs.records


def _as(rec: CardRecord, index: int) -> CardRecord:
    """The recorded card as card ``index`` (minor ``index``), its processes dropped."""
    return replace(rec, index=index, device_number=index, processes=[], findings=[])


def two_models() -> list[CardRecord]:
    """nvidia/0 A100, nvidia/1 H100, nvidia/2 A100 (the two models alternate)."""
    a100, h100 = _recorded("sick-mixed"), _recorded("healthy-mixed")
    assert (a100[0].model, h100[1].model) == ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
    return [_as(a100[0], 0), _as(h100[1], 1), _as(a100[2], 2)]


def two_profiles() -> list[CardRecord]:
    """The recorded MIG GPU (nvidia/0), its MIG 0 a 3g.40gb device, MIG 1-3 1g.20gb."""
    (gpu,) = _mig_cards()
    gpu.gres = "gpu"
    p0 = gpu.partitions[0]
    gpu.partitions[0] = replace(p0, profile="3g.40gb", slices=3, memory_size_mib=40192)
    return [gpu]


def whole_and_mig() -> list[CardRecord]:
    """nvidia/0 a whole A100 (sick-mixed's card 0), nvidia/1 the recorded MIG GPU."""
    (gpu,) = _mig_cards()
    gpu.gres = "gpu"
    return [_as(_recorded("sick-mixed")[0], 0), replace(gpu, index=1)]


def entries(text: str) -> tuple[GresEntry, ...]:
    return parse_gres(text)


def order_doc(cards, registered: str, base_config, lines=None) -> dict:
    return {
        "names": gres_order(cards, entries(registered), base_config),
        "gres_conf_lines": lines,
        "gres_conf": "test",
    }


def _state(cards, order, bad: int | None = None) -> dict:
    lines = [c.to_dict() for c in cards]
    if bad is not None:
        lines[bad]["action"] = "reset_card"
    doc = state(lines)
    doc["gres_order"] = order
    return doc


def env(idx: str) -> Allocation:
    """The Prolog's allocation as slurmd 22.05 sets it for gres.conf lines (seen below:
    SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES both the IDX)."""
    return parse_job_env({"SLURM_JOB_GPUS": idx, "CUDA_VISIBLE_DEVICES": idx}, JOB_ENV)


def labels(cards, alloc, order) -> tuple[list[str], list[str]]:
    dicts = [c.to_dict() for c in cards]
    devices, missing = match_devices(dicts, alloc, order)
    out = [f"nvidia/{c['index']}" + ("" if p is None else f" mig {p['index']}") for c, p in devices]
    return out, missing


# ------------------------------------------------------------------ the order itself
def test_the_order_is_the_registered_types_each_in_the_cards_order(base_config):
    """Gres=gpu:h100:1,gpu:a100:2 on A100, H100, A100: the H100 first, then the A100s
    by index (slurmd 22.05 below: gres.conf a100, v100, a100 with v100 first in Gres=
    gave the v100 IDX 0 and the first a100 IDX 1)."""
    order = gres_order(two_models(), entries("gpu:h100:1,gpu:a100:2"), base_config)
    assert order == {
        "gpu": {
            "types": [
                {"type": "h100", "count": 1, "devices": [[1, None, None]]},
                {"type": "a100", "count": 2, "devices": [[0, None, None], [2, None, None]]},
            ],
            "error": None,
        }
    }
    # one type: nothing to write (the cards' own order is Slurm's)
    assert gres_order(two_models()[:1], entries("gpu:a100:1"), base_config) == {}
    # MIG profiles: the registered types, each type's MIG devices by MIG index
    order = gres_order(two_profiles(), entries("gpu:1g.20gb:3,gpu:3g.40gb:1"), base_config)
    assert [(t["type"], t["devices"]) for t in order["gpu"]["types"]] == [
        ("1g.20gb", [[0, None, 1], [0, None, 2], [0, None, 3]]),
        ("3g.40gb", [[0, None, 0]]),
    ]
    # a whole GPU beside MIG devices: the GPU's model names it, the MIG profile the rest
    order = gres_order(whole_and_mig(), entries("gpu:1g.20gb:4,gpu:a100:1"), base_config)
    assert [(t["type"], len(t["devices"])) for t in order["gpu"]["types"]] == [
        ("1g.20gb", 4),
        ("a100", 1),
    ]
    assert order["gpu"]["types"][1]["devices"] == [[0, None, None]]


def test_a_registration_that_does_not_fit_the_cards_says_so(base_config):
    order = gres_order(two_models(), entries("gpu:h100:2,gpu:a100:2"), base_config)
    assert order["gpu"]["error"] == "gpu:h100 registered 2, 1 found"
    order = gres_order(two_models(), entries("gpu:h100:1,gpu:2"), base_config)
    assert order["gpu"]["error"].startswith("typed and untyped registrations")
    order = gres_order(two_models(), entries("gpu:h100:1,gpu:v100:2"), base_config)
    assert order["gpu"]["error"] == "2 gpu devices of no registered type"
    # the Prolog then leaves the IDX unmatched, never a card picked
    o = order_doc(two_models(), "gpu:h100:2,gpu:a100:2", base_config, lines=True)
    held, missing = labels(two_models(), env("0"), o)
    assert held == [] and missing == [
        "gpu IDX 0 (not mapped: the node's registered Gres= does not fit its cards: "
        "gpu:h100 registered 2, 1 found)"
    ]


# ------------------------------------------------------------------- the mapping
def test_two_models_map_by_the_registered_order(base_config):
    """Registered H100 first while the cards meet an A100 first: AutoDetect would have
    registered a100 first (its records are in device order), so these are gres.conf
    lines: IDX 0 is nvidia/1, IDX 1 and 2 nvidia/0 and nvidia/2. Before: IDX 0 ->
    nvidia/0 (index order), and a reset_card on nvidia/1 let a job on it start."""
    cards = two_models()
    o = order_doc(cards, "gpu:h100:1,gpu:a100:2", base_config)
    assert labels(cards, env("0,1,2"), o) == (["nvidia/1", "nvidia/0", "nvidia/2"], [])
    d = decide(_state(cards, o, bad=1), env("0"), now=NOW)
    assert (d.exit_code, d.reason) == (1, "hetpatrol: reset_card nvidia/1")
    d = decide(_state(cards, o, bad=1), env("1"), now=NOW)
    assert d.ok and d.cards == ("nvidia/0",), d


def test_alternating_models_in_the_met_order_need_gres_conf(base_config):
    """Gres=gpu:a100:2,gpu:h100:1 on A100, H100, A100 is what AutoDetect registers
    (device order: IDX 1 the H100, seen below with Slurm's fake_gpus.conf) and what lines
    in that slurm.conf order give (IDX 1 the second A100): unmatched unless gres.conf
    says which."""
    cards = two_models()
    o = order_doc(cards, "gpu:a100:2,gpu:h100:1", base_config)
    held, missing = labels(cards, env("1"), o)
    assert held == [] and missing == [
        "gpu IDX 1 (not mapped: GRES types a100, h100 alternate among the cards: gres.conf "
        "lines number them by the registered Gres= types, AutoDetect=nvml by device; "
        "which one this node has is not known (gres.conf: test))"
    ]
    lines = order_doc(cards, "gpu:a100:2,gpu:h100:1", base_config, lines=True)
    assert labels(cards, env("1"), lines) == (["nvidia/2"], [])
    auto = order_doc(cards, "gpu:a100:2,gpu:h100:1", base_config, lines=False)
    assert labels(cards, env("1"), auto) == (["nvidia/1"], [])
    # models in runs (A100, A100, H100) in the registered order: one order either way
    runs = [two_models()[i] for i in (0, 2, 1)]
    runs = [replace(c, index=i, device_number=i) for i, c in enumerate(runs)]
    o = order_doc(runs, "gpu:a100:2,gpu:h100:1", base_config)
    assert labels(runs, env("2"), o) == (["nvidia/2"], [])


def test_two_models_under_one_registration_keep_the_cards_order(base_config):
    """Gres=gpu:3 (untyped): _match_type takes every line of the name in file order, so
    the cards' own order; the daemon writes the name's one type to say so. A typed
    Gres=gpu:a100:3 leaves the H100's line out (Slurm takes no line of another type):
    unmatched."""
    cards = two_models()
    o = order_doc(cards, "gpu:3", base_config)
    assert o["names"]["gpu"] == {
        "types": [
            {
                "type": None,
                "count": 3,
                "devices": [[0, None, None], [1, None, None], [2, None, None]],
            }
        ],
        "error": None,
    }
    assert labels(cards, env("1"), o) == (["nvidia/1"], [])
    o = order_doc(cards, "gpu:a100:3", base_config)
    held, missing = labels(cards, env("1"), o)
    assert held == [] and missing == [
        "gpu IDX 1 (not mapped: the node's registered Gres= does not fit its cards: "
        "1 gpu devices of no registered type)"
    ]
    # a lost card under one type is no reason to stop mapping (the GRES check says it)
    o = order_doc(cards, "gpu:4", base_config)
    assert o["names"]["gpu"]["error"] is None
    assert labels(cards, env("2"), o) == (["nvidia/2"], [])


def test_without_the_order_two_models_are_not_guessed(base_config):
    """A state without gres_order (an older daemon, an unread registration): two models
    leave the IDX unmatched. Before: index order."""
    cards = two_models()
    held, missing = labels(cards, env("0"), None)
    assert held == [] and missing == [
        "gpu IDX 0 (not mapped: cards of models NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB "
        "HBM3: Slurm orders several types by the node's registered Gres=, which the state "
        "does not hold)"
    ]


def test_two_mig_profiles_map_by_the_registered_order_when_slurm_numbered_them(base_config):
    """Gres=gpu:1g.20gb:3,gpu:3g.40gb:1: IDX 0-2 are MIG 1-3, IDX 3 MIG 0 (slurmd 22.05
    below). With CUDA_VISIBLE_DEVICES numbers (gres.conf lines: AutoDetect gives MIG
    UUIDs) or gres.conf's word; squeue's IDX alone is not enough."""
    cards = two_profiles()
    o = order_doc(cards, "gpu:1g.20gb:3,gpu:3g.40gb:1", base_config)
    assert labels(cards, env("0,3"), o) == (["nvidia/0 mig 1", "nvidia/0 mig 0"], [])
    held, missing = labels(cards, Allocation({"gpu": frozenset({3})}), o)
    assert held == [] and missing[0].startswith(
        "gpu IDX 3 (not mapped: GRES types 1g.20gb, 3g.40gb: gres.conf lines number them "
        "by the registered Gres= types, AutoDetect=nvml otherwise"
    )
    lines = order_doc(cards, "gpu:1g.20gb:3,gpu:3g.40gb:1", base_config, lines=True)
    assert labels(cards, Allocation({"gpu": frozenset({3})}), lines) == (["nvidia/0 mig 0"], [])


def test_a_whole_gpu_beside_mig_devices_maps_on_gres_conf_lines_only(base_config):
    """Gres=gpu:1g.20gb:4,gpu:a100:1: the MIG devices IDX 0-3, the whole A100 IDX 4.
    AutoDetect would number a whole GPU (given as a number too) among the MIG devices
    by file and NVML order, so only gres.conf's word maps it."""
    cards = whole_and_mig()
    o = order_doc(cards, "gpu:1g.20gb:4,gpu:a100:1", base_config)
    held, missing = labels(cards, env("4"), o)
    assert held == [] and "(a whole GPU beside MIG devices)" in missing[0]
    lines = order_doc(cards, "gpu:1g.20gb:4,gpu:a100:1", base_config, lines=True)
    assert labels(cards, env("4,0"), lines) == (["nvidia/1 mig 0", "nvidia/0"], [])
    d = decide(_state(cards, lines, bad=0), env("4"), now=NOW)
    assert (d.exit_code, d.reason) == (1, "hetpatrol: reset_card nvidia/0")


def test_the_epilog_patrols_the_card_of_the_registered_order(base_config):
    """hetpatrol epilog looks at the cards the job held: SLURM_JOB_GPUS=0 under
    Gres=gpu:h100:1,gpu:a100:2 is the H100, nvidia/1."""
    from hetpatrol.slurm.jobguard import epilog_cards

    cards = two_models()
    doc = _state(cards, order_doc(cards, "gpu:h100:1,gpu:a100:2", base_config))
    held, _alloc = epilog_cards({"SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0"}, doc)
    assert [c["index"] for c in held] == [1]


def test_an_order_naming_other_devices_is_not_used(base_config):
    cards = two_models()
    o = order_doc(cards, "gpu:h100:1,gpu:a100:2", base_config)
    held, missing = labels(cards[:2] + [_as(cards[2], 3)], env("0"), o)
    assert held == [] and missing == [
        "gpu IDX 0 (not mapped: the registered Gres= order names other devices than the cards)"
    ]


def test_card_jobs_map_by_the_order(base_config):
    """card_jobs (stray_process, fault-to-job) on a job given gpu:h100 IDX 0: its card
    is nvidia/1 (before: nvidia/0)."""
    from test_actions_jobguard import REAL_SQUEUE

    doc = json.loads(REAL_SQUEUE)
    job = doc["jobs"][0]
    job["job_state"], job["gres_detail"] = "RUNNING", ["gpu:h100:1(IDX:0)"]
    cards = two_models()
    o = order_doc(cards, "gpu:h100:1,gpu:a100:2", base_config)
    by_card, error = card_jobs(json.dumps(doc), "hp-gpu01", cards, o)
    assert error is None and by_card == {
        0: frozenset(),
        1: frozenset({str(job["job_id"])}),
        2: frozenset(),
    }
    by_card, error = card_jobs(json.dumps(doc), "hp-gpu01", cards, None)
    assert by_card == {} and "cards of models" in error


def test_the_gres_check_writes_the_order_and_gres_confs_word_into_the_state(base_config, tmp_path):
    """The daemon's GRES check reads the registration (sinfo --nodes, every
    registration_cache_seconds) and, for a node of several types, gres.conf's
    AutoDetect: the state file carries both as gres_order."""
    from hetpatrol.collector import CollectorStatus

    gres_conf = tmp_path / "gres.conf"
    gres_conf.write_text(
        "NodeName=gpu07 Name=gpu Type=a100 File=/dev/nvidia0\n"
        "NodeName=gpu07 Name=gpu Type=h100 File=/dev/nvidia1\n"
        "NodeName=gpu07 Name=gpu Type=a100 File=/dev/nvidia2\n"
    )
    settings = SlurmSettings(enabled=True, node_name="gpu07", gres_conf=gres_conf)
    config = replace(base_config, node="host07", slurm=settings)
    line = "NodeName=gpu07 Gres=gpu:h100:1,gpu:a100:2 State=IDLE\n"
    check = GresCheck(FakeScontrol(line))
    cards = two_models()
    result = check.run(cards, [CollectorStatus("nvidia", "ok", 3, 0.1)], config)
    want = {
        "names": gres_order(cards, entries("gpu:h100:1,gpu:a100:2"), base_config),
        "gres_conf_lines": True,
        "gres_conf": f"{gres_conf}: lines, AutoDetect=none",
    }
    assert result.data["order"] == want and check.order == want
    jsonschema.validate(result.data, gres_json_schema())  # the patrol line's gres key
    report = SimpleNamespace(
        node="host07", seq=1, finished=NOW, health="ok", exit_code=0, collectors=[],
        node_findings=[], action="none", escalation={}, node_checks={"gres": result.data},
    )  # fmt: skip
    assert state_document(report, 60.0, cards=False)["gres_order"] == want
    # scontrol unanswered: the gres.conf fallback has its lines' type order, not Gres='s
    failing = FakeScontrol("", returncode=1, stderr="slurm_load_node error: Unable to contact")
    check = GresCheck(failing)
    result = check.run(cards, [CollectorStatus("nvidia", "ok", 3, 0.1)], config)
    assert result.data["source"] == "gres.conf" and "order" not in result.data
    gres_conf.write_text("AutoDetect=nvml\n")
    check = GresCheck(FakeScontrol(line))
    result = check.run(cards, [CollectorStatus("nvidia", "ok", 3, 0.1)], config)
    assert result.data["order"]["gres_conf_lines"] is False
    # one type: no order written, the state as before
    check = GresCheck(FakeScontrol("NodeName=gpu07 Gres=gpu:h100:1 State=IDLE\n"))
    result = check.run(cards[1:2], [CollectorStatus("nvidia", "ok", 1, 0.1)], config)
    assert "order" not in result.data and check.order is None


# ------------------------------------------------------ the real slurmctld/slurmd
def _lines(cards: list[CardRecord], types: dict[int, str]) -> str:
    """gres-conf's lines for ``cards`` (cards by index, MIG devices by MIG index); a
    whole card's Type= is ``types[index]``."""
    out = []
    for c in sorted(cards, key=lambda r: r.index):
        migs = [p for p in c.partitions if p.kind == "mig"]
        for p in migs:
            files = ",".join(
                f"{{dev}}/{f.removeprefix('/dev/')}"
                for f in (f"/dev/nvidia{c.device_number}", *p.device_files)
            )
            out.append(f"NodeName={{node}} Name=gpu Type={p.profile} MultipleFiles={files}")
        if not migs:
            file = f"{{dev}}/nvidia{c.device_number}"
            out.append(f"NodeName={{node}} Name=gpu Type={types[c.index]} File={file}")
    return "\n".join(out) + "\n"


def _devices(cards: list[CardRecord]):
    def make(cluster) -> None:  # character devices: slurmd sets the Prolog's variables
        dev = cluster.root / "dev"
        (dev / "nvidia-caps").mkdir(exist_ok=True)
        for c in cards:
            files = [f"/dev/nvidia{c.device_number}"]
            files += [f for p in c.partitions for f in p.device_files]
            for f in files:
                path = dev / f.removeprefix("/dev/")
                path.unlink(missing_ok=True)
                minor = int(f.rsplit("p", 1)[-1]) if "cap" in f else c.device_number
                os.mknod(path, 0o600 | 0o020000, os.makedev(195, minor))  # S_IFCHR

    return make


CASES = {
    # name: (cards, Type= of whole cards, Gres=, the job's --gres, its IDX, its card)
    "two MIG profiles": (two_profiles, {}, "gpu:1g.20gb:3,gpu:3g.40gb:1", "3g.40gb", 3, 0),
    "whole GPU and MIG": (whole_and_mig, {0: "a100"}, "gpu:1g.20gb:4,gpu:a100:1", "a100", 4, 0),
    "two models": (
        two_models,
        {0: "a100", 1: "h100", 2: "a100"},
        "gpu:h100:1,gpu:a100:2",
        "h100",
        0,
        1,
    ),  # fmt: skip
}


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize("case", list(CASES))
def test_real_slurm_idx_of_several_types_and_the_prolog_follows(case, tmp_path):
    """A real 22.05 cluster, gres-conf's lines for the cards (character devices, so
    slurmd sets SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES in the Prolog) and a Gres= whose
    type order is not the lines' order. The real GRES check reads the node's registered
    Gres= (sinfo --nodes) and the cluster's gres.conf and writes gres_order into the
    state; the card the job should be on needs a reset. slurmd gives the job the IDX of
    Slurm's rule, says it in the Prolog's variables, and the real Prolog refuses the job
    naming that card. (Before: unmatched or another card, and the job ran.)"""
    from slurm_cluster import BINARIES, start_cluster

    from hetpatrol.collector import CollectorStatus

    missing = [b for b in (*BINARIES, "squeue") if shutil.which(b) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(f"not installed: {missing}" if missing else "needs root (mknod)")
    make, types, gres, want_type, want_idx, want_card = CASES[case]
    cards = make()
    node = "hp-order" + str(list(CASES).index(case))
    c = start_cluster(
        gres_conf_text=_lines(cards, types),
        node_gres=gres,
        after_munge=_devices(cards),
        node=node,
    )
    out, env_out, state_path = tmp_path / "guard.out", tmp_path / "env.out", tmp_path / "s.json"
    try:
        with c.explain():
            from hetpatrol.config import load_config

            base = load_config()
            settings = SlurmSettings(
                enabled=True, node_name=node, gres_conf=c.gres_conf, scontrol=tuple(c.scontrol_argv)
            )
            config = replace(base, node=node, slurm=settings)
            check = GresCheck()
            result = check.run(cards, [CollectorStatus("nvidia", "ok", len(cards), 0.1)], config)
            assert result.data["source"] == "sinfo", result.data
            order = result.data["order"]
            assert order["gres_conf_lines"] is True, order
            assert [t["type"] for t in order["names"]["gpu"]["types"]] == [
                e.type for e in entries(gres)
            ]
            doc = _state(cards, order, bad=want_card)
            doc["node"], doc["finished"], doc["interval_seconds"] = node, time.time(), 3600
            state_path.write_text(json.dumps(doc))
            hook = _prolog_script(state_path, out, tmp_path).replace(
                "exec ", f'echo "$SLURM_JOB_GPUS $CUDA_VISIBLE_DEVICES" >> {env_out}\nexec '
            )
            with c.install_hook("prolog", hook):
                c.run("sbatch", f"--gres=gpu:{want_type}:1", "-o", "/dev/null", "--wrap", "true")
                said = _wait_file(out)
                assert env_out.read_text().split() == [str(want_idx), str(want_idx)]
                assert said.strip() == f"hetpatrol: reset_card nvidia/{want_card}", said
                c.wait_for(lambda line: "drain" in line.split(" ")[1], what="node drained")
        c.run("scancel", "--user=root", check=False)
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.slurm
def test_real_autodetect_numbers_alternating_models_by_device(tmp_path):
    """Slurm's fake_gpus.conf standing in for NVML (AutoDetect's records, gres_gpu.c
    ``_get_system_gpu_list_fake``), A100, H100, A100 with Gres=gpu:h100:1,gpu:a100:2:
    the H100 is IDX 1 (device order), and slurmctld's registered Gres= is rebuilt in the
    records' order, A100 first (``_build_node_gres_str``). With gres.conf's AutoDetect
    the mapping takes the device order; without gres.conf's word the registration is
    the one AutoDetect and lines share, so the IDX stays unmatched."""
    from slurm_cluster import BINARIES, start_cluster

    from hetpatrol.collector import CollectorStatus
    from hetpatrol.slurm.jobguard import parse_squeue_json

    missing = [b for b in (*BINARIES, "squeue") if shutil.which(b) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(f"not installed: {missing}" if missing else "needs root (mknod)")
    cards = two_models()
    kinds = ["nvidia_a100-sxm4-80gb", "nvidia_h100_80gb_hbm3", "nvidia_a100-sxm4-80gb"]

    def devices(cluster) -> None:
        _devices(cards)(cluster)
        rows = []
        for i, kind in enumerate(kinds):
            links = ",".join("-1" if j == i else "0" for j in range(3))
            rows.append(f"{kind}|1|0|{links}|{cluster.root}/dev/nvidia{i}")
        (cluster.root / "fake_gpus.conf").write_text("\n".join(rows) + "\n")

    c = start_cluster(
        gres_conf_text="AutoDetect=nvml\n",
        node_gres="gpu:h100:1,gpu:a100:2",
        after_munge=devices,
        node="hp-orderauto",
    )
    try:
        with c.explain():
            shown = c.run("scontrol", "show", "node", "-o", c.node).stdout
            assert " Gres=gpu:a100:2(S:0),gpu:h100:1(S:0) " in shown, shown
            job = c.run("sbatch", "--parsable", "--gres=gpu:h100:1", "-o", "/dev/null",
                        "--wrap", "sleep 300").stdout.strip()  # fmt: skip
            deadline = time.monotonic() + 30
            while True:
                text = c.run("squeue", "--json").stdout
                (record,) = [j for j in json.loads(text)["jobs"] if str(j["job_id"]) == job]
                if record["gres_detail"] or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert record["gres_detail"] == ["gpu:h100:1(IDX:1)"]
            alloc = parse_squeue_json(text, job, c.node)
            from hetpatrol.config import load_config

            settings = SlurmSettings(
                enabled=True,
                node_name=c.node,
                gres_conf=c.gres_conf,
                scontrol=tuple(c.scontrol_argv),
            )
            config = replace(load_config(), node=c.node, slurm=settings)
            result = GresCheck().run(cards, [CollectorStatus("nvidia", "ok", 3, 0.1)], config)
            order = result.data["order"]
            assert order["gres_conf_lines"] is False, order
            assert labels(cards, alloc, order) == (["nvidia/1"], [])
            unknown = dict(order, gres_conf_lines=None)
            held, missing_ = labels(cards, alloc, unknown)
            assert held == [] and "alternate among the cards" in missing_[0]
        c.run("scancel", "--user=root", check=False)
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)
