"""Which jobs run on this node from slurmstepd's step sockets in ``SlurmdSpoolDir``
(:func:`hetpatrol.slurm.card_jobs.spool_slurm_jobs`): the local job list where Slurm makes
no job cgroups (``proctrack/linuxproc``), so a card fault event asks slurmctld one job
at a time instead of for the whole queue.

Names as slurmstepd makes them: ``<NodeName>_<job>.<step>[.<het component>]``
(src/slurmd/slurmstepd/req.c ``_domain_socket_create()``; steps ``extern`` 4294967292,
``batch`` 4294967291, slurm/slurm.h), recorded from the real slurmd 22.05.8 in
fixtures/slurm/slurmd-spool-ls-l-22.05.txt (fixtures/slurm/README.md).

On the real daemons: a cluster of this module's own (proctrack/linuxproc, slurmctld at
debug2, so each RPC it processes is logged and counted).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import slurm_cluster as cluster
from test_stray_process import SHOW_CONFIG, SHOW_JOB, Slurm, cards

from hetpatrol.schema import CardRecord
from hetpatrol.slurm.card_jobs import CardJobs, spool_slurm_jobs

REPO = Path(__file__).resolve().parent.parent
ROOT = frozenset({0})
RECORDED = REPO / "fixtures" / "slurm" / "slurmd-spool-ls-l-22.05.txt"


def make_socket(path: Path) -> None:
    """A Unix socket file at ``path``, as slurmstepd's bind() leaves it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(path))
    finally:
        s.close()


def spool(tmp_path: Path) -> Path:
    d = tmp_path / "spool"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    return d


def test_the_recorded_spool_dir_lists_its_jobs_steps_by_name(tmp_path):
    """The names of the real slurmd 22.05's spool dir during one batch job (the
    recording): that job and nothing else; its other files (``cred_state``, the job's
    script directory) are no job."""
    text = RECORDED.read_text()
    head, _sep, listing = text.partition("\n$ ls -l ")
    assert head.splitlines()[1].startswith("drwxr-xr-x 3 root root ")  # 0755, root's
    lines = listing.splitlines()[1:]
    names = [ln.split()[-1] for ln in lines if ln[:1] in ("s", "d", "-")]
    sockets = [ln.split()[-1] for ln in lines if ln.startswith("s")]
    assert sockets == ["hp-gpu01_1.4294967291"]  # job 1's batch step
    assert names == [
        "hp-gpu01_1.4294967291",
        "hwloc_topo_1.4294967291.xml",
        "hwloc_topo_whole.xml",
        "job00001",
    ]
    d = spool(tmp_path)
    for name in names:
        if name in sockets:
            make_socket(d / name)
        elif name.startswith("job"):
            (d / name).mkdir()
        else:
            (d / name).write_text("")
    got = spool_slurm_jobs("hp-gpu01", str(d), ROOT)
    assert got.error is None
    assert got.jobs == {"1": os.lstat(d / "hp-gpu01_1.4294967291").st_ino}


def test_step_names_het_components_extern_and_node_name(tmp_path):
    """``<NodeName>_<job>.<step>[.<het comp>]``; the extern step's socket is the job's
    key (it lives for the whole job), else batch, else the lowest step; ``%n`` is the
    NodeName; another node's sockets (several slurmd on one host) are not this node's."""
    d = tmp_path / "hp-gpu01"
    d.mkdir(mode=0o755)
    for name in (
        "hp-gpu01_7.0",
        "hp-gpu01_7.4294967292",  # extern
        "hp-gpu01_7.4294967291",  # batch
        "hp-gpu01_8.3",
        "hp-gpu01_8.1",
        "hp-gpu01_9.0.1",  # a het step's component 1
        "hp-gpu02_10.0",  # another NodeName
        "hp-gpu0_11.0",
    ):
        make_socket(d / name)
    got = spool_slurm_jobs("hp-gpu01", str(tmp_path / "%n"), ROOT)
    assert got.error is None and got.path == str(d)
    assert sorted(got.jobs, key=int) == ["7", "8", "9"]
    assert got.jobs["7"] == os.lstat(d / "hp-gpu01_7.4294967292").st_ino
    assert got.jobs["8"] == os.lstat(d / "hp-gpu01_8.1").st_ino
    # a node name with regex characters is taken literally (Slurm's own pattern is not)
    make_socket(d / "hpXgpu01_12.0")
    assert "12" not in spool_slurm_jobs("hp.gpu01", str(d), ROOT).jobs


