"""The Debian package: built by ``packaging/build-deb`` with Debian's own tooling
(dpkg-buildpackage + debhelper), checked by lintian, and installed for real.

How it is run, honestly: one build per test session (module fixture, a temp dir; about
a minute on 2 cores). Its contents are read with ``dpkg-deb -c`` and, extracted with
``dpkg -x`` into a throwaway root, compared byte for byte with this checkout. The
extracted venv is *not* run from there: its ``bin/python3.X`` links
``../../../bin/python3.X`` and its scripts' shebangs name ``/usr/lib/hetpatrol/bin/python``,
which only resolve once the package sits at ``/``. So the package is installed with
``dpkg -i`` on this machine (CI's is a throwaway one, see ``.ci/run``; needs root), its
``/usr/bin/hetpatrol`` is run (also as the ``hetpatrol`` user its sysusers snippet
creates), ``systemd-analyze verify`` checks the installed units, and ``dpkg --purge``
removes it again. A ``hetpatrol`` package or ``/usr/lib/hetpatrol`` already on the machine
is never replaced: the install tests fail instead.

Missing Debian tools skip these tests, but fail them under CI=true (``.ci/run``
installs dpkg-dev, debhelper, build-essential, python3-venv and lintian).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import HETPATROL, NODES, REPO, require_program

PREFIX = "/usr/lib/hetpatrol"
UNITDIR = "/lib/systemd/system"
UNITS = ("hetpatrol.service", "hetpatrol-scontrol.socket", "hetpatrol-scontrol@.service")
SCENARIO = "healthy-mixed"
#: packaging/slurm/<name> -> /usr/libexec/hetpatrol/<name>
SLURM_ENTRY_POINTS = ("healthcheck", "prolog", "epilog", "taskprolog")


def _pyproject_version() -> str:
    text = (REPO / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"$', text, re.M).group(1)


def _pyproject_dependencies() -> list[str]:
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S).group(1)
    return re.findall(r'"([^"]+)"', block)


def _fail_or_skip(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _debian_python() -> str:
    """``/usr/bin/python3`` resolved (python3.11 on bookworm): the venv's interpreter."""
    base = os.path.realpath("/usr/bin/python3")
    if not re.fullmatch(r"/usr/bin/python3\.\d+", base):
        _fail_or_skip(f"/usr/bin/python3 is {base}: Debian's python3 is needed")
    check = subprocess.run([base, "-c", "import ensurepip, venv"], capture_output=True)
    if check.returncode != 0:
        _fail_or_skip("python3-venv is not installed (.ci/run installs it)")
    return base


