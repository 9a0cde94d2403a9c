"""`hetpatrol audit-slurm` on the recorded site gres.conf files (read in place from
../shared/vendor-samples/slurm/) and on slurm.conf / cgroup.conf files written here.
Every expected finding below was worked out by hand from the files.

The live audit (scontrol show config / partition / node + the daemons' cards in a real
Prometheus) runs in test_fleet_real.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import HETPATROL, samples_dir

from hetpatrol.cluster.audit import AuditInput, audit
from hetpatrol.cluster.fleet import DaemonNode
from hetpatrol.cluster.slurm_conf import parse_slurm_conf
from hetpatrol.config import load_config
from hetpatrol.slurm.gres import parse_gres_conf


def _write(tmp: Path, name: str, lines: list[str]) -> Path:
    path = tmp / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(conf: Path, gres: Path | None = None, cgroup: dict | None = None, daemons=None):
    return audit(
        AuditInput(
            conf=parse_slurm_conf(conf),
            gres_conf=parse_gres_conf(gres.read_text()) if gres else None,
            gres_conf_path=str(gres) if gres else "gres.conf",
            cgroup=cgroup,
            cgroup_path="cgroup.conf",
            daemons=daemons,
            profiles=load_config().profiles,
        )
    )


def _found(report, *checks: str) -> list[tuple[str, str, str]]:
    return sorted(
        (f.check, f.severity, f.where) for f in report.findings if not checks or f.check in checks
    )


def test_minimal_untyped_site(tmp_path):
    """gres.conf.site-minimal-untyped.conf: `Name=gpu File=/dev/nvidia[0-9]` (10 GPUs,
    no type). One card class: untyped is a warning, and the counts agree (10 = 10)."""
    gres = samples_dir("slurm") / "gres.conf.site-minimal-untyped.conf"
    conf = _write(
        tmp_path,
        "slurm.conf",
        [
            "ClusterName=shine",
            "GresTypes=gpu",
            "TaskPlugin=task/affinity",
            "HealthCheckProgram=/usr/local/sbin/hetpatrol-healthcheck",
            "HealthCheckInterval=60",
            "Prolog=/etc/slurm/prolog.d/hetpatrol-check.sh",
            "NodeName=gpu[01-02] Gres=gpu:10 State=UNKNOWN",
            "PartitionName=gpu Nodes=gpu[01-02] Default=YES",
        ],
    )
    report = _run(conf, gres)
    # sorted: the order of the two paths depends on where the checkout and ../shared are
    assert _found(report) == sorted(
        [
            ("accounting", "warning", str(conf)),  # AccountingStorageType not set
            ("confinement", "error", f"{conf}:3"),  # TaskPlugin=task/affinity
            ("untyped_gres", "warning", f"{conf}:7"),
            ("untyped_gres", "warning", f"{gres}:1"),
        ]
    )
    assert report.layouts == {"gpu": "one card class"}
    node_line = next(f for f in report.findings if f.where == f"{conf}:7")
    assert node_line.message.startswith("gpu[01-02]: GRES gpu has no type")
    assert report.exit_code == 2


def test_multinode_typed_site(tmp_path):
    """gres.conf.site-multinode-typed.conf: gnode[1-2] 4 x m2070q, viznode1 gtx970 +
    gtx1060, viznode2 rtx2080, gnode9 4 x v100. The slurm.conf written here registers
    gnode9 with 2 V100 and gives viznode1 no Features."""
    gres = samples_dir("slurm") / "gres.conf.site-multinode-typed.conf"
    types = ["m2070q", "gtx970", "gtx1060", "rtx2080", "v100"]
    conf = _write(
        tmp_path,
        "slurm.conf",
        [
            "GresTypes=gpu",
            "AccountingStorageTRES=gres/gpu," + ",".join(f"gres/gpu:{t}" for t in types),
            "TaskPlugin=task/cgroup,task/affinity",
            "HealthCheckProgram=/usr/local/sbin/hetpatrol-healthcheck",
            "HealthCheckInterval=0",
            "NodeName=gnode[1-2] Gres=gpu:m2070q:4 Features=m2070q",
            "NodeName=viznode1 Gres=gpu:gtx970:1,gpu:gtx1060:1",
            "NodeName=viznode2 Gres=gpu:rtx2080:1 Features=rtx2080",
            "NodeName=gnode9 Gres=gpu:v100:2 Features=v100",
            'PartitionName=all Nodes=ALL Default=YES TRESBillingWeights="CPU=1.0,GRES/gpu=2.0"',
            "PartitionName=viz Nodes=viznode[1-2]",
        ],
    )
    report = _run(conf, gres)
    assert _found(
        report, "gres_conf_count", "node_features", "billing", "healthcheck", "prolog"
    ) == [
        ("billing", "warning", f"{conf}:10"),  # billing weighs untyped gres/gpu only
        # gnode9: 4 V100 lines, 2 configured: slurmd ignores the extra 2 (a warning)
        ("gres_conf_count", "warning", f"{conf}:9"),
        ("healthcheck", "warning", f"{conf}:5"),  # HealthCheckInterval=0
        ("node_features", "warning", f"{conf}:10"),  # partition all
        ("node_features", "warning", f"{conf}:11"),  # partition viz
        ("prolog", "info", str(conf)),  # no Prolog
    ]
    count = next(f for f in report.findings if f.check == "gres_conf_count")
    assert count.message.startswith("gnode9: gres.conf gives 2 gpu more than the 2 slurm.conf")
    feats = [f.message for f in report.findings if f.check == "node_features"]
    assert "no node feature tells viznode1 (gtx1060,gtx970) apart" in feats[0]
    assert report.layouts == {
        "all": "one vendor, several card types (features)",
        "viz": "one vendor, several card types (features)",
    }
    assert not [f for f in report.findings if f.check in ("untyped_gres", "gres_types")]
    # task/cgroup, but no cgroup.conf read: ConstrainDevices defaults to no (confinement)
    assert _found(report, "confinement") == [("confinement", "error", "cgroup.conf")]
    assert report.exit_code == 2


def test_manpage_examples_gres_types_and_untyped_lines(tmp_path):
    """gres.conf.schedmd-manpage-examples.conf uses the names gpu, mps and bandwidth;
    GresTypes=gpu lists one of them."""
    gres = samples_dir("slurm") / "gres.conf.schedmd-manpage-examples.conf"
    conf = _write(
        tmp_path,
        "slurm.conf",
        [
            "GresTypes=gpu",
            "NodeName=tux[0-15] Gres=gpu:4,bandwidth:lustre:4G",
            "PartitionName=batch Nodes=tux[0-15]",
        ],
    )
    report = _run(conf, gres)
    (types,) = [f for f in report.findings if f.check == "gres_types"]
    assert (types.severity, types.where) == ("error", f"{conf}:1")
    assert types.message == (f"GresTypes does not list bandwidth, mps (used at {conf}:2, {gres}:8)")
    assert types.fix == "GresTypes=bandwidth,gpu,mps"
    untyped = _found(report, "untyped_gres")
    # one vendor (NVIDIA) under gpu: an untyped request gets some NVIDIA type, a warning
    # the untyped gres.conf lines (27, 28, 29, 37, 45) are all read under AutoDetect (the
    # global nvml of line 5, and line 43's tux[0-7] nvml after line 37's tux3 off):
    # their types come from NVML (gres.conf(5) AutoDetect), not a finding
    assert untyped == [("untyped_gres", "warning", f"{conf}:2")]


MIXED = [
    "GresTypes=gpu,ascend",
    "TaskPlugin=task/affinity",
    "AccountingStorageTRES=gres/gpu",
    "HealthCheckProgram=/usr/sbin/nhc",
    "HealthCheckInterval=300",
    "NodeName=DEFAULT CPUs=64 RealMemory=512000",
    "NodeName=gn[001-004] Gres=gpu:a100:8 Features=a100",
    "NodeName=an[01-04] Gres=ascend:910b:8 Features=910b",
    "NodeName=mx01 Gres=gpu:a100:4,ascend:910b:4",
    "PartitionName=gpu Nodes=gn[001-004]",
    "PartitionName=npu Nodes=an[01-04]",
    'PartitionName=all Nodes=gn[001-004],an[01-04] TRESBillingWeights="CPU=1.0,GRES/gpu=2.0"',
    "PartitionName=mixed Nodes=mx01",
]


def test_mixed_cluster_layouts_isolation_and_tres(tmp_path):
    conf = _write(tmp_path, "slurm.conf", MIXED)
    report = _run(conf, cgroup={"constraincores": "yes", "constraindevices": "no"})
    assert report.layouts == {
        "all": "several vendors (features)",
        "gpu": "one card class",
        "mixed": "mixed nodes",
        "npu": "one card class",
    }
    checks = ("mixed_node", "confinement", "accounting", "billing", "healthcheck", "prolog")
    assert _found(report, *checks) == sorted(
        [
            ("prolog", "info", str(conf)),  # no Prolog
            ("healthcheck", "warning", f"{conf}:4"),  # nhc, not hetpatrol
            # TaskPlugin=task/affinity and ConstrainDevices=no: one finding
            ("confinement", "error", f"{conf}:2"),
            ("mixed_node", "warning", "node mx01"),
            ("billing", "warning", f"{conf}:12"),  # billing: untyped GRES/gpu only
            ("accounting", "warning", str(conf)),  # AccountingStorageType not set
        ]
    )
    (acct,) = [f for f in report.findings if f.check == "accounting"]
    assert acct.message.endswith(
        "AccountingStorageTRES must name gres/ascend,gres/ascend:910b,gres/gpu,gres/gpu:a100"
    )
    (conf_f,) = [f for f in report.findings if f.check == "confinement"]
    assert "TaskPlugin=task/affinity has no task/cgroup" in conf_f.message
    assert "cgroup.conf: ConstrainDevices=no, not yes" in conf_f.message
    (bill,) = [f for f in report.findings if f.check == "billing"]
    assert "gres/ascend:910b,gres/gpu:a100" in bill.message
    on = [*MIXED, "AccountingStorageType=accounting_storage/slurmdbd"]
    report = _run(_write(tmp_path, "on.conf", on), cgroup={"constraindevices": "yes"})
    (acct,) = [f for f in report.findings if f.check == "accounting"]
    assert (acct.severity, acct.where) == ("warning", f"{tmp_path}/on.conf:3")
    assert acct.fix == ("AccountingStorageTRES=gres/ascend,gres/ascend:910b,gres/gpu,gres/gpu:a100")
    assert report.nodes == 9


def test_features_missing_in_a_shared_partition(tmp_path):
    lines = [ln.replace(" Features=910b", "") for ln in MIXED]
    conf = _write(tmp_path, "slurm.conf", lines)
    report = _run(conf)
    (feat,) = [f for f in report.findings if f.check == "node_features"]
    assert (feat.severity, feat.where) == ("warning", f"{conf}:12")
    assert feat.message == (
        "partition all mixes ascend and nvidia, and no node feature tells an[01-04] (910b) "
        "apart: --constraint cannot pick one"
    )
    assert feat.fix == "Features=910b on an[01-04]"


def test_ascend_under_the_gpu_name(tmp_path):
    """Ascend registered as gpu:910b beside NVIDIA gpu:a100: an untyped --gres=gpu:1 can
    land on either vendor (the profiles know 910b as an Ascend card type)."""
    conf = _write(
        tmp_path,
        "slurm.conf",
        [
            "GresTypes=gpu",
            "NodeName=gn01 Gres=gpu:a100:8 Features=a100",
            "NodeName=an01 Gres=gpu:910b:8 Features=910b",
            "PartitionName=all Nodes=gn01,an01",
        ],
    )
    report = _run(conf)
    (shared,) = [f for f in report.findings if f.check == "shared_gres_name"]
    assert (shared.severity, shared.where) == ("warning", f"{conf}:1")
    assert "GRES gpu is used by ascend and nvidia cards" in shared.message


def test_registration_against_the_daemons(tmp_path):
    conf = _write(tmp_path, "slurm.conf", MIXED)
    daemons = {
        f"gn00{i}": DaemonNode(f"gn00{i}", up=True, cards={("nvidia", "a100", "gpu"): 8})
        for i in range(1, 5)
    }
    daemons["gn004"].cards[("nvidia", "a100", "gpu")] = 7  # one card gone from the bus
    daemons["an01"] = DaemonNode("an01", up=True, cards={("ascend", "910b", "ascend"): 8})
    report = _run(conf, daemons=daemons)
    found = [f for f in report.findings if f.check == "gres_vs_daemons"]
    assert [(f.severity, f.where, f.message) for f in found] == [
        ("error", f"{conf}:7", "gn004: gpu:a100: Gres= 8, daemons found 7"),
        (
            "info",
            "nodes an[02-04],mx01",
            "4 nodes with card GRES have no daemon metrics: not compared",
        ),
    ]


def test_silent_daemon_is_not_missing_cards(tmp_path):
    """A node whose exporter is down (up == 0: no card series) or whose last patrol is
    stale is named as a silent daemon, not as a node whose cards are gone."""
    conf = _write(tmp_path, "slurm.conf", MIXED)
    daemons = {
        f"gn00{i}": DaemonNode(f"gn00{i}", up=True, cards={("nvidia", "a100", "gpu"): 8})
        for i in (1, 2, 4)
    }
    daemons["gn003"] = DaemonNode("gn003", up=False)
    for i in range(1, 5):
        daemons[f"an0{i}"] = DaemonNode(f"an0{i}", up=True, cards={("ascend", "910b", "ascend"): 8})
    daemons["an02"].silent = True  # stale: its last series still there
    daemons["an02"].cards[("ascend", "910b", "ascend")] = 3
    daemons["mx01"] = DaemonNode(
        "mx01", up=True, cards={("nvidia", "a100", "gpu"): 4, ("ascend", "910b", "ascend"): 4}
    )
    report = _run(conf, daemons=daemons)
    found = [f for f in report.findings if f.check == "gres_vs_daemons"]
    text = (
        ": daemon silent (scrape target down, last patrol stale or not ready): Gres= not "
        "compared with its cards"
    )
    assert [(f.severity, f.where, f.message) for f in found] == [
        ("warning", f"{conf}:7", "gn003" + text),
        ("warning", f"{conf}:8", "an02" + text),
    ]
    assert all("repair" not in f.fix for f in found)


def test_include_and_continuation(tmp_path):
    _write(tmp_path, "nodes.conf", ["NodeName=gn[01-02] \\", "  Gres=gpu:8  # untyped"])
    conf = _write(tmp_path, "slurm.conf", ["GresTypes=gpu", "Include nodes.conf"])
    parsed = parse_slurm_conf(conf)
    (node,) = parsed.nodes
    assert (node.names, node.gres_text, node.where) == (
        "gn[01-02]",
        "gpu:8",
        f"{tmp_path}/nodes.conf:1",
    )
    _write(tmp_path, "broken.conf", ["Include missing.conf"])
    assert parse_slurm_conf(tmp_path / "broken.conf").problems == [
        f"{tmp_path}/broken.conf:1: Include {tmp_path}/missing.conf: No such file or directory"
    ]


def test_a_huge_line_is_read_in_one_pass_and_values_as_slurm_quotes_them(tmp_path):
    # 100,000 names on one NodeName= line (700 KB): shlex.split grew its token a
    # character at a time (about a minute here; 3 minutes for 200,000 names)
    names = ",".join(f"n{i}" for i in range(100_000))
    _write(tmp_path, "slurm.conf", [f"NodeName={names} Gres=gpu:8 CPUs=4"])
    start = time.monotonic()
    (node,) = parse_slurm_conf(tmp_path / "slurm.conf").nodes
    assert time.monotonic() - start < 10
    assert (node.names, node.gres_text) == (names, "gpu:8")
    # parse_config.c _keyvalue_regex: a double-quoted value whole, no shell quoting
    _write(tmp_path, "q.conf", ['NodeName=q1 Reason="fan broken" Features=it\'s CPUs=2'])
    (node,) = parse_slurm_conf(tmp_path / "q.conf").nodes
    assert node.fields["reason"] == "fan broken" and node.features == ("it's",)


def test_cli_text_and_json(tmp_path):
    conf = _write(tmp_path, "slurm.conf", MIXED)
    _write(tmp_path, "cgroup.conf", ["ConstrainDevices=yes"])
    base = [*HETPATROL, "audit-slurm", "--slurm-conf", str(conf)]
    out = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    doc = json.loads(out.stdout)
    # cgroup.conf beside slurm.conf was read: ConstrainDevices=yes, only TaskPlugin is wrong
    iso = [
        (f["severity"], f["where"], f["message"])
        for f in doc["findings"]
        if f["check"] == "confinement"
    ]
    assert iso == [
        (
            "error",
            f"{conf}:2",
            "jobs are not confined to their cards on an[01-04],gn[001-004],mx01 (9 nodes): "
            "TaskPlugin=task/affinity has no task/cgroup: a job can open every card's device",
        )
    ]
    text = subprocess.run(base, capture_output=True, text=True, timeout=60).stdout
    assert f"ERROR   confinement       {conf}:2" in text
    assert "        fix: TaskPlugin=task/cgroup,task/affinity in slurm.conf and " in text
    assert text.rstrip().endswith("(exit 2)")


def test_cli_missing_file_is_exit_3(tmp_path):
    out = subprocess.run(
        [*HETPATROL, "audit-slurm", "--slurm-conf", str(tmp_path / "nope.conf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 3
    assert "nope.conf" in out.stderr


@pytest.mark.parametrize("value", ["task/cgroup", "task/affinity,task/cgroup"])
def test_task_cgroup_accepted(tmp_path, value):
    lines = [ln if not ln.startswith("TaskPlugin") else f"TaskPlugin={value}" for ln in MIXED]
    report = _run(_write(tmp_path, "slurm.conf", lines), cgroup={"constraindevices": "yes"})
    assert _found(report, "mixed_node", "confinement") == [("mixed_node", "warning", "node mx01")]


def test_live_nodes_grouped_and_matched_by_host_name():
    """Without NodeName lines (scontrol show config) the nodes come from scontrol show
    node: findings name them as a host list; a daemon keyed by NodeHostName matches."""
    from hetpatrol.cluster.slurm_conf import SlurmConf
    from hetpatrol.cluster.slurm_nodes import parse_nodes_text

    live = parse_nodes_text(
        "NodeName=gn001 NodeHostName=gn001.site State=IDLE Gres=gpu:a100:8 Partitions=p\n"
        "NodeName=gn002 NodeHostName=gn002.site State=IDLE Gres=gpu:a100:8 Partitions=p\n"
        "NodeName=gn003 State=IDLE Gres=gpu:8 Partitions=p\n"
    )
    daemons = {
        f"{n}.site": DaemonNode(f"{n}.site", up=True, cards={("nvidia", "a100", "gpu"): 4})
        for n in ("gn001", "gn002")
    }
    report = audit(
        AuditInput(
            conf=SlurmConf(source="scontrol show config"),
            live_nodes=live,
            daemons=daemons,
            profiles=load_config().profiles,
        )
    )
    vs = [(f.severity, f.where, f.message) for f in report.findings if f.check == "gres_vs_daemons"]
    assert vs == [
        ("error", "nodes gn[001-002]", "gn[001-002]: gpu:a100: Gres= 8, daemons found 4"),
        ("info", "node gn003", "1 node with card GRES has no daemon metrics: not compared"),
    ]
    (untyped,) = [f for f in report.findings if f.check == "untyped_gres"]
    assert (untyped.severity, untyped.where) == ("warning", "node gn003")


def test_mixed_node_runtimes_from_the_daemons(tmp_path):
    conf = _write(tmp_path, "slurm.conf", MIXED)
    mx = DaemonNode("mx01", up=True, cards={("nvidia", "a100", "gpu"): 4})
    mx.cards[("ascend", "910b", "ascend")] = 4
    mx.node_findings = {"global_ld_library_path", "gres_mismatch"}
    report = _run(conf, cgroup={"constraindevices": "yes"}, daemons={"mx01": mx})
    (leak,) = [f for f in report.findings if f.check == "mixed_node" and "runtimes" in f.message]
    assert leak.where == "node mx01"
    assert "(daemon finding global_ld_library_path)" in leak.message
    report = _run(conf, cgroup={"constraindevices": "yes"}, daemons={})
    assert [(f.severity, f.where) for f in report.findings if f.check == "mixed_node"] == [
        ("warning", "node mx01"),
        ("info", "node mx01"),  # no daemon: runtimes not checked
    ]


def test_unreadable_gres_line_is_an_error(tmp_path, monkeypatch):
    import hetpatrol.cluster.slurm_conf as sc

    real = sc.parse_gres

    def strict(text):
        if text and "X" in text:
            raise ValueError(f"GRES item 'gpu:a100:X': not name[:type][:count] in {text!r}")
        return real(text)

    monkeypatch.setattr(sc, "parse_gres", strict)
    conf = _write(
        tmp_path,
        "slurm.conf",
        ["GresTypes=gpu", "NodeName=gn01 Gres=gpu:a100:X", "NodeName=gn02 Gres=gpu:a100:8"],
    )
    report = _run(conf)
    (bad,) = [f for f in report.findings if f.check == "gres_syntax"]
    assert (bad.severity, bad.where) == ("error", f"{conf}:2")
    assert bad.message.startswith("Gres= cannot be read: GRES item 'gpu:a100:X'")
    assert report.nodes == 2  # gn01 kept, without GRES


@pytest.mark.parametrize(
    ("sample", "gres", "count_findings"),
    [
        # AutoDetect=nvml and no Name= line: the counts come from NVML, nothing to compare
        ("gres.conf.site-autodetect-nvml.conf", "gpu:titanxp:1", []),
        # one Orin GPU through its DRM render node: File= counts 1
        ("gres.conf.site-jetson-orin-dri.conf", "gpu:orin:1", []),
        (
            "gres.conf.site-jetson-orin-dri.conf",
            "gpu:orin:2",
            ["slurm.conf configures 2 gpu, gres.conf gives 1 of them"],
        ),
    ],
)
def test_single_node_site_files(tmp_path, sample, gres, count_findings):
    conf = _write(
        tmp_path,
        "slurm.conf",
        ["GresTypes=gpu", f"NodeName=n01 Gres={gres}", "PartitionName=p Nodes=n01"],
    )
    report = _run(conf, samples_dir("slurm") / sample)
    found = [f.message for f in report.findings if f.check == "gres_conf_count"]
    assert [m.split(": slurmctld")[0].removeprefix("n01: ") for m in found] == count_findings
    assert report.layouts == {"p": "one card class"}
    assert not [f for f in report.findings if f.check in ("untyped_gres", "gres_types")]


def test_partitions_of_nodesets(tmp_path):
    """Partition Nodes= naming NodeSets (by Nodes= and by Feature=), slurm.conf(5)."""
    conf = _write(
        tmp_path,
        "slurm.conf",
        [
            "GresTypes=gpu,ascend",
            "NodeName=gn[01-02] Gres=gpu:a100:8 Features=a100",
            "NodeName=an[01-02] Gres=ascend:910b:8",
            "NodeSet=npus Nodes=an[01-02]",
            "NodeSet=a100s Feature=a100",
            "PartitionName=gpu Nodes=a100s",
            "PartitionName=all Nodes=a100s,npus",
        ],
    )
    report = _run(conf)
    assert report.layouts == {"all": "several vendors (features)", "gpu": "one card class"}
    (feat,) = [f for f in report.findings if f.check == "node_features"]
    assert (feat.where, feat.fix) == (f"{conf}:7", "Features=910b on an[01-02]")
