"""One TRES split, three readers: ``tres.card_counts`` (``ledger efficiency``), the usage
ledger (``ledger usage``, :func:`hetpatrol.ledger.usage.aggregate`) and the capacity
report (``ledger capacity``, :func:`hetpatrol.ledger.capacity.build`) must read the same
``AllocTRES``/``ReqTRES`` string as the same cards.

Slurm's rule (slurm.conf(5) of Debian's 22.05.8, AccountingStorageTRES): "gres/gpu" counts
"allocated GPUs of any type", "gres/gpu:TYPE" only the typed ones. So per GRES name the
typed counts are the cards as recorded, and the untyped count beyond their sum is cards
of a type not tracked: it goes to the one type the job's nodes have, else it stays
untyped (the report says so). Never the untyped count on top of the typed ones.

The TRES strings are real where a source is named: fixtures/ledger-sample/sacct.txt
(recorded on the test stack, Slurm 22.05.8: an untyped ``--gres=gpu:6`` request has
``ReqTRES`` ``gres/gpu=6`` alone and ``AllocTRES`` both), the shared samples of other
sites (../shared/vendor-samples/slurm, read in place) and tests/test_ledger.py. The
composed ones say how they were made.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from conftest import samples_dir

from hetpatrol.ledger import capacity
from hetpatrol.ledger.sacct_stream import JobRun
from hetpatrol.ledger.tres import card_counts
from hetpatrol.ledger.usage import aggregate, node_types_of


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


WINDOW = (ts("2026-01-01T09:00:00"), ts("2026-01-01T12:00:00"))
NOW = WINDOW[1]
HELD = 3600.0  # every run below holds its cards 10:00..11:00
WAIT = 60.0  # submitted 09:59

#: the nodes (``scontrol show node`` Gres=): hp-gpu01 and hp-h100 as in
#: fixtures/ledger-sample/nodes.txt; two01 holds two GPU types; plain01 untyped GPUs
#: (``Gres=gpu:4``, as fixtures/slurm/example-mixed/slurm.conf has them); mig01 the MIG
#: type of the shared sacct sample
INVENTORY = {
    "hp-gpu01": {"gpu:a100": 8, "ascend:910b": 8},
    "hp-h100": {"gpu:h100": 4},
    "two01": {"gpu:a100": 4, "gpu:h100": 4},
    "plain01": {"gpu": 4},
    "mig01": {"gpu:a100_3g.20gb": 7},
}
NODE_GRES = {
    node: {
        name: frozenset(lab.partition(":")[2] for lab in cards if lab.startswith(name + ":"))
        for name in {lab.partition(":")[0] for lab in cards}
    }
    for node, cards in INVENTORY.items()
}


def shared_tres(name: str, job: str) -> str:
    """The TRES string of ``job`` in a shared sample (``JobID|TRES`` lines, or a line of
    TRES alone: the ``squeue -O tres-alloc`` sample)."""
    for line in (samples_dir("slurm") / name).read_text().splitlines():
        line = line.strip()
        if line.startswith(job + "|"):
            return line.split("|")[1]
        if line.startswith(job + "="):
            return line[len(job) + 1 :]
        if job == "" and line.startswith("cpu="):
            return line
    raise AssertionError(f"{job!r} not in {name}")


def run_of(alloc: str, nodes: str) -> JobRun:
    return JobRun("1", "1", "u", "acct", "p", "normal", nodes, ts("2026-01-01T09:59:00"),
                  ts("2026-01-01T10:00:00"), ts("2026-01-01T11:00:00"), 3600, "COMPLETED",
                  alloc)  # fmt: skip


def inventory() -> dict[str, capacity.NodeCards]:
    return {
        n: capacity.NodeCards(n, cards, "IDLE", False, None, ("p",))
        for n, cards in INVENTORY.items()
    }


def usage_of(alloc: str, nodes: str):
    led = aggregate([run_of(alloc, nodes)], WINDOW, NOW, by=(), node_gres=NODE_GRES)
    got = {
        lab: (t.card_seconds / HELD, t.jobs, t.runs, t.max_cards, t.wait_seconds / t.started)
        for lab, t in led.by_gres().items()
    }
    return got, led.untyped


def capacity_of(alloc: str, req: str, nodes: str):
    rep = capacity.build([(run_of(alloc, nodes), capacity.Request(req, 60))], WINDOW, NOW,
                         "hour", inventory())  # fmt: skip
    got = {
        lab: (c.allocated / HELD, c.jobs, c.jobs_by_name, c.jobs_any_type, c.waits.count)
        for lab, c in rep.classes.items()
        if c.jobs or c.allocated
    }
    return got, rep.untyped


# (case, AllocTRES, ReqTRES, the job's nodes, cards per label, labels asked by name,
#  GRES names left untyped)
A100_8 = "billing=1,cpu=1,gres/gpu:a100=8,gres/gpu=8,mem=1M,node=1"
CASES = [
    # fixtures/ledger-sample/sacct.txt job 1: --gres=gpu:a100:8, typed + untyped alike
    ("sample typed request", A100_8, A100_8, "hp-gpu01", {"gpu:a100": 8}, {"gpu:a100"}, set()),
    # job 2: --gres=gpu:6 untyped; Slurm recorded the A100 type in AllocTRES, not in ReqTRES
    (
        "sample untyped request",
        "billing=1,cpu=1,gres/gpu:a100=6,gres/gpu=6,mem=1M,node=1",
        "billing=1,cpu=1,gres/gpu=6,mem=1M,node=1",
        "hp-gpu01",
        {"gpu:a100": 6},
        set(),
        set(),
    ),
    # job 5: --gres=ascend:1, the other vendor of the node
    (
        "sample ascend",
        "billing=1,cpu=1,gres/ascend:910b=1,gres/ascend=1,mem=1M,node=1",
        "billing=1,cpu=1,gres/ascend=1,mem=1M,node=1",
        "hp-gpu01",
        {"ascend:910b": 1},
        set(),
        set(),
    ),
    # the live test's records with their typed items removed (a site whose
    # AccountingStorageTRES lacks gres/gpu:a100): the one type of hp-gpu01
    (
        "untyped only, one type",
        "billing=1,cpu=1,gres/gpu=2,mem=1M,node=1",
        "billing=1,cpu=1,gres/gpu=2,mem=1M,node=1",
        "hp-gpu01",
        {"gpu:a100": 2},
        set(),
        set(),
    ),
    # the same on a node of two types: no type can be told
    (
        "untyped only, two types",
        "billing=1,cpu=1,gres/gpu=2,mem=1M,node=1",
        "billing=1,cpu=1,gres/gpu=2,mem=1M,node=1",
        "two01",
        {"gpu": 2},
        set(),
        {"gpu"},
    ),
    # composed: a job on two01 where AccountingStorageTRES tracks gres/gpu and
    # gres/gpu:a100 but not gres/gpu:h100 (1 A100 + 2 H100): the remainder, not the sum
    (
        "typed and a remainder of no type",
        "gres/gpu:a100=1,gres/gpu=3",
        "gres/gpu:a100=1,gres/gpu=3",
        "two01",
        {"gpu:a100": 1, "gpu": 2},
        {"gpu:a100"},
        {"gpu"},
    ),
    # composed: a two-node job, 4 A100 on hp-gpu01 (tracked) and 4 untyped GPUs on
    # plain01: the remainder goes to the one type the nodes name, added to its cards.
    # The usage ledger listed it apart from the typed A100s: the job and its run counted
    # twice, max_cards 4 for 8 cards (the defect the one split fixed)
    (
        "typed and a remainder of the same type",
        "gres/gpu:a100=4,gres/gpu=8",
        "gres/gpu:a100=4,gres/gpu=8",
        "hp-gpu01,plain01",
        {"gpu:a100": 8},
        {"gpu:a100"},
        set(),
    ),
    # composed: a two-node job over both types, each tracked: the untyped sum, no remainder
    (
        "two types, sum equal",
        "gres/gpu:a100=4,gres/gpu:h100=2,gres/gpu=6",
        "gres/gpu:a100=4,gres/gpu:h100=2,gres/gpu=6",
        "hp-gpu01,hp-h100",
        {"gpu:a100": 4, "gpu:h100": 2},
        {"gpu:a100", "gpu:h100"},
        set(),
    ),
    # composed, never written by Slurm: the untyped count below the typed sum keeps them
    (
        "untyped below the typed sum",
        "gres/gpu:a100=4,gres/gpu:h100=4,gres/gpu=4",
        "gres/gpu:a100=4,gres/gpu:h100=4,gres/gpu=4",
        "two01",
        {"gpu:a100": 4, "gpu:h100": 4},
        {"gpu:a100", "gpu:h100"},
        set(),
    ),
    # slurm.conf(5): AccountingStorageTRES=gres/gpu:tesla,gres/gpu:volta (no gres/gpu)
    # records the typed TRES alone
    (
        "typed only",
        "cpu=1,gres/gpu:a100=2,node=1",
        "cpu=1,gres/gpu:a100=2,node=1",
        "hp-gpu01",
        {"gpu:a100": 2},
        {"gpu:a100"},
        set(),
    ),
    # tests/test_ledger.py: one TRES written in two cases (xstrcasecmp in Slurm)
    (
        "names differing in case",
        "gres/gpu:A100=8,gres/gpu:a100=8,gres/gpu=8",
        "gres/gpu:A100=8,gres/gpu=8",
        "hp-gpu01",
        {"gpu:a100": 8},
        {"gpu:a100"},
        set(),
    ),
]


@pytest.mark.parametrize(
    "alloc,req,nodes,cards,named,untyped",
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_the_three_readers_agree(alloc, req, nodes, cards, named, untyped):
    types = node_types_of(nodes, NODE_GRES)
    # tres.card_counts (ledger efficiency)
    got = card_counts(alloc, types)
    assert {(f"{n}:{t}" if t else n): c for (n, t), c in got.items()} == cards
    # the usage ledger: one job, one run per label, its cards, its wait once
    use, use_untyped = usage_of(alloc, nodes)
    assert use == {lab: (n, 1, 1, n, WAIT) for lab, n in cards.items()}
    assert use_untyped == untyped
    # the capacity report: the same cards, asked by name where ReqTRES names the type
    cap, cap_untyped = capacity_of(alloc, req, nodes)
    assert cap == {
        lab: (n, 1, int(lab in named), int(lab not in named), 1) for lab, n in cards.items()
    }
    assert cap_untyped == untyped


def test_recorded_tres_of_other_sites():
    """sacct of a MIG slice (slurm-mail #142: ``gres/cpu=9`` is not a card),
    ``squeue -O tres-alloc`` with the untyped item first (ood_core #870), and an
    ``AllocTRES=`` of ``scontrol show job`` with the untyped item alone (slurm-mail #142)."""
    mig = shared_tres("sacct-alloctres-gpu-types.txt", "8117657")
    assert "gres/cpu=9,gres/gpu:a100_3g.20gb=1,gres/gpu=1" in mig
    first = shared_tres("squeue-tres-alloc.txt", "")
    assert first.endswith("gres/gpu=1,gres/gpu:a100=1")
    alone = shared_tres("scontrol-job-tres-fields.txt", "AllocTRES")
    assert alone.endswith("gres/gpu=1")
    for alloc, nodes, cards in (
        (mig, "mig01", {"gpu:a100_3g.20gb": 1}),
        (first, "hp-gpu01", {"gpu:a100": 1}),
        (alone, "hp-gpu01", {"gpu:a100": 1}),
        (alone, "two01", {"gpu": 1}),
    ):
        got = card_counts(alloc, node_types_of(nodes, NODE_GRES))
        assert {(f"{n}:{t}" if t else n): c for (n, t), c in got.items()} == cards, alloc
        use, _ = usage_of(alloc, nodes)
        assert {lab: v[:4] for lab, v in use.items()} == {
            lab: (n, 1, 1, n) for lab, n in cards.items()
        }, alloc
        cap, _ = capacity_of(alloc, alloc, nodes)
        assert {lab: v[0] for lab, v in cap.items()} == cards, alloc


def test_untyped_stays_untyped_without_node_types():
    """``ledger efficiency`` reads no node types: the remainder keeps the bare name."""
    assert card_counts("billing=1,cpu=1,gres/gpu=2,mem=1M,node=1") == {("gpu", None): 2}
    assert card_counts("gres/gpu:a100=1,gres/gpu=3") == {("gpu", "a100"): 1, ("gpu", None): 2}


def test_pending_job_asks_the_types_of_its_partition():
    """fixtures/ledger-sample/sacct.txt job 6: pending on partition h100 with ReqTRES
    ``gres/gpu=2`` and TimelimitRaw 60: 2 H100 for an hour (hp-h100's one type)."""
    run = JobRun("6", "6", "u", "acct", "h100", "normal", "None assigned",
                 ts("2026-01-01T10:00:00"), None, None, 0, "PENDING", "")  # fmt: skip
    inv = {
        "hp-h100": capacity.NodeCards("hp-h100", {"gpu:h100": 4}, "IDLE", False, None,
                                      ("h100",)),
        "two01": capacity.NodeCards("two01", INVENTORY["two01"], "IDLE", False, None, ("p",)),
    }  # fmt: skip
    req = capacity.Request("billing=1,cpu=1,gres/gpu=2,mem=1M,node=1", 60)
    rep = capacity.build([(run, req)], WINDOW, NOW, "hour", inv)
    pending = {lab: (c.pending_jobs, c.pending_card_seconds) for lab, c in rep.classes.items()}
    assert pending == {"gpu:h100": (1, 2 * 3600.0), "gpu:a100": (0, 0.0)}
    run.partition = "p"  # two types: the bare name
    rep = capacity.build([(run, req)], WINDOW, NOW, "hour", inv)
    assert rep.classes["gpu"].pending_jobs == 1


def test_one_tres_string_on_nodes_of_other_types():
    """The same untyped ``AllocTRES`` (the ledger sample's ``gres/gpu=2``, typed items
    removed) on three nodes: each run takes its own nodes' type, or none."""
    alloc = "billing=1,cpu=1,gres/gpu=2,mem=1M,node=1"
    runs = [run_of(alloc, n) for n in ("hp-gpu01", "hp-h100", "two01", "hp-gpu01")]
    led = aggregate(runs, WINDOW, NOW, by=(), node_gres=NODE_GRES)
    got = {lab: (t.card_seconds / HELD, t.jobs) for lab, t in led.by_gres().items()}
    assert got == {"gpu:a100": (4, 2), "gpu:h100": (2, 1), "gpu": (2, 1)}
    assert led.untyped == {"gpu"}
