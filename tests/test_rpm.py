"""The RPM: built by ``packaging/build-rpm`` with rpmbuild (Debian's ``rpm`` package) from
the same sources as the Debian package, checked by rpmlint, and installed into a scratch
root with ``rpm --root``.

What this cannot show without an EL or openEuler machine: the scriptlets running there
(``systemd-sysusers``, ``systemd-tmpfiles``, ``systemctl``: the scratch root has no
systemd, so the install uses ``--noscripts``; the %pre text is checked instead), the
dependency on the interpreter being met by that distribution's ``python3.11`` package,
and the unit under that distribution's systemd. The venv is run in the scratch root with
this machine's ``/usr/bin/python3.11`` standing in for that package's.

Missing tools skip these tests, but fail them under CI=true (``.ci/run`` installs ``rpm``
and ``rpmlint``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, require_program

PREFIX = "/usr/lib/hetpatrol"
UNITDIR = "/usr/lib/systemd/system"
UNITS = ("hetpatrol.service", "hetpatrol-scontrol.socket", "hetpatrol-scontrol@.service")
PYTHON = "/usr/bin/python3.11"


def _version() -> str:
    text = (REPO / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"$', text, re.M).group(1)


@dataclass
class Built:
    rpm: Path
    rpmlint: str


def _query(rpm: Path, *args: str) -> str:
    res = subprocess.run(
        ["rpm", "-qp", "--nosignature", *args, str(rpm)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    require_program("rpmbuild", package="rpm")
    require_program("rpmlint", package="rpmlint")
    if not Path(PYTHON).exists():
        message = f"{PYTHON} is not on this machine (the venv links it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    out = tmp_path_factory.mktemp("rpm")
    res = subprocess.run(
        [str(REPO / "packaging" / "build-rpm"), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    rpms = list(out.glob(f"hetpatrol-{_version()}-1*.rpm"))
    assert len(rpms) == 1, list(out.iterdir())
    return Built(rpms[0], (out / "rpmlint.txt").read_text())


@pytest.mark.slow
def test_rpmlint_reports_no_error(built):
    summary = [x for x in built.rpmlint.splitlines() if "packages and" in x and "checked" in x]
    assert summary and " 0 errors" in summary[-1], built.rpmlint
    errors = [x for x in built.rpmlint.splitlines() if ": E: " in x]
    assert errors == [], "\n".join(errors)


@pytest.mark.slow
def test_metadata_requires_only_the_interpreter_and_marks_the_config(built):
    assert _query(built.rpm, "--queryformat", "%{VERSION}-%{RELEASE}") == f"{_version()}-1"
    requires = {x.split()[0] for x in _query(built.rpm, "--requires").splitlines()}
    # the venv's own files generate no dependency (AutoReqProv: no); rpmlib() features
    # and the scriptlets' shell are rpm's own
    ours = {r for r in requires if not r.startswith(("rpmlib(", "/bin/sh"))}
    assert ours == {PYTHON, "systemd"}, requires
    configs = _query(built.rpm, "--configfiles").split()
    assert configs == ["/etc/hetpatrol/hetpatrol.yaml", "/etc/logrotate.d/hetpatrol"]


@pytest.mark.slow
def test_pre_creates_the_user_and_the_ascend_group_from_the_sysusers_snippet(built):
    scripts = _query(built.rpm, "--scripts")
    # rpm -q --scripts: "preinstall scriptlet (using /bin/sh):" then its text, then the next
    pre = re.search(r"^preinstall scriptlet [^\n]*\n(.*?)^\w+ scriptlet ", scripts, re.M | re.S)
    assert pre, scripts
    pre = pre.group(1)
    assert "systemd-sysusers --replace=/usr/lib/sysusers.d/hetpatrol.conf -" in pre
    snippet = (REPO / "systemd" / "hetpatrol.sysusers").read_text()
    for line in snippet.splitlines():
        assert line in pre, line  # inlined at build time: the same lines
    assert "g HwHiAiUser -" in pre
    assert "systemd-tmpfiles --create /usr/lib/tmpfiles.d/hetpatrol.conf" in scripts


@pytest.mark.slow
def test_installed_into_a_scratch_root_holds_the_repositorys_files(built, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("rpm --root installs need root (CI runs as root)")
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["rpm", "--root", str(root), "--initdb"], check=True)
    res = subprocess.run(
        [
            "rpm",
            "--root",
            str(root),
            "-i",
            "--nodeps",
            "--noscripts",
            "--nosignature",
            str(built.rpm),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # the units, with the entry points at /usr/bin (as the Debian package)
    for unit in UNITS:
        installed = (root / UNITDIR.lstrip("/") / unit).read_text()
        repo = (REPO / "systemd" / unit).read_text()
        assert installed == repo.replace("/usr/local/bin/hetpatrol", "/usr/bin/hetpatrol")
    same = {
        "usr/lib/sysusers.d/hetpatrol.conf": "systemd/hetpatrol.sysusers",
        "usr/lib/tmpfiles.d/hetpatrol.conf": "packaging/debian/hetpatrol.tmpfiles",
        "etc/logrotate.d/hetpatrol": "systemd/hetpatrol.logrotate",
        "usr/share/hetpatrol/slurm/slurm.conf": "packaging/slurm/slurm.conf",
        "usr/libexec/hetpatrol/healthcheck": "packaging/slurm/healthcheck",
        "usr/libexec/hetpatrol/prolog": "packaging/slurm/prolog",
        "usr/libexec/hetpatrol/epilog": "packaging/slurm/epilog",
        "usr/libexec/hetpatrol/taskprolog": "packaging/slurm/taskprolog",
        "usr/share/hetpatrol/grafana/hetpatrol.json": "config/grafana/hetpatrol.json",
    }
    for path, source in same.items():
        assert (root / path).read_bytes() == (REPO / source).read_bytes(), path
    for name in ("healthcheck", "prolog", "epilog", "taskprolog"):
        assert os.access(root / "usr/libexec/hetpatrol" / name, os.X_OK), name
    # the node config: the bundled default with the node paths (packaging/node-config)
    config = (root / "etc/hetpatrol/hetpatrol.yaml").read_text()
    assert "\nstate_path: /var/lib/hetpatrol/state.json\n" in config
    assert "\n  path: /var/log/hetpatrol/patrol.jsonl\n" in config
    # directories with the unit's modes
    assert (root / "var/log/hetpatrol").stat().st_mode & 0o777 == 0o750
    assert (root / "var/lib/hetpatrol/textfile").is_dir()
    # the venv links the interpreter relatively; that distribution's package provides it
    # (here: this machine's, linked in)
    link = root / PREFIX.lstrip("/") / "bin" / Path(PYTHON).name
    assert os.readlink(link) == f"../../../bin/{Path(PYTHON).name}"
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (root / PYTHON.lstrip("/")).symlink_to(PYTHON)
    res = subprocess.run(
        [str(root / PREFIX.lstrip("/") / "bin/python"), "-I", "-m", "hetpatrol.cli", "--version"],
        capture_output=True,
        text=True,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"hetpatrol {_version()}"
    res = subprocess.run(
        [
            str(root / PREFIX.lstrip("/") / "bin/python"),
            "-I",
            "-m",
            "hetpatrol.cli",
            "validate-config",
            str(root / "etc/hetpatrol/hetpatrol.yaml"),
        ],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    shutil.rmtree(root, ignore_errors=True)
