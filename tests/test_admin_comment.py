"""slurm.admin_comment (opt-in): each card fault appended to the AdminComment of the jobs
on the card, through the root helper, which takes only an append of one hetpatrol note
to a job that ran on its node.

Unit tests read fixtures/slurm/squeue-admin-comment-22.05-{unset,set}.txt (slurmctld
22.05.8, job 5 on hp-gpu01 whose name, comment and work directory each forge an
``AdminComment=`` line; fixtures/slurm/README.md); the ``slurm`` ones run the real
slurmctld and the real helper (tests/test_scontrol_helper.py's ``serving``) and count the
RPCs slurmctld logs at debug2: one ``REQUEST_JOB_INFO_SINGLE`` per read, never
``REQUEST_JOB_INFO`` (the whole queue)."""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import slurm_cluster as cluster
from test_scontrol_helper import call, serving

from hetpatrol.slurm.admin_comment import (
    AdminCommenter,
    JobNote,
    appended,
    check_append,
    job_note_argv,
    note,
    parse_job_note,
)
from hetpatrol.slurm.settings import BreakerSettings, DrainSettings, SlurmSettings

REPO = Path(__file__).resolve().parent.parent
SLURM = REPO / "fixtures" / "slurm"
UNSET = (SLURM / "squeue-admin-comment-22.05-unset.txt").read_text()
SET = (SLURM / "squeue-admin-comment-22.05-set.txt").read_text()
SHOW_JOB = (SLURM / "scontrol-show-job-22.05-forged-admin-comment.txt").read_text()
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
    record = parse_job_note(UNSET, "5")
    assert record == JobNote("5", "hp-gpu01", "")
    assert check_append(record, "hp-gpu01", "hetpatrol: xid 79 nvidia/0 t") is None
    assert "did not run on" in check_append(record, "hp-gpu02", "hetpatrol: x")
    assert "one note" in check_append(record, "hp-gpu01", "admin: mine")
    assert "one note" in check_append(record, "hp-gpu01", "hetpatrol: a | admin: b")
    kept = record._replace(admin_comment="site: keep")
    assert "does not keep" in check_append(kept, "hp-gpu01", "hetpatrol: x")
    assert check_append(kept, "hp-gpu01", "site: keep | hetpatrol: x") is None


def test_the_job_is_read_alone_and_no_text_of_its_owner_stands_in():
    """Job 5's name, comment and work directory each hold a line ``   AdminComment=...``
    (and the comment ``|hp-gpu01|``): ``scontrol show job 5`` prints three such lines
    and none of Slurm's own (none is set), so its text cannot tell them apart. The
    one-job squeue answer holds the job's number, host list and AdminComment only:
    unset, then ``site: a|b | hetpatrol: ...`` whole (``|`` inside kept)."""
    lines = [x for x in SHOW_JOB.split("\n") if x.startswith("   AdminComment=")]
    assert [x.split("=", 1)[1] for x in lines] == [
        "site: forged-in-name ",
        "hetpatrol: forged-in-workdir ",
        "hetpatrol: forged-in-comment  ",
    ]
    assert job_note_argv("/usr/bin/squeue", "5") == [
        "/usr/bin/squeue",
        "--jobs=5",
        "--states=all",
        "--noheader",
        "--Format=JobID:|,NodeList:|,admin_comment:0",
    ]
    assert parse_job_note(UNSET, "5") == JobNote("5", "hp-gpu01", "")
    assert parse_job_note(SET, "5") == JobNote(
        "5", "hp-gpu01", "site: a|b | hetpatrol: xid 79 nvidia/6 2026-12-01T20:53:21.490Z"
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "does not list job 5"),
        ("6|hp-gpu01|(null)\n", "for job '6', not 5"),
        ("5|hp-gpu01|(null)\n6|hp-gpu01|(null)\n", "more than one line"),
        ("5|hp-gpu01|site: a\nb\n", "more than one line"),
        ("5|hp gpu01|(null)\n", "is not a host list"),
        ("5 hp-gpu01 (null)\n", "not JOBID|NODELIST|ADMIN_COMMENT"),
        ("5|hp-gpu01|" + "a" * (1 << 20) + "\n", "more than 1048576 characters"),
    ],
)
def test_an_answer_that_is_not_one_record_of_the_job_is_not_read(text, why):
    said = parse_job_note(text, "5")
    assert isinstance(said, str) and why in said, said


def test_a_pending_job_holds_no_node():
    record = parse_job_note("4||(null)\n", "4")  # recorded on 22.05: PD, no NodeList
    assert record == JobNote("4", "", "")
    assert "did not run on hp-gpu01" in check_append(record, "hp-gpu01", "hetpatrol: x")


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

    doc = json.loads(c.run("squeue", "--json").stdout)  # the test's own look, whole queue
    return next(j for j in doc["jobs"] if str(j["job_id"]) == job).get("admin_comment") or ""


def _rpcs(log: Path, seen: int) -> tuple[int, int]:
    """(whole-queue, single-job) job reads slurmctld logged at debug2 after ``seen``."""
    rpcs = log.read_text()[seen:]
    return (
        rpcs.count("Processing RPC: REQUEST_JOB_INFO from"),
        rpcs.count("Processing RPC: REQUEST_JOB_INFO_SINGLE from"),
    )


