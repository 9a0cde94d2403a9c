"""``hetpatrol task-prolog`` (hetpatrol/slurm/task_prolog.py) on a recorded ``squeue
--json`` of the real Slurm 22.05 test cluster (fixtures/slurm/README.md: job 1's name,
comment and work directory hold forged ``Nodes=hp-gpu01 GRES=ascend:910b:1(IDX:3)``
text; Slurm gave it gpu IDX 0 and ascend IDX 0), the packaged wrapper and the generated
TaskProlog script. The script run by the real slurmd is in tests/test_gres_conf.py."""

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
    parse_export,
    task_prolog_lines,
)

REAL_SQUEUE = (REPO / "fixtures" / "slurm" / "squeue-json-22.05-hostile.json").read_text()
ENV = {"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "hp-gpu01"}
ASCEND = Export("ascend", "ASCEND_RT_VISIBLE_DEVICES", {0: 10, 1: 11, 3: 13})


def replay(text: str, seen: list | None = None):
    def runner(argv, timeout):
        if seen is not None:
            seen.append((list(argv), timeout))
        return text

    return runner


def test_the_jobs_own_index_never_the_forged_one():
    seen: list = []
    lines = task_prolog_lines(
        ENV, [ASCEND], scontrol="/usr/bin/scontrol", runner=replay(REAL_SQUEUE, seen)
    )
    # ascend IDX 0 -> 10; the forged IDX:3 (-> 13) in name, comment, workdir is not read
    assert lines == ["export ASCEND_RT_VISIBLE_DEVICES=10"]
    assert seen == [(["/usr/bin/squeue", "--json", "--jobs=1"], 10.0)]


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
    ],
)
def test_what_cannot_be_read_sets_nothing_and_says_why(env, runner, said):
    lines = task_prolog_lines(env, [ASCEND], scontrol="scontrol", runner=runner)
    assert len(lines) == 1 and lines[0].startswith("print hetpatrol TaskProlog: "), lines
    assert said in lines[0] and lines[0].endswith(": no device variable set"), lines
    assert lines[0].isprintable()


def test_a_failing_or_hung_squeue_sets_nothing():
    def fails(argv, timeout):
        raise subprocess.CalledProcessError(1, argv, b"", b"slurm_load_jobs error\n")

    def hangs(argv, timeout):
        raise subprocess.TimeoutExpired(argv, timeout)

    for runner, said in ((fails, "CalledProcessError"), (hangs, "TimeoutExpired")):
        (line,) = task_prolog_lines(ENV, [ASCEND], scontrol="scontrol", runner=runner)
        assert f"squeue --json: {said}" in line and line.isprintable(), line


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


def test_the_cli_runs_squeue_beside_scontrol(tmp_path):
    """The whole program, as the wrapper runs it (the console script is
    hetpatrol.entry): a stand-in squeue (the recorded output; it writes its arguments)
    beside the given scontrol."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/args\ncat {REPO}/fixtures/slurm/'
        "squeue-json-22.05-hostile.json\n"
    )
    squeue.chmod(0o755)
    res = subprocess.run(
        [sys.executable, "-m", "hetpatrol.entry", "task-prolog",
         "--scontrol", str(bin_dir / "scontrol"),
         "--export", "ascend", "ASCEND_RT_VISIBLE_DEVICES", "0=10,1=11",
         "--export", "gpu", "ZE_AFFINITY_MASK", "0=4"],
        env={**os.environ, **ENV}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout == "export ASCEND_RT_VISIBLE_DEVICES=10\nexport ZE_AFFINITY_MASK=4\n"
    assert (tmp_path / "args").read_text() == "--json --jobs=1\n"


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
    recorded answer: whatever Python or loader settings the job's user has, the task gets
    its variable, exactly the one line, nothing on stderr."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(f"#!/bin/sh\ncat {REPO}/fixtures/slurm/squeue-json-22.05-hostile.json\n")
    squeue.chmod(0o755)
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
