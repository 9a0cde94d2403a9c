"""``hetpatrol doctor``: the unit read as systemd merges it, the probes run with the unit's
credentials (``setpriv``), a real daemon's ``/metrics``, the report's width, and the
support bundle's redaction. The installed package's doctor: tests/test_package.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import HETPATROL, REPO, replay_run_argv

from hetpatrol import doctor
from hetpatrol.tool import RECORD_DIR_ENV, run_tool

UNIT = REPO / "systemd" / "hetpatrol.service"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unit_dir(tmp_path: Path, text: str, dropins: dict[str, str] | None = None) -> Path:
    d = tmp_path / "units"
    d.mkdir()
    (d / "hetpatrol.service").write_text(text)
    for name, body in (dropins or {}).items():
        (d / "hetpatrol.service.d").mkdir(exist_ok=True)
        (d / "hetpatrol.service.d" / name).write_text(body)
    return d


def test_the_shipped_unit_is_read_as_systemd_runs_it(tmp_path):
    d = _unit_dir(tmp_path, UNIT.read_text())
    u = doctor.unit_settings((str(d),))
    assert (u.user, u.group, u.groups, u.capabilities) == (
        "hetpatrol",
        "hetpatrol",
        ("HwHiAiUser",),
        ("syslog",),
    )
    assert u.config == "/etc/hetpatrol/hetpatrol.yaml"
    assert u.path.startswith("/usr/local/sbin:") and "/usr/local/Ascend/driver/tools" in u.path


def test_a_drop_in_resets_and_extends_lists_and_overrides_the_user(tmp_path):
    # systemd.service(5): an empty assignment resets a list; the last User= wins
    d = _unit_dir(
        tmp_path,
        UNIT.read_text(),
        {
            "10-groups.conf": "[Service]\nSupplementaryGroups=\nSupplementaryGroups=video render\n",
            "20-root.conf": "[Service]\nUser=root\nExecStart=\nExecStart=/x run --config=/y\n",
        },
    )
    u = doctor.unit_settings((str(d),))
    assert (u.user, u.groups, u.config) == ("root", ("video", "render"), "/y")


def test_a_quote_systemd_would_not_accept_is_said_or_skipped_as_systemd_does(tmp_path):
    # systemd ignores an Environment= assignment it cannot unquote (the unit still runs):
    # the doctor stopped at "No closing quotation", naming neither setting nor file
    d = _unit_dir(
        tmp_path,
        "[Service]\nEnvironment=MSG=it's\nEnvironment=PATH=/opt/x:/usr/bin\n"
        "ExecStart=/usr/bin/hetpatrol run --config /etc/h.yaml\n",
        {"20-broken.conf": '[Service]\nExecStart=\nExecStart=/x run --config "/y\n'},
    )
    with pytest.raises(ValueError, match=r"the unit's ExecStart= cannot be read .*'/x run"):
        doctor.unit_settings((str(d),))
    (d / "hetpatrol.service.d" / "20-broken.conf").unlink()
    u = doctor.unit_settings((str(d),))
    assert (u.path, u.config) == ("/opt/x:/usr/bin", "/etc/h.yaml")


def test_a_group_the_node_lacks_fails_with_what_systemd_does(tmp_path):
    text = UNIT.read_text().replace(
        "SupplementaryGroups=HwHiAiUser", "SupplementaryGroups=no-such-group-hp"
    )
    checks = doctor.diagnose((str(_unit_dir(tmp_path, text)),))
    assert [(c.level, c.name) for c in checks] == [("FAIL", "unit")]
    assert "no group no-such-group-hp" in checks[0].detail
    assert "216/GROUP" in checks[0].detail and "sysusers" in checks[0].fix
    assert doctor.exit_code(checks) == 2


def _config(tmp_path: Path, port: int) -> Path:
    cfg = tmp_path / "hetpatrol.yaml"
    cfg.write_text(
        f'listen: "127.0.0.1:{port}"\n'
        f"state_path: {tmp_path}/state/state.json\n"
        f"jsonl:\n  path: {tmp_path}/log/patrol.jsonl\n"
    )
    return cfg


@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv to the unit's user needs root")
def test_as_root_the_probe_runs_with_the_units_credentials_and_finds_the_daemon(tmp_path):
    port = _free_port()
    cfg = _config(tmp_path, port)
    unit = (
        "[Service]\nUser=root\nGroup=root\nAmbientCapabilities=CAP_SYSLOG\n"
        f"Environment=PATH=/usr/bin:/bin\nExecStart=/usr/bin/hetpatrol run --config {cfg}\n"
    )
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "xdg"))
    proc = subprocess.Popen(
        replay_run_argv("healthy-mixed", port, tmp_path / "d.jsonl", 1.0),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # ready when /metrics answers (the daemon serves after its first patrol)
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    pytest.fail("daemon did not answer: " + proc.communicate()[1][-2000:])
                time.sleep(0.2)
        checks = doctor.diagnose((str(_unit_dir(tmp_path, unit)),))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)
    by = {c.name: c for c in checks}
    assert by["unit"].detail == "runs as root:root, caps syslog"
    assert by["config"].level == "OK" and str(cfg) in by["config"].detail
    assert by["kmsg"].level == "OK" and by["kmsg"].detail == "/dev/kmsg readable as root"
    assert by["state"].detail == f"{tmp_path}/state/state.json writable as root"
    assert by["jsonl"].level == "OK"
    assert by["metrics"] == doctor.Check(
        "OK", "metrics", f"http://127.0.0.1:{port}/metrics answers"
    )
    # this machine has no accelerator and no vendor tool: every plugin says absent, once
    assert by["vendors absent"].level == "INFO"
    assert by["vendors absent"].detail.startswith("amd, ascend, cambricon,")
    assert {c.level for c in checks} <= {"OK", "INFO"}, doctor.render(checks)
    assert doctor.exit_code(checks) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv to another user needs root")
def test_a_state_directory_the_units_user_cannot_write_fails(tmp_path):
    # pytest's tmp_path lies under a 0700 directory: this one the user nobody can read
    shared = Path(tempfile.mkdtemp(prefix="hetpatrol-doctor-"))
    try:
        shared.chmod(0o755)
        cfg = _config(shared, _free_port())
        cfg.chmod(0o644)
        (shared / "state").mkdir(mode=0o700)
        unit = f"[Service]\nUser=nobody\nGroup=nogroup\nExecStart=/x run --config {cfg}\n"
        checks = doctor.diagnose((str(_unit_dir(tmp_path, unit)),))
    finally:
        shutil.rmtree(shared)
    tmp_path = shared
    by = {c.name: c for c in checks}
    if "probe" in by and "Permission denied" in by["probe"].detail:
        pytest.skip(f"the user nobody cannot run {sys.executable}: {by['probe'].detail}")
    assert by["state"].level == "FAIL"
    assert f"{tmp_path}/state is not writable" in by["state"].detail
    assert "as nobody" in by["state"].detail
    assert doctor.exit_code(checks) == 2


def test_the_report_fits_80_columns_and_says_every_fix():
    checks = [
        doctor.Check("OK", "kmsg", "/dev/kmsg readable as hetpatrol"),
        doctor.Check(
            "FAIL",
            "metrics",
            "http://127.0.0.1:9477/metrics: [Errno 111] Connection refused " * 3,
            "systemctl enable --now hetpatrol.service; journalctl -u hetpatrol",
        ),
        doctor.Check("WARN", "vendor nvidia", "tool \x1b[31mred\x1b[0m", "fix \x07 it"),
    ]
    text = doctor.render(checks, 80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "\x1b" not in text and "\x07" not in text
    assert "fix: systemctl enable --now hetpatrol.service;" in text
    assert text.splitlines()[-1] == "1 ok, 1 warn, 1 fail"
    assert doctor.exit_code(checks) == 2


def test_the_deploy_pages_example_is_what_render_prints_for_the_shipped_plugins():
    """docs/deploy.md's report of a packaged node (daemon stopped): read back into its
    checks, :func:`doctor.render` prints it as shown (columns, wrapping, the count line),
    and it has one ``patrol <name>`` line per plugin pyproject.toml ships (the page once
    showed two of nine, under a narrower name column, and counted 4 OK lines of 5)."""
    import tomllib

    text = (REPO / "docs" / "deploy.md").read_text()
    m = re.search(r"```\n(OK   unit .*?)```", text, re.S)
    assert m, "docs/deploy.md: no doctor report example"
    shown = m[1]
    lines = shown.splitlines()
    indent = min(len(ln) - len(ln.lstrip()) for ln in lines if ln.startswith(" "))
    checks: list[doctor.Check] = []
    for line in lines[:-1]:
        if not line.startswith(" "):
            level, name = line[:4].strip(), line[5:indent].strip()
            checks.append(doctor.Check(level, name, line[indent:]))
            continue
        last, more = checks[-1], line[indent:]
        if more.startswith("fix: "):
            checks[-1] = doctor.Check(last.level, last.name, last.detail, more[5:])
        elif last.fix is not None:
            checks[-1] = doctor.Check(last.level, last.name, last.detail, f"{last.fix} {more}")
        else:
            checks[-1] = doctor.Check(last.level, last.name, f"{last.detail} {more}")
    assert doctor.render(checks, 80) == shown
    shipped = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][
        "hetpatrol.collectors"
    ]
    patrolled = [c.name.removeprefix("patrol ") for c in checks if c.name.startswith("patrol ")]
    assert patrolled == sorted(shipped)


def test_run_tool_records_a_replay_file_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv(RECORD_DIR_ENV, str(tmp_path / "rec"))
    out = run_tool(["sh", "-c", "echo 'NPU 0 OK'"], 5)
    assert out.stdout == "NPU 0 OK\n"
    assert (tmp_path / "rec" / "sh_-c_echo 'NPU 0 OK'.txt").read_text() == "NPU 0 OK\n"


def test_the_bundle_redacts_user_names_unless_asked(tmp_path):
    cfg = _config(tmp_path, _free_port())
    (tmp_path / "state").mkdir()
    (tmp_path / "log").mkdir()
    state = {"cards": [{"processes": [{"pid": 7, "user": "alice", "job_id": "42"}]}]}
    (tmp_path / "state" / "state.json").write_text(json.dumps(state))
    lines = [json.dumps({"kind": "card", "seq": i, "user": "alice"}) for i in range(300)]
    (tmp_path / "log" / "patrol.jsonl").write_text("\n".join(lines) + "\n")
    for redact, name in ((True, "r.tgz"), (False, "plain.tgz")):
        argv = [*HETPATROL, "doctor", "--config", str(cfg), "--unit-dir", str(tmp_path / "none")]
        argv += ["--bundle", str(tmp_path / name)] + ([] if redact else ["--no-redact"])
        res = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert res.returncode in (1, 2), res.stderr  # no unit: a warning; no daemon: a failure
        with tarfile.open(tmp_path / name) as tar:
            members = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar}
            assert all(m.mode == 0o600 for m in tar.getmembers())
        assert {"doctor.json", "versions.txt", "config.yaml", "state.json"} <= set(members)
        jsonl = members["patrol.jsonl"].decode().splitlines()
        assert len(jsonl) == 200 and json.loads(jsonl[-1])["seq"] == 299
        blob = b"".join(members.values())
        if redact:
            assert b"alice" not in blob
            proc = json.loads(members["state.json"])["cards"][0]["processes"][0]
            assert proc["pid"] == 7 and proc["job_id"] == "42"  # support needs these
            # the same placeholder for the same name, in every file
            assert re.fullmatch(r"user-\d+", proc["user"])
            assert json.loads(jsonl[0])["user"] == proc["user"]
        else:
            assert b'"user": "alice"' in members["state.json"]
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600
    # never written through a link left at the path
    (tmp_path / "link.tgz").symlink_to(tmp_path / "victim")
    res = subprocess.run(
        [
            *HETPATROL,
            "doctor",
            "--config",
            str(cfg),
            "--unit-dir",
            str(tmp_path / "none"),
            "--bundle",
            str(tmp_path / "link.tgz"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 1 and not (tmp_path / "victim").exists(), res.stderr
    assert shutil.which("setpriv"), "util-linux's setpriv runs the probe"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_directory_another_user_owns_fails_with_the_daemons_own_reason(tmp_path):
    """The daemon refuses to write where someone else could swap its files
    (hetpatrol.safe_files); doctor says so before the daemon does."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 65534, 65534)  # nobody
    cfg = tmp_path / "hetpatrol.yaml"
    cfg.write_text(f'listen: "127.0.0.1:{_free_port()}"\nstate_path: {shared}/state.json\n')
    checks = doctor.probe(str(cfg), "/usr/bin:/bin")
    (state,) = [c for c in checks if c.name == "state"]
    assert state.level == "FAIL"
    assert state.detail == (
        f"{shared}/state.json as root: refusing to write {shared}/state.json: "
        f"directory {shared} is owned by uid 65534 (nobody), not root or this user"
    )