def test_hostile_names_files_and_owners_are_no_job(tmp_path):
    """Only a socket, of root/SlurmUser/SlurmdUser, with exactly Slurm's name counts:
    not a regular file, a directory, a symbolic link (never followed) or another user's
    socket of that name, nor names of another shape."""
    d = spool(tmp_path)
    make_socket(d / "hp-gpu01_1.0")
    (d / "hp-gpu01_2.0").write_text("")  # a regular file
    (d / "hp-gpu01_3.0").mkdir()
    (d / "hp-gpu01_4.0").symlink_to(d / "hp-gpu01_1.0")  # a link to a real socket
    make_socket(d / "hp-gpu01_5.0")
    os.chown(d / "hp-gpu01_5.0", 1000, 1000, follow_symlinks=False)  # a user's
    for name in (
        "hp-gpu01_6",
        "hp-gpu01_.0",  # Slurm's pattern reads an empty number as 0
        "hp-gpu01_7.",
        "hp-gpu01_8.0.1.2",
        "hp-gpu01_9.0x",
        "xhp-gpu01_10.0",
        "hp-gpu01_12345678901.0",  # more than 32 bits
        "hp-gpu01_4294967296.0",
        "hp-gpu01_14.4294967296",
        "hp-gpu01_13.0\n",
        "hp-gpu01_١٤.0",  # Arabic-Indic digits: not [0-9]
    ):
        make_socket(d / name)
    got = spool_slurm_jobs("hp-gpu01", str(d), ROOT)
    assert got.error is None and got.jobs == {"1": os.lstat(d / "hp-gpu01_1.0").st_ino}
    # SlurmUser's own socket counts when its uid is trusted
    assert sorted(spool_slurm_jobs("hp-gpu01", str(d), frozenset({0, 1000})).jobs) == ["1", "5"]


@pytest.mark.parametrize(
    "setup, why",
    [
        (lambda d: d.chmod(0o777), "is writable by others (mode 777)"),
        (lambda d: d.chmod(0o775), "is writable by others (mode 775)"),
        (lambda d: d.chmod(0o1777), "is writable by others (mode 1777)"),
        (lambda d: os.chown(d, 1000, 1000), "is owned by uid 1000"),
        (lambda d: os.chown(d.parent, 1000, 1000), "is owned by uid 1000"),
        (lambda d: d.parent.chmod(0o777), "is writable by others (mode 777)"),
    ],
)
def test_a_directory_others_can_write_is_not_read(tmp_path, setup, why):
    """The directory and every one on the way must be root's/SlurmUser's and not
    writable by others (on the way: unless sticky), else no listing, with why."""
    base = tmp_path / "base"
    base.mkdir(mode=0o755)
    d = base / "spool"
    d.mkdir(mode=0o755)
    make_socket(d / "hp-gpu01_1.0")
    assert spool_slurm_jobs("hp-gpu01", str(d), ROOT).jobs == {
        "1": os.lstat(d / "hp-gpu01_1.0").st_ino
    }
    setup(d)
    got = spool_slurm_jobs("hp-gpu01", str(d), ROOT)
    assert got.jobs is None and why in got.error, got.error


def test_links_missing_relative_hostname_and_a_huge_directory(tmp_path):
    d = spool(tmp_path)
    make_socket(d / "hp-gpu01_1.0")
    link = tmp_path / "link"
    link.symlink_to(d)
    # root's link on the way is followed (the final directory is opened O_NOFOLLOW)
    assert sorted(spool_slurm_jobs("hp-gpu01", str(link), ROOT).jobs) == ["1"]
    os.chown(link, 1000, 1000, follow_symlinks=False)  # a user's link: never followed
    got = spool_slurm_jobs("hp-gpu01", str(link), ROOT)
    assert got.jobs is None and "symbolic link of uid 1000" in got.error
    for path, why in (
        (str(tmp_path / "none"), "No such file or directory"),
        ("spool", "not a path read here"),
        ("/var/spool/%h", "not a path read here"),
    ):
        got = spool_slurm_jobs("hp-gpu01", path, ROOT)
        assert got.jobs is None and why in got.error, got.error
    for n in range(50):
        (d / f"job{n:05d}").mkdir()
    assert sorted(spool_slurm_jobs("hp-gpu01", str(d), ROOT, max_entries=51).jobs) == ["1"]
    got = spool_slurm_jobs("hp-gpu01", str(d), ROOT, max_entries=50)
    assert got.jobs is None and "more than 50 entries" in got.error


