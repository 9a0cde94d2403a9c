"""The ledger on a real Slurm accounting stack (tests/slurm_accounting.py): MariaDB,
slurmdbd, slurmctld, slurmd with ``gpu:a100:8`` and ``ascend:910b:8``,
``AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/ascend,gres/ascend:910b``.

Two users in two accounts submit short ``sbatch --wrap`` jobs (typed and untyped
requests, one requeued while running); the node has one CPU, so they run one after the
other. The expected card-seconds are the counts the test asked for times the Start..End
that sacct reports for each run; the truncated window is checked against ``sacct -T``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from datetime import datetime

import pytest
import slurm_accounting as acct
from prometheus_client.parser import text_string_to_metric_families

from hetpatrol.ledger.sacct_stream import sacct_argv

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.accounting]
accounting_cluster = acct.accounting_cluster

#: (user, account, --gres, seconds, cards, ledger label); the first is requeued once
JOBS = [
    ("hpbob", "chemistry", "gpu:a100:1", 3, 1, "gpu:a100"),
    ("hpalice", "physics", "gpu:a100:2", 2, 2, "gpu:a100"),
    ("hpalice", "physics", "gpu:2", 2, 2, "gpu:a100"),  # untyped request on an A100 node
    ("hpbob", "chemistry", "ascend:910b:4", 2, 4, "ascend:910b"),
    ("hpbob", "chemistry", "ascend:1", 2, 1, "ascend:910b"),
]


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def sbatch(cluster, user: str, account: str, gres: str, seconds: int, *extra: str) -> str:
    out = cluster.run(
        "runuser", "-u", user, "--", "sbatch", "--parsable", f"--account={account}",
        f"--gres={gres}", "--chdir=/tmp", "--output=/dev/null", *extra,
        "--wrap", f"sleep {seconds}",
    )  # fmt: skip
    return out.stdout.strip().split(";")[0]


def wait_until(predicate, timeout: float, what: str, show=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}" + (f": {show()}" if show else ""))


def sacct_runs(cluster, *extra: str) -> list[dict]:
    out = cluster.run(
        "sacct", "-a", "-X", "-D", "-P", "-n", "--noconvert", "-S", "now-2hours",
        "-o", "JobIDRaw,User,Account,Start,End,State,AllocTRES", *extra,
    ).stdout  # fmt: skip
    keys = ("id", "user", "account", "start", "end", "state", "tres")
    return [dict(zip(keys, ln.split("|"), strict=True)) for ln in out.splitlines() if ln]


def hetpatrol(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hetpatrol.cli", *args],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def jobs(accounting_cluster):
    """Run :data:`JOBS` (the first requeued once); their sacct runs, per job id."""
    c = accounting_cluster
    with c.explain():
        ids = [
            sbatch(c, u, a, g, s, *(["--requeue"] if i == 0 else []))
            for i, (u, a, g, s, _, _) in enumerate(JOBS)
        ]  # noqa: E501
        first = ids[0]

        def running():
            state = c.run("squeue", "-h", "-j", first, "-o", "%T", check=False).stdout
            return state.strip() == "RUNNING"

        wait_until(running, 30, f"job {first} running")
        time.sleep(1)
        c.run("scontrol", "requeue", first)
        # a requeued job waits for its BeginTime; once it does, let it start again at once
        wait_until(
            lambda: c.run("squeue", "-h", "-j", first, "-o", "%T %r").stdout.split()
            == ["PENDING", "BeginTime"],
            30, "the requeued job pending on its BeginTime",
        )  # fmt: skip
        c.run("scontrol", "update", f"JobId={first}", "StartTime=now")

        def all_done():
            runs = sacct_runs(c)
            done = [r for r in runs if r["id"] in ids and r["state"] == "COMPLETED"]
            return runs if len(done) == len(ids) else None

        runs = wait_until(
            all_done, 90, "every job COMPLETED in accounting",
            lambda: (sacct_runs(c), c.run("squeue", "-a").stdout),
        )  # fmt: skip
    by_id: dict[str, list[dict]] = {}
    for r in runs:
        if r["id"] in ids:
            by_id.setdefault(r["id"], []).append(r)
    return ids, by_id


def expected(ids, by_id, window=None) -> dict[tuple[str, str, str], float]:
    """card-seconds per (account, user, label): our counts x sacct's Start..End."""
    out: dict[tuple[str, str, str], float] = {}
    for job_id, (user, account, _g, _s, cards, lab) in zip(ids, JOBS, strict=True):
        for r in by_id[job_id]:
            start, end = ts(r["start"]), ts(r["end"])
            if window:
                start, end = max(start, window[0]), min(end, window[1])
            k = (account, user, lab)
            out[k] = out.get(k, 0.0) + cards * max(0.0, end - start)
    return out


