"""The ledger's tables fit the terminal (``COLUMNS`` or the tty's width, as ``once`` and
``fleet`` do): on a pseudo-terminal 80 columns wide no line is wider, short headers come
first, the least useful columns go next (a note says which), then labels go on a line of
their own; a pipe gets every column whole.

The figures are read off the recorded sample (fixtures/ledger-sample/, see
tests/test_ledger_capacity.py for how each is derived): physics/hpalice 64 A100
card-seconds (0.018 card-hours, 2 jobs, 2 runs, waits 13 and 18 s: mean 0.004 h, at most
8 cards); chemistry/hpbob 16 A100 card-seconds (0.004, wait 22 s: 0.006 h) and 6 910B
card-seconds (0.002, waits 25 and 27 s: 0.007 h, at most 2 cards).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import HETPATROL, REPO, samples_dir
from pty_helpers import run_on_pty
from test_ledger_spans import SACCT

from hetpatrol.ledger.table import fit, wrap

SAMPLE = REPO / "fixtures" / "ledger-sample"
START, END = (SAMPLE / "window.txt").read_text().split()
SAVED = ["--sacct-file", str(SAMPLE / "sacct.txt"), "--nodes-file", str(SAMPLE / "nodes.txt"),
         "--start", START, "--end", END]  # fmt: skip
CAPACITY = ["capacity", *SAVED, "--events-file", str(SAMPLE / "events.txt"),
            "--config-file", str(SAMPLE / "config.txt"), "--by", "minute"]  # fmt: skip
WIDE_BY = ["usage", *SAVED, "--by", "user,account,partition,qos"]


def ledger(args: list[str], columns: str | None, code: int = 0) -> list[str]:
    """stdout of ``hetpatrol ledger ARGS`` on a pseudo-terminal ``columns`` wide, or in a
    pipe (None, no ``COLUMNS``)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    argv = [*HETPATROL, "ledger", *args]
    if columns is None:
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == code, res.stderr
        return res.stdout.splitlines()
    env["COLUMNS"] = columns
    rc, out = run_on_pty(argv, env, timeout=120)
    assert rc == code
    return out.splitlines()


def test_usage_at_80_columns_shortens_headers_then_drops_runs():
    lines = ledger(WIDE_BY, "80")
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert lines[1].split() == ["USER", "ACCOUNT", "PARTITION", "QOS", "GRES", "CARD_H", "JOBS",
                                "WAIT_H", "MAX"]  # fmt: skip
    assert lines[2].split() == ["hpalice", "physics", "debug", "normal", "gpu:a100", "0.018",
                                "2", "0.004", "8"]  # fmt: skip
    assert lines[-1] == "(RUNS left out to fit 80 columns; a pipe or another --format shows them)"


def test_usage_in_a_pipe_keeps_every_column():
    lines = ledger(WIDE_BY, None)
    assert lines[1].split() == ["USER", "ACCOUNT", "PARTITION", "QOS", "GRES", "CARD_HOURS",
                                "JOBS", "RUNS", "MEAN_WAIT_HOURS", "MAX_CARDS"]  # fmt: skip
    assert lines[3].split() == ["hpbob", "chemistry", "debug", "normal", "ascend:910b", "0.002",
                                "2", "2", "0.007", "2"]  # fmt: skip
    assert len(lines[1]) > 80


def test_usage_very_narrow_puts_the_labels_on_their_own_line():
    lines = ledger([*WIDE_BY[:-1], "user,account,partition,qos,node"], "60")
    assert max(len(line) for line in lines) <= 60, "\n".join(lines)
    at = lines.index("USER  ACCOUNT  PARTITION  QOS  NODE  GRES")
    assert lines[at + 1].split() == ["CARD_H", "JOBS", "RUNS", "WAIT_H", "MAX"]
    assert lines[at + 2] == "hpalice  physics  debug  normal  hp-gpu01  gpu:a100"
    assert lines[at + 3].split() == ["0.018", "2", "2", "0.004", "8"]


def test_capacity_at_80_columns():
    lines = ledger(CAPACITY, "80")
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    at = next(i for i, line in enumerate(lines) if line.startswith("CLASS"))
    assert lines[at].split() == ["CLASS", "CARDS", "CAP_H", "ALLOC_H", "ALLOC", "BUSY", "DOWN",
                                 "P90_H", "PEND_H", "VERDICT"]  # fmt: skip
    # gpu:h100: 4 cards, 152 card-seconds (0.042 h), down 37 of 38 s (97 %), 2 h pending
    assert lines[at + 3].split() == ["gpu:h100", "4", "0.042", "0.000", "0%", "-", "97%", "-",
                                     "2.000", "unhealthy"]  # fmt: skip
    assert "(BY_NAME/ANY, WAIT_P50_H left out to fit 80 columns;" in lines[at + 4]
    # the sreport note is wrapped under its indent, never cut
    text = " ".join(line.strip() for line in lines)
    assert "sreport: gres/gpu:h100 is not in AccountingStorageTRES: Slurm keeps no" in text


