"""``hetpatrol check`` (Slurm HealthCheckProgram): one line, Nagios exit codes, answered
from the daemon's state file alone, and never a call to scontrol."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import HETPATROL, NODES
from fakes import Scripted, make_patroller

import hetpatrol
from hetpatrol.config import load_config
from hetpatrol.exporters.state import write_state
from hetpatrol.healthcheck import check
from hetpatrol.patrol import Patroller

CHECK = [*HETPATROL, "check"]


@pytest.fixture
def guarded_path(tmp_path):
    """A PATH whose only scontrol leaves a mark: proof that check never runs it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mark = tmp_path / "scontrol-was-run"
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!/bin/sh\ntouch {mark}\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    yield env
    assert not mark.exists(), "hetpatrol check ran scontrol"


def state_file(base_config, path: Path, temps: list[float], mode: str = "ok") -> Path:
    scripted = Scripted("ascend")
    scripted.temps = temps
    scripted.mode = mode
    patroller = make_patroller(base_config, {"ascend": scripted})
    try:
        report = patroller.run()
    finally:
        patroller.close()
    write_state(path, report, interval_seconds=10)
    return path


def run_check(env, *args: str) -> tuple[int, list[str]]:
    out = subprocess.run(
        [*CHECK, *args], env=env, capture_output=True, text=True, timeout=30, cwd="/"
    )
    return out.returncode, out.stdout.splitlines()


def test_fresh_ok_state_exits_0(base_config, tmp_path, guarded_path):
    path = state_file(base_config, tmp_path / "state.json", [40.0, 41.0])
    code, lines = run_check(guarded_path, "--state-path", str(path))
    assert code == 0
    assert lines == [lines[0]] and lines[0].startswith("HETPATROL OK - n1: 2 ok (patrol 1, ")


def test_critical_state_exits_2_and_names_the_card(base_config, tmp_path, guarded_path):
    path = state_file(base_config, tmp_path / "state.json", [40.0, 95.0, 85.0])
    code, lines = run_check(guarded_path, "--state-path", str(path))
    assert code == 2
    (line,) = lines
    assert line.startswith("HETPATROL CRITICAL - n1: 1 critical, 1 ok, 1 warning; ")
    assert "ascend/1/0 critical temperature; ascend/2/0 warning temperature" in line


def test_a_card_names_only_the_checks_of_its_own_severity(tmp_path, guarded_path):
    """fixtures/nodes/nvlink-storm: GPU 2's XID is critical, its NVLink checks warnings
    and its clock reasons info (hetpatrol once --replay ... -v); the line names the
    critical XID alone for it, as the other GPUs' warning XIDs alone for them."""
    config = replace(load_config(), node="nvlink-storm-01")
    patroller = Patroller(config, replay_dir=NODES / "nvlink-storm")
    try:
        report = patroller.run()
    finally:
        patroller.close()
    path = tmp_path / "state.json"
    write_state(path, report, interval_seconds=10)
    code, (line,) = run_check(guarded_path, "--state-path", str(path))
    assert code == 2
    assert line.startswith(
        "HETPATROL CRITICAL - nvlink-storm-01: 1 critical, 4 ok, 3 warning; nvidia/2 "
        "critical xid; nvidia/0 warning xid; nvidia/1 warning xid; nvidia/3 warning xid "
        "(patrol 1, "
    ), line


def test_stale_state_exits_3(base_config, tmp_path, guarded_path):
    path = state_file(base_config, tmp_path / "state.json", [40.0])
    doc = json.loads(path.read_text())
    doc["finished_boot"] -= time.time() - 3600 - doc["finished"]
    doc["finished"] = time.time() - 3600
    path.write_text(json.dumps(doc))
    code, lines = run_check(guarded_path, "--state-path", str(path))
    assert code == 3
    (line,) = lines
    assert re.match(
        r"HETPATROL UNKNOWN - stale verdict: last patrol 36\d\d s ago \(max 40 s\)", line
    )
    code, _ = run_check(guarded_path, "--state-path", str(path), "--max-age", "7200")
    assert code == 0


def test_missing_or_broken_state_exits_3(tmp_path, guarded_path):
    code, lines = run_check(guarded_path, "--state-path", str(tmp_path / "nope.json"))
    assert code == 3
    assert lines == [
        f"HETPATROL UNKNOWN - no state file {tmp_path}/nope.json: is the hetpatrol daemon running?"
    ]
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "hetpatrol.state/1", "fini')
    code, lines = run_check(guarded_path, "--state-path", str(bad))
    assert code == 3 and len(lines) == 1 and lines[0].startswith("HETPATROL UNKNOWN - cannot read")


