"""slurm.admin_comment (opt-in): each card fault appended to the AdminComment of the jobs
on the card, through the root helper, which takes only an append of one hetpatrol note
to a job that ran on its node.

Unit tests read fixtures/slurm/squeue-json-22.05-hostile.json (slurmctld 22.05.8, job 1
on hp-gpu01, ``admin_comment`` empty); the ``slurm`` ones run the real slurmctld and
the real helper (tests/test_scontrol_helper.py's ``serving``)."""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import slurm_cluster as cluster
from test_scontrol_helper import call, serving

from hetpatrol.slurm.admin_comment import AdminCommenter, appended, check_append, job_records, note
from hetpatrol.slurm.settings import BreakerSettings, DrainSettings, SlurmSettings

REPO = Path(__file__).resolve().parent.parent
SQUEUE = (REPO / "fixtures" / "slurm" / "squeue-json-22.05-hostile.json").read_text()
EVENT = {
    "kind": "event",
    "event": "xid",
    "xid": 79,
    "vendor": "nvidia",
    "index": 6,
    "ts": "2026-12-01T20:53:21.490Z",
    "jobs": None,
}

slurm_cluster = cluster.slurm_cluster
slurm_node = cluster.slurm_node


def test_note_append_and_the_helper_rule():
    assert note(EVENT) == "hetpatrol: xid 79 nvidia/6 2026-12-01T20:53:21.490Z"
    assert appended("", "hetpatrol: a") == "hetpatrol: a"
    assert appended("site: x", "hetpatrol: a") == "site: x | hetpatrol: a"
    assert appended("site: x | hetpatrol: a", "hetpatrol: a") is None  # written once
    record = job_records(SQUEUE)["1"]
    assert record.get("admin_comment") in ("", None)
    assert check_append(record, "hp-gpu01", "hetpatrol: xid 79 nvidia/0 t") is None
    assert "did not run on" in check_append(record, "hp-gpu02", "hetpatrol: x")
    assert "one note" in check_append(record, "hp-gpu01", "admin: mine")
    assert "one note" in check_append(record, "hp-gpu01", "hetpatrol: a | admin: b")
    kept = dict(record, admin_comment="site: keep")
    assert "does not keep" in check_append(kept, "hp-gpu01", "hetpatrol: x")
    assert check_append(kept, "hp-gpu01", "site: keep | hetpatrol: x") is None


def _settings(c, scontrol) -> SlurmSettings:
    sinfo = ("env", f"SLURM_CONF={c.conf}", shutil.which("sinfo") or "sinfo")
    return SlurmSettings(
        enabled=True,
        node_name=c.node,
        scontrol=tuple(scontrol),
        gres_conf=None,
        admin_comment=True,
        drain=DrainSettings(breaker=BreakerSettings(sinfo=sinfo)),
    )


def _admin_comment(c, job) -> str:
    import json

    doc = json.loads(c.run("squeue", "--json").stdout)
    return next(j for j in doc["jobs"] if str(j["job_id"]) == job).get("admin_comment") or ""


@pytest.mark.slurm
def test_real_slurmctld_admin_comment_through_the_helper(slurm_node, tmp_path):
    c = slurm_node
    scontrol = shutil.which("scontrol")
    with c.explain(), serving(tmp_path, scontrol, node=c.node, env=c.env) as (path, _):
        job = (
            c.run(
                "sbatch", "--parsable", "--gres=gpu:a100:1", "-o", "/dev/null", "--wrap", "sleep 30"
            )
            .stdout.strip()
            .split(";")[0]
        )
        try:
            deadline = time.monotonic() + 30
            while "RUNNING" not in c.run("squeue", "-h", "-j", job, "-o", "%T").stdout:
                assert time.monotonic() < deadline, "job never ran"
                time.sleep(0.2)
            client = [sys.executable, "-m", "hetpatrol.scontrol_helper", f"--socket={path}"]
            settings = _settings(c, client)
            commenter = AdminCommenter()
            first = dict(EVENT, jobs=[job])
            done = commenter.on_events([first], settings, c.node)
            assert done == [["update", f"JobId={job}", f"AdminComment={note(first)}"]]
            assert _admin_comment(c, job) == note(first)
            second = dict(first, xid=48, ts="2026-12-01T21:00:00.000Z")
            commenter.on_events([first, second], settings, c.node)  # the first not twice
            assert _admin_comment(c, job) == f"{note(first)} | {note(second)}"
            # the helper: no note over an admin's text, no foreign text, no job elsewhere
            res = call(path, "update", f"JobId={job}", "AdminComment=admin: mine")
            assert res.returncode == 2 and "does not keep the current one" in res.stderr
            keep = _admin_comment(c, job)
            res = call(path, "update", f"JobId={job}", f"AdminComment={keep} | admin: x")
            assert res.returncode == 2 and "one note" in res.stderr
            res = call(path, "update", "JobId=999999", "AdminComment=hetpatrol: x")
            assert res.returncode == 2 and "does not list job 999999" in res.stderr
            assert _admin_comment(c, job) == keep
            # slurmctld itself sets no limit: 70000 characters set and read back whole
            c.scontrol("update", f"JobId={job}", "AdminComment=" + "a" * 70000)
            assert _admin_comment(c, job) == "a" * 70000
        finally:
            c.run("scancel", job, check=False)


def test_off_by_default_runs_nothing():
    runs = []
    settings = replace(SlurmSettings(enabled=True), admin_comment=False)
    AdminCommenter(lambda argv, t: runs.append(argv)).on_events(
        [dict(EVENT, jobs=["1"])], settings, "n"
    )
    assert runs == []


def test_a_note_past_the_length_limit_is_logged_not_dropped_silently():
    """slurmctld 22.05 takes an AdminComment of any length (70000 characters set and read
    back whole: test_real_slurmctld_admin_comment_through_the_helper), so the limit is
    hetpatrol's own
    (ADMIN_COMMENT_MAX): a job whose AdminComment is already near it (another tool's
    notes) gets no note, and the daemon log says so with the job, instead of nothing."""
    import json

    from hetpatrol.logs import capture_logs
    from hetpatrol.slurm.admin_comment import ADMIN_COMMENT_MAX
    from hetpatrol.tool import ToolOutput

    doc = json.loads(SQUEUE)
    doc["jobs"][0]["admin_comment"] = "site: " + "x" * (ADMIN_COMMENT_MAX - 20)
    runs = []

    def runner(argv, timeout):
        runs.append(argv)
        return ToolOutput(tuple(argv), json.dumps(doc), "", 0, False, 0.01)

    settings = replace(SlurmSettings(enabled=True), admin_comment=True)
    with capture_logs() as events:
        done = AdminCommenter(runner).on_events([dict(EVENT, jobs=["1"])], settings, "hp-gpu01")
    assert done == [] and len(runs) == 1  # squeue only: no update
    (skipped,) = [e for e in events if e["event"] == "admin_comment_skipped"]
    assert skipped["job"] == "1" and str(ADMIN_COMMENT_MAX) in skipped["why"]
