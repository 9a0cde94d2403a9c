"""The ledger's parts without Slurm: TRES reconciliation (on recorded sacct output), the
window arithmetic, sacct parsing errors, the audit, quotas, and the CLI on a saved file.
The same code against a real accounting stack: tests/test_ledger_live.py."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import samples_dir
from prometheus_client.parser import text_string_to_metric_families

from hetpatrol.cli import main
from hetpatrol.ledger import audit, quotas, report
from hetpatrol.ledger.sacct_stream import (
    FIELDS,
    JobRun,
    SacctError,
    TimeParser,
    parse_lines,
    stream_sacct,
)
from hetpatrol.ledger.slurm_state import node_gres_types
from hetpatrol.ledger.tres import card_counts, gres_tres
from hetpatrol.ledger.usage import aggregate

SLURM = samples_dir("slurm")


def sample_tres(name: str) -> dict[str, str]:
    """JobID -> second column of a recorded ``sacct ... -P`` sample (header, prompt skipped)."""
    out = {}
    for line in (SLURM / name).read_text().splitlines():
        if line.startswith("$") or line.startswith("JobID|"):
            continue
        job, tres = line.split("|")[:2]
        out[job] = tres
    return out


# ---------------------------------------------------------------------------- TRES
def test_recorded_alloc_tres_typed_cards_only():
    tres = sample_tres("sacct-alloctres-gpu-types.txt")
    # gres/gpu:a100_3g.20gb=1,gres/gpu=1 (a MIG slice type); gres/cpu=9 is not a card
    assert card_counts(tres["8117657"]) == {("gpu", "a100_3g.20gb"): 1}
    assert card_counts(tres["8117678"]) == {("gpu", "h100"): 1}


def test_recorded_usage_tres_are_not_cards():
    tres = sample_tres("sacct-tresusageinmax-gpuutil-gpumem.txt")
    # gres/gpumem=38888M, gres/gpuutil=100 of the NVML acct_gather plugin
    assert gres_tres(tres["18194943.batch"]) == ({}, [])


def test_untyped_count_takes_the_nodes_single_type():
    assert card_counts("cpu=1,gres/gpu=2", {"gpu": frozenset({"a100"})}) == {("gpu", "a100"): 2}
    both = frozenset({"a100", "h100"})
    assert card_counts("gres/gpu=2", {"gpu": both}) == {("gpu", None): 2}
    assert card_counts("gres/gpu=2") == {("gpu", None): 2}
    # 1 tracked A100 + 2 GPUs of a type not in AccountingStorageTRES, on an H100 node
    assert card_counts("gres/gpu:a100=1,gres/gpu=3", {"gpu": frozenset({"h100"})}) == {
        ("gpu", "a100"): 1,
        ("gpu", "h100"): 2,
    }
    # two vendors side by side
    assert card_counts("gres/ascend:910b=4,gres/ascend=4,gres/gpu:a100=1,gres/gpu=1") == {
        ("ascend", "910b"): 4,
        ("gpu", "a100"): 1,
    }


def test_unreadable_tres_count_is_reported_raw():
    assert gres_tres("gres/gpu=two,gres/npu:910b=1") == ({("npu", "910b"): 1}, ["gres/gpu=two"])


def test_tres_names_differing_only_in_case_are_one_tres():
    """Slurm matches TRES type and name with xstrcasecmp (assoc_mgr_find_tres_pos(),
    src/common/assoc_mgr.c): gres/gpu:A100 and gres/gpu:a100 are the same 8 cards, which
    were added up to 16 (16 card-hours for an 8-card hour)."""
    tres = "gres/gpu:A100=8,gres/gpu:a100=8,gres/gpu=8"
    assert card_counts(tres) == {("gpu", "a100"): 8}
    assert gres_tres(tres) == ({("gpu", "a100"): 8, ("gpu", None): 8}, [])
    led = aggregate([run_(tres=tres)], W, W[1], by=("account",))
    assert [(r["gres"], r["card_hours"]) for r in report.rows(led)] == [
        ("gpu:a100", 8 * 0.5)
    ]  # 10:30-11:00 in the window


def test_shares_of_a_card_are_not_cards():
    """gres/mps (a share of a card's compute, in percent per card) and gres/shard (a slice
    count) are not whole cards: a job holding 100 MPS and 40 shards holds no card. The
    AllocTRES shape is that of a shard job on a GB10 (as recorded in the gtop project's
    tests: billing=10,cpu=10,gres/shard:nvidia_gb10=40,gres/shard=40,...)."""
    shard = "billing=10,cpu=10,gres/shard:nvidia_gb10=40,gres/shard=40,mem=50G,node=1"
    assert gres_tres(shard) == ({}, [])
    mps = "cpu=2,gres/gpu:a100=1,gres/gpu=1,gres/mps:a100=100,gres/mps=100,gres/Shard=4"
    assert card_counts(mps) == {("gpu", "a100"): 1}
    led = aggregate([run_(tres=shard), run_(job="2", tres="gres/mps=100")], W, W[1], by=("user",))
    assert report.rows(led) == []


def test_usage_table_and_csv_print_no_control_characters():
    """Account and user names are chosen by people: an escape sequence in one drove the
    terminal of whoever ran `ledger usage`. Printed escaped (\\x1b), JSON as always."""
    led = aggregate(
        [run_(account="evil\x1b]0;pwned\x07\x1b[2J", user="u\u202eexe.sh")],
        W,
        W[1],
        by=("account", "user"),
    )
    for text in (report.to_table(led), report.to_csv(led)):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
        assert "evil\\x1b]0;pwned\\x07\\x1b[2J" in text and "u\\u202eexe.sh" in text
    assert json.loads(report.to_json(led))["rows"][0]["account"].startswith("evil\x1b]0;")


# --------------------------------------------------------------------- sacct lines
def line(job="1", user="u", account="a", start="2026-01-01T10:00:00",
         end="2026-01-01T11:00:00", state="COMPLETED", tres="gres/gpu:a100=2,gres/gpu=2",
         submit="2026-01-01T09:30:00", nodes="n1", elapsed="3600") -> str:  # fmt: skip
    return "|".join([job, job, user, account, "p", "normal", nodes, submit, start, end,
                     elapsed, state, tres])  # fmt: skip


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_parse_lines_fields_and_unknown_times():
    runs = list(parse_lines([line(end="Unknown", state="RUNNING") + "\n", "\n"]))
    assert len(runs) == 1
    r = runs[0]
    assert (r.job_id, r.user, r.account, r.nodes, r.state) == ("1", "u", "a", "n1", "RUNNING")
    assert r.start == ts("2026-01-01T10:00:00") and r.end is None
    assert list(parse_lines([line(state="CANCELLED by 0")]))[0].state == "CANCELLED"


def test_parse_lines_refuses_a_short_line_with_its_text():
    with pytest.raises(SacctError, match=r"sacct line 2: 3 fields, expected 13.*'1\|2\|3'"):
        list(parse_lines([line(), "1|2|3"]))
    with pytest.raises(SacctError, match="sacct line 1: .*2026-13-01"):
        list(parse_lines([line(start="2026-13-01T00:00:00")]))


def test_time_parser_agrees_with_datetime_across_dst():
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Europe/Berlin"
    time.tzset()
    try:
        parse = TimeParser()
        # 2026-03-29: 02:00 CET -> 03:00 CEST; 2026-10-25: 03:00 CEST -> 02:00 CET
        for text in ("2026-03-29T01:59:59", "2026-03-29T03:00:00", "2026-03-29T12:34:56",
                     "2026-10-25T01:15:00", "2026-10-25T04:00:00", "2026-12-31T23:59:59"):  # fmt: skip  # noqa: E501
            assert parse(text) == datetime.fromisoformat(text).timestamp(), text
        assert parse("2026-03-29T03:00:00") - parse("2026-03-29T01:59:59") == 1
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


def test_stream_sacct_reads_a_process_and_reports_its_failure(tmp_path):
    saved = tmp_path / "sacct.txt"
    saved.write_text(line() + "\n" + line(job="2") + "\n")
    assert [r.job_id for r in stream_sacct(["cat", str(saved)])] == ["1", "2"]
    with pytest.raises(SacctError, match="exited with 3: sacct: error: no slurmdbd"):
        list(stream_sacct(["sh", "-c", "echo 'sacct: error: no slurmdbd' >&2; exit 3"]))
    with pytest.raises(SacctError, match="cannot run /nonexistent/sacct"):
        list(stream_sacct(["/nonexistent/sacct"]))


# -------------------------------------------------------------------------- usage
def run_(**kw) -> JobRun:
    return next(parse_lines([line(**kw)]))


W = (ts("2026-01-01T10:30:00"), ts("2026-01-01T12:00:00"))


def test_window_cut_requeue_running_pending():
    runs = [
        run_(job="1"),  # 10:00-11:00, 2 A100: cut to 10:30-11:00 = 2 x 1800
        run_(
            job="2",
            start="2026-01-01T11:00:00",
            end="2026-01-01T11:10:00",
            state="REQUEUED",
            submit="2026-01-01T10:50:00",
        ),  # fmt: skip
        run_(
            job="2",
            start="2026-01-01T11:20:00",
            end="2026-01-01T13:00:00",
            submit="2026-01-01T11:10:00",
        ),  # fmt: skip  # cut at 12:00
        run_(
            job="3",
            start="2026-01-01T11:30:00",
            end="Unknown",
            state="RUNNING",
            tres="gres/ascend:910b=8,gres/ascend=8",
            submit="2026-01-01T11:30:00",
        ),  # fmt: skip
        run_(job="4", start="Unknown", end="Unknown", state="PENDING"),
        run_(job="5", start="2026-01-01T08:00:00", end="2026-01-01T09:00:00"),  # before
    ]
    now = ts("2026-01-01T11:45:00")
    led = aggregate(runs, W, now, by=("account",))
    a100 = led.groups[("a", "gpu:a100")]
    assert a100.card_seconds == 2 * 1800 + 2 * 600 + 2 * 2400
    assert (a100.jobs, a100.runs) == (2, 3)  # job 2 once, in two runs
    # waits of the runs that started in the window: 10 min and 10 min
    assert (a100.started, a100.wait_seconds) == (2, 1200)
    npu = led.groups[("a", "ascend:910b")]
    assert npu.card_seconds == 8 * 900  # running: 11:30 .. now
    assert led.running_cards == {("a", "ascend:910b"): 8}
    assert led.records == 6


def test_group_by_node_splits_a_multi_node_run():
    runs = [run_(nodes="gpu[01-02]", tres="gres/gpu:a100=8,gres/gpu=8")]
    led = aggregate(runs, W, W[1], by=("user", "node"))
    assert {k: t.card_seconds for k, t in led.groups.items()} == {
        ("u", "gpu01", "gpu:a100"): 4 * 1800,
        ("u", "gpu02", "gpu:a100"): 4 * 1800,
    }


def test_untyped_time_noted_when_the_node_type_is_unknown():
    led = aggregate([run_(tres="gres/gpu=2")], W, W[1], by=())
    assert list(led.groups) == [("gpu",)]
    assert "gpu: some card time has no type" in report.notes(led)[0]
    node_gres = node_gres_types((SLURM / "scontrol-show-node.slurm17.11.4nodes.txt").read_text())
    first = next(iter(node_gres))
    assert node_gres[first] == {"gpu": frozenset({"m60"})}
    led = aggregate([run_(tres="gres/gpu=2", nodes=first)], W, W[1], by=(), node_gres=node_gres)
    assert list(led.groups) == [("gpu:m60",)] and not led.untyped


def test_unknown_group_field_refused():
    with pytest.raises(ValueError, match="cannot group by 'cluster'"):
        aggregate([], W, W[1], by=("cluster",))


def test_report_formats():
    led = aggregate([run_(), run_(job="2", user="v")], W, W[1], by=("user",))
    doc = json.loads(report.to_json(led))
    assert doc["rows"][0] == {
        "user": "u", "gres": "gpu:a100", "card_hours": 1.0, "card_seconds": 3600.0,
        "jobs": 1, "runs": 1, "mean_wait_hours": None, "max_cards": 2,
    }  # fmt: skip
    csv_lines = report.to_csv(led).splitlines()
    assert csv_lines[1] == "u,gpu:a100,1.0,1,1,,2,3600.0"
    table = report.to_table(led).splitlines()
    assert table[1].split() == ["USER", "GRES", "CARD_HOURS", "JOBS", "RUNS",
                                "MEAN_WAIT_HOURS", "MAX_CARDS"]  # fmt: skip
    assert table[2].split() == ["u", "gpu:a100", "1.000", "1", "1", "-", "2"]


# -------------------------------------------------------------------------- audit
CONFIG = "AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu\n"
NODES = (
    "NodeName=g1 Arch=x86_64 Gres=gpu:a100:8(S:0-1),ascend:910b:8 State=IDLE\n"
    "NodeName=g2 Arch=x86_64 Gres=gpu:h100:8 State=IDLE\n"
)
PARTS = (
    "PartitionName=gpu Nodes=g[1-2] State=UP TRESBillingWeights=CPU=1.0,GRES/gpu:a100=4\n"
    "PartitionName=cpu Nodes=c1 State=UP\n"
)


def test_audit_gives_the_line_to_add():
    found = audit.audit(CONFIG, NODES, PARTS)
    by_check = {(f.check, f.severity): f for f in found}
    typed = next(f for f in found if "gres/ascend:910b" in f.message)
    assert typed.severity == "error"
    assert "lacks gres/ascend:910b, gres/gpu:a100, gres/gpu:h100" in typed.message
    assert typed.fix.startswith(
        "AccountingStorageTRES=gres/gpu,gres/ascend,gres/ascend:910b,gres/gpu:a100,gres/gpu:h100"
    )
    untyped = [f for f in found if "lacks gres/ascend:" in f.message and ":" not in
               f.message.split("lacks ")[1].split(":")[0]]  # fmt: skip
    assert untyped and untyped[0].severity == "error"  # no ascend time recorded at all
    billing = by_check[("tres_billing_weights", "warning")]
    assert "does not weight GRES/ascend:910b, GRES/gpu:h100" in billing.message
    assert 'TRESBillingWeights="CPU=1.0,GRES/gpu:a100=4,GRES/ascend:910b=<w>,' in billing.fix
    assert audit.exit_code(found) == 2


def test_audit_clean_and_untyped_missing_is_a_warning():
    config = (
        "AccountingStorageTRES = cpu,gres/gpu:a100,gres/gpu:h100,gres/ascend,gres/ascend:910b\n"  # noqa: E501
    )
    parts = "PartitionName=gpu Nodes=g[1-2] TRESBillingWeights=GRES/gpu:a100=4,GRES/gpu:h100=8,GRES/ascend:910b=2\n"  # noqa: E501
    found = audit.audit(config, NODES, parts)
    assert [(f.severity, f.check) for f in found] == [("warning", "accounting_storage_tres")]
    assert "lacks gres/gpu:" in found[0].message
    config += "AccountingStorageTRES = ignored second spelling\n"
    full = config.replace("cpu,", "cpu,gres/gpu,", 1)
    assert audit.audit(full, NODES, parts) == []


# ------------------------------------------------------------------------- quotas
# the shape of `sacctmgr -n -P show assoc format=<ASSOC_FIELDS>` on the live stack
# (tests/test_ledger_live.py reads the real one), with a sub-account lab1 of physics
ASSOC = """hetpatroltest|root||||||
hetpatroltest|root|root|||||
hetpatroltest|chemistry|||root|||
hetpatroltest|chemistry|hpbob|||gres/ascend:910b=120||
hetpatroltest|physics|||root|gres/gpu:a100=600|gres/gpu:a100=4|gres/gpu=2
hetpatroltest|lab1|||physics|||
hetpatroltest|lab1|hpalice|||||gres/gpu=2
"""


def test_parse_assoc_and_evaluate_with_sub_accounts():
    limits, parents = quotas.parse_assoc(ASSOC)
    assert parents == {"chemistry": "root", "physics": "root", "lab1": "physics"}
    assert {(lim.account, lim.user, lim.gres, lim.kind, lim.value) for lim in limits} == {
        ("chemistry", "hpbob", "ascend:910b", "GrpTRESMins", 120.0),
        ("physics", "", "gpu:a100", "GrpTRESMins", 600.0),
        ("physics", "", "gpu:a100", "GrpTRES", 4.0),
        ("physics", "", "gpu", "MaxTRESPerJob", 2.0),
        ("lab1", "hpalice", "gpu", "MaxTRESPerJob", 2.0),
    }
    runs = [
        run_(account="lab1", user="hpalice"),  # 2 x A100, 1800 s in W: 60 card-minutes
        run_(
            account="physics",
            user="x",
            start="2026-01-01T11:00:00",
            end="Unknown",
            state="RUNNING",
            tres="gres/gpu:h100=3,gres/gpu=3",
        ),  # fmt: skip
        run_(
            account="chemistry",
            user="hpbob",
            tres="gres/ascend:910b=4,gres/ascend=4",
            end="2026-01-01T11:15:00",
        ),  # fmt: skip
    ]
    led = aggregate(runs, W, ts("2026-01-01T11:30:00"), by=("account", "user"))
    rows = {(r.limit.account, r.limit.gres, r.limit.kind): r
            for r in quotas.evaluate(limits, led, parents)}  # fmt: skip
    assert rows[("physics", "gpu:a100", "GrpTRESMins")].used == 60  # from sub-account lab1
    assert rows[("physics", "gpu:a100", "GrpTRES")].used == 0  # the running job is H100
    per_job = rows[("physics", "gpu", "MaxTRESPerJob")]
    assert (per_job.used, per_job.status) == (3, "reached")  # untyped limit: every type
    bob = rows[("chemistry", "ascend:910b", "GrpTRESMins")]
    assert (bob.used, bob.ratio, bob.status) == (180, 1.5, "reached")
    assert quotas.exit_code(rows.values()) == 2
    assert quotas.exit_code([rows[("physics", "gpu:a100", "GrpTRESMins")]]) == 0


def test_quota_file_and_textfile(tmp_path):
    qf = tmp_path / "quotas.yaml"
    qf.write_text("quotas:\n  - {account: a, gres: gpu:a100, card_hours: 1.2}\n")
    limits = quotas.load_quota_file(qf)
    led = aggregate([run_()], W, W[1], by=("account", "user"))
    rows = quotas.evaluate(limits, led, {})
    assert (rows[0].used, rows[0].status) == (1.0, "warning")  # 83 %
    assert quotas.exit_code(rows) == 1
    prom = tmp_path / "q.prom"
    quotas.write_textfile(rows, led, prom)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(prom.read_text())
           for s in f.samples}  # fmt: skip
    labels = (("account", "a"), ("gres", "gpu:a100"), ("limit", "card_hours"), ("user", ""))
    assert got[("hetpatrol_ledger_quota_usage_ratio", labels)] == pytest.approx(1 / 1.2)
    with_unit = tuple(sorted((*labels, ("unit", "card_hours"))))
    assert got[("hetpatrol_ledger_quota_limit", with_unit)] == 1.2
    assert got[("hetpatrol_ledger_card_seconds",
                (("account", "a"), ("gres", "gpu:a100"), ("user", "u")))] == 3600  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("quotas: {}\n", "top-level 'quotas:' list"),
        ("quotas:\n  - {gres: gpu, card_hours: 1}\n", "quota 1 needs 'account' and 'gres'"),
        ("quotas:\n  - {account: a, gres: gpu, card_hours: 0}\n", "card_hours must be"),
        ("quotas:\n  - {account: a, gres: gpu, card_hours: yes}\n", "card_hours must be"),
    ],
)
def test_bad_quota_file(tmp_path, text, message):
    qf = tmp_path / "q.yaml"
    qf.write_text(text)
    with pytest.raises(quotas.QuotaError, match=message):
        quotas.load_quota_file(qf)


# ---------------------------------------------------------------------------- CLI
def test_cli_on_a_saved_file(tmp_path, capsys):
    saved = tmp_path / "sacct.txt"
    saved.write_text(line() + "\n" + line(job="2", account="b", tres="gres/npu:910b=1") + "\n")
    args = ["ledger", "usage", "--sacct-file", str(saved), "--no-node-types",
            "--start", "2026-01-01T10:30:00", "--end", "2026-01-01T12:00:00"]  # fmt: skip
    assert main([*args, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["account"], r["gres"], r["card_hours"]) for r in rows] == [
        ("a", "gpu:a100", 1.0),
        ("b", "npu:910b", 0.5),
    ]
    saved.write_text("1|2|3\n")
    assert main(args) == 65
    assert "sacct line 1: 3 fields" in capsys.readouterr().err
    assert main(["ledger", "usage", "--no-node-types", "--sacct", "/nonexistent/sacct"]) == 69
    assert "cannot run /nonexistent/sacct" in capsys.readouterr().err
    assert main([*args[:4], "--start", "now", "--end", "now-1days"]) == 64
    assert "--end (now-1days) must be after --start (now)" in capsys.readouterr().err
    assert main(["ledger", "usage", "--no-node-types", "--sacct-file", "/nonexistent/x"]) == 64
    assert "--sacct-file /nonexistent/x: No such file or directory" in capsys.readouterr().err


def test_fields_are_what_the_parser_reads():
    assert FIELDS[0] == "JobIDRaw" and FIELDS[-1] == "AllocTRES" and len(FIELDS) == 13
    assert Path(sys.executable).exists()