def ledger_json(cluster, *args: str) -> dict:
    res = hetpatrol(cluster, "ledger", "usage", "--format", "json", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_requeue_left_two_runs(jobs):
    ids, by_id = jobs
    states = [r["state"] for r in by_id[ids[0]]]
    assert states == ["REQUEUED", "COMPLETED"], by_id[ids[0]]
    for job_id in ids[1:]:
        assert [r["state"] for r in by_id[job_id]] == ["COMPLETED"]


def test_card_hours_match_counts_and_elapsed(accounting_cluster, jobs):
    ids, by_id = jobs
    doc = ledger_json(accounting_cluster, "--start", "now-2hours", "--by", "account,user")
    got = {(r["account"], r["user"], r["gres"]): r for r in doc["rows"]}
    want = expected(ids, by_id)
    assert set(got) == set(want)  # the untyped gpu:2 job is A100 time, no bare "gpu" row
    for key, seconds in want.items():
        assert got[key]["card_seconds"] == pytest.approx(seconds), key
        assert got[key]["card_hours"] == pytest.approx(seconds / 3600, abs=1e-6)
    # every job counted once, the requeued one in two runs
    assert got[("chemistry", "hpbob", "gpu:a100")]["jobs"] == 1
    assert got[("chemistry", "hpbob", "gpu:a100")]["runs"] == 2
    assert got[("physics", "hpalice", "gpu:a100")]["jobs"] == 2
    assert got[("physics", "hpalice", "gpu:a100")]["max_cards"] == 2
    assert got[("chemistry", "hpbob", "ascend:910b")]["jobs"] == 2
    assert doc["notes"] == []


def test_untyped_request_recorded_typed_by_slurm(jobs):
    """AllocTRES of the ``--gres=gpu:2`` job already names the type (typed TRES kept)."""
    ids, by_id = jobs
    tres = by_id[ids[2]][0]["tres"]
    assert "gres/gpu:a100=2" in tres and "gres/gpu=2" in tres


def test_window_cut_agrees_with_sacct_truncate(accounting_cluster, jobs):
    ids, by_id = jobs
    c = accounting_cluster
    first_run = by_id[ids[0]][0]
    start = ts(first_run["start"]) + 1  # cuts the requeued job's first run
    end = ts(by_id[ids[3]][0]["end"]) - 1  # cuts the 910b x4 job
    s_txt = datetime.fromtimestamp(start).strftime("%Y-%m-%dT%H:%M:%S")
    e_txt = datetime.fromtimestamp(end).strftime("%Y-%m-%dT%H:%M:%S")
    doc = ledger_json(c, "--start", s_txt, "--end", e_txt, "--by", "account")
    got = {(r["account"], r["gres"]): r["card_seconds"] for r in doc["rows"]}
    # sacct's own truncation (-T): Start/End moved to the window's edges
    truncated = c.run(
        "sacct", "-a", "-X", "-D", "-T", "-P", "-n", "--noconvert", "-S", s_txt, "-E", e_txt,
        "-o", "JobIDRaw,Account,Start,End,AllocTRES",
    ).stdout  # fmt: skip
    sacct_totals: dict[tuple[str, str], float] = {}
    count_of = {job_id: (job[1], job[4], job[5]) for job_id, job in zip(ids, JOBS, strict=True)}
    for line in truncated.splitlines():
        job_id, account, s, e, _tres = line.split("|")
        if job_id not in count_of or s == "Unknown":
            continue
        _acc, cards, lab = count_of[job_id]
        k = (account, lab)
        sacct_totals[k] = sacct_totals.get(k, 0.0) + cards * max(0.0, ts(e) - ts(s))
    want = expected(ids, by_id, (start, end))
    want_by_account: dict[tuple[str, str], float] = {}
    for (account, _user, lab), v in want.items():
        if v:
            want_by_account[(account, lab)] = want_by_account.get((account, lab), 0.0) + v
    assert got == pytest.approx(want_by_account)
    assert got == pytest.approx({k: v for k, v in sacct_totals.items() if v})


def test_table_and_csv(accounting_cluster, jobs):
    res = hetpatrol(accounting_cluster, "ledger", "usage", "--start", "now-2hours", "--by", "")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[1].split() == [
        "GRES", "CARD_HOURS", "JOBS", "RUNS", "MEAN_WAIT_HOURS", "MAX_CARDS"
    ]  # fmt: skip
    assert {ln.split()[0] for ln in lines[2:]} == {"ascend:910b", "gpu:a100"}
    res = hetpatrol(accounting_cluster, "ledger", "usage", "--start", "now-2hours",
                    "--by", "user", "--format", "csv")  # fmt: skip
    assert res.stdout.splitlines()[0] == (
        "user,gres,card_hours,jobs,runs,mean_wait_hours,max_cards,card_seconds"
    )


def test_audit_finds_no_billing_weights_but_typed_tres(accounting_cluster):
    res = hetpatrol(accounting_cluster, "ledger", "audit", "--format", "json")
    assert res.returncode == 1, res.stdout + res.stderr
    findings = json.loads(res.stdout)
    assert [f["check"] for f in findings] == ["tres_billing_weights"]
    assert (
        'TRESBillingWeights="CPU=1.0,GRES/ascend:910b=<w>,GRES/gpu:a100=<w>"'
        in (findings[0]["fix"])
    )


def test_quotas_from_sacctmgr(accounting_cluster, jobs, tmp_path):
    ids, by_id = jobs
    c = accounting_cluster
    c.run("sacctmgr", "-i", "modify", "account", "physics", "set",
          "GrpTRESMins=gres/gpu:a100=1", "GrpTRES=gres/gpu:a100=4", "MaxTRESPerJob=gres/gpu=2")  # fmt: skip  # noqa: E501
    c.run("sacctmgr", "-i", "modify", "user", "hpbob", "set",
          "GrpTRESMins=gres/ascend:910b=60")  # fmt: skip
    prom = tmp_path / "ledger.prom"
    res = hetpatrol(c, "ledger", "quota", "--start", "now-2hours", "--format", "json",
                    "--textfile", str(prom))  # fmt: skip
    rows = json.loads(res.stdout)
    got = {(r["account"], r["user"], r["gres"], r["kind"]): r for r in rows}
    want = expected(ids, by_id)
    a100_minutes = want[("physics", "hpalice", "gpu:a100")] / 60
    ascend_minutes = want[("chemistry", "hpbob", "ascend:910b")] / 60
    r = got[("physics", "", "gpu:a100", "GrpTRESMins")]
    assert (r["limit"], r["used"]) == (1, pytest.approx(a100_minutes, abs=1e-5))
    assert r["status"] == (
        "reached" if a100_minutes >= 1 else "ok" if a100_minutes < 0.8 else "warning"
    )  # noqa: E501
    assert got[("physics", "", "gpu:a100", "GrpTRES")]["used"] == 0  # nothing running
    per_job = got[("physics", "", "gpu", "MaxTRESPerJob")]
    assert (per_job["used"], per_job["status"]) == (2, "reached")
    bob = got[("chemistry", "hpbob", "ascend:910b", "GrpTRESMins")]
    assert bob["used"] == pytest.approx(ascend_minutes, abs=1e-5)
    assert res.returncode == 2  # MaxTRESPerJob reached
    samples = {
        (s.name, s.labels.get("account"), s.labels.get("gres"), s.labels.get("limit")): s.value
        for fam in text_string_to_metric_families(prom.read_text())
        for s in fam.samples
    }
    key = ("hetpatrol_ledger_quota_usage_ratio", "physics", "gpu:a100", "GrpTRESMins")
    assert samples[key] == pytest.approx(a100_minutes)
    assert samples[("hetpatrol_ledger_quota_usage_ratio", "physics", "gpu", "MaxTRESPerJob")] == 1


def test_running_job_counted_up_to_now(accounting_cluster, jobs):
    c = accounting_cluster
    job = sbatch(c, "hpalice", "physics", "gpu:a100:2", 60)  # MaxTRESPerJob gpu=2
    try:
        # accounting holds the start once slurmctld has sent it to slurmdbd
        runs = wait_until(
            lambda: [r for r in sacct_runs(c, "-j", job) if r["state"] == "RUNNING"],
            30, "the long job RUNNING in accounting",
        )  # fmt: skip
        start = ts(runs[0]["start"])
        time.sleep(2)
        before = time.time()
        doc = ledger_json(c, "--start", "now-2hours", "--by", "account,user")
        after = time.time()
        prev = expected(*jobs)[("physics", "hpalice", "gpu:a100")]
        row = next(r for r in doc["rows"] if (r["account"], r["gres"]) == ("physics", "gpu:a100"))
        running = row["card_seconds"] - prev
        assert 2 * (int(before) - start) - 2 <= running <= 2 * (after - start) + 2
        res = hetpatrol(c, "ledger", "quota", "--start", "now-2hours", "--format", "json")
        rows = {(r["account"], r["gres"], r["kind"]): r for r in json.loads(res.stdout)}
        assert rows[("physics", "gpu:a100", "GrpTRES")]["used"] == 2  # held now, of 4
    finally:
        c.run("scancel", job, check=False)


def sreport_seconds(cluster, tres: str, start: str, end: str) -> dict[str, float]:
    """``sreport job SizesByAccount`` TRES-seconds per account for one TRES (one CPU-size
    bucket: every test job has one CPU)."""
    out = cluster.run(
        "sreport", "-P", "-n", "-t", "seconds", f"--tres={tres}", "job", "SizesByAccount",
        f"start={start}", f"end={end}", "grouping=1000", "FlatView",
    ).stdout  # fmt: skip
    totals = {}
    for ln in out.splitlines():
        parts = ln.split("|")
        if len(parts) >= 4 and parts[2].isdigit():
            totals[parts[1]] = float(parts[2]) + float(parts[3])
    return totals


def test_agrees_with_sreport_on_past_hours(accounting_cluster, jobs):
    """sreport only reports whole past hours (it rounds its window to hours and stops at
    the last full one). So the test jobs' records are moved 3 hours back in the
    accounting database (and back again after): same jobs, same durations."""
    ids, by_id = jobs
    c = accounting_cluster
    shift = 3 * 3600
    cols = ("time_submit", "time_eligible", "time_start", "time_end")
    where = f"id_job IN ({','.join(ids)})"
    move = ", ".join(f"{col} = IF({col} > 0, {col} - {{s}}, 0)" for col in cols)
    acct.sql(c, f"UPDATE hetpatroltest_job_table SET {move.format(s=shift)} WHERE {where}")
    try:
        starts = [ts(r["start"]) - shift for runs in by_id.values() for r in runs]
        ends = [ts(r["end"]) - shift for runs in by_id.values() for r in runs]
        w0 = math.floor(min(starts) / 3600) * 3600
        w1 = math.floor(max(ends) / 3600) * 3600 + 3600
        s_txt = datetime.fromtimestamp(w0).strftime("%Y-%m-%dT%H:%M:%S")
        e_txt = datetime.fromtimestamp(w1).strftime("%Y-%m-%dT%H:%M:%S")
        doc = ledger_json(c, "--start", s_txt, "--end", e_txt, "--by", "account")
        got = {(r["account"], r["gres"]): r["card_seconds"] for r in doc["rows"]}
        a100 = sreport_seconds(c, "gres/gpu:a100", s_txt, e_txt)
        npu = sreport_seconds(c, "gres/ascend:910b", s_txt, e_txt)
        assert got[("physics", "gpu:a100")] == a100["physics"]
        assert got[("chemistry", "ascend:910b")] == npu["chemistry"]
        # the requeued job: both runs, as in sreport (which reads every run's record)
        assert got[("chemistry", "gpu:a100")] == a100["chemistry"]
        want = expected(ids, by_id)
        assert got[("chemistry", "gpu:a100")] == want[("chemistry", "hpbob", "gpu:a100")]
        assert len(by_id[ids[0]]) == 2
    finally:
        back = move.format(s=-shift).replace("- -", "+ ")
        acct.sql(c, f"UPDATE hetpatroltest_job_table SET {back} WHERE {where}")


def test_untyped_records_take_the_type_of_the_live_node(accounting_cluster, jobs, tmp_path):
    """A site whose AccountingStorageTRES lacks the typed names records only ``gres/gpu=N``:
    the same sacct records with their typed items removed are given the type that
    ``scontrol show node`` reports for hp-gpu01 (gpu:a100, ascend:910b)."""
    c = accounting_cluster
    argv = sacct_argv("now-2hours", "now", ["sacct"])
    records = c.run(*argv).stdout.splitlines()
    stripped = []
    for ln in records:
        fields = ln.split("|")
        fields[-1] = ",".join(
            t for t in fields[-1].split(",") if not (t.startswith("gres/") and ":" in t)
        )
        stripped.append("|".join(fields))
    assert all("gres/gpu:" not in ln and "gres/ascend:" not in ln for ln in stripped)
    saved = tmp_path / "untyped.txt"
    saved.write_text("\n".join(stripped) + "\n")
    typed = ledger_json(c, "--start", "now-2hours", "--by", "account")
    untyped = ledger_json(c, "--start", "now-2hours", "--by", "account", "--sacct-file", str(saved))
    rows = {(r["account"], r["gres"]): r["card_seconds"] for r in untyped["rows"]}
    want = {(r["account"], r["gres"]): r["card_seconds"] for r in typed["rows"]}
    assert rows == pytest.approx(want)
    assert untyped["notes"] == []
    # without the nodes' types the time stays untyped, and the report says so
    bare = ledger_json(c, "--start", "now-2hours", "--by", "", "--sacct-file", str(saved),
                       "--no-node-types")  # fmt: skip
    assert {r["gres"] for r in bare["rows"]} == {"gpu", "ascend"}
    assert [n.split(":")[0] for n in bare["notes"]] == ["ascend", "gpu"]


def test_saved_sacct_with_its_header_reads_as_the_live_run(accounting_cluster, jobs, tmp_path):
    # the real sacct's header (-P without -n) in another field order: read by its names
    # a fixed end: a job still running counts to it in both readings
    now = time.time()
    start, end = (time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) for t in (now - 7200, now))
    argv = sacct_argv(start, end)
    fields = argv[argv.index("-o") + 1].split(",")
    argv[argv.index("-o") + 1] = ",".join(reversed(fields))
    argv.remove("-n")
    out = accounting_cluster.run(*argv).stdout
    assert out.splitlines()[0] == "|".join(reversed(fields))  # sacct names them as -o did
    saved = tmp_path / "sacct.txt"
    saved.write_text(out)
    window = ("--start", start, "--end", end, "--by", "account,user")
    live = ledger_json(accounting_cluster, *window)
    read = ledger_json(accounting_cluster, *window, "--sacct-file", str(saved))
    assert read["records"] == live["records"] > 0
    assert read["rows"] == live["rows"]