class SpoolSlurm(Slurm):
    """The recorded 22.05 ``scontrol show config`` with ``SlurmdSpoolDir`` pointing at
    a test directory."""

    def __init__(self, spool_dir, jobs=None, proctrack="linuxproc"):
        super().__init__(jobs, proctrack)
        self.spool_dir = spool_dir

    def __call__(self, argv, timeout):
        out = super().__call__(argv, timeout)
        if list(argv)[-2:] == ["show", "config"]:
            text = SHOW_CONFIG[self.proctrack].replace(
                "/tmp/hetpatrol-slurm-XXXXXXXX/spool", str(self.spool_dir)
            )
            return dataclasses.replace(out, stdout=text)
        return out


def test_without_job_cgroups_a_fault_event_asks_its_jobs_one_at_a_time(tmp_path):
    """proctrack/linuxproc: nothing asked per patrol (stray not judged, as before); a
    fault event lists the step sockets and asks job 5 once (``scontrol -d show job 5``),
    never the queue; a second event asks nothing more; its socket gone, job 5 is
    forgotten; a spool dir that cannot be read falls back to one whole-queue read."""
    d = spool(tmp_path)
    slurm = SpoolSlurm(d, {"5": SHOW_JOB["hostile"]})
    cj = CardJobs(["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, cgroup_root=tmp_path / "cg")
    make_socket(d / "hp-gpu01_5.4294967291")
    cs = cards()
    cj.refresh(cs)
    assert cj.spool_dir == str(d) and all(cj.jobs_of(c) is None for c in cs)
    assert cj.stray_jobs_of(cs[0]) is None and cj.queries == 0
    # job 5's own block: gpu IDX 0, ascend IDX 0-2 (fixtures/slurm/README.md)
    got = [cj.fault_jobs_of(c) for c in cs]
    assert got == [{"5"}, set(), {"5"}, {"5"}, {"5"}, set()]
    assert [c[-1] for c in slurm.calls if c[-2:-1] == ["job"]] == ["5"]
    assert slurm.queue_wide() == [] and cj.error is None
    cs = cards()
    cj.refresh(cs)
    assert cj.fault_jobs_of(cs[0]) == {"5"} and cj.queries == 1
    (d / "hp-gpu01_5.4294967291").unlink()  # the job ended here
    cs = cards()
    cj.refresh(cs)
    assert [cj.fault_jobs_of(c) for c in cs] == [set()] * 6 and cj.queries == 1
    d.chmod(0o777)
    cs = cards()
    cj.refresh(cs)
    assert cj.fault_jobs_of(cs[0]) == {"1"} and len(slurm.queue_wide()) == 1
    assert "writable by others" in cj.spool_error


def test_with_job_cgroups_the_sockets_are_a_second_source(tmp_path):
    """proctrack/cgroup: a job with a step socket but no job cgroup where it is looked
    for is asked and mapped too (its socket's inode the key)."""
    d = spool(tmp_path)
    slurm = SpoolSlurm(d, {"5": SHOW_JOB["hostile"]}, proctrack="cgroup")
    cj = CardJobs(["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, cgroup_root=tmp_path / "cg")
    make_socket(d / "hp-gpu01_5.0")
    cs = cards()
    cj.refresh(cs)
    assert [cj.jobs_of(c) for c in cs] == [{"5"}, set(), {"5"}, {"5"}, {"5"}, set()]
    assert cj.queries == 1 and slurm.queue_wide() == []


# ------------------------------------------------------------------ real slurmd 22.05
@pytest.fixture(scope="module")
def debug_cluster():
    """A cluster of its own: the session cluster's proctrack/linuxproc, slurmctld at
    debug2 (each RPC it processes logged)."""
    import shutil

    missing = [b for b in cluster.BINARIES if shutil.which(b) is None]
    if missing:
        cluster._fail_or_skip(f"not installed: {', '.join(missing)} (Debian: slurmd)")
    if os.geteuid() != 0:
        cluster._fail_or_skip("the Slurm test cluster runs SlurmUser=root: run as root")
    try:
        c = cluster.start_cluster(overrides={"SlurmctldDebug": "debug2"})
    except RuntimeError as exc:  # the daemons' own logs are in the message
        pytest.fail(str(exc))
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)


@pytest.mark.slurm
@pytest.mark.slow
def test_real_slurmd_step_socket_names_the_job_and_a_fault_asks_it_alone(debug_cluster):
    """proctrack/linuxproc on the real slurmd 22.05: a running job's id is found from the
    spool dir (``<NodeName>_<job>.4294967291``, its batch step), a fault event gets its
    cards with 0 ``REQUEST_JOB_INFO`` (one ``REQUEST_JOB_INFO_SINGLE``), and the socket
    goes at the job's end. The spool dir is root's, mode 0755: ``nobody`` cannot make a
    file there."""
    c = debug_cluster
    cs = [CardRecord("nvidia", i, gres="gpu", uuid=f"GPU-{i}") for i in range(8)]
    cs += [CardRecord("ascend", i, gres="ascend", chip=0) for i in range(8)]
    spool_dir = c.root / "spool"
    log = c.root / "log" / "slurmctld.log"
    job = None
    with c.explain():
        st = os.lstat(spool_dir)
        print(f"spool dir: uid {st.st_uid} mode {st.st_mode & 0o7777:o}")
        assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o755)
        made = subprocess.run(
            ["runuser", "-u", "nobody", "--", "touch", str(spool_dir / f"{c.node}_99.0")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert made.returncode != 0 and "Permission denied" in made.stderr, made
        assert not (spool_dir / f"{c.node}_99.0").exists()
        try:
            job = (
                c.run(
                    "sbatch",
                    "--parsable",
                    "--gres=gpu:a100:2,ascend:910b:1",
                    "-o",
                    "/dev/null",
                    "--wrap",
                    "sleep 60",
                )
                .stdout.strip()
                .split(";")[0]
            )
            cj = CardJobs(c.scontrol_argv, c.node)
            cj.refresh(cs)
            assert cj.proctrack == "proctrack/linuxproc" and cj.spool_dir == str(spool_dir)
            deadline = time.monotonic() + 30
            while job not in (cj.spool_jobs() or {}):
                assert time.monotonic() < deadline, f"no socket of job {job}: {cj.spool_error}"
                time.sleep(0.2)
            listing = subprocess.run(
                ["ls", "-l", "--time-style=+", str(spool_dir)], capture_output=True, text=True
            ).stdout
            itself = subprocess.run(
                ["ls", "-ld", "--time-style=+", str(spool_dir)], capture_output=True, text=True
            ).stdout
            print(f"$ ls -ld {spool_dir}\n{itself}$ ls -l {spool_dir}\n{listing}")
            assert f"{c.node}_{job}.4294967291" in listing
            seen = len(log.read_text())
            cj.refresh(cs)
            assert all(cj.jobs_of(r) is None for r in cs) and cj.queries == 0
            held = [(r.vendor, r.index) for r in cs if cj.fault_jobs_of(r) == frozenset({job})]
            assert held == [("nvidia", 0), ("nvidia", 1), ("ascend", 0)], cj.error
            assert cj.error is None and cj.queries == 1
            deadline = time.monotonic() + 15
            while "REQUEST_JOB_INFO_SINGLE" not in log.read_text()[seen:]:
                assert time.monotonic() < deadline, "slurmctld logged no RPC"
                time.sleep(0.2)
            rpcs = log.read_text()[seen:]
            print(f"slurmctld RPCs during the fault read:\n{rpcs[-3000:]}")
            assert "Processing RPC: REQUEST_JOB_INFO from" not in rpcs
            assert rpcs.count("Processing RPC: REQUEST_JOB_INFO_SINGLE from") == 1
        finally:
            if job:
                c.run("scancel", job, check=False)
        deadline = time.monotonic() + 60
        while list(spool_dir.glob(f"{c.node}_{job}.*")):
            assert time.monotonic() < deadline, "the job's socket outlived it"
            time.sleep(0.2)
        assert job not in spool_slurm_jobs(c.node, str(spool_dir), frozenset({0})).jobs


def test_privatedata_hides_a_job_so_free_cards_are_unknown_never_none(tmp_path):
    """``PrivateData=jobs`` (the recorded 22.05 config) and a reader that is neither root
    nor SlurmUser: a socket's job answered "Invalid job id" may be another user's job on
    any card no answer names, so no card of the fault read is "no job"."""
    d = spool(tmp_path)
    config = REPO / "fixtures" / "slurm" / "scontrol-show-config-22.05-privatedata-jobs.txt"
    text = config.read_text().replace("/tmp/hetpatrol-slurm-XXXXXXXX/spool", str(d))

    class Private(Slurm):
        def __call__(self, argv, timeout):
            out = super().__call__(argv, timeout)
            if list(argv)[-2:] == ["show", "config"]:
                return dataclasses.replace(out, stdout=text)
            return out

    slurm = Private({})  # every job: "Invalid job id specified"
    cj = CardJobs(["/usr/bin/sinfo"], "hp-gpu01", runner=slurm, uid=65534)
    make_socket(d / "hp-gpu01_1.4294967291")
    cs = cards()
    cj.refresh(cs)
    assert cj.spool_dir == str(d) and cj.proctrack == "proctrack/linuxproc"
    assert [cj.fault_jobs_of(c) for c in cs] == [None] * 6
    assert "PrivateData=jobs" in cj.error and "job 1:" in cj.error
    assert cj.queries == 1 and slurm.queue_wide() == []
