"""One interconnect domain per training job: topology.conf leaf switches and partitions
that span card classes (hetpatrol/cluster/domains.py, in ``audit-slurm``)."""

from __future__ import annotations

import pytest

from hetpatrol.cli import main
from hetpatrol.cluster.domains import (
    Switch,
    domain_findings,
    node_table,
    parse_topology_conf,
)
from hetpatrol.cluster.slurm_conf import parse_slurm_conf
from hetpatrol.config import load_config

# topology.conf(5)'s example (Slurm man page, "Slurm's network topology configuration
# file for use with the topology/tree plugin"), as printed there
MANPAGE = """\
##################################################################
# Slurm's network topology configuration file for use with the
# topology/tree plugin
##################################################################
SwitchName=s0 Nodes=dev[0-5]
SwitchName=s1 Nodes=dev[6-11]
SwitchName=s2 Nodes=dev[12-17]
SwitchName=s3 Switches=s[0-2] LinkSpeed=100Mb/s
"""

SLURM_CONF = """\
ClusterName=mixed
GresTypes=gpu,ascend
NodeName=gn[01-04] Gres=gpu:h100:8 Features=h100
NodeName=an[01-04] Gres=gpu:a100:8
NodeName=npu[01-04] Gres=ascend:910b:8 Features=910b
NodeName=cpu[01-02]
PartitionName=all Nodes=ALL Default=YES
PartitionName=train Nodes=gn[01-04],npu[01-04]
PartitionName=nv Nodes=gn[01-02],an[01-02]
"""

TOPOLOGY = """\
# leaf switches (a site's fat tree)
SwitchName=leaf1 Nodes=gn[01-02],an[01-02] LinkSpeed=400Gb/s
SwitchName=leaf2 Nodes=gn[03-04],npu[01-02]
switchname=leaf3 nodes=npu[03-04],cpu[01-02]
SwitchName=spine Switches=leaf[1-3]
"""


def test_topology_conf_lines():
    got = parse_topology_conf(MANPAGE, "t.conf")
    assert got == [
        Switch("s0", "switch", "dev[0-5]", None, "t.conf:5"),
        Switch("s1", "switch", "dev[6-11]", None, "t.conf:6"),
        Switch("s2", "switch", "dev[12-17]", None, "t.conf:7"),
        Switch("s3", "switch", None, "s[0-2]", "t.conf:8"),
    ]
    blocks = parse_topology_conf("BlockName=b1 Nodes=n[1-4]\nBlockSizes=4,16\n")
    assert blocks == [Switch("b1", "block", "n[1-4]", None, "topology.conf:1")]
    with pytest.raises(ValueError, match=r"topology.conf:2: neither SwitchName= nor BlockName="):
        parse_topology_conf("SwitchName=s0 Nodes=a1\nNodes=a2\n")


def findings(tmp_path, topology: str | None = TOPOLOGY, conf_text: str = SLURM_CONF):
    conf_path = tmp_path / "slurm.conf"
    conf_path.write_text(conf_text)
    conf = parse_slurm_conf(conf_path)
    classes, features, parts = node_table(conf, load_config().profiles)
    switches = parse_topology_conf(topology, "topology.conf") if topology else None
    return domain_findings(switches, parts, lambda n: classes.get(n, set()), features)


def test_switches_and_partitions_spanning_card_classes(tmp_path):
    conf = tmp_path / "slurm.conf"
    got = {(f.where.replace(f"{conf}:", "slurm.conf:"), f.severity): f for f in findings(tmp_path)}
    # leaf1: H100 (feature h100) and A100 (no feature) share the GRES name gpu
    leaf1 = got[("topology.conf:2", "warning")]
    assert leaf1.check == "job_domain"
    assert leaf1.message == (
        "switch leaf1 spans card classes of one GRES name (gpu:h100 on gn[01-02]; "
        "gpu:a100 on an[01-02]) and nothing keeps a multi-node job in one class: an "
        "untyped --gres=gpu job may take nodes of each"
    )
    # leaf2: gpu and ascend, a job's GRES request picks one: no finding; leaf3 likewise
    assert not [k for k in got if k[0] in ("topology.conf:3", "topology.conf:4")]
    # partitions: all (ALL) and nv span h100 and a100 without a feature on the A100s
    assert ("slurm.conf:7", "warning") in got and ("slurm.conf:9", "warning") in got
    assert "partition all spans" in got[("slurm.conf:7", "warning")].message
    # train: gpu and ascend only
    assert not [k for k in got if k[0] == "slurm.conf:8"]
    assert len(got) == 3


def test_features_on_every_class_make_it_a_reminder(tmp_path):
    conf = SLURM_CONF.replace("Gres=gpu:a100:8\n", "Gres=gpu:a100:8 Features=a100,ib\n")
    got = findings(tmp_path, conf_text=conf)
    path = tmp_path / "slurm.conf"
    assert {(f.where.replace(f"{path}:", "slurm.conf:"), f.severity) for f in got} == {
        ("topology.conf:2", "info"),
        ("slurm.conf:7", "info"),
        ("slurm.conf:9", "info"),
    }
    leaf1 = next(f for f in got if f.where == "topology.conf:2")
    assert leaf1.message.endswith("stays in one class only if it asks --constraint=[h100|a100]")
    # a feature every node has ("ib" on both would not distinguish) is not offered
    both = conf.replace("Features=h100\n", "Features=h100,ib\n")
    leaf1 = next(f for f in findings(tmp_path, conf_text=both) if f.where == "topology.conf:2")
    assert "--constraint=[h100|a100]" in leaf1.message
    # a feature both classes carry keeps nothing apart: A100s with only "ib" -> warning
    only_ib = SLURM_CONF.replace("Gres=gpu:a100:8\n", "Gres=gpu:a100:8 Features=ib\n").replace(
        "Features=h100\n", "Features=h100,ib\n"
    )
    got = findings(tmp_path, conf_text=only_ib)
    assert next(f for f in got if f.where == "topology.conf:2").severity == "warning"


def test_audit_slurm_reads_topology_beside_slurm_conf(tmp_path, capsys):
    (tmp_path / "slurm.conf").write_text(SLURM_CONF)
    (tmp_path / "topology.conf").write_text(TOPOLOGY)
    code = main(["audit-slurm", "--slurm-conf", str(tmp_path / "slurm.conf"), "--json"])
    out = capsys.readouterr().out
    assert '"check": "job_domain"' in out and "switch leaf1 spans" in out
    assert code >= 1
    (tmp_path / "topology.conf").write_text("SwitchName=s0 Nodes=a\nLinkSpeed=1\n")
    code = main(["audit-slurm", "--slurm-conf", str(tmp_path / "slurm.conf")])
    err = capsys.readouterr().err
    assert code == 3 and "topology.conf:2: neither SwitchName= nor BlockName=" in err
