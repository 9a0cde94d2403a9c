"""The job-start guard (hetpatrol.slurm.jobguard): allocation parsing, the decision, and a
real Slurm Prolog that runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetpatrol import healthcheck
from hetpatrol.slurm import jobguard
from hetpatrol.slurm.jobguard import Allocation, decide, parse_job_env, parse_squeue_json
from tests import slurm_cluster as cluster

slurm_cluster = cluster.slurm_cluster
slurm_node = cluster.slurm_node

NOW = 1_800_000_000.0

# `squeue --json` of a real Slurm 22.05.8 cluster (tests/slurm_cluster.py; see
# fixtures/slurm/README.md): job 1 named 'train Nodes=hp-gpu01 GRES=ascend:910b:1(IDX:3)',
# with a comment holding a forged detail line and such a work directory, given gpu IDX 0
# and ascend IDX 0; jobs 2 and 3 pending
SQUEUE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "squeue-json-22.05-hostile.json"
)
REAL_SQUEUE = SQUEUE.read_text()


def squeue_json(**changes) -> str:
    """The recorded document with job 1's fields changed (``job_resources=None`` drops
    it), as a later or multi-node record would have them."""
    doc = json.loads(REAL_SQUEUE)
    job = doc["jobs"][0]
    for key, value in changes.items():
        if value is None:
            job.pop(key, None)
        else:
            job[key] = value
    return json.dumps(doc)


#: ``scontrol --version`` of a Slurm whose squeue --json keeps --jobs= (23.02.3 and later)
#: and of the 22.05 installed here (it ignores every filter: the whole queue)
V23, V22 = "slurm 23.11.4\n", "slurm-wlm 22.05.8\n"
#: recorded ``scontrol -d show job`` of slurmctld 22.05.8 (fixtures/slurm/README.md): job
#: 5, Slurm's block gpu IDX 0 + ascend IDX 0-2, forged lines of another shape in its name,
#: work directory and comment; job 7, ascend IDX 0, an exact copy of Slurm's block saying
#: ascend IDX 4-7 in its name and comment
SHOW_JOB = {
    name: (SQUEUE.parent / f"scontrol-show-job-d-22.05-{name}.txt").read_text()
    for name in ("hostile", "copied-block")
}


def card(vendor, index, gres, *, action=None, chip=None, uuid=None, findings=()):
    c = {
        "vendor": vendor,
        "index": index,
        "chip": chip,
        "gres": gres,
        "uuid": uuid,
        "health": "ok",
        "findings": list(findings),
    }
    if action is not None:
        c["action"] = action
    return c


# the state file's job_env as the daemon writes it: the plugins' VendorInfo.job_env rows
# (collectors/ascend.py, collectors/nvidia.py), plugins in name order
JOB_ENV = [
    {"vendor": "ascend", "name": "ASCEND_VISIBLE_DEVICES", "ids": "vendor_order",
     "gres": None, "uuid_prefixes": []},
    {"vendor": "ascend", "name": "ASCEND_RT_VISIBLE_DEVICES", "ids": "vendor_order",
     "gres": None, "uuid_prefixes": []},
    {"vendor": "nvidia", "name": "CUDA_VISIBLE_DEVICES", "ids": "gres_idx",
     "gres": "gpu", "uuid_prefixes": ["GPU-", "MIG-"]},
]  # fmt: skip


def state(cards, *, finished=NOW - 5, interval=10.0, findings=()):
    return {
        "schema": "hetpatrol.state/1",
        "node": "hp-gpu01",
        "seq": 42,
        "finished": finished,
        "interval_seconds": interval,
        "health": "ok",
        "exit_code": 0,
        "collectors": {},
        "findings": list(findings),
        "cards": list(cards),
        "job_env": JOB_ENV,
    }


NODE = [
    card("nvidia", 0, "gpu", action="none", uuid="GPU-aaaa"),
    card("nvidia", 1, "gpu", action="reset_card", uuid="GPU-bbbb"),
    card("nvidia", 2, "gpu", action="watch", uuid="GPU-cccc"),
    card("ascend", 0, "ascend", action="none", chip=0),
    card("ascend", 1, "ascend", action="isolate_card", chip=0),
]


# ------------------------------------------------------------------ allocation
@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0,1", {0, 1}),
        ("0-2,7", {0, 1, 2, 7}),
        ("", set()),
        ("N/A", set()),
        ("NoDevFiles", set()),
        ("GPU-aaaa", None),
        ("3-1", None),
        (None, None),
    ],
)
def test_parse_index_list(text, want):
    got = jobguard.parse_index_list(text)
    assert got == (None if want is None else frozenset(want))


def test_env_slurm_job_gpus_wins_and_uuids_are_exact():
    a = parse_job_env({"SLURM_JOB_GPUS": "1,2", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert a.by_gres == {"gpu": frozenset({1, 2})}
    assert a.sources == ("SLURM_JOB_GPUS",)
    a = parse_job_env({"CUDA_VISIBLE_DEVICES": "GPU-BBBB,MIG-x"})
    assert a.uuids == {"gpu-bbbb", "mig-x"}
    a = parse_job_env({"ASCEND_RT_VISIBLE_DEVICES": "1", "ASCEND_VISIBLE_DEVICES": "0,1"})
    assert a.vendor_ids == {"ascend": {0, 1}}
    assert a.sources == ("ASCEND_VISIBLE_DEVICES",)
    a = parse_job_env({"ASCEND_VISIBLE_DEVICES": "x", "ASCEND_RT_VISIBLE_DEVICES": "2"})
    assert a.vendor_ids == {"ascend": {2}} and "is not a list of device IDs" in a.errors[0]
    a = parse_job_env({"CUDA_VISIBLE_DEVICES": "0,x"})
    assert a.errors == ("CUDA_VISIBLE_DEVICES='0,x' is not readable",)
    a = parse_job_env({"SLURM_JOB_GPUS": "banana"})
    assert a.by_gres == {} and "banana" in a.errors[0]
    assert parse_job_env({}).empty


def test_squeue_json_gives_what_slurm_allocated_never_what_the_job_is_named():
    a = parse_squeue_json(REAL_SQUEUE, "1", "hp-gpu01")
    # Slurm gave gpu IDX 0 and ascend IDX 0; the name, comment and work directory all say
    # "ascend ... (IDX:3)" and are not read
    assert (a.by_gres, a.errors) == ({"gpu": frozenset({0}), "ascend": frozenset({0})}, ())
    assert a.sources == ("squeue --json",)
    doc = json.loads(REAL_SQUEUE)
    assert "IDX:3" in doc["jobs"][0]["name"] and "\n     Nodes=" in doc["jobs"][0]["comment"]
    # a pending job (no job_resources, gres_detail []), another node, an unknown job
    assert parse_squeue_json(REAL_SQUEUE, "3", "hp-gpu01").by_gres == {}
    assert parse_squeue_json(REAL_SQUEUE, "1", "hp-gpu02").by_gres == {}
    assert "0 records of job '99'" in parse_squeue_json(REAL_SQUEUE, "99", "hp-gpu01").errors[0]


def test_squeue_json_pairs_gres_detail_with_the_hosts_in_slurms_order():
    # two hosts: gres_detail[i] belongs to the i-th host of job_resources.nodes
    # (src/api/job_info.c pairs them so for scontrol's "Nodes=... GRES=" lines)
    res = {"nodes": "gpu[1-2]", "allocated_hosts": 2, "allocated_nodes": []}
    text = squeue_json(job_resources=res, gres_detail=["gpu:2(IDX:2-3)", "gpu:1(IDX:0)"])
    assert parse_squeue_json(text, "1", "gpu1").by_gres == {"gpu": frozenset({2, 3})}
    assert parse_squeue_json(text, "1", "gpu2").by_gres == {"gpu": frozenset({0})}
    assert parse_squeue_json(text, "1", "gpu3").by_gres == {}
    # allocated_nodes names each host: it must agree with the host list
    res["allocated_nodes"] = [{"nodename": "gpu2"}, {"nodename": "gpu1"}]
    text = squeue_json(job_resources=res, gres_detail=["gpu:2(IDX:2-3)", "gpu:1(IDX:0)"])
    a = parse_squeue_json(text, "1", "gpu1")
    assert a.by_gres == {} and "differ" in a.errors[0]
    # a later data_parser's {"list": ...}; a GRES item with no (IDX:...) part, which
    # Slurm never prints (gres_ctld_job_build_details): that name's cards are unknown,
    # never "none" (tests/test_slurm_json_versions.py has the recorded forms)
    res = {"nodes": {"list": "gpu[1-2]"}}
    text = squeue_json(job_resources=res, gres_detail=["gpu:2(IDX:2-3)", "ascend:910b:1"])
    a = parse_squeue_json(text, "1", "gpu2")
    assert a.by_gres == {} and "no (IDX:...) part" in a.errors[0]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{not json", "not JSON"),
        ("[]", "no jobs list"),
        (squeue_json(gres_detail="gpu:1(IDX:0)"), "not a list of strings"),
        (squeue_json(job_resources=None), "no job_resources"),
        (squeue_json(gres_detail=["gpu:1(IDX:0)", "gpu:1(IDX:1)"]), "2 gres_detail entries"),
        (squeue_json(gres_detail=["gpu:1(IDX:zero)"]), "IDX not readable"),
        (squeue_json(job_id=True), "0 records"),
        ("x" * (jobguard.SQUEUE_JSON_MAX + 1), "larger than"),
    ],
)
def test_squeue_json_that_cannot_be_read_is_unknown_never_guessed(text, said):
    a = parse_squeue_json(text, "1", "hp-gpu01")
    assert said in "; ".join(a.errors)
    assert not any(a.by_gres.values())


def test_squeue_beside_scontrol():
    assert jobguard.squeue_argv("/usr/bin/scontrol") == ["/usr/bin/squeue", "--json"]
    assert jobguard.squeue_argv("scontrol") == ["squeue", "--json"]


# -------------------------------------------------------------------- decision
def test_pass_when_the_jobs_cards_are_fine():
    d = decide(state(NODE), Allocation({"gpu": frozenset({0, 2})}), now=NOW)
    assert d.ok and d.cards == ("nvidia/0", "nvidia/2")
    assert d.reason.startswith("job cards ok: nvidia/0, nvidia/2 (patrol 42, 5 s ago)")


def test_fail_when_an_allocated_card_needs_a_reset():
    d = decide(state(NODE), Allocation({"gpu": frozenset({0, 1})}), now=NOW)
    assert (d.exit_code, d.reason) == (1, "hetpatrol: reset_card nvidia/1")
    d = decide(state(NODE), Allocation({"ascend": frozenset({1})}), now=NOW)
    assert d.reason == "hetpatrol: isolate_card ascend/1/0"
    d = decide(state(NODE), Allocation(uuids=frozenset({"gpu-bbbb"})), now=NOW)
    assert not d.ok
    d = decide(state(NODE), Allocation(vendor_ids={"ascend": frozenset({1})}), now=NOW)
    assert not d.ok


def test_a_job_without_cards_passes_a_node_with_bad_cards():
    assert decide(state(NODE), Allocation(), now=NOW).ok


def test_reboot_node_blocks_every_accelerator_job():
    cards = [
        card("nvidia", 0, "gpu", action="none"),
        card("nvidia", 1, "gpu", action="reboot_node"),
    ]
    d = decide(state(cards), Allocation({"gpu": frozenset({0})}), now=NOW)
    assert d.reason == "hetpatrol: reboot_node nvidia/1"
    node_finding = {
        "check": "nvml_driver",
        "severity": "critical",
        "message": "m",
        "action": "reboot_node",
    }
    d = decide(
        state([cards[0]], findings=[node_finding]), Allocation({"gpu": frozenset({0})}), now=NOW
    )
    assert d.reason == "hetpatrol: reboot_node node nvml_driver m"
    assert decide(state([cards[0]], findings=[node_finding]), Allocation(), now=NOW).ok


def test_stale_missing_or_future_verdicts_fail():
    d = decide(state(NODE, finished=NOW - 41), Allocation(), now=NOW)
    assert d.reason == "hetpatrol: stale verdict: last patrol 41 s ago (max 40 s)"
    assert decide(state(NODE, finished=NOW - 39), Allocation(), now=NOW).ok
    assert not decide(state(NODE, finished=NOW + 400), Allocation(), now=NOW).ok
    d = decide(None, Allocation(), now=NOW, read_error="no state file /x")
    assert d.reason == "hetpatrol: no verdict: no state file /x"
    assert not decide({"schema": "other"}, Allocation(), now=NOW).ok


@pytest.mark.parametrize(
    ("finished", "interval", "max_age"),
    [
        (NOW - 5, 10.0, None),
        (NOW - 41, 10.0, None),
        (NOW - 100, 30, None),
        (NOW - 20, 10, 15.0),
        (NOW + 301, 10, None),
        ("x", 10, None),
        (NOW - 5, "bad", None),
        (NOW - 61, None, None),
    ],
)
def test_staleness_agrees_with_hetpatrol_check(finished, interval, max_age):
    doc = state(NODE, finished=finished, interval=interval)
    mine = jobguard.verdict_age(doc, NOW, max_age)
    theirs = healthcheck.verdict_age(doc, NOW, max_age)
    assert mine[1] == theirs[1]
    assert (mine[0] == theirs[0]) or (mine[0] != mine[0] and theirs[0] != theirs[0])


def test_unmapped_idx_is_reported_not_failed():
    d = decide(state(NODE), Allocation({"gpu": frozenset({0, 7})}), now=NOW)
    assert d.ok and d.unmatched == ("gpu IDX 7",)
    assert d.reason.endswith("not in the verdict: gpu IDX 7")


def test_cards_without_an_action_field_are_judged_by_their_findings():
    old = [
        card(
            "nvidia",
            0,
            "gpu",
            findings=[{"check": "remapped_rows_failure", "severity": "critical"}],
        ),
        card("nvidia", 1, "gpu", findings=[{"check": "temperature", "severity": "warning"}]),
    ]
    assert not decide(state(old), Allocation({"gpu": frozenset({0})}), now=NOW).ok
    assert decide(state(old), Allocation({"gpu": frozenset({1})}), now=NOW).ok


def test_scontrol_only_when_it_could_change_the_answer():
    env = parse_job_env({"SLURM_JOB_GPUS": "0"})
    good = [card("nvidia", 0, "gpu", action="none"), card("ascend", 0, "ascend", action="watch")]
    assert not jobguard.needs_scontrol(state(good), env)
    assert not jobguard.needs_scontrol(state(NODE[:3]), env)  # gpu covered by the env
    assert jobguard.needs_scontrol(state(NODE), env)  # a bad ascend card, no ascend env
    assert jobguard.needs_scontrol(state(NODE[:3]), parse_job_env({}))
    assert not jobguard.needs_scontrol(None, env)


def test_guard_reads_the_file_and_runs_scontrol_only_when_needed(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state(NODE)))
    calls = []

    def runner(argv, timeout):
        calls.append((list(argv), timeout))
        return V23 if argv[-1] == "--version" else squeue_json(job_id=7)

    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "hp-gpu01", "SLURM_JOB_GPUS": "0"}
    d = jobguard.guard(env, path, runner=runner, clock=lambda: NOW)
    # gpu 0 fine, but the verdict has a bad ascend card the env says nothing about:
    # the job's one record (Slurm 23.11: squeue --json --jobs=7) says ascend IDX 0 -> pass
    assert d.ok, d.reason
    assert [c[0] for c in calls] == [["scontrol", "--version"], ["squeue", "--json", "--jobs=7"]]
    assert all(0 < c[1] <= 5 for c in calls)
    calls.clear()
    path.write_text(json.dumps(state(NODE[:1])))
    assert jobguard.guard(env, path, runner=runner, clock=lambda: NOW).ok
    assert calls == []


def test_guard_never_raises_and_fails_closed_on_a_missing_or_odd_file(tmp_path):
    d = jobguard.guard({}, tmp_path / "nope.json", clock=lambda: NOW)
    assert d.exit_code == 1 and "is the hetpatrol daemon running?" in d.reason
    (tmp_path / "bad.json").write_text("{not json")
    assert jobguard.guard({}, tmp_path / "bad.json", clock=lambda: NOW).exit_code == 1
    assert jobguard.guard({}, tmp_path, clock=lambda: NOW).exit_code == 1  # a directory

    def boom(argv, timeout):
        raise subprocess.TimeoutExpired(argv, timeout)

    (tmp_path / "s.json").write_text(json.dumps(state(NODE)))
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "hp-gpu01"}
    d = jobguard.guard(env, tmp_path / "s.json", runner=boom, clock=lambda: NOW)
    assert d.ok  # scontrol timed out: the job's cards are unknown, nothing to blame


def test_the_guard_imports_nothing_heavy():
    code = (
        "import sys, hetpatrol.slurm.jobguard\n"
        "heavy = {'yaml', 'jsonschema', 'prometheus_client', 'pynvml', 'structlog', 'asyncio'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_plugins_declare_the_variables_the_state_file_carries_them():
    """The vendors' variables are the plugins' (VendorInfo.job_env), written by the
    daemon into the state file; given rows or none read from there, the plugins'
    otherwise (a state file of an older daemon)."""
    from hetpatrol.collector import job_env_declarations
    from hetpatrol.config import load_config
    from hetpatrol.exporters.state import state_document
    from hetpatrol.patrol import Patroller

    assert job_env_declarations() == JOB_ENV
    nodes = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
    report = Patroller(load_config(), replay_dir=nodes / "healthy-mixed").run()
    assert state_document(report, 10.0)["job_env"] == JOB_ENV
    env = {"ASCEND_VISIBLE_DEVICES": "1"}
    assert parse_job_env(env, []).vendor_ids == {}
    assert parse_job_env(env, jobguard.job_env_of(state(NODE))).vendor_ids == {"ascend": {1}}
    old = state(NODE)
    del old["job_env"]
    assert jobguard.job_env_of(old) is None
    assert parse_job_env(env, jobguard.job_env_of(old)).vendor_ids == {"ascend": {1}}
    odd = [{"vendor": "x", "name": "X_DEVICES", "ids": "gres_idx"}, 7, {"name": "Y"}]
    assert jobguard.job_env_of({"job_env": odd}) == []


def test_a_prolog_on_a_daemon_state_file_imports_no_plugin(tmp_path):
    """The Prolog runs before every job: on the daemon's state file (with job_env) it
    imports no vendor plugin and no yaml, and still reads the vendors' variables."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps(state(NODE)))
    code = (
        "import sys\n"
        "from hetpatrol.slurm import jobguard\n"
        "env = {'SLURM_JOB_ID': '7', 'SLURMD_NODENAME': 'hp-gpu01', "
        "'ASCEND_VISIBLE_DEVICES': '1'}\n"
        f"d = jobguard.guard(env, {str(path)!r}, clock=lambda: {NOW!r})\n"
        "print(d.exit_code, d.reason)\n"
        "print(sorted(m for m in sys.modules if m.startswith('hetpatrol.collector') "
        "or m.split('.')[0] == 'yaml'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["1 hetpatrol: isolate_card ascend/1/0", "[]"], out.stderr


def test_the_guard_loads_no_vendor_plugin_when_the_daemon_wrote_the_actions(tmp_path, monkeypatch):
    """The vendors' fault tables (VendorInfo.actions) are loaded only for a finding
    without its action: a daemon's state file (every card and finding carries one)
    costs the prolog no plugin import; a bare XID finding still gets its catalog action."""
    from hetpatrol.actions import findings as table

    monkeypatch.setattr(table, "_tables", None)
    xid = {"check": "xid", "severity": "critical", "value": {"79": 1}, "action": "reboot_node"}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(state(NODE, findings=[xid])))
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "hp-gpu01", "SLURM_JOB_GPUS": "0"}
    d = jobguard.guard(env, path, clock=lambda: NOW)
    assert d.exit_code == 1 and "reboot_node" in d.reason
    assert table._tables is None
    del xid["action"]
    path.write_text(json.dumps(state(NODE, findings=[xid])))
    d = jobguard.guard(env, path, clock=lambda: NOW)
    assert d.exit_code == 1 and "reboot_node" in d.reason and "79" in d.reason
    assert table._tables is not None


