"""``hetpatrol ledger spans``: jobs whose nodes held different card classes, from sacct
lines and the nodes' GRES of a recorded ``scontrol show node`` (Slurm 17.11, 4 nodes:
nodea-01 gpu:m60:8, nodebbbb-002 gpu:rtx2080:4, nodecc-04 no GRES, noded gpu:quadro:1
and vmem:2G)."""

from __future__ import annotations

import json

from conftest import samples_dir

from hetpatrol.cli import main
from hetpatrol.ledger.sacct_stream import parse_lines
from hetpatrol.ledger.slurm_state import node_gres_types
from hetpatrol.ledger.spans import spanning_jobs


def line(job, nodes, tres, user="u", account="a", partition="p") -> str:
    """One ``sacct -P -n -X -D -o <FIELDS>`` line (the ledger's field order)."""
    return "|".join([job, job, user, account, partition, "normal", nodes,
                     "2026-01-01T09:30:00", "2026-01-01T10:00:00", "2026-01-01T11:00:00",
                     "3600", "COMPLETED", tres])  # fmt: skip


SACCT = [
    line("101", "nodea-01,nodebbbb-002", "cpu=8,gres/gpu=12,node=2"),  # m60 + rtx2080
    line("102", "nodea-01", "cpu=8,gres/gpu=8,node=1"),  # one node
    line("103", "nodea-01,nodecc-04", "cpu=8,gres/gpu=8,node=2"),  # nodecc-04: no cards
    line("104", "nodea-01,nodebbbb-002", "cpu=8,mem=1G,node=2"),  # no card GRES asked
    line("105", "None assigned", "cpu=8,gres/gpu=8"),  # never ran
    line("106", "nodebbbb-002,noded,nodea-01", "gres/gpu:rtx2080=4,gres/gpu=13,node=3"),
]


def node_gres():
    text = (samples_dir("slurm") / "scontrol-show-node.slurm17.11.4nodes.txt").read_text()
    return node_gres_types(text)


def test_jobs_across_card_classes():
    jobs = spanning_jobs(parse_lines(s + "\n" for s in SACCT), node_gres(), {"gpu", "ascend"})
    assert [j.job_id for j in jobs] == ["101", "106"]
    assert jobs[0].classes == (("gpu:m60", ("nodea-01",)), ("gpu:rtx2080", ("nodebbbb-002",)))
    assert jobs[1].classes == (
        ("gpu:m60", ("nodea-01",)),
        ("gpu:quadro", ("noded",)),
        ("gpu:rtx2080", ("nodebbbb-002",)),
    )
    # a GRES name no profile gives cards (vmem) is no class of its own
    assert all("vmem" not in label for j in jobs for label, _ in j.classes)


def test_ledger_spans_command(tmp_path, capsys):
    saved = tmp_path / "sacct.txt"
    saved.write_text("\n".join(SACCT) + "\n")
    scontrol = tmp_path / "scontrol"
    sample = samples_dir("slurm") / "scontrol-show-node.slurm17.11.4nodes.txt"
    scontrol.write_text(f"#!/bin/sh\ncat '{sample}'\n")
    scontrol.chmod(0o755)
    args = ["ledger", "spans", "--sacct-file", str(saved), "--scontrol", str(scontrol),
            "--start", "2026-01-01T00:00:00", "--end", "2026-01-02T00:00:00"]  # fmt: skip
    assert main(args) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        "101 user=u account=a partition=p elapsed=3600s: gpu:m60 on 1 node (nodea-01); "
        "gpu:rtx2080 on 1 node (nodebbbb-002)"
    )
    assert main([*args, "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc[1]["classes"] == {
        "gpu:m60": ["nodea-01"],
        "gpu:quadro": ["noded"],
        "gpu:rtx2080": ["nodebbbb-002"],
    }
    saved.write_text("\n".join(SACCT[1:5]) + "\n")
    assert main(args) == 0
    assert capsys.readouterr().out == "ok: no job ran on nodes of two card classes\n"
    assert main([*args, "--no-node-types"]) == 64
    assert "spans needs the nodes' GRES types" in capsys.readouterr().err