def _bundle(tmp_path: Path, monkeypatch, cfg: Path) -> dict[str, bytes]:
    """write_bundle with the recorded patrol left out (its own test runs it)."""
    from hetpatrol import doctor_bundle

    monkeypatch.setattr(doctor_bundle, "_record_patrol", lambda d, c: d.mkdir() or "{}")
    out = doctor_bundle.write_bundle(tmp_path / "b.tgz", [], str(cfg))
    with tarfile.open(out) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar}


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another user needs root to make")
def test_the_bundle_takes_no_file_another_user_left_at_the_daemons_paths(tmp_path, monkeypatch):
    # the doctor runs as root: a config keeping its files in a shared directory (/tmp)
    # must not let another user's link put a root-only file into the tarball
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$SECRET-HASH:19000:0:99999:7:::\n")
    secret.chmod(0o600)
    (shared / "patrol.jsonl").symlink_to(secret)
    os.lchown(shared / "patrol.jsonl", 65534, 65534)
    (shared / "state.json").write_text('{"cards": [], "note": "SECRET-FORGED"}')
    os.chown(shared / "state.json", 65534, 65534)
    cfg = tmp_path / "hetpatrol.yaml"
    cfg.write_text(f"state_path: {shared}/state.json\njsonl:\n  path: {shared}/patrol.jsonl\n")
    members = _bundle(tmp_path, monkeypatch, cfg)
    assert b"SECRET" not in b"".join(members.values())
    assert "patrol.jsonl" not in members and "state.json" not in members
    assert b"symlink owned by uid 65534" in members["patrol.jsonl.error"]
    assert b"owned by uid 65534" in members["state.json.error"]


