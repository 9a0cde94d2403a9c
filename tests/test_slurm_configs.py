"""``hetpatrol audit-slurm`` on real public Slurm configs (tests/slurm_configs/, sources
in its README): the exact findings per config, each judged by the man pages and, where
a rule says what a daemon does, by the daemons (test_audit_rules_daemons.py). The
health-check and Prolog advice (no config here runs hetpatrol) is left out of the lists.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hetpatrol.cluster.audit import AuditInput, audit
from hetpatrol.cluster.audit_view import parse_cgroup_conf
from hetpatrol.cluster.slurm_conf import parse_slurm_conf
from hetpatrol.config import load_config
from hetpatrol.slurm.gres import parse_gres_conf

CONFIGS = Path(__file__).parent / "slurm_configs"

EXPECTED = {
    # partitions name gpu_partition_[12] (no such node: slurmctld fatal); gres.conf is
    # for WorkerNode[12], so GPU[12] get no line (INVAL, 0 < 8) and the lines do nothing
    "2bh-ubuntu20": (
        ("partition_nodes", "error", "slurm.conf:79"),
        ("partition_nodes", "error", "slurm.conf:80"),
        ("gres_conf_count", "error", "slurm.conf:77"),
        ("gres_conf_count", "error", "slurm.conf:78"),
        ("confinement", "error", "cgroup.conf"),  # cgroup.conf without ConstrainDevices
        ("untyped_gres", "warning", "slurm.conf:77"),
        ("untyped_gres", "warning", "slurm.conf:78"),
        ("untyped_gres", "warning", "gres.conf:1"),
        ("gres_conf_nodes", "warning", "gres.conf:1"),
        ("gres_conf_nodes", "warning", "gres.conf:2"),
    ),
    # gres.conf has no Name= line (only NodeName=slurm-ctrl CPUs=2): linux1 gets 0 of 8
    "adavanisanti-ubuntu": (
        ("gres_conf_count", "error", "slurm.conf:97"),
        ("untyped_gres", "warning", "slurm.conf:97"),
    ),
    # AutoDetect=off on the line: 8 files for gpu:8; no cgroup.conf; accounting none
    "ai4city-single-node": (
        ("confinement", "error", "cgroup.conf"),
        ("untyped_gres", "warning", "slurm.conf:148"),
        ("untyped_gres", "warning", "gres.conf:3"),
        ("accounting", "warning", "slurm.conf:113"),
    ),
    # global gres.conf lines (2 A100s) on every node; pulse configures 1, five nodes 0
    "anw-sh-setup": (
        ("confinement", "error", "slurm.conf:57"),  # TaskPlugin=task/none
        ("gres_conf_count", "warning", "slurm.conf:152"),
        ("gres_conf_count", "warning", "slurm.conf:156"),
        ("gres_conf_count", "warning", "slurm.conf:157"),
        ("gres_conf_count", "warning", "slurm.conf:158"),
        ("gres_conf_count", "warning", "slurm.conf:159"),
        ("gres_conf_count", "warning", "slurm.conf:162"),
        ("accounting", "warning", "slurm.conf"),  # slurmdbd, no AccountingStorageTRES
    ),
    # CPUs=0-15,32-47 (thread ids) where Slurm reads logical cores: 2 x 16 = 32 cores
    "arlk-lambda": (
        ("confinement", "error", "slurm.conf:23"),
        ("untyped_gres", "warning", "slurm.conf:53"),
        ("untyped_gres", "warning", "gres.conf:1"),
        *(("gres_conf_cores", "warning", f"gres.conf:{n}") for n in range(1, 9)),
        ("accounting", "warning", "slurm.conf:42"),
    ),
    # typed, ConstrainDevices=yes; AutoDetect=nvidia is 24.11 (22.05: unknown flag)
    "ashaneason-hpclab3": (
        ("gres_conf_autodetect", "warning", "gres.conf:1"),
        ("accounting", "warning", "slurm.conf:19"),
    ),
    # gres.conf is for gpu25 only: gpu27, gpu[28-29] get none
    "asmh1989-gpu25": (
        ("gres_conf_count", "error", "slurm.conf:57"),
        ("gres_conf_count", "error", "slurm.conf:58"),
        ("confinement", "error", "slurm.conf:22"),
        ("untyped_gres", "warning", "slurm.conf:57"),
        ("untyped_gres", "warning", "slurm.conf:58"),
        ("untyped_gres", "warning", "slurm.conf:60"),
        ("untyped_gres", "warning", "gres.conf:2"),
        ("accounting", "warning", "slurm.conf"),
    ),
    # gpu27: Cores=48-63 on 2 x 24 cores; gpu[28-29] and gpu25 get no line
    "asmh1989-root": (
        ("gres_conf_count", "error", "slurm.conf:58"),
        ("gres_conf_count", "error", "slurm.conf:60"),
        ("confinement", "error", "slurm.conf:22"),
        ("untyped_gres", "warning", "slurm.conf:57"),
        ("untyped_gres", "warning", "slurm.conf:58"),
        ("untyped_gres", "warning", "slurm.conf:60"),
        ("untyped_gres", "warning", "gres.conf:2"),
        ("gres_conf_cores", "warning", "gres.conf:5"),
        ("accounting", "warning", "slurm.conf"),
    ),
    "biomero-local-gpu": (
        ("confinement", "error", "slurm.conf"),
        ("untyped_gres", "warning", "slurm.conf:95"),
        ("untyped_gres", "warning", "gres.conf:9"),
    ),
    # CPUs=0-3 on a node of 1 x 2 cores; a line for linux2, which is not defined
    "brdarji-ubuntu": (
        ("untyped_gres", "warning", "slurm.conf:96"),
        ("untyped_gres", "warning", "gres.conf:1"),
        ("gres_conf_nodes", "warning", "gres.conf:1"),
        ("gres_conf_cores", "warning", "gres.conf:2"),
    ),
    # untyped gres.conf lines under AutoDetect=nvml: merged, no finding
    "dragonruler-slurmdocs": (("accounting", "warning", "slurm.conf:115"),),
    # the node has no Gres=: the 3 gres.conf GPUs are ignored
    "ehb54-gpu": (
        ("gres_conf_count", "warning", "slurm.conf:110"),
        ("accounting", "warning", "slurm.conf:87"),
    ),
    # one global line Type=orin for every node: iris and nano nodes get 0 of theirs
    "homelab-heterogeneous": (
        ("gres_conf_count", "error", "slurm.conf:21"),
        ("gres_conf_count", "error", "slurm.conf:27"),
        ("confinement", "error", "slurm.conf"),
        ("gres_conf_count", "warning", "slurm.conf:30"),
        ("node_features", "warning", "slurm.conf:32"),
        ("accounting", "warning", "slurm.conf"),
    ),
    "kielhofner-docker-cuda": (),  # no GRES
    # Gres=gpu:8, one gres.conf file
    "mknoxnv-ubuntu": (
        ("gres_conf_count", "error", "slurm.conf:97"),
        ("untyped_gres", "warning", "slurm.conf:97"),
        ("untyped_gres", "warning", "gres.conf:1"),
    ),
    "nju-digital-heart": (
        ("confinement", "error", "slurm.conf"),
        ("accounting", "warning", "slurm.conf"),
    ),
    "openqse-qfw": (),  # qpu: no card
    "reversesage-ubuntu2004": (
        ("confinement", "error", "cgroup.conf"),
        ("untyped_gres", "warning", "slurm.conf:97"),
        ("untyped_gres", "warning", "gres.conf:2"),
    ),
    # the dev overlay's slac.conf defines fewer nodes than its gres.conf names
    # Slurm's own testsuite (test7.17): lower-case Nodename=/gres= keys, DEFAULT lines,
    # Cores=[a-b]. 4 logical cores (2 x 2): Cores=[4-7] names cores slurmctld does not
    # have (gres.c _node_config_validate: "NOTE: gres_slurmd_conf->cpus is cores",
    # bit_alloc(core_cnt)); test7.17's own program accepts it, for it checks against 8
    # CPUs without slurmd's abstract-to-machine conversion
    "schedmd-test7.17.1": (
        ("confinement", "error", "slurm.conf"),
        ("untyped_gres", "warning", "slurm.conf:12"),
        ("untyped_gres", "warning", "gres.conf:4"),
        ("gres_conf_cores", "warning", "gres.conf:5"),
        ("accounting", "warning", "slurm.conf"),
    ),
    "schedmd-test7.17.2": (  # 8 cores (2 x 4): Cores=8-15 are the threads
        ("confinement", "error", "slurm.conf"),
        ("untyped_gres", "warning", "slurm.conf:11"),
        ("untyped_gres", "warning", "gres.conf:4"),
        ("gres_conf_cores", "warning", "gres.conf:5"),
        ("accounting", "warning", "slurm.conf"),
    ),
    "schedmd-test7.17.3": (
        ("confinement", "error", "slurm.conf"),
        ("untyped_gres", "warning", "slurm.conf:11"),
        ("untyped_gres", "warning", "gres.conf:4"),
        *(("gres_conf_cores", "warning", f"gres.conf:{n}") for n in (8, 9, 10, 11)),
        ("accounting", "warning", "slurm.conf"),
    ),
    "schedmd-test7.17.4": (
        ("confinement", "error", "slurm.conf"),
        ("untyped_gres", "warning", "slurm.conf:11"),
        ("untyped_gres", "warning", "gres.conf:4"),
        ("accounting", "warning", "slurm.conf"),
    ),
    # no GresTypes, no Gres= (test7.17 expects this one to fail)
    "schedmd-test7.17.6": (
        ("gres_types", "error", "slurm.conf"),
        ("untyped_gres", "warning", "gres.conf:4"),
        ("gres_conf_count", "warning", "slurm.conf:11"),
        ("accounting", "warning", "slurm.conf"),
    ),
    # Cores=[0-10000] (test7.17 expects this one to fail)
    "schedmd-test7.17.7": (
        ("confinement", "error", "slurm.conf"),
        ("untyped_gres", "warning", "slurm.conf:11"),
        ("untyped_gres", "warning", "gres.conf:4"),
        ("gres_conf_cores", "warning", "gres.conf:4"),
        ("gres_conf_cores", "warning", "gres.conf:5"),
        ("accounting", "warning", "slurm.conf"),
    ),
    "slaclab-dev": (
        *(("gres_conf_nodes", "warning", f"gres.conf:{n}") for n in (10, 11, 12, 17, 18, 19, 24)),
        ("accounting", "warning", "slurm.conf:125"),
        ("billing", "info", "slurm.conf"),
    ),
    # Features=GPU_SKU:V100,...: the types are told apart (no node_features)
    "slaclab-prod": (
        ("accounting", "warning", "slurm.conf:125"),
        ("billing", "info", "slurm.conf"),
    ),
    # global untyped lines: dgx[1-4] take 8 of 8; master (no Gres=) ignores them
    "yyuzhongpv-gpu-cluster": (
        ("untyped_gres", "warning", "slurm.conf:100"),
        ("untyped_gres", "warning", "gres.conf:1"),
        ("gres_conf_count", "warning", "slurm.conf:99"),
    ),
}


def _audit(d: Path):
    gres = d / "gres.conf"
    cgroup = d / "cgroup.conf"
    return audit(
        AuditInput(
            conf=parse_slurm_conf(d / "slurm.conf"),
            gres_conf=parse_gres_conf(gres.read_text()) if gres.is_file() else None,
            gres_conf_path=str(gres),
            cgroup=parse_cgroup_conf(cgroup.read_text()) if cgroup.is_file() else None,
            cgroup_path=str(cgroup),
            profiles=load_config().profiles,
        )
    )


def test_every_config_is_listed():
    assert sorted(p.name for p in CONFIGS.iterdir() if p.is_dir()) == sorted(EXPECTED)
    assert len(EXPECTED) >= 20


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_findings_of_a_real_config(name):
    d = CONFIGS / name
    report = _audit(d)
    got = tuple(
        (f.check, f.severity, f.where.replace(f"{d}/", ""))
        for f in sorted(
            report.findings, key=lambda f: ("error", "warning", "info").index(f.severity)
        )
        if f.check not in ("healthcheck", "prolog")
    )
    assert got == EXPECTED[name]