# ----------------------------------------------------------------- real Slurm
def _prolog_script(state_path: Path, out: Path, tmp_path: Path) -> str:
    py = tmp_path / "prolog.py"
    py.write_text(
        "import os, sys\n"
        "from hetpatrol.slurm.jobguard import prolog_main\n"
        f"w = lambda s: open({str(out)!r}, 'a').write(s)\n"
        f"sys.exit(prolog_main(os.environ, {str(state_path)!r}, "
        f"scontrol={shutil.which('scontrol')!r}, write=w))\n"
    )
    return f"#!/bin/sh\nexec {sys.executable} {py}\n"


def _wait_file(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{path} not written in {timeout:.0f} s")


@pytest.mark.slurm
def test_real_prolog_passes_good_cards_and_fails_a_bad_one(slurm_node, tmp_path):
    """slurmd runs the guard as Prolog; its env has no SLURM_JOB_GPUS here (fake
    /dev files), so the guard asks scontrol for the IDX, and fails on GPU IDX 1, with
    hetpatrol's reason on the drained node."""
    c = slurm_node
    out = tmp_path / "guard.out"
    state_path = tmp_path / "state.json"
    cards = [card("nvidia", i, "gpu", action="none") for i in range(8)]
    cards += [card("ascend", i, "ascend", action="none", chip=0) for i in range(8)]
    cards[1]["action"] = "reset_card"
    state_path.write_text(json.dumps(state(cards, finished=time.time(), interval=3600)))
    with c.explain(), c.install_hook("prolog", _prolog_script(state_path, out, tmp_path)):
        # a job on GPU IDX 0 only: passes (the bad card 1 is not the job's)
        job = c.run("sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true")
        first = _wait_file(out)
        assert first.startswith("job cards ok: nvidia/0"), first
        c.run("scontrol", "wait_job", job.stdout.strip().split(";")[0], check=False)
        c.wait_for(lambda line: line.split(" ")[1] == "idle", what="node idle")
        out.unlink()
        # two GPUs: IDX 0-1, and card 1 needs a reset -> the Prolog fails
        c.run("sbatch", "--gres=gpu:2", "-o", "/dev/null", "--wrap", "true")
        second = _wait_file(out)
        assert second.strip() == "hetpatrol: reset_card nvidia/1", second
        line = c.wait_for(lambda line: "drain" in line.split(" ")[1], what="node drained")
        # hetpatrol's reason, set by the Prolog before it failed, not "Prolog error"
        assert c.reason().startswith("hetpatrol: reset_card nvidia/1"), line
        # Slurm requeues (and holds) the job once slurmctld has the Prolog's failure: the
        # drain (set by the Prolog itself) can be seen a moment before that
        deadline = time.monotonic() + 30
        queue = c.run("squeue", "-h", "-o", "%T %r").stdout
        while "requeued held" not in queue and time.monotonic() < deadline:
            time.sleep(0.5)
            queue = c.run("squeue", "-h", "-o", "%T %r").stdout
        assert "requeued held" in queue, queue
    c.run("scancel", "--user=root", check=False)


@pytest.mark.slurm
def test_real_prolog_reads_the_allocation_not_a_hostile_job_name(slurm_node, tmp_path):
    """A job named, commented and run in a directory that all say
    ``Nodes=<node> GRES=ascend:910b:1(IDX:3)`` (and a comment holding a newline and a
    forged ``scontrol show job -d`` detail line) while NPU 3 needs ``isolate_card``: Slurm
    gives the job NPU 0, the real Prolog reads that from the job's one record (22.05:
    ``scontrol -d show job``, Slurm's own per-node block only) and lets the job run; the
    node is not drained. (Read from any ``Nodes=`` line of the text, the name was IDX 3.)"""
    c = slurm_node
    out = tmp_path / "guard.out"
    state_path = tmp_path / "state.json"
    cards = [card("nvidia", i, "gpu", action="none") for i in range(8)]
    cards += [card("ascend", i, "ascend", action="none", chip=0) for i in range(8)]
    cards[8 + 3]["action"] = "isolate_card"
    state_path.write_text(json.dumps(state(cards, finished=time.time(), interval=3600)))
    forged = f"Nodes={c.node} GRES=ascend:910b:1(IDX:3)"
    workdir = tmp_path / forged
    workdir.mkdir()
    log = c.root / "log" / "slurmctld.log"
    with c.explain(), c.install_hook("prolog", _prolog_script(state_path, out, tmp_path)):
        # slurmctld logs each RPC it processes at debug2 (set live, put back below)
        c.run("scontrol", "setdebug", "debug2")
        seen = len(log.read_text())
        job = c.run(
            "sbatch",
            "--parsable",
            "-J",
            f"train {forged}",
            f"--comment=x\n     Nodes={c.node} CPU_IDs=0 Mem=0 GRES=ascend:910b:1(IDX:3)",
            "-D",
            str(workdir),
            "--gres=ascend:910b:1",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        ).stdout.strip()
        said = _wait_file(out)
        rpcs = log.read_text()[seen:]
        c.run("scontrol", "setdebug", "info")
        assert said.startswith("job cards ok: ascend/0/0 (patrol 42"), said
        # the Prolog asked for its one job (22.05: scontrol -d show job), not the queue
        assert "Processing RPC: REQUEST_JOB_INFO from" not in rpcs, rpcs[-3000:]
        assert rpcs.count("Processing RPC: REQUEST_JOB_INFO_SINGLE from") == 1, rpcs[-3000:]
        c.run("scontrol", "wait_job", job.split(";")[0], check=False)
        line = c.wait_for(lambda line: line.split(" ")[1] == "idle", what="node idle")
        assert c.reason() == "none", line
    c.run("scancel", "--user=root", check=False)


@pytest.mark.slurm
def test_real_prolog_on_a_state_file_of_another_user_drains_nothing(slurm_node, tmp_path):
    """A state file owned by someone else that says a held card needs a reset: not the
    daemon's verdict, so the real Prolog neither believes it nor fails (failing would
    let that user drain the node): the job runs, the node stays idle, the line says why."""
    c = slurm_node
    out = tmp_path / "guard.out"
    state_path = tmp_path / "state.json"
    cards = [card("nvidia", i, "gpu", action="reset_card") for i in range(8)]
    state_path.write_text(json.dumps(state(cards, finished=time.time(), interval=3600)))
    os.chown(state_path, 54321, -1)
    with c.explain(), c.install_hook("prolog", _prolog_script(state_path, out, tmp_path)):
        job = c.run("sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true")
        said = _wait_file(out)
        assert said.startswith(f"untrusted state file {state_path}: "), said
        assert "is owned by uid 54321" in said and said.rstrip().endswith("job let through")
        c.run("scontrol", "wait_job", job.stdout.strip().split(";")[0], check=False)
        line = c.wait_for(lambda line: line.split(" ")[1] == "idle", what="node idle")
        assert c.reason() == "none", line
    c.run("scancel", "--user=root", check=False)


def test_reason_carries_the_action_fields_the_daemon_wrote():
    bad = card("nvidia", 3, "gpu", action="reboot_node")
    bad.update(action_source="nvidia_xid", action_code="xid:79", action_reason="RESTART_BM")
    cards = [card("nvidia", i, "gpu", action="none") for i in range(3)] + [bad]
    cards.append(card("nvidia", 4, "gpu", action="isolate_card"))
    d = decide(state(cards), Allocation({"gpu": frozenset({3})}), now=NOW)
    assert d.reason == "hetpatrol: reboot_node nvidia/3 xid 79 RESTART_BM"
    d = decide(state(cards), Allocation({"gpu": frozenset({3, 4})}), now=NOW)
    assert d.reason == (
        "hetpatrol: reboot_node nvidia/3 xid 79 RESTART_BM; also nvidia/4 isolate_card"
    )


def test_prolog_main_sets_the_drain_reason_then_fails(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state(NODE, finished=time.time())))
    calls, lines = [], []

    def runner(argv, timeout):
        calls.append(list(argv))
        if argv[-1] == "--version":
            return V23
        return squeue_json(job_id=9) if argv[0] == "squeue" else ""

    env = {"SLURM_JOB_ID": "9", "SLURMD_NODENAME": "hp-gpu01", "SLURM_JOB_GPUS": "1"}
    rc = jobguard.prolog_main(env, path, runner=runner, write=lines.append)
    assert rc == 1
    assert calls[-1] == [
        "scontrol",
        "update",
        "NodeName=hp-gpu01",
        "State=DRAIN",
        "Reason=hetpatrol: reset_card nvidia/1",
    ]
    assert lines == ["hetpatrol: reset_card nvidia/1\n"]
    calls.clear()
    env["SLURM_JOB_GPUS"] = "0"
    assert jobguard.prolog_main(env, path, runner=runner, write=lines.append) == 0
    assert all(c[1] != "update" for c in calls)