def test_state_path_from_a_config_with_slurm_enabled(base_config, tmp_path, guarded_path):
    path = state_file(base_config, tmp_path / "state.json", [40.0])
    cfg = tmp_path / "h.yaml"
    cfg.write_text(
        f"node: n1\nstate_path: {path}\nslurm: {{enabled: true, drain: {{enabled: true}}}}\n"
    )
    code, lines = run_check(guarded_path, "--config", str(cfg))
    assert code == 0 and lines[0].startswith("HETPATROL OK")
    cfg.write_text("node: n1\nslurm: {enabled: maybe}\n")
    code, lines = run_check(guarded_path, "--config", str(cfg))
    assert code == 3 and "slurm.enabled" in lines[0] and len(lines) == 1


def test_check_function_unknown_and_unreadable(base_config, tmp_path):
    path = state_file(base_config, tmp_path / "state.json", [40.0], mode="fail")
    code, line = check(path)
    assert code == 3 and line.startswith("HETPATROL UNKNOWN - n1: ")
    assert "collector_failed" in line
    if os.geteuid() != 0:  # root reads any file
        path.chmod(0)
        assert check(path)[0] == 3
    doc = json.loads(path.read_text())
    del doc["health"]
    path.write_text(json.dumps(doc))
    assert check(path) == (3, f"HETPATROL UNKNOWN - state file {path} has no verdict")


def test_check_distrusts_damaged_state_files(tmp_path):
    """A forged or damaged state file is UNKNOWN (3), never OK and never a traceback."""
    import time as _time

    from fakes import Scripted, make_patroller

    from hetpatrol.config import load_config
    from hetpatrol.exporters.state import write_state

    path = tmp_path / "state.json"
    write_state(path, make_patroller(load_config(), {"ascend": Scripted()}).run(), 10)
    good = json.loads(path.read_text())
    assert check(path)[0] == 0
    # the wall clock's rules: a file without this boot's stamp (another boot's, an
    # older writer's)
    del good["boot_id"], good["finished_boot"]
    cases = {
        "future": {**good, "finished": _time.time() + 86400},
        "nan": {**good, "finished": float("nan")},
        "exit_code lies": {**good, "exit_code": 0, "health": "critical"},
        "interval nan": {**good, "interval_seconds": float("nan"), "finished": 1.0},
        "cards not a list": {**good, "cards": 5, "health": "warning"},
    }
    expected = {
        "future": 3,
        "nan": 3,
        "exit_code lies": 2,
        "interval nan": 3,
        "cards not a list": 3,
    }
    for name, doc in cases.items():
        path.write_text(json.dumps(doc))
        code, line = check(path)
        assert code == expected[name], (name, line)
        assert "\n" not in line
    path.write_text("[" * 100000 + "]" * 100000)  # deeper than the JSON parser allows
    assert check(path)[0] == 3


HEAVY = ("jsonschema", "prometheus_client", "pynvml", "structlog", "asyncio", "yaml", "psutil")


def _modules_after(argv: list[str], tmp_path) -> tuple[int, str, list[str]]:
    """Exit code, stdout and the heavy modules imported by ``hetpatrol.entry.main(argv)``
    in a fresh interpreter (Slurm runs ``check`` on every node at every interval)."""
    code = (
        "import sys, json\n"
        "from hetpatrol.entry import main\n"
        f"rc = main({argv!r})\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        "sys.stdout.flush()\n"
        "print(json.dumps([rc, heavy]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    *lines, last = run.stdout.strip().splitlines()
    rc, heavy = json.loads(last)
    return rc, "\n".join(lines), heavy


def test_check_imports_nothing_past_json_and_the_os_without_site_hooks(tmp_path):
    """Without site hooks (``python -S``: no .pth file or editable finder importing for
    it), ``check --state-path`` imports no argparse, typing, pathlib, tempfile or glob:
    each was milliseconds of a run slurmd makes on every node at every interval."""
    state = tmp_path / "state.json"
    write_state(state, Patroller(load_config(), replay_dir=NODES / "healthy-mixed").run(), 10.0)
    root = str(Path(hetpatrol.__file__).resolve().parents[1])
    code = (
        f"import sys; sys.path.insert(0, {root!r})\n"
        "from hetpatrol.entry import main\n"
        f"rc = main(['check', '--state-path', {str(state)!r}])\n"
        "extra = {'argparse', 'typing', 'pathlib', 'tempfile', 'glob', 'yaml', 'logging'}\n"
        "print(rc, sorted({m.split('.')[0] for m in sys.modules} & extra))\n"
    )
    run = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert run.stdout.splitlines()[-1] == "0 []", run.stdout + run.stderr


def test_check_with_a_state_path_imports_no_heavy_module(tmp_path):
    state = tmp_path / "state.json"
    report = Patroller(load_config(), replay_dir=NODES / "sick-mixed").run()
    write_state(state, report, 10.0)
    rc, out, heavy = _modules_after(["check", "--state-path", str(state)], tmp_path)
    assert (rc, heavy) == (2, [])
    assert out.startswith(f"HETPATROL CRITICAL - {report.node}: 3 critical, 9 ok; nvidia/1 ")
    rc, out, heavy = _modules_after(["check", f"--state-path={state}", "--max-age=1e6"], tmp_path)
    assert (rc, heavy) == (2, [])


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--state-path", "S", "--max-age", "0"],  # the full parser's usage error
        ["check", "--state-path", "S", "--config", "C"],
        ["check", "--state-path"],
        ["check", "--state-path", "S", "--state-path", "S"],
    ],
)
def test_check_forms_the_fast_path_does_not_know_go_to_the_full_cli(argv, tmp_path, capsys):
    from hetpatrol.cli import main as cli_main
    from hetpatrol.entry import main as entry_main

    def outcome(main):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        return code, capsys.readouterr()

    assert outcome(entry_main) == outcome(cli_main)


