"""``hetpatrol ledger capacity`` on the real Slurm accounting stack: MariaDB, slurmdbd,
slurmctld and slurmd on loopback (tests/slurm_accounting.py) with the node of
tests/record_ledger_sample.py that has no slurmd (``hp-h100``, ``gpu:h100:4``, DOWN) and
its scenario: hp-gpu01 drained by hetpatrol while the jobs are submitted, five jobs of two
card classes, an admin drain, one job pending on the H100s at the end.

Expected card-seconds: the cards each job asked for x the Start..End that sacct reports;
the drains: the Start..End of ``sacctmgr show event``. ``sreport cluster utilization``
reports whole past hours only, so for the comparison with it the scenario's records
(jobs, events, the cluster's registration) are moved 3 hours back in the database, the
rollup is made to start before them (``last_ran_table``) and slurmdbd restarted, which
rolls up at start (src/slurmdbd/slurmdbd.c, ``_rollup_handler``).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from datetime import datetime

import pytest
import record_ledger_sample as rec
import slurm_accounting as acct

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.accounting]

#: cards per job of rec.JOBS (the scenario's), and their class
CARDS = [(8, "gpu:a100"), (6, "gpu:a100"), (4, "gpu:a100"), (2, "ascend:910b"),
         (1, "ascend:910b")]  # fmt: skip


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def local(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")


@pytest.fixture(scope="module")
def stack():
    missing = [b for b in acct.BINARIES if acct.shutil.which(b) is None]
    if missing:
        acct.base._fail_or_skip(f"not installed: {', '.join(missing)}")
    if acct.os.geteuid() != 0:
        acct.base._fail_or_skip("the accounting stack runs as root: run as root")
    try:
        cluster = acct.start_accounting_cluster(rec.extra_conf())
    except (RuntimeError, subprocess.SubprocessError) as exc:
        pytest.fail(f"Slurm accounting stack did not start: {exc}")
    created: list[str] = []
    try:
        created = acct.add_users(cluster)
        with cluster.explain():
            window = rec.scenario(cluster)
        yield cluster, window
    finally:
        cluster.stop()
        acct.shutil.rmtree(cluster.root, ignore_errors=True)
        acct.remove_users(created)


def hetpatrol(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetpatrol.cli", "ledger", *args],
                          env=cluster.env, capture_output=True, text=True, timeout=120)  # fmt: skip


def capacity_json(cluster, start: str, end: str, *extra: str) -> dict:
    res = hetpatrol(cluster, "capacity", "--start", start, "--end", end, "--by", "minute",
                    "--format", "json", *extra)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return {c["class"]: c for c in json.loads(res.stdout)["classes"]}


def sacct_runs(cluster, ids: list[str]) -> dict[str, tuple[float, float, float]]:
    out = cluster.run("sacct", "-a", "-X", "-P", "-n", "-S", "now-6hours", "-j", ",".join(ids),
                      "-o", "JobIDRaw,Submit,Start,End").stdout  # fmt: skip
    rows = [ln.split("|") for ln in out.splitlines() if ln]
    return {r[0]: (ts(r[1]), ts(r[2]), ts(r[3])) for r in rows}


def test_capacity_on_the_live_stack(stack):
    cluster, w = stack
    s, e = local(w["start"]), local(w["end"])
    got = capacity_json(cluster, s, e, "--no-sreport")
    runs = sacct_runs(cluster, w["ids"])
    want: dict[str, float] = {}
    waits: dict[str, list[float]] = {}
    for job_id, (cards, lab) in zip(w["ids"], CARDS, strict=True):
        submit, start, end = runs[job_id]
        want[lab] = want.get(lab, 0.0) + cards * (end - start)
        waits.setdefault(lab, []).append(start - submit)
    for lab, seconds in want.items():
        assert got[lab]["allocated_card_hours"] == pytest.approx(seconds / 3600, abs=1e-6)
    assert got["gpu:a100"]["wait_p90_hours"] == pytest.approx(max(waits["gpu:a100"]) / 3600,
                                                              abs=1e-6)  # fmt: skip
    # ledger usage counts the same
    res = hetpatrol(cluster, "usage", "--start", s, "--end", e, "--by", "", "--format", "json")
    usage = {r["gres"]: r["card_hours"] for r in json.loads(res.stdout)["rows"]}
    assert usage == {lab: pytest.approx(v / 3600, abs=1e-6) for lab, v in want.items()}
    # drains and downs as sacctmgr recorded them, hetpatrol's apart
    ev = cluster.run("sacctmgr", "-P", "-n", "show", "event", "Event=Node", f"Start={s}",
                     f"End={e}", "Format=NodeName,Start,End,Reason").stdout  # fmt: skip
    spans = {}
    for ln in ev.splitlines():
        node, a, b, reason = ln.split("|", 3)
        end = w["end"] if b == "Unknown" else ts(b)
        spans[(node, reason)] = min(end, w["end"]) - max(ts(a), w["start"])
    ours = spans[("hp-gpu01", rec.OUR_REASON)]
    assert got["gpu:a100"]["drained_by_hetpatrol_card_hours"] == pytest.approx(
        8 * ours / 3600, abs=1e-6)  # fmt: skip
    assert got["ascend:910b"]["drained_card_hours"] == pytest.approx(
        8 * spans[("hp-gpu01", rec.ADMIN_REASON)] / 3600, abs=1e-6)  # fmt: skip
    assert got["gpu:h100"]["down_card_hours"] == pytest.approx(
        4 * spans[("hp-h100", rec.DOWN_REASON)] / 3600, abs=1e-6)  # fmt: skip
    assert got["gpu:h100"]["verdict"] == "unhealthy"
    # demand: the H100 job pending at the end (2 cards x 60 minutes), the any-type request
    assert (got["gpu:h100"]["pending_jobs"], got["gpu:h100"]["pending_card_hours"]) == (1, 2.0)
    assert (got["gpu:a100"]["jobs_by_name"], got["gpu:a100"]["jobs_any_type"]) == (2, 1)
    assert got["gpu:a100"]["cards"] == 8 and got["gpu:h100"]["cards"] == 4


def test_agrees_with_sreport_where_the_tres_is_tracked(stack):
    cluster, w = stack
    shift = 3 * 3600
    c = cluster
    ids = ",".join([*w["ids"], w["pending"]])
    cols = ("time_submit", "time_eligible", "time_start", "time_end")
    move = ", ".join(f"{col} = IF({col} > 0, {col} - {shift}, 0)" for col in cols)
    acct.sql(c, f"UPDATE hetpatroltest_job_table SET {move} WHERE id_job IN ({ids})")
    ev_move = (f"time_start = time_start - {shift}, "
               f"time_end = IF(time_end > 0, time_end - {shift}, 0)")  # fmt: skip
    acct.sql(c, f"UPDATE hetpatroltest_event_table SET {ev_move}")
    w0 = math.floor((w["start"] - shift) / 3600) * 3600
    acct.sql(c, f"UPDATE hetpatroltest_last_ran_table SET hourly_rollup = {w0 - 3600}, "
                f"daily_rollup = {w0 - 86400}, monthly_rollup = {w0 - 86400 * 31}")  # fmt: skip
    # slurmdbd rolls up at start
    dbd = c.procs.pop("slurmdbd")
    dbd.terminate()
    dbd.wait(timeout=30)
    acct._spawn(c, "slurmdbd", ["slurmdbd", "-D"])
    s, e = local(w0), local(w0 + 2 * 3600)

    def rolled() -> bool:
        out = c.run("sreport", "-P", "-n", "-t", "seconds", "--tres=gres/gpu:a100", "cluster",
                    "utilization", f"start={s}", f"end={e}", check=False).stdout  # fmt: skip
        return any(ln.split("|")[2:3] not in ([], ["0"]) for ln in out.splitlines() if ln)

    deadline = time.monotonic() + 60
    while not rolled():
        assert time.monotonic() < deadline, c.logs()
        time.sleep(0.5)
    got = capacity_json(c, s, e)
    for lab in ("gpu:a100", "ascend:910b"):
        sr = got[lab]["sreport"]
        assert sr is not None, got[lab]["sreport_note"]
        assert sr["allocated"] == pytest.approx(got[lab]["allocated_card_hours"], abs=1e-6)
        assert got[lab]["sreport_note"].startswith("agrees: ")
        assert got[lab]["sreport_allocated_card_hours"] == sr["allocated"]
    assert got["gpu:h100"]["sreport"] is None  # not in AccountingStorageTRES