def test_prolog_main_hard_time_limit_lets_the_job_through(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state(NODE, finished=time.time())))

    def stuck(argv, timeout):
        time.sleep(60)  # a scontrol that ignores its timeout

    lines = []
    env = {"SLURM_JOB_ID": "9", "SLURMD_NODENAME": "hp-gpu01"}
    t = time.monotonic()
    rc = jobguard.prolog_main(env, path, runner=stuck, timeout=1.0, write=lines.append)
    # let through at the 1 s limit, not after the stuck scontrol's 60 s
    assert rc == 0 and time.monotonic() - t < 30
    assert lines == ["hard time limit 1 s hit: job let through\n"]


def test_epilog_cards_from_env_and_scontrol():
    calls = []

    def runner(argv, timeout):
        calls.append(argv)
        return V23 if argv[-1] == "--version" else squeue_json(job_id=5)

    env = {"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "hp-gpu01", "SLURM_JOB_GPUS": "1"}
    held, alloc = jobguard.epilog_cards(env, state(NODE), runner=runner)
    # gpu from the env (IDX 1); ascend not covered -> the job's record: ascend IDX 0
    assert [jobguard.card_name(c) for c in held] == ["ascend/0/0", "nvidia/1"]
    assert calls == [["scontrol", "--version"], ["squeue", "--json", "--jobs=5"]]
    calls.clear()
    env["ASCEND_VISIBLE_DEVICES"] = ""
    held, _ = jobguard.epilog_cards(env, state(NODE), runner=runner)
    assert [jobguard.card_name(c) for c in held] == ["nvidia/1"] and calls == []


def _slurm_22_05(job_text, calls):
    """A stand-in scontrol of Slurm 22.05 recording argv: ``--version``, ``-d show job``
    answering ``job_text``, ``update`` nothing; a squeue (any) fails the test."""

    def runner(argv, timeout):
        calls.append(list(argv))
        assert not argv[0].endswith("squeue"), argv  # 22.05: the whole queue
        if argv[-1] == "--version":
            return V22
        if argv[1:4] == ["-d", "show", "job"]:
            return job_text
        return ""

    return runner


def test_the_prolog_on_22_05_asks_for_its_one_job_never_the_queue(tmp_path):
    """Slurm 22.05: a blocking ascend card the environment does not cover; the Prolog
    asks ``scontrol -d show job 5`` (one REQUEST_JOB_INFO_SINGLE), never ``squeue --json``
    (every job of the cluster there), and reads Slurm's own block: ascend IDX 0-2, so
    the bad NPU 5 (in the forged IDX 4-7 of the name/comment) is not the job's: pass.
    The same job on NPU 1 bad: fail, and the drain reason is set."""
    cards = [card("nvidia", i, "gpu", action="none") for i in range(2)]
    cards += [card("ascend", i, "ascend", action="none", chip=0) for i in range(8)]
    cards[2 + 5]["action"] = "isolate_card"
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state(cards, finished=time.time())))
    env = {"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "hp-gpu01", "SLURM_JOB_GPUS": "0"}
    calls, lines = [], []
    runner = _slurm_22_05(SHOW_JOB["hostile"], calls)
    assert jobguard.prolog_main(env, path, runner=runner, write=lines.append) == 0
    assert calls == [["scontrol", "--version"], ["scontrol", "-d", "show", "job", "5"]]
    assert lines[0].startswith("job cards ok: ascend/0/0, ascend/1/0, ascend/2/0, nvidia/0")
    cards[2 + 5]["action"], cards[2 + 1]["action"] = "none", "isolate_card"
    path.write_text(json.dumps(state(cards, finished=time.time())))
    calls.clear()
    assert jobguard.prolog_main(env, path, runner=runner, write=lines.append) == 1
    assert calls[-1][:4] == ["scontrol", "update", "NodeName=hp-gpu01", "State=DRAIN"]
    assert lines[-1] == "hetpatrol: isolate_card ascend/1/0\n"


def test_a_copied_block_in_the_name_can_neither_drain_nor_hide_on_22_05(tmp_path):
    """Job 7 holds ascend IDX 0; its name and comment copy Slurm's block saying IDX 4-7.
    NPU 4 needs isolate_card: the forged block would fail the job and drain the node;
    the readings differ, so the job's ascend cards are unknown and it goes through,
    saying why. The Epilog then looks at every card (none hidden by the copy)."""
    cards = [card("ascend", i, "ascend", action="none", chip=0) for i in range(8)]
    cards[4]["action"] = "isolate_card"
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state(cards, finished=time.time())))
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "hp-gpu01"}
    calls, lines = [], []
    runner = _slurm_22_05(SHOW_JOB["copied-block"], calls)
    assert jobguard.prolog_main(env, path, runner=runner, write=lines.append) == 0
    assert all(c[1] != "update" for c in calls)
    assert "cards unknown (scontrol show job -d: 3 per-node blocks that differ" in lines[0]
    held, alloc = jobguard.epilog_cards(env, state(cards), runner=runner)
    assert held == [] and "per-node blocks that differ" in alloc.errors[0]


