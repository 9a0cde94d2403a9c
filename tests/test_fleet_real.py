"""`hetpatrol fleet` and `hetpatrol audit-slurm` against a real slurmctld and a real
Prometheus scraping three real hetpatrol daemons.

Slurm (22.05 here: the text path) declares, beside the test cluster's own node
hp-gpu01 (slurmd running, Gres=gpu:a100:8,ascend:910b:8, partition debug), nodes without
a slurmd, which Slurm lists all the same:

- gn[001-002]: Gres=gpu:a100:4,ascend:910b:8, Features=a100,910b, partition mixed
  (gn002 also in partition spare); gn002 drained by an admin.
- an01: Gres=ascend:910b:8, partition npu, drained with a hetpatrol reason.

Daemons (`hetpatrol run --replay ... --node N`), each scraped with a `node` target label:
hp-gpu01 (8 healthy A100 + 8 healthy 910B4, built by make_replay), gn001 (sick-mixed),
an01 (ascend-a3-only: 16 chips of type 910_93, which Slurm registers as ascend:910b:8),
ghost01 (ascend-dcmi-error; not in Slurm). A batch job holds gpu:a100:2 on hp-gpu01.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import HETPATROL, NODES
from slurm_cluster import BINARIES, _fail_or_skip, make_replay, start_cluster
from test_end_to_end import free_port
from test_prometheus_real import http_json, http_text, stop, tool, wait

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EXTRA_CONF = """\
NodeName=gn[001-002] NodeAddr=127.0.0.1 Gres=gpu:a100:4,ascend:910b:8 Features=a100,910b \\
 State=UNKNOWN
