"""The audit rules one by one (hetpatrol/cluster/audit_rules/), and the issue's example
config audited as a whole. What each rule claims the daemons do is shown on the real
slurmctld/slurmd in test_audit_rules_daemons.py; the expected findings here were worked
out by hand from the files and the man pages cited in each rule module.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import HETPATROL, REPO

from hetpatrol.cluster.audit import AuditInput, audit
from hetpatrol.cluster.audit_rules import advice
from hetpatrol.cluster.audit_rules.context import feature_tokens, vendor_of_file
from hetpatrol.cluster.audit_rules.registry import RULES
from hetpatrol.cluster.slurm_conf import parse_slurm_conf
from hetpatrol.config import load_config
from hetpatrol.slurm.gres import parse_gres_conf

EXAMPLE_GRES = [
    "NodeName=node[01-20] Name=gpu Type=a100 File=/dev/nvidia[0-7]",
    "NodeName=node[21-30] Name=ascend Type=910B File=/dev/davinci[0-7]",
]
EXAMPLE_SLURM = [
    "GresTypes=gpu,ascend",
    "NodeName=node[01-20] Gres=gpu:8",
    "NodeName=node[21-30] Gres=ascend:8",
    "PartitionName=hetero Nodes=node[01-40] Default=YES MaxTime=INFINITE State=UP",
]


def _write(tmp: Path, name: str, lines: list[str]) -> Path:
    path = tmp / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _audit(tmp: Path, slurm: list[str], gres: list[str] | None = None, cgroup=None, **kw):
    conf = _write(tmp, "slurm.conf", slurm)
    gpath = _write(tmp, "gres.conf", gres) if gres is not None else None
    return audit(
        AuditInput(
            conf=parse_slurm_conf(conf),
            gres_conf=parse_gres_conf(gpath.read_text()) if gpath else None,
            gres_conf_path="gres.conf",
            cgroup=cgroup,
            profiles=load_config().profiles,
            **kw,
        )
    )


def _of(report, check: str):
    return [f for f in report.findings if f.check == check]


# the settings that keep the rules not under test quiet
QUIET = [
    "GresTypes=gpu",
    "AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:v100",
    "TaskPlugin=task/cgroup,task/affinity",
    "AccountingStorageType=accounting_storage/slurmdbd",
    "HealthCheckProgram=/usr/local/sbin/hetpatrol-check",
    "HealthCheckInterval=300",
    "Prolog=/usr/local/sbin/hetpatrol-prolog",
]
CGROUP = {"constraindevices": "yes"}


def test_every_rule_names_its_source():
    names = [r.NAME for r in RULES]
    assert len(names) == len(set(names))
    package = Path(RULES[0].__file__).parent
    helpers = {"__init__", "context", "advice", "registry", "layout"}
    modules = {p.stem for p in package.glob("*.py")} - helpers
    assert modules == {r.__name__.rsplit(".", 1)[1] for r in RULES}  # each one registered
    for rule in RULES:
        assert rule.SOURCE and rule.__doc__, rule.__name__


def test_the_example_config_says_exactly_this(tmp_path):
    """The example of the issue: node[31-40] undefined (slurmctld fatal), both GRES
    untyped while gres.conf has types, the partition mixes two vendors with no feature,
    accounting off, jobs not confined, no health check, no Prolog. Nothing else."""
    _write(tmp_path, "gres.conf", EXAMPLE_GRES)
    conf = _write(tmp_path, "slurm.conf", EXAMPLE_SLURM)
    out = subprocess.run(
        [*HETPATROL, "audit-slurm", "--slurm-conf", str(conf), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    doc = json.loads(out.stdout)
    got = [(f["check"], f["severity"], f["where"]) for f in doc["findings"]]
    assert got == [
        ("partition_nodes", "error", f"{conf}:4"),
        ("confinement", "error", str(conf)),
        ("untyped_gres", "warning", f"{conf}:3"),
        ("untyped_gres", "warning", f"{conf}:2"),
        ("node_features", "warning", f"{conf}:4"),
        ("accounting", "warning", str(conf)),
        ("healthcheck", "warning", str(conf)),
        ("prolog", "info", str(conf)),
    ]
    msg = {(f["check"], f["where"]): f["message"] for f in doc["findings"]}
    assert msg[("partition_nodes", f"{conf}:4")] == (
        "partition hetero: node[31-40] (10 nodes) defined by no NodeName line: slurmctld "
        "does not start (fatal: Invalid node names in partition hetero)"
    )
    assert "--gres=gpu:a100:1 cannot be asked" in msg[("untyped_gres", f"{conf}:2")]
    assert "--gres=ascend:910B:1 cannot be asked" in msg[("untyped_gres", f"{conf}:3")]
    assert msg[("node_features", f"{conf}:4")] == (
        "partition hetero mixes ascend and nvidia, and no node feature tells node[01-20] "
        "(a100), node[21-30] (910b) apart: --constraint cannot pick one"
    )
    assert msg[("accounting", str(conf))].startswith(
        "AccountingStorageType=(not set): accounting is off, nothing is metered per card "
        "type; when it is on, AccountingStorageTRES must name gres/ascend,gres/ascend:910b,"
        "gres/gpu,gres/gpu:a100"
    )
    assert msg[("confinement", str(conf))].startswith(
        "jobs are not confined to their cards on node[01-30] (30 nodes): "
        "TaskPlugin=(not set) has no task/cgroup; no cgroup.conf read"
    )
    fixes = {f["check"]: f["fix"] for f in doc["findings"]}
    # the entry points the packages install (packaging/slurm/), and what each runs
    assert fixes["healthcheck"] == (
        "HealthCheckProgram=/usr/libexec/hetpatrol/healthcheck (runs `hetpatrol check`), "
        "HealthCheckInterval=60, HealthCheckNodeState=ANY"
    )
    assert advice.HEALTHCHECK_PROGRAM in (REPO / "packaging/slurm/slurm.conf").read_text()
    assert fixes["prolog"] == (
        "Prolog=/usr/libexec/hetpatrol/prolog and Epilog=/usr/libexec/hetpatrol/epilog "
        "(run `hetpatrol prolog` / `hetpatrol epilog`)"
    )
    assert "`hetpatrol prolog`" in fixes["prolog"]
    assert "hetpatrol check" not in fixes["prolog"]
    text = subprocess.run(
        [*HETPATROL, "audit-slurm", "--slurm-conf", str(conf), "--color", "never"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert text.endswith(
        "partitions:\n        hetero: several vendors (features)\n\n"
        "audit: 30 nodes, 2 errors, 5 warnings, 1 note (exit 2)\n"
    )


# ------------------------------------------------------------------ partition_nodes
def test_partition_nodes_all_nodesets_and_defined_names(tmp_path):
    report = _audit(
        tmp_path,
        [
            *QUIET,
            "NodeName=gn[01-02] Gres=gpu:a100:8",
            "NodeSet=ns Nodes=gn01",
            "PartitionName=a Nodes=ALL",
            "PartitionName=b Nodes=ns,gn02",
            "PartitionName=c Nodes=gn[02-03],ns",
        ],
        cgroup=CGROUP,
    )
    (f,) = _of(report, "partition_nodes")
    assert (f.severity, f.where) == ("error", f"{tmp_path}/slurm.conf:12")
    assert f.message.startswith("partition c: gn03 (1 node) defined by no NodeName line")


# ------------------------------------------------------------------ node_features
@pytest.mark.parametrize(
    ("v100", "a100", "lacking"),
    [
        ("GPU_SKU:V100", "GPU_SKU:A100", False),  # KEY:VALUE, any case
        ("gpu_v100", "gpu_a100", False),
        ("v100-32gb", "a100-80gb", False),
        ("sm_70", "sm_80", False),  # no type named, but unique per class
        ("gpu", "gpu", True),  # the same feature on both: does not pick
        ("", "a100", True),  # V100 nodes: nothing picks them
    ],
)
def test_node_features_as_users_write_them(tmp_path, v100, a100, lacking):
    feat = lambda f: f" Features={f}" if f else ""  # noqa: E731
    report = _audit(
        tmp_path,
        [
            *QUIET,
            f"NodeName=v[01-02] Gres=gpu:v100:4{feat(v100)}",
            f"NodeName=a[01-02] Gres=gpu:a100:4{feat(a100)}",
            "PartitionName=all Nodes=ALL",
        ],
        cgroup=CGROUP,
    )
    found = _of(report, "node_features")
    assert bool(found) == lacking
    if lacking:
        assert found[0].severity == "warning"
        assert "v[01-02] (v100)" in found[0].message


def test_feature_tokens():
    assert feature_tokens("GPU_SKU:V100") == {"gpu_sku:v100", "gpu", "sku", "v100"}
    assert "a100" in feature_tokens("a100-80gb")


# ------------------------------------------------------------------ confinement
def test_confinement_on_a_single_vendor_node(tmp_path):
    """An 8-GPU node with TaskPlugin=task/none: not only mixed nodes are checked."""
    slurm = [q for q in QUIET if not q.startswith("TaskPlugin")]
    report = _audit(
        tmp_path,
        [
            *slurm,
            "TaskPlugin=task/none",
            "NodeName=gn01 Gres=gpu:a100:8",
            "PartitionName=p Nodes=gn01",
        ],
        cgroup=CGROUP,
    )
    (f,) = _of(report, "confinement")
    assert (f.severity, f.where) == ("error", f"{tmp_path}/slurm.conf:7")
    assert "TaskPlugin=task/none has no task/cgroup" in f.message
    ok = _audit(
        tmp_path,
        [*QUIET, "NodeName=gn01 Gres=gpu:a100:8", "PartitionName=p Nodes=gn01"],
        cgroup=CGROUP,
    )
    assert not _of(ok, "confinement")
    assert not ok.findings  # the quiet config is quiet


# ------------------------------------------------------------------ gres_conf_count
def test_autodetect_merges_untyped_lines(tmp_path):
    """Typed slurm.conf, untyped gres.conf lines under AutoDetect=nvml: Slurm merges the
    detected types (gres.conf(5) AutoDetect): no count finding."""
    report = _audit(
        tmp_path,
        [*QUIET, "NodeName=gn01 Gres=gpu:a100:8", "PartitionName=p Nodes=gn01"],
        ["AutoDetect=nvml", "NodeName=gn01 Name=gpu File=/dev/nvidia[0-7]"],
        cgroup=CGROUP,
    )
    assert not _of(report, "gres_conf_count")


def test_defined_card_node_without_a_gres_conf_line(tmp_path):
    report = _audit(
        tmp_path,
        [*QUIET, "NodeName=gn[01-02] Gres=gpu:a100:8", "PartitionName=p Nodes=gn[01-02]"],
        ["NodeName=gn01 Name=gpu Type=a100 File=/dev/nvidia[0-7]"],
        cgroup=CGROUP,
    )
    (f,) = _of(report, "gres_conf_count")
    assert f.severity == "error"
    assert f.message.startswith("gn02: slurm.conf configures 8 gpu, gres.conf gives 0 of them")


def test_multiple_files_counts_one_card_per_line(tmp_path):
    report = _audit(
        tmp_path,
        [*QUIET, "NodeName=gn01 Gres=gpu:a100:2", "PartitionName=p Nodes=gn01"],
        [
            "NodeName=gn01 Name=gpu Type=a100 MultipleFiles=/dev/nvidia[0-3]",
            "NodeName=gn01 Name=gpu Type=a100 MultipleFiles=/dev/nvidia[4-7]",
        ],
        cgroup=CGROUP,
    )
    assert not report.findings


# ------------------------------------------------------------------ gres.conf lines
def test_gres_conf_files_all_or_none(tmp_path):
    report = _audit(
        tmp_path,
        [*QUIET, "NodeName=gn[01-02] Gres=gpu:a100:2", "PartitionName=p Nodes=gn[01-02]"],
        [
            "NodeName=gn01 Name=gpu Type=a100 File=/dev/nvidia[0-1]",
            "NodeName=gn02 Name=gpu Type=a100 Count=2",
        ],
        cgroup=CGROUP,
    )
    (f,) = _of(report, "gres_conf_files")
    assert (f.severity, f.where) == ("warning", "gres.conf:2")
    assert "File= is given on gn01 but not on gn02" in f.message


def test_gres_conf_cores_beyond_the_node(tmp_path):
    report = _audit(
        tmp_path,
        [
            *QUIET,
            "NodeName=gn01 Sockets=2 CoresPerSocket=16 ThreadsPerCore=2 Gres=gpu:a100:2",
            "PartitionName=p Nodes=gn01",
        ],
        [
            "NodeName=gn01 Name=gpu Type=a100 File=/dev/nvidia0 Cores=0-15",
            "NodeName=gn01 Name=gpu Type=a100 File=/dev/nvidia1 Cores=16-63",
        ],
        cgroup=CGROUP,
    )
    (f,) = _of(report, "gres_conf_cores")
    assert (f.severity, f.where) == ("warning", "gres.conf:2")
    assert f.message.startswith("Cores=16-63 names core 63, but gn01 has 32 cores (0-31)")


def test_vendor_hidden_under_another_name(tmp_path):
    """Name=gpu File=/dev/davinci[0-7]: Ascend NPUs under NVIDIA's GRES name, next to
    real NVIDIA GPUs under the same name: an untyped --gres=gpu:1 can get an NPU."""
    assert vendor_of_file("/dev/davinci3") == "ascend"
    assert vendor_of_file("/dev/nvidia0") == "nvidia"
    assert vendor_of_file("/dev/davinci_manager") == ""
    report = _audit(
        tmp_path,
        [
            *QUIET,
            "NodeName=gn01 Gres=gpu:a100:8",
            "NodeName=an01 Gres=gpu:a100:8",
            "PartitionName=p Nodes=ALL",
        ],
        [
            "NodeName=gn01 Name=gpu Type=a100 File=/dev/nvidia[0-7]",
            "NodeName=an01 Name=gpu Type=a100 File=/dev/davinci[0-7]",
        ],
        cgroup=CGROUP,
    )
    (f,) = _of(report, "device_vendor")
    assert (f.severity, f.where) == ("error", "gres.conf:2")
    assert "Name=gpu Type=a100 names nvidia cards, but its File= /dev/davinci0" in f.message


def test_accounting_on_with_the_typed_tres(tmp_path):
    report = _audit(
        tmp_path,
        [
            *QUIET,
            "NodeName=gn01 Gres=gpu:a100:8",
            "PartitionName=p Nodes=gn01",
        ],
        cgroup=CGROUP,
    )
    assert not report.findings
    for value in ("", "accounting_storage/none"):
        slurm = [q for q in QUIET if not q.startswith("AccountingStorageType")]
        if value:
            slurm.append(f"AccountingStorageType={value}")
        report = _audit(
            tmp_path,
            [*slurm, "NodeName=gn01 Gres=gpu:a100:8", "PartitionName=p Nodes=gn01"],
            cgroup=CGROUP,
        )
        (f,) = _of(report, "accounting")
        assert f.message.startswith(
            f"AccountingStorageType={value or '(not set)'}: accounting is off"
        )


def test_untyped_gres_conf_lines_one_finding_per_name(tmp_path):
    report = _audit(
        tmp_path,
        [*QUIET, "NodeName=gn01 Gres=gpu:2", "PartitionName=p Nodes=gn01"],
        ["NodeName=gn01 Name=gpu File=/dev/nvidia0", "NodeName=gn01 Name=gpu File=/dev/nvidia1"],
        cgroup=CGROUP,
    )
    assert [(f.severity, f.where, f.message) for f in _of(report, "untyped_gres")] == [
        (
            "warning",
            f"{tmp_path}/slurm.conf:8",
            "gn01: GRES gpu has no type: a job cannot ask for this card class by name",
        ),
        ("warning", "gres.conf:1", "gres.conf Name=gpu without Type= (lines 1, 2)"),
    ]


def test_default_lines_continuations_frontends_and_down_nodes(tmp_path):
    """NodeName=DEFAULT values reach the lines after it, a backslash continues a line,
    FrontendName is no node line, and DownNodes of defined nodes is no finding."""
    report = _audit(
        tmp_path,
        [
            *QUIET,
            "FrontendName=fe01",
            "NodeName=DEFAULT Gres=gpu:a100:8 \\",
            "   Features=a100",
            "NodeName=gn[01-02]-ib",
            "DownNodes=gn01-ib State=DOWN Reason=bad",
            "DownNodes=gn09-ib State=DOWN Reason=gone",
            "PartitionName=p Nodes=gn[01-02]-ib",
        ],
        cgroup=CGROUP,
    )
    assert report.nodes == 2
    assert [(f.check, f.where) for f in report.findings] == [
        ("down_nodes", f"{tmp_path}/slurm.conf:13")
    ]
    assert report.layouts == {"p": "one card class"}


def test_the_example_fits_an_80_column_terminal_and_a_pipe_keeps_lines_whole(tmp_path):
    from test_status_view import run_on_pty

    _write(tmp_path, "gres.conf", EXAMPLE_GRES)
    conf = _write(tmp_path, "slurm.conf", EXAMPLE_SLURM)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    rc, out = run_on_pty(
        ["audit-slurm", "--slurm-conf", str(conf), "--color", "never"], {**env, "COLUMNS": "80"}
    )
    assert rc == 2
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    # the fatal partition error, wrapped under its own indent
    at = lines.index("ERROR   partition_nodes")  # the temp dir's path is long: below it
    assert "".join(x.strip() for x in lines[at + 1 : at + 4]).startswith(f"{conf}:4partition")
    assert "        partition hetero: node[31-40] (10 nodes) defined by no NodeName line:" in lines
    piped = subprocess.run(
        [*HETPATROL, "audit-slurm", "--slurm-conf", str(conf), "--color", "never"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    ).stdout.splitlines()
    at = piped.index(f"ERROR   partition_nodes   {conf}:4")
    assert piped[at + 1] == (
        "        partition hetero: node[31-40] (10 nodes) defined by no NodeName line: slurmctld "
        "does not start (fatal: Invalid node names in partition hetero)"
    )


def test_at_80_columns_a_long_slurm_conf_value_breaks_after_its_commas():
    """The recorded cluster's accounting fix at 80 columns (a tmux pane): the
    AccountingStorageTRES value is longer than a line and was cut inside a name
    (``AccountingStorag`` / ``eTRES=``, ``gres/gp`` / ``u:a100``); it breaks after a
    comma now, every line within 80 columns, and the pieces join back to the value."""
    from test_status_view import run_on_pty

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    replay = str(REPO / "fixtures" / "cluster" / "mixed")
    rc, out = run_on_pty(
        ["audit-slurm", "--replay", replay, "--color", "never"], {**env, "COLUMNS": "80"}
    )
    assert rc == 2
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    at = lines.index("        fix: AccountingStorageType=accounting_storage/slurmdbd,")
    assert lines[at + 1 : at + 3] == [
        "          AccountingStorageTRES=gres/ascend,gres/ascend:910_93,gres/ascend:910b,",
        "          gres/gpu,gres/gpu:a100",
    ]


def test_untyped_gres_vendor_from_its_own_name_not_the_nodes_other_gres(tmp_path):
    """A mixed node's Ascend cards sit under ``ascend``; the untyped ``gpu`` of an
    NVIDIA-only node holds NVIDIA cards alone: a warning, no two-vendor error."""
    report = _audit(
        tmp_path,
        [
            *QUIET,
            "GresTypes=gpu,ascend",
            "NodeName=gn001 Gres=gpu:h100:8,ascend:910b:8",
            "NodeName=hgx01 Gres=gpu:8",
            "PartitionName=p Nodes=gn001,hgx01",
        ],
        [
            "NodeName=gn001 Name=gpu Type=h100 File=/dev/nvidia[0-7]",
            "NodeName=gn001 Name=ascend Type=910b File=/dev/davinci[0-7]",
            "# the NVIDIA-only node",
            "NodeName=hgx01 Name=gpu File=/dev/nvidia[0-7]",
        ],
        cgroup=CGROUP,
    )
    got = [(f.severity, f.where, f.message) for f in _of(report, "untyped_gres")]
    assert got == [
        (
            "warning",
            f"{tmp_path}/slurm.conf:10",
            "hgx01: GRES gpu has no type: a job cannot ask for this card class by name",
        ),
        ("warning", "gres.conf:4", "gres.conf Name=gpu without Type="),
    ]