def test_a_newer_state_schema_is_read():
    doc = state(NODE)
    doc["schema"] = "hetpatrol.state/2"
    assert decide(doc, Allocation({"gpu": frozenset({0})}), now=NOW).ok
    doc["schema"] = "nothing.state/1"
    assert not decide(doc, Allocation({"gpu": frozenset({0})}), now=NOW).ok


def test_cli_main_in_a_fresh_process(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state(NODE, finished=time.time())))
    code = "import sys\nfrom hetpatrol.slurm.jobguard import cli_main\nsys.exit(cli_main())\n"
    env = {"SLURM_JOB_GPUS": "0", "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "-c", code, "--state-path", str(path), "--scontrol", "/bin/false"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (run.returncode, run.stdout.startswith("job cards ok: nvidia/0")) == (0, True), run
    env["SLURM_JOB_GPUS"] = "1"
    run = subprocess.run(
        [sys.executable, "-c", code, "--state-path", str(path), "--no-set-reason"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (run.returncode, run.stdout) == (1, "hetpatrol: reset_card nvidia/1\n")
    run = subprocess.run(
        [sys.executable, "-c", code, "--state-path", str(path), "--block-on", "critical"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    # a bad Prolog= line is hetpatrol's fault, not the cards': said, the job let through
    # (a non-zero exit would drain every node the line runs on)
    assert run.returncode == 0 and "not an action word" in run.stderr
    assert run.stderr.rstrip().endswith(": job let through")


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"SLURM_JOB_GPUS": "0-999999999"}, "SLURM_JOB_GPUS='0-999999999' is not a list"),
        ({"SLURM_JOB_GPUS": "\u0661"}, "is not a list of GPU IDs"),  # an Arabic-Indic one
        ({"CUDA_VISIBLE_DEVICES": "$(reboot)"}, "CUDA_VISIBLE_DEVICES='$(reboot)'"),
    ],
)
def test_cards_that_cannot_be_told_are_said_not_hidden(env, said):
    # the verdict has cards needing a drain action; the job's cards cannot be read from
    # the environment (and no scontrol here): the job goes through, and the line says why
    decision = jobguard.decide(state(NODE), jobguard.parse_job_env(env), now=NOW)
    assert decision.ok
    assert decision.reason.startswith("job cards ok: cards unknown (")
    assert said in decision.reason
    assert "): job let through (patrol 42, 5 s ago)" in decision.reason


@pytest.mark.parametrize("max_age", ["-1", "0", "nan", "inf", "1e999", "abc"])
def test_a_bad_max_age_is_a_usage_error_that_lets_the_job_through(tmp_path, max_age):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state(NODE, finished=time.time())))
    code = "import sys\nfrom hetpatrol.slurm.jobguard import cli_main\nsys.exit(cli_main())\n"
    run = subprocess.run(
        [sys.executable, "-c", code, "--state-path", str(path), "--max-age", max_age],
        env={"SLURM_JOB_GPUS": "0", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0 and "a positive number of seconds" in run.stderr, run