def test_capacity_in_a_pipe_keeps_every_column():
    lines = ledger(CAPACITY, None)
    head = next(line for line in lines if line.startswith("CLASS"))
    assert "WAIT_P50_H" in head and "BY_NAME/ANY" in head and "WAIT_P90_H" in head


def test_quota_at_80_columns(tmp_path):
    qf = tmp_path / "q.yaml"
    long = "a-very-long-account-name-chosen-by-a-site-for-its-biggest-lab"
    qf.write_text(f"quotas:\n  - {{account: {long}, gres: gpu:a100, card_hours: 1}}\n"
                  "  - {account: physics, gres: gpu:a100, card_hours: 1}\n")  # fmt: skip
    lines = ledger(["quota", *SAVED, "--quota-file", str(qf)], "80")
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert lines[0].split() == ["ACCOUNT", "USER", "GRES"]
    assert lines[1].split() == ["LIMIT", "USED", "OF", "PCT", "STATUS"]
    assert lines[4] == "physics  -  gpu:a100"
    assert lines[5].split() == ["card_hours", "0.02", "1", "card_hours", "2%", "ok"]
    piped = ledger(["quota", *SAVED, "--quota-file", str(qf)], None)
    assert piped[0].split() == ["ACCOUNT", "USER", "GRES", "LIMIT", "USED", "OF", "PCT", "STATUS"]


def test_spans_lines_wrap_at_80_columns(tmp_path):
    saved = tmp_path / "sacct.txt"
    saved.write_text("\n".join(SACCT) + "\n")
    nodes = samples_dir("slurm") / "scontrol-show-node.slurm17.11.4nodes.txt"
    args = ["spans", "--sacct-file", str(saved), "--nodes-file", str(nodes),
            "--start", "2026-01-01T00:00:00", "--end", "2026-01-02T00:00:00"]  # fmt: skip
    lines = ledger(args, "80", code=1)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert (
        lines[0] == "101 user=u account=a partition=p elapsed=3600s: gpu:m60 on 1 node (nodea-01);"
    )
    assert lines[1] == "  gpu:rtx2080 on 1 node (nodebbbb-002)"
    assert len(ledger(args, None, code=1)) == 2  # a pipe: one line a job


@pytest.mark.parametrize("width", [None, 40])
def test_fit_tries_short_headers_before_dropping(width):
    head, body = ["NAME", "A_LONG_HEADER", "B"], [["x" * 30, "1", "22"]]
    lines = fit(head, body, width, labels=1, short={"A_LONG_HEADER": "A"}, drop=("B",))
    if width is None:
        assert lines == ["NAME" + " " * 28 + "A_LONG_HEADER   B", "x" * 30 + " " * 14 + "1  22"]
    else:  # 30 + 2 + 1 + 2 + 2 = 37 fits 40 once the header is short: B stays
        assert lines == ["NAME" + " " * 28 + "A   B", "x" * 30 + "  1  22"]


def test_wrap_breaks_at_spaces_only():
    assert wrap("a " * 5 + "http://x/" + "y" * 50, 20) == [
        "a a a a a", "  http://x/" + "y" * 50
    ]  # fmt: skip
    assert wrap("one line", None, indent=2) == ["  one line"]


def test_audit_wraps_messages_and_keeps_the_fix_words_whole(tmp_path):
    # scontrol stands in by replaying the sample's recorded config and nodes; the partition
    # line is written here in `scontrol show partition -o` form (the sample has none)
    fake = tmp_path / "scontrol"
    fake.write_text(
        '#!/bin/sh\ncase "$2" in\n'
        f"config) cat '{SAMPLE / 'config.txt'}' ;;\nnode) cat '{SAMPLE / 'nodes.txt'}' ;;\n"
        "partition) echo 'PartitionName=debug Default=YES Nodes=hp-gpu01,hp-h100 State=UP' ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    lines = ledger(["audit", "--scontrol", str(fake)], "80", code=2)
    assert [ln for ln in lines if len(ln) > 80 and " " in ln.strip()] == [], "\n".join(lines)
    assert (
        lines[0]
        == "error: AccountingStorageTRES lacks gres/gpu:h100: Slurm keeps no per-type record"
    )
    # the line to paste into slurm.conf is one word: never cut
    fix = "AccountingStorageTRES=gres/ascend,gres/ascend:910b,gres/gpu,gres/gpu:a100,gres/gpu:h100"
    assert "    " + fix in lines
    piped = ledger(["audit", "--scontrol", str(fake)], None, code=2)
    assert piped[1] == f"  fix: {fix}   # in slurm.conf, then restart slurmctld"
