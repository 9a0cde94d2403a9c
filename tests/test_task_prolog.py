"""``hetpatrol task-prolog`` (hetpatrol/slurm/task_prolog.py) on recorded answers of the
real Slurm 22.05 test cluster (fixtures/slurm/README.md): ``squeue --json`` (job 1's
name, comment and work directory hold forged ``Nodes=hp-gpu01 GRES=ascend:910b:1(IDX:3)``
text; Slurm gave it gpu IDX 0 and ascend IDX 0), read as Slurm 23.02.3 and later answer
for one job, and ``scontrol -d show job`` (job 5: forged ``Nodes=... GRES=ascend:910b:8
(IDX:4-7)`` lines in its name, work directory and comment, Slurm gave it gpu IDX 0 and
ascend IDX 0-2; job 7: an exact copy of Slurm's per-node block in its name and comment),
the 22.05 path; the packaged wrapper and the generated TaskProlog script. The script run
by the real slurmd is in tests/test_gres_conf.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from hetpatrol.slurm.gres_conf import CardLine, Plan
from hetpatrol.slurm.task_prolog import (
    Export,
    cli_main,
    job_query,
    parse_export,
    parse_show_job_detail,
    slurm_version,
    task_prolog_lines,
)

SLURM = REPO / "fixtures" / "slurm"
REAL_SQUEUE = (SLURM / "squeue-json-22.05-hostile.json").read_text()
SHOW_HOSTILE = (SLURM / "scontrol-show-job-d-22.05-hostile.txt").read_text()
SHOW_COPIED = (SLURM / "scontrol-show-job-d-22.05-copied-block.txt").read_text()
ENV = {"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "hp-gpu01"}
ENV5 = {**ENV, "SLURM_JOB_ID": "5"}
ASCEND = Export("ascend", "ASCEND_RT_VISIBLE_DEVICES", {0: 10, 1: 11, 3: 13})
ASCEND8 = Export("ascend", "ASCEND_RT_VISIBLE_DEVICES", {i: 10 + i for i in range(8)})
NEW, OLD = "slurm 23.11.4\n", "slurm-wlm 22.05.8\n"  # scontrol --version (OLD: recorded)


def replay(text: str, seen: list | None = None, version: str = NEW):
    """A stand-in runner: ``scontrol --version`` says ``version``, the job's query
    answers ``text``; each (argv, timeout) is recorded in ``seen``."""

    def runner(argv, timeout):
        if seen is not None:
            seen.append((list(argv), timeout))
        return version if list(argv[1:]) == ["--version"] else text

    return runner


def test_the_jobs_own_index_never_the_forged_one():
    seen: list = []
    lines = task_prolog_lines(
        ENV, [ASCEND], scontrol="/usr/bin/scontrol", runner=replay(REAL_SQUEUE, seen)
    )
    # ascend IDX 0 -> 10; the forged IDX:3 (-> 13) in name, comment, workdir is not read
    assert lines == ["export ASCEND_RT_VISIBLE_DEVICES=10"]
    assert [argv for argv, _t in seen] == [
        ["/usr/bin/scontrol", "--version"],
        ["/usr/bin/squeue", "--json", "--jobs=1"],  # one job (23.02.3 and later)
    ]
    assert seen[0][1] == 10.0 and 0 < seen[1][1] <= 10.0  # one limit for both


def test_the_version_picks_the_one_job_query():
    # squeue(1) of 23.02.3 first keeps --jobs= with --json; 23.02.2 and 22.05 ignore it
    assert slurm_version(OLD) == (22, 5, 8)
    assert slurm_version("slurm 24.11.0-0rc1\n") == (24, 11, 0)
    assert slurm_version("slurm 23.02.3") == (23, 2, 3)
    for said in ("", "scontrol: error: x", "slurm 23.2", "slurm 123456.1.1"):
        assert slurm_version(said) is None, said
    squeue = ["/opt/s/squeue", "--json", "--jobs=7"]
    assert job_query("/opt/s/scontrol", "7", (23, 2, 3)) == squeue
    assert job_query("/opt/s/scontrol", "7", (24, 11, 0)) == squeue
    show = ["/opt/s/scontrol", "-d", "show", "job", "7"]
    assert job_query("/opt/s/scontrol", "7", (23, 2, 2)) == show
    assert job_query("/opt/s/scontrol", "7", (22, 5, 8)) == show


def test_slurm_22_05_reads_one_job_and_never_runs_squeue_json():
    """On 22.05 ``squeue --json`` lists every job of the cluster whatever --jobs= says:
    the 22.05 path must never run it (argv recorded by the stand-in runner)."""
    seen: list = []

    def runner(argv, timeout):
        seen.append(list(argv))
        assert "--json" not in argv and not argv[0].endswith("squeue"), argv
        return OLD if argv[1:] == ["--version"] else SHOW_HOSTILE

    gpu = Export("gpu", "ZE_AFFINITY_MASK", {0: 7, 1: 8})
    lines = task_prolog_lines(ENV5, [ASCEND8, gpu], scontrol="/usr/bin/scontrol", runner=runner)
    # Slurm's block: gpu IDX 0, ascend IDX 0-2; the forged IDX:4-7 (-> 14-17) is not taken
    assert lines == ["export ASCEND_RT_VISIBLE_DEVICES=10,11,12", "export ZE_AFFINITY_MASK=7"]
    assert seen == [
        ["/usr/bin/scontrol", "--version"],
        ["/usr/bin/scontrol", "-d", "show", "job", "5"],
    ]


def test_the_22_05_text_keeps_only_slurms_own_per_node_block():
    a = parse_show_job_detail(SHOW_HOSTILE, "5", "hp-gpu01")
    assert a.by_gres == {"gpu": frozenset({0}), "ascend": frozenset({0, 1, 2})}, a
    assert not a.errors
    assert parse_show_job_detail(SHOW_HOSTILE, "5", "hp-gpu02").by_gres == {}
    # another job's record, or none
    assert (
        "does not begin with job 6's record"
        in parse_show_job_detail(SHOW_HOSTILE, "6", "hp-gpu01").errors[0]
    )
    # a line Slurm does not print inside its block: no block of Slurm's is left
    odd = SHOW_HOSTILE.replace("   JOB_GRES=", "   JOB_GRES=x y\n   JOB_GRES=", 1)
    assert "no per-node block" in parse_show_job_detail(odd, "5", "hp-gpu01").errors[0]
    # a host list naming the node among others; "\r" is no line end of Slurm's
    two = SHOW_HOSTILE.replace(
        "     Nodes=hp-gpu01 CPU_IDs=0 Mem=1", "     Nodes=hp-gpu[00-01] CPU_IDs=0 Mem=1"
    )
    assert parse_show_job_detail(two, "5", "hp-gpu01").by_gres["ascend"] == {0, 1, 2}
    cr = SHOW_HOSTILE.replace("JobName=train\n", "JobName=train\r\n", 1)
    assert parse_show_job_detail(cr, "5", "hp-gpu01").by_gres["ascend"] == {0, 1, 2}


def test_an_exact_copy_of_slurms_block_in_name_or_comment_sets_nothing():
    """The one forgery the 22.05 text cannot tell apart: a job name or comment holding an
    exact copy of Slurm's per-node block (recorded job 7: ``GRES=ascend:910b:4(IDX:4-7)``
    in both, Slurm gave it ascend IDX 0). Three blocks that differ: no variable is set
    and one print line says why; the forged IDX 4-7 is never exported. (From Slurm
    23.02.3 the one-job JSON tells them apart.)"""
    env = {**ENV, "SLURM_JOB_ID": "7"}
    (line,) = task_prolog_lines(
        env, [ASCEND8], scontrol="scontrol", runner=replay(SHOW_COPIED, version=OLD)
    )
    assert line.startswith("print hetpatrol TaskProlog: scontrol show job -d: 3 per-node ")
    assert "differ for hp-gpu01" in line and line.endswith(": no device variable set")


def test_each_export_maps_its_gres_and_skips_what_the_job_does_not_hold():
    gpu = Export("gpu", "ZE_AFFINITY_MASK", {0: 7})
    mlu = Export("mlu", "MLU_VISIBLE_DEVICES", {0: 0})
    lines = task_prolog_lines(
        ENV, [gpu, ASCEND, mlu], scontrol="scontrol", runner=replay(REAL_SQUEUE)
    )
    assert lines == ["export ZE_AFFINITY_MASK=7", "export ASCEND_RT_VISIBLE_DEVICES=10"]
    # job 1 holds nothing on another node
    other = {**ENV, "SLURMD_NODENAME": "hp-gpu02"}
    assert task_prolog_lines(other, [ASCEND], scontrol="s", runner=replay(REAL_SQUEUE)) == []
    # no export asked: squeue is not run at all
    assert task_prolog_lines(ENV, [], scontrol="s", runner=None) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("env", "runner", "said"),
    [
        ({"SLURMD_NODENAME": "hp-gpu01"}, replay(REAL_SQUEUE), "SLURM_JOB_ID '' is not a job id"),
        ({**ENV, "SLURM_JOB_ID": "1;id"}, replay(REAL_SQUEUE), "'1;id' is not a job id"),
        ({"SLURM_JOB_ID": "1"}, replay(REAL_SQUEUE), "SLURMD_NODENAME is not set"),
        ({**ENV, "SLURM_JOB_ID": "99"}, replay(REAL_SQUEUE), "0 records of job '99'"),
        (ENV, replay("{not json"), "squeue --json: not JSON"),
        (ENV, replay('{"jobs": []}\n\x1b[2J'), "squeue --json: not JSON"),
        (ENV, replay("", version="slurm\n"), "scontrol --version said 'slurm\\n'"),
        (ENV5, replay("slurm_load_jobs error", version=OLD), "does not begin with job 5's"),
    ],
)
def test_what_cannot_be_read_sets_nothing_and_says_why(env, runner, said):
    lines = task_prolog_lines(env, [ASCEND], scontrol="scontrol", runner=runner)
    assert len(lines) == 1 and lines[0].startswith("print hetpatrol TaskProlog: "), lines
    assert said in lines[0] and lines[0].endswith(": no device variable set"), lines
    assert lines[0].isprintable()


@pytest.mark.parametrize(
    ("version", "what"), [(NEW, "squeue --json"), (OLD, "scontrol show job -d"), (None, "")]
)
def test_a_failing_or_hung_query_sets_nothing(version, what):
    def fails(argv, timeout):
        if version and argv[1:] == ["--version"]:
            return version
        raise subprocess.CalledProcessError(1, argv, b"", b"slurm_load_jobs error\n")

    def hangs(argv, timeout):
        if version and argv[1:] == ["--version"]:
            return version
        raise subprocess.TimeoutExpired(argv, timeout)

    what = what or "scontrol --version"  # None: scontrol --version itself fails
    # a refusal says scontrol's own last stderr line (ask_job)
    for runner, said in ((fails, "exit 1: slurm_load_jobs error"), (hangs, "TimeoutExpired")):
        (line,) = task_prolog_lines(ENV, [ASCEND], scontrol="scontrol", runner=runner)
        assert f"TaskProlog: {what}: {said}" in line and line.isprintable(), line


def test_export_arguments_are_checked():
    assert parse_export("ascend", "ASCEND_RT_VISIBLE_DEVICES", "0=10,2=3") == Export(
        "ascend", "ASCEND_RT_VISIBLE_DEVICES", {0: 10, 2: 3}
    )
    for args, said in (
        (("asc$(id)", "V", "0=1"), "GRES name 'asc$(id)' is not one word"),
        (("ascend", "A-B", "0=1"), "variable 'A-B' is not a variable name"),
        (("ascend", "V", "0=1,"), "is not INDEX=ID"),
        (("ascend", "V", "0=1,0=2"), "index 0 twice"),
    ):
        with pytest.raises(ValueError, match=re.escape(said)):
            parse_export(*args)


def test_a_usage_error_is_a_print_line_and_exit_0(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["--export", "ascend", "V", "x"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("print hetpatrol TaskProlog: --export: table 'x'"), out
    assert out.count("\n") == 1


@pytest.mark.parametrize(
    ("version", "job", "fixture", "args"),
    [
        ("slurm 23.11.4", "1", "squeue-json-22.05-hostile.json", "squeue --json --jobs=1"),
        (OLD.strip(), "5", "scontrol-show-job-d-22.05-hostile.txt", "scontrol -d show job 5"),
    ],
)
def test_the_cli_runs_one_query_beside_scontrol(tmp_path, version, job, fixture, args):
    """The whole program, as the wrapper runs it (the console script is
    hetpatrol.entry): stand-in scontrol and squeue (the recorded outputs; they write
    their arguments) in the given scontrol's directory. 23.11: squeue --json for the one
    job; 22.05: scontrol -d show job, squeue never run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "squeue"):
        tool = bin_dir / name
        tool.write_text(
            f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "{version}"; exit 0; }}\n'
            f'echo "{name} $*" >> {tmp_path}/args\ncat {SLURM}/{fixture}\n'
        )
        tool.chmod(0o755)
    res = subprocess.run(
        [sys.executable, "-m", "hetpatrol.entry", "task-prolog",
         "--scontrol", str(bin_dir / "scontrol"),
         "--export", "ascend", "ASCEND_RT_VISIBLE_DEVICES", "0=10,1=11,2=12",
         "--export", "gpu", "ZE_AFFINITY_MASK", "0=4"],
        env={**os.environ, **ENV, "SLURM_JOB_ID": job}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    ascend = "10" if job == "1" else "10,11,12"  # job 1: IDX 0; job 5: IDX 0-2
    assert res.stdout == f"export ASCEND_RT_VISIBLE_DEVICES={ascend}\nexport ZE_AFFINITY_MASK=4\n"
    assert (tmp_path / "args").read_text() == f"{args}\n"


def test_the_entry_point_imports_neither_config_nor_collectors():
    """It runs before every task: the job_gres path only (no yaml, jsonschema, the
    collectors, the Prolog's verdict code)."""
    code = (
        "import sys\nfrom hetpatrol.entry import main\n"
        "main(['task-prolog', '--export', 'ascend', 'V', '0=1'])\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('yaml', 'jsonschema', "
        "'prometheus_client') or m.startswith(('hetpatrol.collector', 'hetpatrol.config', "
        "'hetpatrol.actions', 'hetpatrol.slurm.jobguard', 'hetpatrol.cli'))]\n"
        "print(bad)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "SLURMD_NODENAME")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "[]", res.stdout


def plan8(node: str = "hp-gpu01") -> Plan:
    """8 ascend cards in gres.conf order, Slurm's index i -> id 10+i (so that the table,
    not the index, shows in a variable)."""
    plan = Plan(node)
    for i in range(8):
        plan.cards.append(
            CardLine(
                f"ascend/{i}/0",
                "ascend",
                "ascend",
                "910b",
                f"/dev/davinci{i}",
                i,
                None,
                visible=(("ASCEND_RT_VISIBLE_DEVICES", 10 + i),),
            )  # fmt: skip
        )
    return plan


def test_the_generated_script_says_when_the_program_is_not_installed(tmp_path):
    script = tmp_path / "taskprolog"
    script.write_text(plan8().task_prolog(str(tmp_path / "no such program")))
    res = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        f"print hetpatrol TaskProlog: {tmp_path}/no such program is not installed: "
        "no device variable set\n"
    )


def test_the_generated_script_passes_its_table_to_the_program(tmp_path):
    program = tmp_path / "prog"
    program.write_text('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    program.chmod(0o755)
    script = tmp_path / "taskprolog"
    script.write_text(plan8().task_prolog(str(program)))
    res = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    table = ",".join(f"{i}={10 + i}" for i in range(8))
    assert res.stdout.split() == [
        "[--export]", "[ascend]", "[ASCEND_RT_VISIBLE_DEVICES]", f"[{table}]"
    ]  # fmt: skip


def test_the_packaged_wrapper_exits_0_when_hetpatrol_cannot_run(tmp_path):
    """slurmstepd fails the task when the TaskProlog fails: the wrapper says it instead.
    Its own PATH has no hetpatrol here (no package installed), and a user's PYTHONPATH
    is not passed on."""
    if Path("/usr/bin/hetpatrol").exists() or Path("/usr/local/bin/hetpatrol").exists():
        pytest.skip("a hetpatrol is installed on this machine")
    wrapper = REPO / "packaging" / "slurm" / "taskprolog"
    start = time.monotonic()
    res = subprocess.run(
        ["sh", str(wrapper), "--export", "ascend", "V", "0=1"],
        env={"PYTHONPATH": "/nonexistent", **ENV},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("print hetpatrol TaskProlog: hetpatrol task-prolog exited 127")
    assert time.monotonic() - start < 30


#: what a job's user may have in the environment slurmstepd runs the TaskProlog with
#: (the task's own): each broke ``hetpatrol task-prolog`` in the packaged wrapper, which
#: dropped only PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, PYTHONUSERBASE and PYTHONSAFEPATH
HOSTILE_ENV = [
    {"PYTHONINSPECT": "1"},  # a traceback of SystemExit and exit 1
    {"PYTHONIOENCODING": "utf-16"},  # every line UTF-16: slurmstepd reads no export
    {"PYTHONHASHSEED": "abc"},  # "Fatal Python error: config_init_hash_seed"
    {"PYTHONPLATLIBDIR": "xx"},  # no standard library found
    {"PYTHONEXECUTABLE": "/bin/false"},  # no module named 'hetpatrol'
    {"PYTHONWARNINGS": "error", "PYTHONDEVMODE": "1", "PYTHONMALLOC": "debug"},
    {"LD_PRELOAD": "/nonexistent/lib.so"},  # ld.so's error on every program
]


@pytest.mark.parametrize("hostile", HOSTILE_ENV, ids=lambda e: ",".join(e))
def test_the_packaged_wrapper_drops_the_users_python_and_loader_settings(tmp_path, hostile):
    """The wrapper as packaged (its PATH; this checkout's hetpatrol in place of the
    installed command, as in tests/test_gres_conf.py) with a stand-in squeue replaying the
    recorded answer (and an scontrol saying a version whose squeue filters): whatever
    Python or loader settings the job's user has, the task gets its variable, exactly the
    one line, nothing on stderr."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(f"#!/bin/sh\ncat {REPO}/fixtures/slurm/squeue-json-22.05-hostile.json\n")
    squeue.chmod(0o755)
    # a Slurm whose squeue --json honours --jobs (23.02.3 and later): the squeue path
    scontrol = bin_dir / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 'slurm 23.11.4'\n")
    scontrol.chmod(0o755)
    wrapper = (REPO / "packaging" / "slurm" / "taskprolog").read_text()
    assert "\nhetpatrol task-prolog " in wrapper
    program = tmp_path / "taskprolog"
    program.write_text(
        wrapper.replace(
            "\nhetpatrol task-prolog ", f"\n{sys.executable} -m hetpatrol.entry task-prolog "
        )
    )
    res = subprocess.run(
        ["sh", str(program), "--scontrol", str(bin_dir / "scontrol"),
         "--export", "ascend", "ASCEND_RT_VISIBLE_DEVICES", "0=10,1=11"],
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **ENV, **hostile},
        stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
    )  # fmt: skip
    # (ld.so says its LD_PRELOAD error once more, for sh itself, before a line of it runs)
    loader = b"LD_PRELOAD cannot be preloaded"
    said = [line for line in res.stderr.splitlines() if loader not in line]
    assert (res.returncode, said, res.stdout) == (
        0, [], b"export ASCEND_RT_VISIBLE_DEVICES=10\n"
    )  # fmt: skip
    assert res.stderr.count(b"\n") <= (1 if "LD_PRELOAD" in hostile else 0)