NodeName=an01 NodeAddr=127.0.0.1 Gres=ascend:910b:8 State=UNKNOWN
PartitionName=mixed Nodes=gn[001-002] State=UP
PartitionName=spare Nodes=gn002 State=UP
PartitionName=npu Nodes=an01 State=UP
"""
ADMIN_REASON = "disk replaced"
# the relabel rule docs/fleet.md "Fleet view" shows, read from there
RELABEL = yaml.safe_load(
    (Path(__file__).resolve().parents[1] / "docs" / "fleet.md")
    .read_text()
    .split("    relabel_configs:\n", 1)[1]
    .split("```", 1)[0]
)[0]
HP_REASON = "hetpatrol: vendor_health ascend/3"


def _leaky(replay: Path) -> Path:
    """The replay with a loader config naming both CUDA and CANN (the daemon's
    library_path_mix finding: the runtimes of this mixed node are not kept apart)."""
    conf = replay / "root" / "etc" / "ld.so.conf.d"
    conf.mkdir(parents=True)
    (conf / "vendors.conf").write_text(
        "/usr/local/cuda/lib64\n/usr/local/Ascend/ascend-toolkit/latest/lib64\n"
    )
    return replay


class Env:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.daemons: dict[str, subprocess.Popen] = {}
        self.prom_port = 0
        self.cluster = None

    @property
    def prometheus(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}"

    @property
    def scontrol(self) -> str:
        return shlex.join(self.cluster.scontrol_argv)

    def query(self, expr: str) -> list:
        import urllib.parse

        return http_json(
            f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        )["data"]["result"]

    def hetpatrol(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*HETPATROL, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "NO_COLOR": "1"},
        )


@contextlib.contextmanager
def fleet_stack(tmp: Path):
    """The cluster of this module's docstring, running until the block ends: the real
    slurmctld/slurmd, Prometheus and the four daemons (tests/record_cluster_sample.py
    records it into fixtures/cluster/mixed)."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        _fail_or_skip(f"not installed: {', '.join(missing)}")
    if os.geteuid() != 0:
        _fail_or_skip("the Slurm test cluster runs SlurmUser=root: run as root")
    prometheus = tool("prometheus")
    e = Env(tmp)
    try:
        e.cluster = start_cluster(extra_conf=EXTRA_CONF)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    penv = dict(os.environ, XDG_STATE_HOME=str(tmp / "xdg"), PYTHONUNBUFFERED="1")
    daemons = {
        "hp-gpu01": _leaky(make_replay(tmp / "a100x8", 8, node="hp-gpu01")),
        "gn001": NODES / "sick-mixed",
        "an01": NODES / "ascend-a3-only",
        "ghost01": NODES / "ascend-dcmi-error",
    }
    targets = []
    try:
        for node, replay in daemons.items():
            port = free_port()
            log = open(tmp / f"{node}.log", "w")  # noqa: SIM115
            cmd = [*HETPATROL, "run", "--replay", str(replay), "--node", node]
            cmd += ["--listen", f"127.0.0.1:{port}", "--interval", "1"]
            cmd += ["--jsonl-path", str(tmp / f"{node}.jsonl")]
            cmd += ["--state-path", str(tmp / f"{node}.state.json")]
            proc = subprocess.Popen(cmd, env=penv, stdout=log, stderr=subprocess.STDOUT)
            e.procs.append(proc)
            e.daemons[node] = proc
            log.close()
            targets.append({"targets": [f"127.0.0.1:{port}"], "labels": {"node": node}})
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "hetpatrol",
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "static_configs": targets,
                },
                {  # the README's relabel: node = the host of the target address
                    "job_name": "relabel-check",
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "static_configs": [
                        {"targets": [targets[0]["targets"][0].replace("127.0.0.1", "localhost")]}
                    ],
                    "relabel_configs": [RELABEL],
                },
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        e.prom_port = free_port()
        log = open(tmp / "prometheus.log", "w")  # noqa: SIM115
        e.procs.append(
            subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{e.prom_port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        log.close()
        wait(lambda: http_text(f"{e.prometheus}/-/ready"), what="prometheus ready")
        wait(
            lambda: (
                {s["metric"]["node"] for s in e.query('hetpatrol_card_info{job="hetpatrol"}')}
                == {"hp-gpu01", "gn001", "an01"}
                and len(e.query('hetpatrol_patrol_ready{job="hetpatrol"} == 1')) == 4
            ),
            what="cards of both card nodes scraped, all daemons ready",
        )
        c = e.cluster
        c.scontrol("update", "NodeName=gn002", "State=DRAIN", f"Reason={ADMIN_REASON}")
        c.scontrol("update", "NodeName=an01", "State=DRAIN", f"Reason={HP_REASON}")
        c.run(
            "sbatch",
            "-w",
            "hp-gpu01",
            "-p",
            "debug",
            "--gres=gpu:a100:2",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 600",
        )
        wait(
            lambda: "GresUsed=gpu:a100:2" in c.scontrol("-d", "-o", "show", "node", "hp-gpu01"),
            what="the job holds 2 A100s",
        )
        yield e
    finally:
        for proc in reversed(e.procs):
            stop(proc)
        if e.cluster is not None:
            e.cluster.run("scancel", "--full", "-u", "root", check=False)
            e.cluster.stop()
            shutil.rmtree(e.cluster.root, ignore_errors=True)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with fleet_stack(tmp_path_factory.mktemp("fleetreal")) as e:
        yield e


def _cls(doc: dict, vendor: str, card_type: str) -> dict:
    (found,) = [c for c in doc["classes"] if (c["vendor"], c["card_type"]) == (vendor, card_type)]
    return found


def _part(cls: dict, name: str) -> dict:
    (found,) = [p for p in cls["partitions"] if p["partition"] == name]
    return found


def test_fleet_json_joins_live_slurm_with_live_metrics(env):
    out = env.hetpatrol(
        "fleet", "--prometheus", env.prometheus, "--scontrol", env.scontrol, "--json"
    )
    assert out.returncode == 2, out.stderr  # gn001 has critical cards
    doc = json.loads(out.stdout)
    assert doc["sources"]["slurm"] == "text"  # Slurm 22.05: scontrol has no --json
    assert doc["nodes"] == 5  # hp-gpu01 gn001 gn002 an01 + ghost01 (Prometheus only)
    assert [(c["vendor"], c["card_type"], c["gres"]) for c in doc["classes"]] == [
        ("ascend", "910_93", "ascend"),
        ("ascend", "910b", "ascend"),
        ("nvidia", "a100", "gpu"),
    ]
    a100 = _cls(doc, "nvidia", "a100")
    # Slurm: 8 (hp-gpu01) + 4 + 4 (gn[001-002]); daemons: 8 + 4 (sick-mixed: GPUs 0-2 read,
    # GPU 3 lost from the bus, its type unknown: counted under the node's only NVIDIA class)
    assert a100["cards_slurm"] == 16
    assert a100["cards_seen"] == 12
    # sick-mixed: GPU 1 remapped rows pending, GPU 3 lost -> critical; the rest ok
    assert a100["health"] == {"ok": 10, "warning": 0, "critical": 2, "unknown": 0}
    assert a100["nodes"] == 3  # gn002 counted once though in two partitions
    debug = _part(a100, "debug")
    assert (debug["allocated"], debug["idle"]) == (2, 6)  # GresUsed=gpu:a100:2(IDX:0-1)
    mixed = _part(a100, "mixed")
    assert [b["hosts"] for b in mixed["batches"]] == ["gn[001-002]"]
    assert (mixed["nodes"], mixed["cards_slurm"], mixed["cards_seen"]) == (2, 8, 4)
    assert (mixed["drained_other"], mixed["drained_hetpatrol"], mixed["silent"]) == (1, 0, 1)
    assert _part(a100, "spare")["hosts"] == "gn002"
    # versions: driver 555.42.02 and VBIOS 92.00.9E.00.02 on both A100 nodes
    # (sick-mixed nvidia-smi -q; make_replay copies its GPU 0)
    assert a100["versions"] == [
        {"driver_version": "555.42.02", "firmware_version": "92.00.9E.00.02", "nodes": 2}
    ]
    npu = _cls(doc, "ascend", "910b")
    assert (npu["cards_slurm"], npu["cards_seen"]) == (8 + 16 + 8, 16)
    assert npu["health"]["critical"] == 1  # sick-mixed NPU 5: Health "Alarm"
    npu_part = _part(npu, "npu")  # an01: 910b registered, none found, drained by us
    assert (npu_part["cards_slurm"], npu_part["cards_seen"]) == (8, 0)
    assert npu_part["drained_hetpatrol"] == 1
    a3 = _cls(doc, "ascend", "910_93")  # an01's 16 chips: Slurm registers none of them
    assert (a3["cards_slurm"], a3["cards_seen"], a3["health"]["ok"]) == (0, 16, 16)
    assert a3["versions"] == [{"driver_version": "24.1.rc3.5", "firmware_version": "", "nodes": 1}]
    # npu-smi versions: 25.0.rc1.1 (healthy-mixed, copied by make_replay), 25.2.0 (sick)
    assert {(v["driver_version"], v["nodes"]) for v in npu["versions"]} == {
        ("25.0.rc1.1", 1),
        ("25.2.0", 1),
    }
    assert doc["slurm_only"] == {"nodes": 1, "hosts": "gn002", "with_card_gres": "gn002"}
    assert doc["prometheus_only"] == {"nodes": 1, "hosts": "ghost01"}


def test_fleet_table_names_batches_and_missing_nodes(env):
    out = env.hetpatrol("fleet", "--prometheus", env.prometheus, "--scontrol", env.scontrol)
    assert out.returncode == 2, out.stderr
    text = out.stdout
    assert "\x1b[" not in text  # NO_COLOR / not a terminal
    lines = text.splitlines()
    header = lines[0].split()
    assert header[:8] == ["class", "/", "partition", "/", "nodes", "nodes", "slurm", "seen"]
    rows = [line.split() for line in lines if line.strip().startswith("gn[001-002]")]
    # first the ascend 910b block (8 NPUs registered per node, sick-mixed reads 8), then a100
    assert [r[1:4] for r in rows] == [["2", "16", "8"], ["2", "8", "4"]]
    assert "in Slurm, not in Prometheus: 1 node: gn002" in text
    assert "in Prometheus, not in Slurm: 1 node: ghost01" in text
    assert text.rstrip().endswith("fleet: 5 nodes, CRITICAL (exit 2)")


def test_fleet_prometheus_unreachable_is_unknown(env):
    out = env.hetpatrol(
        "fleet", "--prometheus", f"http://127.0.0.1:{free_port()}", "--scontrol", env.scontrol
    )
    assert out.returncode == 3
    assert "hetpatrol fleet: http://127.0.0.1:" in out.stderr
    assert "Connection refused" in out.stderr


def test_sinfo_json_and_scontrol_text_agree(env):
    """Slurm 22.05's `sinfo --json` (openapi v0.0.38) and `scontrol -d -o show node` read
    into the same nodes: the JSON parser is checked against the real program too."""
    from hetpatrol.cluster.slurm_nodes import parse_nodes_json, parse_nodes_text

    c = env.cluster
    js = parse_nodes_json(c.run("sinfo", "--json").stdout)
    txt = parse_nodes_text(c.scontrol("-d", "-o", "show", "node"))
    assert sorted(js, key=lambda n: n.name) == sorted(txt, key=lambda n: n.name)
    an01 = next(n for n in txt if n.name == "an01")
    assert an01.drained_by_hetpatrol and an01.reason == HP_REASON
    gn002 = next(n for n in txt if n.name == "gn002")
    assert gn002.partitions == ("mixed", "spare") and gn002.drained
    assert not gn002.drained_by_hetpatrol


def test_audit_slurm_live_with_prometheus(env):
    """audit-slurm on the running cluster (scontrol show config / partition / node) and
    the daemons' cards: hp-gpu01 and gn001 register what their daemons found (gn001's
    lost GPU is still a GPU found), an01 registers the wrong type and count."""
    out = env.hetpatrol(
        "audit-slurm",
        "--scontrol",
        env.scontrol,
        "--prometheus",
        env.prometheus,
        "--gres-conf",
        str(env.cluster.gres_conf),
        "--json",
    )
    assert out.returncode == 2, out.stderr
    doc = json.loads(out.stdout)
    vs = [f for f in doc["findings"] if f["check"] == "gres_vs_daemons"]
    errors = [f for f in vs if f["severity"] == "error"]
    assert [f["where"] for f in errors] == ["node an01"]
    assert errors[0]["message"] == (
        "an01: ascend:910_93: Gres= 0, daemons found 16; ascend:910b: Gres= 8, daemons found 0"
    )
    assert errors[0]["fix"].startswith("Gres=ascend:910_93:16")
    warn = [f for f in vs if f["severity"] == "warning"]
    assert warn and warn[0]["where"] == "node ghost01"
    layouts = doc["layouts"]
    assert layouts == {
        "debug": "mixed nodes",
        "mixed": "mixed nodes",
        "npu": "one card class",  # the daemon finds 910_93 only
        "spare": "mixed nodes",
    }
    runtime = [
        (f["severity"], f["where"], f["message"])
        for f in doc["findings"]
        if f["check"] == "mixed_node" and f["where"].startswith("node ")
    ]
    assert runtime == [
        (
            "error",
            "node hp-gpu01",
            "hp-gpu01: CUDA and CANN runtimes are not kept apart (daemon finding "
            "library_path_mix): a job loads the other vendor's libraries",
        ),
        ("info", "node gn002", "1 node without daemon metrics: runtime isolation not checked"),
    ]
    checks = {(f["check"], f["severity"]) for f in doc["findings"]}
    # the test cluster runs TaskPlugin=task/none: jobs are not confined to their cards
    assert ("confinement", "error") in checks
    # no HealthCheckProgram in the test slurm.conf
    assert ("healthcheck", "warning") in checks


def test_fleet_from_saved_json_equals_the_text_path(env, tmp_path):
    """`--slurm-nodes FILE` with the real `sinfo --json` of this cluster (Slurm 22.05's
    openapi v0.0.38 document): the JSON path gives the same fleet as scontrol's text."""
    saved = tmp_path / "nodes.json"
    saved.write_text(env.cluster.run("sinfo", "--json").stdout)
    by_json = env.hetpatrol(
        "fleet", "--prometheus", env.prometheus, "--slurm-nodes", str(saved), "--json"
    )
    by_text = env.hetpatrol(
        "fleet", "--prometheus", env.prometheus, "--scontrol", env.scontrol, "--json"
    )
    assert (by_json.returncode, by_text.returncode) == (2, 2), by_json.stderr
    a, b = json.loads(by_json.stdout), json.loads(by_text.stdout)
    assert a["sources"]["slurm"] == f"file {saved}"
    for doc in (a, b):
        del doc["generated_at"], doc["sources"]
    assert a == b


def test_a_stopped_daemon_is_listed_silent(env):
    """Runs last (it stops ghost01's daemon): once Prometheus scrapes `up == 0` for it,
    fleet lists it as silent (it stays listed as not in Slurm)."""
    stop(env.daemons["ghost01"])
    wait(
        lambda: [s for s in env.query('up{node="ghost01"} == 0')],
        what="Prometheus sees ghost01 down",
    )
    out = env.hetpatrol(
        "fleet", "--prometheus", env.prometheus, "--scontrol", env.scontrol, "--json"
    )
    assert out.returncode == 2, out.stderr
    doc = json.loads(out.stdout)
    assert doc["silent"] == {"nodes": 1, "hosts": "ghost01"}
    assert doc["prometheus_only"] == {"nodes": 1, "hosts": "ghost01"}


def test_a_down_node_with_a_silent_daemon(env):
    """Runs after the others that read gn001: its daemon stopped (``up == 0``) and the
    node set DOWN in the real slurmctld. fleet counts its cards ``down``, not ``idle``;
    audit-slurm names its daemon silent (a warning), not its cards missing."""
    stop(env.daemons["gn001"])
    wait(
        lambda: [s for s in env.query('up{node="gn001"} == 0')],
        what="Prometheus sees gn001 down",
    )
    env.cluster.scontrol("update", "NodeName=gn001", "State=DOWN", "Reason=h31 test")
    assert "State=DOWN" in env.cluster.scontrol("-o", "show", "node", "gn001")
    out = env.hetpatrol(
        "fleet", "--prometheus", env.prometheus, "--scontrol", env.scontrol, "--json"
    )
    doc = json.loads(out.stdout)
    # gn[001-002] in mixed: gn001 4 A100 + 8 910B down, gn002 drained by an admin
    for vendor, card_type, cards in (("nvidia", "a100", 4), ("ascend", "910b", 8)):
        mixed = _part(_cls(doc, vendor, card_type), "mixed")
        assert (mixed["idle"], mixed["down"], mixed["allocated"]) == (0, cards, 0), mixed
    out = env.hetpatrol(
        "audit-slurm",
        "--scontrol",
        env.scontrol,
        "--prometheus",
        env.prometheus,
        "--gres-conf",
        str(env.cluster.gres_conf),
        "--json",
    )
    vs = [f for f in json.loads(out.stdout)["findings"] if f["check"] == "gres_vs_daemons"]
    assert [f["severity"] for f in vs if "gn001" in f["message"]] == ["warning"], vs
    (silent,) = [f for f in vs if "gn001" in f["message"]]
    assert silent["message"].startswith("gn001: daemon silent (scrape target down"), silent


def test_the_readme_relabel_gives_the_node_label(env):
    assert RELABEL == {
        "source_labels": ["__address__"],
        "regex": "([^:]+)(?::\\d+)?",
        "target_label": "node",
    }
    up = wait(lambda: env.query('up{job="relabel-check"} == 1'), what="relabel job scraped")
    assert up[0]["metric"]["node"] == "localhost"