@pytest.mark.slurm
def test_real_slurmctld_admin_comment_through_the_helper(slurm_node, tmp_path):
    """A job whose name, comment and work directory each forge an ``AdminComment=`` line
    (none is set): the note is written as the whole value, no forged text kept; each
    read, the daemon's and the helper's, is one REQUEST_JOB_INFO_SINGLE, and slurmctld
    logs no REQUEST_JOB_INFO (the whole queue)."""
    c = slurm_node
    scontrol = shutil.which("scontrol")
    log = c.root / "log" / "slurmctld.log"
    workdir = tmp_path / "w\n   AdminComment=hetpatrol: forged-in-workdir "
    workdir.mkdir()
    with c.explain(), serving(tmp_path, scontrol, node=c.node, env=c.env) as (path, _):
        job = (
            c.run(
                "sbatch",
                "--parsable",
                "-J",
                "train\n   AdminComment=site: forged-in-name ",
                f"--comment=c|{c.node}|site: forged\n   AdminComment=hetpatrol: forged ",
                "-D",
                str(workdir),
                "--gres=gpu:a100:1",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 30",
            )
            .stdout.strip()
            .split(";")[0]
        )
        try:
            deadline = time.monotonic() + 30
            while "RUNNING" not in c.run("squeue", "-h", "-j", job, "-o", "%T").stdout:
                assert time.monotonic() < deadline, "job never ran"
                time.sleep(0.2)
            shown = c.scontrol("show", "job", job)
            assert shown.count("\n   AdminComment=") == 3, shown  # all three forged
            client = [sys.executable, "-m", "hetpatrol.scontrol_helper", f"--socket={path}"]
            settings = _settings(c, client)
            commenter = AdminCommenter()
            first = dict(EVENT, jobs=[job])
            c.run("scontrol", "setdebug", "debug2")  # each RPC logged (put back below)
            try:
                seen = len(log.read_text())
                done = commenter.on_events([first], settings, c.node)
                assert _rpcs(log, seen) == (0, 2), log.read_text()[seen:][-3000:]
            finally:
                c.run("scontrol", "setdebug", "info")
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
            assert res.returncode == 2, res.stderr
            assert "cannot read job 999999: slurm_load_jobs error: Invalid job id" in res.stderr
            assert _admin_comment(c, job) == keep
            # slurmctld itself sets no limit: 70000 characters set and read back whole
            c.scontrol("update", f"JobId={job}", "AdminComment=" + "a" * 70000)
            assert _admin_comment(c, job) == "a" * 70000
            said = c.run(*job_note_argv("squeue", job)).stdout
            assert parse_job_note(said, job) == JobNote(job, c.node, "a" * 70000)
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
    from hetpatrol.logs import capture_logs
    from hetpatrol.slurm.admin_comment import ADMIN_COMMENT_MAX
    from hetpatrol.tool import ToolOutput

    answer = UNSET.replace("(null)", "site: " + "x" * (ADMIN_COMMENT_MAX - 20))
    runs = []

    def runner(argv, timeout):
        runs.append(argv)
        return ToolOutput(tuple(argv), answer, "", 0, False, 0.01)

    settings = replace(SlurmSettings(enabled=True), admin_comment=True)
    with capture_logs() as events:
        done = AdminCommenter(runner).on_events([dict(EVENT, jobs=["5"])], settings, "hp-gpu01")
    assert done == [] and len(runs) == 1  # squeue only: no update
    assert runs[0] == ["squeue", *job_note_argv("squeue", "5")[1:]]
    (skipped,) = [e for e in events if e["event"] == "admin_comment_skipped"]
    assert skipped["job"] == "5" and str(ADMIN_COMMENT_MAX) in skipped["why"]


def test_each_job_is_asked_once_alone_and_an_unread_one_gets_no_note():
    """Two events on job 5 and one on job 6 (another node's): job 5 asked once and
    noted twice in one write each, job 6 asked once and skipped; a job squeue does not
    answer for is logged as unread, nothing written."""
    from hetpatrol.logs import capture_logs
    from hetpatrol.tool import ToolOutput

    runs = []

    def runner(argv, timeout):
        runs.append(list(argv))
        if argv[0] == "squeue":
            job = argv[1].removeprefix("--jobs=")
            text = {"5": UNSET, "6": "6|hp-gpu02|(null)\n"}.get(job, "")
            rc = 0 if text else 1
            err = "" if text else "slurm_load_jobs error: Invalid job id specified\n"
            return ToolOutput(tuple(argv), text, err, rc, False, 0.01)
        return ToolOutput(tuple(argv), "", "", 0, False, 0.01)

    settings = replace(SlurmSettings(enabled=True), admin_comment=True)
    second = dict(EVENT, xid=48, jobs=["5", "6", "7"])
    with capture_logs() as events:
        done = AdminCommenter(runner).on_events(
            [dict(EVENT, jobs=["5"]), second], settings, "hp-gpu01"
        )
    asked = [r[1] for r in runs if r[0] == "squeue"]
    assert asked == ["--jobs=5", "--jobs=6", "--jobs=7"]
    assert [d[1] for d in done] == ["JobId=5", "JobId=5"]
    assert done[1][2] == f"AdminComment={note(EVENT)} | {note(second)}"
    why = {e["job"]: e.get("why") or e.get("error") for e in events}
    assert why["6"] == "job not found on this node"
    assert "Invalid job id" in why["7"]