def test_the_bundle_redacts_a_name_wherever_it_is_written(tmp_path, monkeypatch):
    # a process name is a path under its user's home; the name is known only from a
    # later line's "user" (an LDAP user /etc/passwd does not list)
    (tmp_path / "state").mkdir()
    (tmp_path / "log").mkdir()
    proc = {"pid": 7, "name": "/home/zoe/env/bin/python", "user": "zoe", "job_id": "42"}
    (tmp_path / "state" / "state.json").write_text(json.dumps({"cards": [{"processes": [proc]}]}))
    lines = [
        {"kind": "event", "message": "zoe's job 42 on GPU 0", "zoe": 1},
        "not JSON: zoe",
        {"kind": "card", "processes": [{"user": "zoe", "pid": 7}]},
    ]
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    (tmp_path / "log" / "patrol.jsonl").write_text(text)
    members = _bundle(tmp_path, monkeypatch, _config(tmp_path, _free_port()))
    assert b"zoe" not in b"".join(members.values())
    placeholder = json.loads(members["state.json"])["cards"][0]["processes"][0]["user"]
    assert re.fullmatch(r"user-\d+", placeholder)
    first, second, _ = members["patrol.jsonl"].decode().splitlines()
    assert json.loads(first)["message"] == f"{placeholder}'s job 42 on GPU 0"
    assert json.loads(first)[placeholder] == 1 and second == f"not JSON: {placeholder}"