# ------------------------------------------------------------- whose state file
OTHER_UID = 54321  # no user of this machine: "someone else"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def _trusted_state(tmp_path) -> Path:
    state = tmp_path / "state.json"
    write_state(state, Patroller(load_config(), replay_dir=NODES / "healthy-mixed").run(), 10.0)
    assert check(state)[0] == 0
    return state


def _all_three(state: Path) -> tuple[tuple[int, str], object, tuple[int, str]]:
    """(check, the Prolog's decision, the Epilog) on ``state``."""
    from hetpatrol.slurm import jobguard
    from hetpatrol.slurm.epilog import run_epilog

    env = {"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0"}

    def no_scontrol(argv, timeout):
        raise AssertionError(argv)

    def no_patrol():
        raise AssertionError("patrolled on an untrusted state file")

    guard = jobguard.guard(env, state, runner=no_scontrol)
    return check(state), guard, run_epilog(env, state, no_patrol, runner=no_scontrol)


def _refused(state: Path, said: str) -> None:
    (code, line), guard, (ecode, eline) = _all_three(state)
    assert code == 3 and line.startswith(f"HETPATROL UNKNOWN - untrusted state file {state}: ")
    assert said in line, line
    # the Prolog: not the daemon's verdict, so no drain either (whoever wrote it would
    # decide the drain): the job goes through, the reason said
    assert guard.exit_code == 0 and guard.reason.startswith("untrusted state file"), guard
    assert said in guard.reason and guard.reason.endswith(": job let through")
    assert ecode == 0 and said in eline and eline.endswith("nothing checked"), eline


@needs_root
def test_a_state_file_of_another_user_is_refused(tmp_path):
    state = _trusted_state(tmp_path)
    os.chown(state, OTHER_UID, -1)
    _refused(state, f"is owned by uid {OTHER_UID}, not root or the daemon's")


@pytest.mark.parametrize(("mode", "said"), [(0o646, "everyone"), (0o660, "group")])
def test_a_state_file_others_can_write_is_refused(tmp_path, mode, said):
    state = _trusted_state(tmp_path)
    state.chmod(mode)
    _refused(state, f"is writable by {said}")


@needs_root
def test_a_symlink_or_directory_of_another_user_on_the_way_is_refused(tmp_path):
    state = _trusted_state(tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(state)
    assert check(link)[0] == 0  # root's own symlink: followed
    os.lchown(link, OTHER_UID, -1)
    _refused(link, f"is a symlink owned by uid {OTHER_UID}")
    # a symlinked directory on the way, owned by someone else
    (tmp_path / "d").symlink_to(tmp_path)
    os.lchown(tmp_path / "d", OTHER_UID, -1)
    _refused(tmp_path / "d" / "state.json", f"{tmp_path}/d is a symlink owned by uid")
    # a directory someone else owns (they can swap the file in it)
    sub = tmp_path / "sub"
    sub.mkdir()
    state.rename(sub / "state.json")
    assert check(sub / "state.json")[0] == 0
    os.chown(sub, OTHER_UID, -1)
    _refused(sub / "state.json", f"{sub} is owned by uid {OTHER_UID}")


def test_a_world_writable_directory_on_the_way_is_refused_unless_sticky(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    state = _trusted_state(sub)
    sub.chmod(0o777)
    _refused(state, f"{sub} is writable by everyone (mode 777)")
    sub.chmod(0o1777)  # /tmp's mode: only an entry's owner may rename or remove it
    assert check(state)[0] == 0


@needs_root
def test_the_daemons_own_user_is_trusted(tmp_path, monkeypatch):
    """The packaged unit runs the daemon as User=hetpatrol: root's Prolog believes that
    user's file (here the user ``nobody`` stands in for it)."""
    import pwd

    from hetpatrol import healthcheck

    unit = (Path(__file__).resolve().parents[1] / "systemd" / "hetpatrol.service").read_text()
    assert re.search(r"(?m)^User=(\S+)$", unit).group(1) == healthcheck.DAEMON_USER
    nobody = pwd.getpwnam("nobody").pw_uid
    state = _trusted_state(tmp_path)
    os.chown(state, nobody, -1)
    assert check(state)[0] == 3
    monkeypatch.setattr(healthcheck, "DAEMON_USER", "nobody")
    assert check(state)[0] == 0