@dataclass
class Built:
    deb: Path
    changes: Path
    #: ``dpkg-deb -c``: path (without the leading ".") -> (mode string, link target or "")
    entries: dict[str, tuple[str, str]]
    #: the .deb extracted with ``dpkg -x``
    root: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    for program, package in (
        ("dpkg-buildpackage", "dpkg-dev"),
        ("dh", "debhelper"),
        ("strip", "build-essential"),
    ):
        require_program(program, package=package)
    _debian_python()
    out = tmp_path_factory.mktemp("deb")
    # lintian runs in its own test below, so that a lintian error fails that test only
    env = dict(os.environ, HETPATROL_NO_LINTIAN="1")
    res = subprocess.run(
        [str(REPO / "packaging" / "build-deb"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
    arch = subprocess.run(
        ["dpkg-architecture", "-qDEB_HOST_ARCH"], capture_output=True, text=True, check=True
    ).stdout.strip()
    stem = f"hetpatrol_{_pyproject_version()}-1_{arch}"
    deb = out / f"{stem}.deb"
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    entries = {}
    for line in listing.splitlines():
        # drwxr-xr-x root/root 0 2026-12-01 07:27 ./usr/bin/hetpatrol -> ../lib/...
        fields = line.split(None, 5)
        name, _, target = fields[5].partition(" -> ")
        entries[name.removeprefix(".").rstrip("/") or "/"] = (fields[0], target)
    root = out / "root"
    subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return Built(deb=deb, changes=out / f"{stem}.changes", entries=entries, root=root)


def _control(deb: Path, field: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), field], capture_output=True, text=True, check=True
    ).stdout.strip()


# ------------------------------------------------------------------ what the .deb holds
@pytest.mark.slow
def test_package_holds_venv_units_config_and_rules(built):
    e = built.entries
    # the venv, and the two entry points on PATH as symlinks into it
    for path in (
        f"{PREFIX}/pyvenv.cfg",
        f"{PREFIX}/bin/hetpatrol",
        f"{PREFIX}/bin/hetpatrol-scontrol",
        f"{PREFIX}/lib/python3.{_debian_python().rsplit('.', 1)[1]}/site-packages/hetpatrol/cli.py",
    ):
        assert path in e, path
    # the data files the code reads through importlib.resources: the bundled config and
    # the plugins' own (profiles, the Ascend fault code table beside its plugin)
    site = f"{PREFIX}/lib/python3.{_debian_python().rsplit('.', 1)[1]}/site-packages/hetpatrol"
    for path in (
        "bundled/hetpatrol.yaml",
        "collectors/nvidia_profiles.yaml",
        "collectors/ascend_fault_codes.yaml",
    ):
        assert e[f"{site}/{path}"][0] == "-rw-r--r--", path
    assert f"{site}/bundled/ascend_fault_codes.yaml" not in e
    assert e["/usr/bin/hetpatrol"] == ("lrwxrwxrwx", "../lib/hetpatrol/bin/hetpatrol")
    assert e["/usr/bin/hetpatrol-scontrol"] == (
        "lrwxrwxrwx",
        "../lib/hetpatrol/bin/hetpatrol-scontrol",
    )
    assert e[f"{PREFIX}/bin/hetpatrol"][0] == "-rwxr-xr-x"
    # units, sysusers, tmpfiles, logrotate, config, Prometheus rules, Grafana
    for unit in UNITS:
        assert e[f"{UNITDIR}/{unit}"][0] == "-rw-r--r--", unit
    for path in (
        "/usr/lib/sysusers.d/hetpatrol.conf",
        "/usr/lib/tmpfiles.d/hetpatrol.conf",
        "/etc/logrotate.d/hetpatrol",
        "/etc/hetpatrol/hetpatrol.yaml",
        "/usr/share/hetpatrol/prometheus/hetpatrol-rules.yml",
        "/usr/share/hetpatrol/prometheus/tests/hetpatrol-rules.test.yml",
        "/usr/share/hetpatrol/grafana/hetpatrol.json",
        "/usr/share/doc/hetpatrol/copyright",
    ):
        assert e[path][0] == "-rw-r--r--", path
    # Slurm's entry points, where docs/slurm.md and audit-slurm's advice name them
    for name in SLURM_ENTRY_POINTS:
        assert e[f"/usr/libexec/hetpatrol/{name}"][0] == "-rwxr-xr-x", name
    assert e["/usr/share/hetpatrol/slurm/slurm.conf"][0] == "-rw-r--r--"
    # nothing in /usr/local or /opt; no byte code (postinst compiles it), no pip
    assert not [p for p in e if p.startswith(("/usr/local", "/opt"))]
    assert not [p for p in e if "__pycache__" in p or p.endswith(".pyc")]
    assert not [p for p in e if "/site-packages/pip" in p or p.endswith("/bin/pip")]


@pytest.mark.slow
def test_control_fields_and_conffiles(built, tmp_path):
    assert _control(built.deb, "Version") == f"{_pyproject_version()}-1"
    depends = [d.strip() for d in _control(built.deb, "Depends").split(",")]
    # the venv links this exact interpreter: its minor version is a dependency
    assert "python3 (>= 3.10)" in depends
    assert Path(_debian_python()).name in depends
    assert _control(built.deb, "Maintainer") == "hetpatrol developers <hetpatrol@hetpatrol.invalid>"
    subprocess.run(["dpkg-deb", "-e", str(built.deb), str(tmp_path / "ctl")], check=True)
    conffiles = (tmp_path / "ctl" / "conffiles").read_text().split()
    assert conffiles == ["/etc/hetpatrol/hetpatrol.yaml", "/etc/logrotate.d/hetpatrol"]


@pytest.mark.slow
def test_units_are_the_repositorys_with_the_packaged_paths(built):
    for unit in UNITS:
        repo = (REPO / "systemd" / unit).read_text()
        packaged = (built.root / UNITDIR.lstrip("/") / unit).read_text()
        assert ("/usr/local/bin/hetpatrol" in repo) == unit.endswith(".service"), unit
        assert packaged == repo.replace("/usr/local/bin/hetpatrol", "/usr/bin/hetpatrol"), unit
    service = (built.root / UNITDIR.lstrip("/") / "hetpatrol.service").read_text()
    assert (
        "ExecStart=/usr/bin/hetpatrol run --config /etc/hetpatrol/hetpatrol.yaml --log-format json"
        in service
    )
    helper = (built.root / UNITDIR.lstrip("/") / "hetpatrol-scontrol@.service").read_text()
    assert "ExecStart=/usr/bin/hetpatrol-scontrol --serve --config /etc/hetpatrol/" in helper


@pytest.mark.slow
def test_files_installed_as_they_are_in_the_repository(built):
    same = {
        "usr/lib/sysusers.d/hetpatrol.conf": "systemd/hetpatrol.sysusers",
        "etc/logrotate.d/hetpatrol": "systemd/hetpatrol.logrotate",
        "usr/share/hetpatrol/prometheus/hetpatrol-rules.yml": "config/prometheus/"
        "hetpatrol-rules.yml",
        "usr/share/hetpatrol/prometheus/tests/hetpatrol-rules.test.yml": "config/prometheus/"
        "tests/hetpatrol-rules.test.yml",
        "usr/share/hetpatrol/grafana/hetpatrol.json": "config/grafana/hetpatrol.json",
        "usr/share/hetpatrol/prometheus/hetpatrol-compat-rules.yml": "config/prometheus/"
        "hetpatrol-compat-rules.yml",
        "usr/share/hetpatrol/prometheus/tests/hetpatrol-compat-rules.test.yml": "config/"
        "prometheus/tests/hetpatrol-compat-rules.test.yml",
        "usr/share/hetpatrol/slurm/slurm.conf": "packaging/slurm/slurm.conf",
        **{f"usr/libexec/hetpatrol/{n}": f"packaging/slurm/{n}" for n in SLURM_ENTRY_POINTS},
    }
    for installed, source in same.items():
        assert (built.root / installed).read_bytes() == (REPO / source).read_bytes(), installed
    # the package carries this checkout's code: every module of hetpatrol/ and collectors/
    site = next((built.root / PREFIX.lstrip("/")).glob("lib/python3.*/site-packages"))
    for src_dir, pkg in (
        (REPO / "hetpatrol", "hetpatrol"),
        (REPO / "collectors", "hetpatrol/collectors"),
    ):
        modules = sorted(p.relative_to(src_dir) for p in src_dir.rglob("*.py"))
        assert modules, src_dir
        for rel in modules:
            assert (site / pkg / rel).read_bytes() == (src_dir / rel).read_bytes(), rel


@pytest.mark.slow
def test_config_is_the_bundled_default_with_the_node_paths(built):
    repo_lines = (REPO / "config" / "hetpatrol.yaml").read_text().splitlines()
    packaged_lines = (built.root / "etc/hetpatrol/hetpatrol.yaml").read_text().splitlines()
    assert len(packaged_lines) == len(repo_lines)
    changed = {new for old, new in zip(repo_lines, packaged_lines, strict=True) if old != new}
    assert changed == {
        "  path: /var/log/hetpatrol/patrol.jsonl",
        "  max_bytes: 0",
        "state_path: /var/lib/hetpatrol/state.json",
        '  scontrol: ["/usr/bin/hetpatrol-scontrol"]',
    }
    doc = yaml.safe_load("\n".join(packaged_lines))
    assert doc["jsonl"]["path"] == "/var/log/hetpatrol/patrol.jsonl"
    assert doc["state_path"] == "/var/lib/hetpatrol/state.json"


@pytest.mark.slow
def test_venv_names_no_build_path_and_links_debians_python(built):
    venv = built.root / PREFIX.lstrip("/")
    cfg = dict(
        line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if line
    )
    base = _debian_python()
    assert cfg["home"] == "/usr/bin"
    assert cfg["executable"] == base
    assert cfg["include-system-site-packages"] == "false"
    assert cfg["command"] == f"{base} -m venv {PREFIX}"
    name = Path(base).name
    assert os.readlink(venv / "bin" / name) == f"../../../bin/{name}"
    for script in ("hetpatrol", "hetpatrol-scontrol"):
        first = (venv / "bin" / script).read_text().splitlines()[0]
        assert first == f"#!{PREFIX}/bin/python", script


@pytest.mark.slow
def test_no_file_names_the_build_directory_and_records_match(built):
    """What makes two builds of one commit in two directories the same .deb (checked by
    hand: identical sha256): no file keeps the build path, and every RECORD hash (pip's
    list of installed files) is that of the file as shipped, relocated scripts included."""
    build_dir = str(built.deb.parent).encode()
    for path in built.root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert build_dir not in path.read_bytes(), path
    site = next((built.root / PREFIX.lstrip("/")).glob("lib/python3.*/site-packages"))
    checked = 0
    for record in site.glob("*.dist-info/RECORD"):
        for name, digest, size in csv.reader(io.StringIO(record.read_text())):
            if not digest:
                continue  # RECORD itself, and files pip lists without a hash
            data = (site / name).read_bytes()
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert (digest, int(size)) == (f"sha256={want.decode()}", len(data)), name
            checked += 1
    assert checked > 100


@pytest.mark.slow
def test_packaged_rules_pass_their_promtool_tests(built):
    promtool = require_program("promtool", package="prometheus")
    for name in ("hetpatrol-rules.test.yml", "hetpatrol-compat-rules.test.yml"):
        tests = built.root / "usr/share/hetpatrol/prometheus/tests" / name
        res = subprocess.run(
            [promtool, "test", "rules", tests.name],
            capture_output=True,
            text=True,
            cwd=tests.parent,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert "SUCCESS" in res.stdout + res.stderr


# ---------------------------------------------------------------------------- lintian
@pytest.mark.slow
def test_lintian_finds_no_error(built):
    lintian = require_program("lintian", package="lintian")
    res = subprocess.run(
        [lintian, "--display-info", "--allow-root", "--tag-display-limit", "0", str(built.changes)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    tags = [line for line in res.stdout.splitlines() if re.match(r"[EWIPNX]: ", line)]
    print("lintian warnings:\n" + "\n".join(t for t in tags if t.startswith("W: ")))
    errors = [t for t in tags if t.startswith("E: ")]
    assert errors == [], "\n".join(errors)
    # exit 0: no tag at or above --fail-on's default (error), and lintian itself ran
    assert res.returncode == 0, res.stdout + res.stderr


# ------------------------------------------------------------------- installed for real
def _dpkg_status(package: str) -> str:
    res = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True
    )
    return res.stdout if res.returncode == 0 else ""


def _purge() -> subprocess.CompletedProcess:
    return subprocess.run(["dpkg", "--purge", "hetpatrol"], capture_output=True, text=True)


@pytest.fixture(scope="module")
def installed(built):
    if os.geteuid() != 0:
        _fail_or_skip("installing the package with dpkg -i needs root (CI runs as root)")
    if "installed" in _dpkg_status("hetpatrol") or Path(PREFIX).exists():
        pytest.fail(
            f"a hetpatrol package or {PREFIX} is already on this machine: the test installs "
            "and purges its own build and will not replace it (dpkg --purge hetpatrol first)"
        )
    res = subprocess.run(["dpkg", "-i", str(built.deb)], capture_output=True, text=True)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        yield built
    finally:
        if _dpkg_status("hetpatrol"):
            _purge()


@pytest.mark.slow
def test_installed_hetpatrol_runs_from_the_packaged_paths(installed):
    res = subprocess.run(
        ["/usr/bin/hetpatrol", "--version"], capture_output=True, text=True, cwd="/"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"hetpatrol {_pyproject_version()}"
    # the venv is the one at /usr/lib/hetpatrol, on Debian's interpreter (not pyenv's)
    res = subprocess.run(
        [
            f"{PREFIX}/bin/python",
            "-c",
            "import sys, hetpatrol; print(sys.prefix, sys.base_prefix, hetpatrol.__file__)",
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",  # not the checkout: `python -c` puts the working directory on sys.path
    )
    prefix, base_prefix, module = res.stdout.split()
    assert (prefix, base_prefix) == (PREFIX, "/usr")
    assert module.startswith(f"{PREFIX}/lib/python3.")
    res = subprocess.run(
        ["/usr/bin/hetpatrol", "validate-config", "/etc/hetpatrol/hetpatrol.yaml"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def _table(stdout: str) -> list[str]:
    """``once`` output less the collector lines (``  nvidia ok (8 cards, 0.033 s)``),
    whose timings differ from run to run."""
    return [line for line in stdout.splitlines() if not re.search(r"\d+ cards, [\d.]+ s\)", line)]


@pytest.mark.slow
def test_installed_once_replay_as_root_and_as_the_hetpatrol_user(installed):
    # a copy the hetpatrol user can read (the checkout may sit under a 0700 home)
    shared = Path(tempfile.mkdtemp(prefix="hetpatrol-pkg-"))
    try:
        shared.chmod(0o755)
        scenario = shared / SCENARIO
        shutil.copytree(NODES / SCENARIO, scenario)
        for path in (scenario, *scenario.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        node = yaml.safe_load((scenario / "scenario.yaml").read_text())["node"]
        checkout = subprocess.run(
            [*HETPATROL, "once", "--replay", str(scenario)], capture_output=True, text=True
        )
        assert checkout.returncode == 0, checkout.stderr
        for argv in (
            ["/usr/bin/hetpatrol", "once", "--replay", str(scenario)],
            [
                "runuser",
                "-u",
                "hetpatrol",
                "--",
                "/usr/bin/hetpatrol",
                "once",
                "--replay",
                str(scenario),
            ],
        ):
            res = subprocess.run(argv, capture_output=True, text=True, cwd="/")
            assert res.returncode == 0, res.stdout + res.stderr
            table = _table(res.stdout)
            # the fixture's node: 8 H100 + 8 910B4, all OK
            assert table[0] == f"node {node}  OK   exit 0"
            assert table[1].startswith("16 cards: 16 ok   drivers: ")
            groups = [
                line.split("  ")[0] for line in table if line.startswith(("nvidia ", "ascend "))
            ]
            assert groups == ["ascend 910b (gres ascend)", "nvidia h100 (gres gpu)"]
            rows = [line.split() for line in table if re.match(r"^  \d+ ", line)]
            health_words = {"OK", "WARNING", "CRITICAL", "UNKNOWN"}
            assert [[w for w in r if w in health_words] for r in rows] == [["OK"]] * 16
            assert "  nvidia ok (8 cards, " in res.stdout
            assert "  ascend ok (8 cards, " in res.stdout
            # the same verdicts as this checkout's code
            assert table == _table(checkout.stdout)
    finally:
        shutil.rmtree(shared)


@pytest.mark.slow
def test_systemd_analyze_verify_installed_units(installed, tmp_path):
    analyze = require_program("systemd-analyze", package="systemd")
    # verify cannot load a bare template: an instance name linked to the installed file
    instance = tmp_path / "hetpatrol-scontrol@0.service"
    instance.symlink_to(f"{UNITDIR}/hetpatrol-scontrol@.service")
    units = [f"{UNITDIR}/hetpatrol.service", f"{UNITDIR}/hetpatrol-scontrol.socket", str(instance)]
    res = subprocess.run([analyze, "verify", *units], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == "", res.stderr
    # ...and verify does check that ExecStart exists: the same unit naming a path the
    # package does not ship fails
    broken = tmp_path / "hetpatrol.service"
    broken.write_text(
        Path(f"{UNITDIR}/hetpatrol.service")
        .read_text()
        .replace("/usr/bin/hetpatrol", "/usr/local/bin/hetpatrol-missing")
    )
    res = subprocess.run([analyze, "verify", str(broken)], capture_output=True, text=True)
    assert res.returncode != 0 and "hetpatrol-missing" in res.stderr, res.stderr


def _unit_directories(unit: Path) -> dict[str, int]:
    """Directory -> mode that the unit's StateDirectory=/LogsDirectory= create."""
    d: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            d.setdefault(key.strip(), []).append(value.strip())
    out = {}
    for kind, base in (("State", "/var/lib"), ("Logs", "/var/log")):
        mode = int(d.get(f"{kind}DirectoryMode", ["0755"])[-1], 8)
        for value in d.get(f"{kind}Directory", []):
            for name in value.split():
                out[f"{base}/{name}"] = mode
    return out


@pytest.mark.slow
def test_sysusers_and_tmpfiles_agree_with_the_unit(installed):
    import grp
    import pwd

    user = pwd.getpwnam("hetpatrol")
    assert user.pw_dir == "/var/lib/hetpatrol"
    assert user.pw_shell in ("/usr/sbin/nologin", "/sbin/nologin")
    assert grp.getgrgid(user.pw_gid).gr_name == "hetpatrol"
    # read off the installed unit (today /var/lib/hetpatrol{,/textfile} 0755 and
    # /var/log/hetpatrol 0750): a unit that changes them needs the tmpfiles snippet to follow
    want = _unit_directories(Path(f"{UNITDIR}/hetpatrol.service"))
    assert {"/var/lib/hetpatrol", "/var/log/hetpatrol"} <= set(want), want
    tmpfiles = {}
    for line in Path("/usr/lib/tmpfiles.d/hetpatrol.conf").read_text().splitlines():
        if line and not line.startswith("#"):
            kind, path, mode, owner, group, _age = line.split()
            assert (kind, owner, group) == ("d", "hetpatrol", "hetpatrol"), line
            tmpfiles[path] = int(mode, 8)
    assert tmpfiles == want
    # postinst ran systemd-tmpfiles --create: the directories exist, owned and moded so
    for path, mode in want.items():
        st = os.stat(path)
        assert (st.st_uid, st.st_mode & 0o7777) == (user.pw_uid, mode), path
    config = yaml.safe_load(Path("/etc/hetpatrol/hetpatrol.yaml").read_text())
    assert Path(config["jsonl"]["path"]).parent.as_posix() in want
    assert Path(config["state_path"]).parent.as_posix() in want


@pytest.mark.slow
def test_unit_user_and_groups_resolve_and_run_the_installed_program(installed):
    """The unit's User=, Group= and SupplementaryGroups= exist after the install, on a node
    without the Ascend driver too (systemd refuses a unit whose group is missing,
    216/GROUP): the install created what it names. The installed program then runs with
    exactly those credentials, as systemd would start it (setpriv sets uid, gid and the
    supplementary groups)."""
    import grp
    import pwd

    d: dict[str, str] = {}
    for line in Path(f"{UNITDIR}/hetpatrol.service").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            d[key.strip()] = value.strip()
    user = pwd.getpwnam(d["User"])
    group = grp.getgrnam(d["Group"])
    groups = [grp.getgrnam(name) for name in d["SupplementaryGroups"].split()]
    assert [g.gr_name for g in groups] == ["HwHiAiUser"]
    assert all(g.gr_gid < 1000 or g.gr_mem for g in groups), groups
    res = subprocess.run(
        [
            "setpriv",
            f"--reuid={user.pw_uid}",
            f"--regid={group.gr_gid}",
            "--groups=" + ",".join(str(g.gr_gid) for g in groups),
            "/usr/bin/hetpatrol",
            "validate-config",
            "/etc/hetpatrol/hetpatrol.yaml",
        ],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.slow
def test_installed_slurm_entry_points_run(installed, tmp_path):
    """/usr/libexec/hetpatrol/healthcheck runs the installed check on the packaged state
    path: no daemon has written it on this machine, so the verdict is unknown (exit 3)
    with the reason, as slurmd would log it. The prolog and epilog are valid sh."""
    for name in SLURM_ENTRY_POINTS:
        res = subprocess.run(["sh", "-n", f"/usr/libexec/hetpatrol/{name}"])
        assert res.returncode == 0, name
    res = subprocess.run(
        ["/usr/libexec/hetpatrol/healthcheck"],
        capture_output=True,
        text=True,
        cwd="/",
        env={},  # slurmd runs it with a bare environment
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.stdout.startswith("HETPATROL UNKNOWN"), res.stdout
    assert "/var/lib/hetpatrol/state.json" in res.stdout, res.stdout
    # the units' Documentation= are the installed docs
    for unit in UNITS:
        for line in Path(f"{UNITDIR}/{unit}").read_text().splitlines():
            if line.startswith("Documentation="):
                for uri in line.split("=", 1)[1].split():
                    assert uri.startswith("file:/") and Path(uri[5:]).is_file(), (unit, uri)
    snippet = Path("/usr/share/hetpatrol/slurm/slurm.conf").read_text()
    for key, name in (
        ("HealthCheckProgram", "healthcheck"),
        ("Prolog", "prolog"),
        ("Epilog", "epilog"),
    ):
        assert f"\n{key}=/usr/libexec/hetpatrol/{name}\n" in snippet, key


@pytest.mark.slow
def test_installed_doctor_probes_as_the_units_user(installed):
    """``hetpatrol doctor`` on the installed node: the unit read from /lib/systemd/system,
    the probe run as hetpatrol with HwHiAiUser and CAP_SYSLOG; no daemon runs here, so
    /metrics fails (exit 2) and says how to start it."""
    res = subprocess.run(
        ["/usr/bin/hetpatrol", "doctor", "--json"], capture_output=True, text=True, cwd="/"
    )
    assert res.returncode == 2, res.stdout + res.stderr
    by = {c["name"]: c for c in json.loads(res.stdout)}
    assert by["unit"]["detail"] == "runs as hetpatrol:hetpatrol +HwHiAiUser, caps syslog"
    assert by["config"]["detail"] == "/etc/hetpatrol/hetpatrol.yaml loads"
    assert by["kmsg"] == {
        "level": "OK",
        "name": "kmsg",
        "detail": "/dev/kmsg readable as hetpatrol",
        "fix": None,
    }
    assert by["state"]["detail"] == "/var/lib/hetpatrol/state.json writable as hetpatrol"
    assert by["jsonl"]["detail"] == "/var/log/hetpatrol/patrol.jsonl writable as hetpatrol"
    assert by["metrics"]["level"] == "FAIL"
    assert "systemctl enable --now hetpatrol.service" in by["metrics"]["fix"]


@pytest.mark.slow
def test_purge_removes_the_package_and_what_it_created(installed):
    # postinst byte-compiled the venv; prerm must remove that, or dpkg leaves directories
    assert list(Path(PREFIX).rglob("__pycache__"))
    res = _purge()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "not empty" not in res.stdout + res.stderr, res.stdout + res.stderr
    for path in (
        PREFIX,
        "/usr/bin/hetpatrol",
        "/usr/libexec/hetpatrol",
        "/etc/hetpatrol",
        "/var/lib/hetpatrol",
        "/var/log/hetpatrol",
    ):
        assert not os.path.lexists(path), path


# ------------------------------------------------------------------------ the pins
def test_constraints_pin_every_runtime_dependency_within_pyproject():
    from packaging.requirements import Requirement

    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
    pins = {}
    for line in (REPO / "packaging" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[norm(name)] = version
    deps = [Requirement(d) for d in _pyproject_dependencies()]
    assert len(deps) >= 5
    for req in deps:
        assert norm(req.name) in pins, f"{req.name} is not pinned in packaging/constraints.txt"
        assert req.specifier.contains(pins[norm(req.name)]), (req, pins[norm(req.name)])