def test_the_bundle_bounds_the_state_file_and_does_not_wait_on_a_fifo(tmp_path, monkeypatch):
    (tmp_path / "state").mkdir()
    (tmp_path / "log").mkdir()
    with open(tmp_path / "state" / "state.json", "wb") as f:
        f.truncate(64 * 1024 * 1024)  # sparse: no disk used
    os.mkfifo(tmp_path / "log" / "patrol.jsonl", 0o600)
    start = time.monotonic()
    members = _bundle(tmp_path, monkeypatch, _config(tmp_path, _free_port()))
    assert time.monotonic() - start < 60
    assert b"larger than" in members["state.json.error"]
    assert b"not a regular file" in members["patrol.jsonl.error"]


def test_the_bundle_holds_the_effective_config_and_names_its_files(tmp_path, monkeypatch):
    """``doctor --bundle`` held no config when the bundled one was used, and only the
    site file's few lines otherwise: ``config-effective.yaml`` is the config as it is
    used (bundled plus site), its head naming the files, redacted as the rest."""
    import yaml

    from hetpatrol import doctor_bundle
    from hetpatrol.config_file import bundled_config_path

    (tmp_path / "state").mkdir()
    proc = {"pid": 7, "name": "python", "user": "zoe", "job_id": "42"}
    (tmp_path / "state" / "state.json").write_text(json.dumps({"cards": [{"processes": [proc]}]}))
    cfg = tmp_path / "hetpatrol.yaml"
    cfg.write_text(
        f"interval_seconds: 30\nnode: zoe\nstate_path: {tmp_path}/state/state.json\n"
        f"jsonl:\n  path: {tmp_path}/log/patrol.jsonl\n"
    )
    members = _bundle(tmp_path, monkeypatch, cfg)
    text = members["config-effective.yaml"].decode()
    head = [x for x in text.splitlines() if x.startswith("#   ")]
    assert head[0] == f"#   {bundled_config_path()}" and head[-1] == f"#   {cfg}", head
    doc = yaml.safe_load(text)
    assert doc["interval_seconds"] == 30  # the site's
    assert doc["recovery_patrols"] == 3 and doc["jsonl"]["backups"] == 5  # bundled
    assert any(p["name"] == "a100" for p in doc["profiles"])  # the plugin's profiles
    assert "zoe" not in text and re.fullmatch(r"user-\d+", doc["node"]), doc["node"]
    # no config file: the bundled config alone, named, not nothing
    monkeypatch.setattr(doctor_bundle, "_record_patrol", lambda d, c: d.mkdir() or "{}")
    out = doctor_bundle.write_bundle(tmp_path / "c.tgz", [], None)
    with tarfile.open(out) as tar:
        names = {m.name.split("/", 1)[1]: m for m in tar}
        text = tar.extractfile(names["config-effective.yaml"]).read().decode()
    assert "config.yaml" not in names
    assert f"#   {bundled_config_path()}\n" in text and f"#   {cfg}" not in text
    assert yaml.safe_load(text)["interval_seconds"] == 10
