"""``hetpatrol doctor``: can the daemon, as its unit runs it, see what the patrol needs?

Run as root on an installed node. It reads ``hetpatrol.service`` (``systemctl show`` where
systemd runs, else the unit file and its drop-ins), then runs its probes **as the unit
runs the daemon**: the unit's ``User=``, ``Group=``, ``SupplementaryGroups=``,
``AmbientCapabilities=`` and ``PATH`` (through util-linux ``setpriv``), on the unit's
config file. Each check is one line, ``OK``/``INFO``/``WARN``/``FAIL``, its name, what was
seen, and for anything but OK a ``fix:`` line. Exit 0 when nothing is WARN or FAIL, 1 with
a WARN, 2 with a FAIL (64 bad arguments).

What is checked, and the source of each fact:

- ``unit``: the unit's user and groups exist (``getpwnam``/``getgrnam``);
- ``config``: the unit's ``--config`` file loads (:func:`hetpatrol.config.load_config`);
- ``kmsg``: ``/dev/kmsg`` opens for reading (XIDs; needs ``CAP_SYSLOG`` under
  ``kernel.dmesg_restrict=1``);
- ``vendor <name>``: for every registered plugin, its device nodes
  (``VendorInfo.device_nodes``: each existing one opens with the access it declares) and
  its tools (``VendorInfo.tool_dirs``: found on the unit's ``PATH``); a vendor with
  neither on this node is ``INFO absent``;
- ``patrol``: one patrol with the unit's config (``hetpatrol once --format json``): each
  collector's state and card count;
- ``state``, ``jsonl``, ``textfile``: the directories of those paths are writable;
- ``scontrol``: ``scontrol ping`` answers (only where the config drains or checks GRES);
- ``drain helper``: the helper's socket (``ListenStream=`` of
  ``hetpatrol-scontrol.socket``) accepts a connection, where the config drains through it;
- ``metrics``: the daemon answers ``GET /metrics`` on its ``listen`` address.

``--bundle FILE`` also writes a support tarball (:mod:`hetpatrol.doctor_bundle`).
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetpatrol.node_view import printable

UNIT = "hetpatrol.service"


def _clean(text: str) -> str:
    """``text`` with its control characters shown as escapes (tools and names print
    what they like)."""
    return str(printable(text))


HELPER_SOCKET_UNIT = "hetpatrol-scontrol.socket"
#: where the packages (Debian, RPM) and a manual install (docs/deploy.md) put the units
UNIT_DIRS = ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")
#: systemd's default PATH for services (systemd.exec(5), "Environment variables")
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
LEVELS = ("OK", "INFO", "WARN", "FAIL")


@dataclass(frozen=True)
class Check:
    """One line of the report: ``level`` one of :data:`LEVELS`, the check's ``name``,
    what was seen (``detail``), and ``fix`` (None for OK and INFO)."""

    level: str
    name: str
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "name": self.name, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class UnitSettings:
    """What ``hetpatrol.service`` runs the daemon as: ``user``, ``group``,
    ``groups`` (supplementary), ``capabilities`` (ambient, names without ``CAP_``,
    lower case), ``path`` (its ``PATH``), ``config`` (the ``--config`` of ``ExecStart``),
    ``source`` (where these were read)."""

    user: str
    group: str
    groups: tuple[str, ...]
    capabilities: tuple[str, ...]
    path: str
    config: str | None
    source: str


# ------------------------------------------------------------------------ the unit
def _unit_files(name: str, unit_dirs: tuple[str, ...]) -> list[Path]:
    """The unit file systemd would load (the first directory wins, systemd.unit(5)
    "Unit File Load Path"), then its drop-ins ``<name>.d/*.conf`` in lexical order."""
    files: list[Path] = []
    for d in unit_dirs:
        if (Path(d) / name).is_file():
            files.append(Path(d) / name)
            break
    dropins: dict[str, Path] = {}
    for d in reversed(unit_dirs):  # a drop-in of the same name in /etc overrides /usr
        for f in sorted((Path(d) / f"{name}.d").glob("*.conf")):
            dropins[f.name] = f
    return files + [dropins[k] for k in sorted(dropins)]


def _directives(files: list[Path]) -> dict[str, list[str]]:
    """``[Service]`` directives of ``files`` in order; an empty assignment resets a list
    (systemd.service(5))."""
    out: dict[str, list[str]] = {}
    for f in files:
        section = None
        lines = f.read_text().splitlines()
        joined: list[str] = []
        for line in lines:  # backslash continuations
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + " " + line.strip()
            else:
                joined.append(line)
        for line in joined:
            s = line.strip()
            if not s or s.startswith(("#", ";")):
                continue
            if s.startswith("["):
                section = s
                continue
            key, sep, value = s.partition("=")
            if section != "[Service]" or not sep:
                continue
            key, value = key.strip(), value.strip()
            if value == "":
                out[key] = []
            else:
                out.setdefault(key, []).append(value)
    return out


def _config_of(exec_start: str) -> str | None:
    try:
        argv = shlex.split(exec_start.lstrip("-@:+!"))
    except ValueError as exc:  # systemd refuses such a unit ("Invalid ExecStart")
        raise ValueError(f"the unit's ExecStart= cannot be read ({exc}): {exec_start!r}") from None
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--config="):
            return a.split("=", 1)[1]
    return None


def unit_settings(unit_dirs: tuple[str, ...] = UNIT_DIRS) -> UnitSettings | None:
    """The unit's credentials and config, or None when no ``hetpatrol.service`` exists.

    Read from the unit file and its drop-ins, the way systemd merges them (the last
    assignment of a single-valued setting wins; ``SupplementaryGroups=`` and
    ``AmbientCapabilities=`` accumulate until an empty assignment)."""
    files = _unit_files(UNIT, unit_dirs)
    if not files:
        return None
    d = _directives(files)
    path = SYSTEMD_PATH
    for env in d.get("Environment", []):
        try:
            items = shlex.split(env)
        except ValueError:  # systemd logs "Invalid environment assignment, ignoring"
            continue
        for item in items:
            if item.startswith("PATH="):
                path = item[5:]
    groups = tuple(g for v in d.get("SupplementaryGroups", []) for g in v.split())
    caps = tuple(
        c.lower().removeprefix("cap_") for v in d.get("AmbientCapabilities", []) for c in v.split()
    )
    user = (d.get("User") or ["root"])[-1]
    return UnitSettings(
        user=user,
        group=(d.get("Group") or [user])[-1],
        groups=groups,
        capabilities=caps,
        path=path,
        config=_config_of((d.get("ExecStart") or [""])[-1]),
        source=", ".join(str(f) for f in files),
    )


# ------------------------------------------------------------------ the probes
def _open_check(path: str, access: str) -> str | None:
    """None when ``path`` opens with ``access`` ("r"/"rw"), else the reason."""
    flags = (os.O_RDWR if access == "rw" else os.O_RDONLY) | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    return None


def _writable_dir(path: str | None) -> str | None:
    if not path:
        return None
    d = Path(path).expanduser().parent
    probe = d
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the daemon creates missing directories below this one
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    from hetpatrol.safe_files import UnsafePath, check_directory

    try:  # the daemon's own rule: no directory someone else could change under it
        check_directory(probe, Path(path).expanduser())
    except UnsafePath as exc:
        return str(exc)
    except OSError as exc:
        return f"{probe}: {exc.strerror or exc}"
    return None


def _vendor_checks(unit_path: str) -> list[Check]:
    from importlib.metadata import entry_points

    from hetpatrol.host_access import device_paths

    out, absent = [], []
    for ep in sorted(entry_points(group="hetpatrol.collectors"), key=lambda e: e.name):
        try:
            info = ep.load().vendor_info
        except Exception as exc:  # noqa: BLE001 - a broken plugin is a finding
            out.append(
                Check(
                    "FAIL",
                    f"vendor {ep.name}",
                    f"plugin does not load: {exc}",
                    f"reinstall the plugin that provides {ep.value}",
                )
            )
            continue
        present, denied = [], []
        for node in info.device_nodes:
            for p in device_paths(node):
                if os.path.exists(p):
                    present.append(p)
                    why = _open_check(p, node.access)
                    if why:
                        denied.append(f"{p} ({node.access}: {why})")
        tools, missing = [], []
        for tool, dirs in info.tool_dirs.items():
            found = shutil.which(tool, path=unit_path)
            if found:
                tools.append(found)
            elif any(os.path.exists(os.path.join(d, tool)) for d in dirs):
                missing.append(f"{tool} (in {', '.join(dirs)}, not on the unit's PATH)")
        if not present and not tools and not missing:
            absent.append(ep.name)
            continue
        if denied:
            out.append(
                Check(
                    "FAIL",
                    f"vendor {ep.name}",
                    "cannot open " + "; ".join(denied),
                    "give the unit's user the device group (SupplementaryGroups=) "
                    "and DeviceAllow= for these nodes (docs/deploy.md)",
                )
            )
        elif missing:
            out.append(
                Check(
                    "FAIL",
                    f"vendor {ep.name}",
                    "tool " + "; ".join(missing),
                    "add the tool's directory to the unit's Environment=PATH=",
                )
            )
        else:
            seen = f"{len(present)} device nodes open"
            if tools:
                seen += ", " + ", ".join(tools)
            out.append(Check("OK", f"vendor {ep.name}", seen))
    if absent:
        out.append(
            Check("INFO", "vendors absent", ", ".join(absent) + " (no device node, no tool)")
        )
    return out


def _patrol_checks(config: str | None) -> list[Check]:
    argv = [sys.executable, "-m", "hetpatrol.cli", "once", "--format", "json"]
    if config:
        argv += ["--config", config]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        doc = json.loads(res.stdout)
    except (subprocess.TimeoutExpired, ValueError) as exc:
        return [
            Check(
                "FAIL",
                "patrol",
                f"one patrol did not complete: {exc}",
                "run `hetpatrol once -v` as the unit's user and read its error",
            )
        ]
    out = []
    collectors = doc.get("patrol", {}).get("collectors", {})
    for name, st in sorted(collectors.items()):
        state = st.get("state")
        detail = f"{state}, {st.get('cards', 0)} cards"
        if state in ("ok", "absent", "disabled"):
            out.append(Check("OK" if state == "ok" else "INFO", f"patrol {name}", detail))
        else:
            why = _clean(str(st.get("error") or ""))[:160]
            out.append(
                Check(
                    "FAIL",
                    f"patrol {name}",
                    f"{detail}: {why}",
                    "see docs/failures.md for this collector state",
                )
            )
    if not collectors:
        out.append(Check("WARN", "patrol", "no collector configured", "list collectors"))
    return out


def probe(config_path: str | None, unit_path: str) -> list[Check]:
    """The checks that must run as the daemon's user (see the module docstring)."""
    from hetpatrol.config import load_config
    from hetpatrol.config_file import ConfigError
    from hetpatrol.kernel_log import KMSG_PATH

    me = pwd.getpwuid(os.getuid()).pw_name
    checks = []
    try:
        cfg = load_config(Path(config_path) if config_path else None)
        checks.append(Check("OK", "config", f"{config_path or 'bundled'} loads"))
    except (ConfigError, OSError) as exc:
        return [
            Check(
                "FAIL",
                "config",
                f"{config_path}: {exc.summary() if isinstance(exc, ConfigError) else exc}",
                f"hetpatrol validate-config {config_path}",
            )
        ]
    why = _open_check(KMSG_PATH, "r")
    if why:
        checks.append(
            Check(
                "FAIL",
                "kmsg",
                f"{KMSG_PATH} as {me}: {why}",
                "AmbientCapabilities=CAP_SYSLOG and DeviceAllow=/dev/kmsg r",
            )
        )
    else:
        checks.append(Check("OK", "kmsg", f"{KMSG_PATH} readable as {me}"))
    checks += _vendor_checks(unit_path)
    for name, path in (
        ("state", cfg.state_path),
        ("jsonl", cfg.jsonl_path),
        ("textfile", cfg.textfile_path),
    ):
        if not path:
            continue
        why = _writable_dir(str(path))
        if why:
            checks.append(
                Check(
                    "FAIL",
                    name,
                    f"{path} as {me}: {why}",
                    "StateDirectory=/LogsDirectory= in the unit, or a path the unit's user owns",
                )
            )
        else:
            checks.append(Check("OK", name, f"{path} writable as {me}"))
    checks += _slurm_checks(cfg, unit_path, me)
    checks += _patrol_checks(config_path)
    return checks


def _slurm_checks(cfg: Any, unit_path: str, me: str) -> list[Check]:
    slurm = getattr(cfg, "slurm", None)
    if slurm is None or not (slurm.enabled or slurm.drain.enabled):
        return [Check("INFO", "scontrol", "the config neither drains nor checks GRES")]
    out = []
    scontrol = shutil.which("scontrol", path=unit_path)
    if scontrol is None:
        out.append(
            Check(
                "FAIL",
                "scontrol",
                "scontrol is not on the unit's PATH",
                "install slurm-client (Debian) / slurm (EL) on the node",
            )
        )
    else:
        try:
            res = subprocess.run([scontrol, "ping"], capture_output=True, text=True, timeout=10)
            text = _clean(
                (res.stdout + res.stderr).strip().splitlines()[-1:][0]
                if (res.stdout + res.stderr).strip()
                else ""
            )
            ok = res.returncode == 0 and "UP" in res.stdout
        except subprocess.TimeoutExpired:
            ok, text = False, "no answer in 10 s"
        out.append(
            Check("OK", "scontrol", f"scontrol ping as {me}: {text}")
            if ok
            else Check(
                "FAIL",
                "scontrol",
                f"scontrol ping as {me}: {text}",
                "slurmctld must be reachable from the node (slurm.conf, munge)",
            )
        )
    helper = [a for a in slurm.scontrol if "hetpatrol-scontrol" in a]
    if slurm.drain.enabled and helper:
        sock = _helper_socket()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(3)
                s.connect(sock)
            out.append(Check("OK", "drain helper", f"{sock} accepts {me}"))
        except OSError as exc:
            out.append(
                Check(
                    "FAIL",
                    "drain helper",
                    f"{sock}: {exc.strerror or exc}",
                    "systemctl enable --now hetpatrol-scontrol.socket",
                )
            )
    return out


def _helper_socket() -> str:
    for f in _unit_files(HELPER_SOCKET_UNIT, UNIT_DIRS):
        for line in f.read_text().splitlines():
            if line.startswith("ListenStream="):
                return line.split("=", 1)[1].strip()
    return "/run/hetpatrol-scontrol.sock"


# ------------------------------------------------------------ as root, then the probe
def _metrics_check(config_path: str | None) -> Check:
    from hetpatrol.config import load_config

    try:
        listen = load_config(Path(config_path) if config_path else None).listen
    except Exception:  # noqa: BLE001 - the config line already says why
        return Check("WARN", "metrics", "not checked: the config does not load", None)
    if not listen:
        return Check("INFO", "metrics", "no listen address: /metrics is off")
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - our own daemon
            body = r.read(1 << 20).decode("utf-8", "replace")
        if "hetpatrol_" not in body:
            return Check(
                "WARN",
                "metrics",
                f"{url} answers, but not with hetpatrol's series",
                "another program holds the port: set listen:",
            )
        return Check("OK", "metrics", f"{url} answers")
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        return Check(
            "FAIL",
            "metrics",
            f"{url}: {reason}",
            "systemctl enable --now hetpatrol.service; journalctl -u hetpatrol",
        )


def _run_probe_as(unit: UnitSettings) -> list[Check]:
    """The probe in a child with the unit's credentials (``setpriv``, util-linux)."""
    user = pwd.getpwnam(unit.user)
    gid = grp.getgrnam(unit.group).gr_gid
    gids = [grp.getgrnam(g).gr_gid for g in unit.groups]
    argv = [
        "setpriv",
        f"--reuid={user.pw_uid}",
        f"--regid={gid}",
        "--groups=" + ",".join(str(g) for g in gids) if gids else "--clear-groups",
    ]
    if unit.capabilities:
        caps = ",".join(f"+{c}" for c in unit.capabilities)
        argv += [f"--inh-caps={caps}", f"--ambient-caps={caps}"]
    argv += [sys.executable, "-m", "hetpatrol.cli", "doctor", "--probe", "--unit-path", unit.path]
    if unit.config:
        argv += ["--config", unit.config]
    env = {"PATH": unit.path, "HOME": user.pw_dir or "/", "LANG": "C.UTF-8"}
    with tempfile.TemporaryDirectory() as cwd:
        os.chmod(cwd, 0o755)
        res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    checks = []
    for line in res.stdout.splitlines():
        try:
            checks.append(Check(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    if not checks:
        err = _clean(res.stderr.strip()[-300:])
        checks.append(
            Check(
                "FAIL",
                "probe",
                f"the probe as {unit.user} failed: {err}",
                "run `hetpatrol doctor` again with --log-level debug",
            )
        )
    return checks


def diagnose(unit_dirs: tuple[str, ...] = UNIT_DIRS, config: str | None = None) -> list[Check]:
    """Every check, in report order (see the module docstring)."""
    unit = unit_settings(unit_dirs)
    checks: list[Check] = []
    if unit is None:
        checks.append(
            Check(
                "WARN",
                "unit",
                f"no {UNIT} in {', '.join(unit_dirs)}: checked as this user",
                "install the package (docs/deploy.md)",
            )
        )
        checks += probe(config, os.environ.get("PATH", SYSTEMD_PATH))
        checks.append(_metrics_check(config))
        return checks
    config = config or unit.config
    missing = []
    for kind, name in (
        ("user", unit.user),
        ("group", unit.group),
        *(("group", g) for g in unit.groups),
    ):
        try:
            (pwd.getpwnam if kind == "user" else grp.getgrnam)(name)
        except KeyError:
            missing.append(f"{kind} {name}")
    if missing:
        checks.append(
            Check(
                "FAIL",
                "unit",
                f"{unit.source}: no {', '.join(missing)} "
                "(systemd refuses to start it: 216/GROUP or 217/USER)",
                "systemd-sysusers (the package's sysusers.d snippet)",
            )
        )
        return checks
    who = f"{unit.user}:{unit.group}" + (f" +{','.join(unit.groups)}" if unit.groups else "")
    caps = f", caps {','.join(unit.capabilities)}" if unit.capabilities else ""
    checks.append(Check("OK", "unit", f"runs as {who}{caps}"))
    if os.geteuid() != 0:
        checks.append(
            Check(
                "WARN",
                "probe",
                "not root: probed as this user, not the unit's",
                "run `hetpatrol doctor` as root",
            )
        )
        checks += probe(config, unit.path)
    else:
        unit = UnitSettings(**{**unit.__dict__, "config": config})
        checks += _run_probe_as(unit)
    checks.append(_metrics_check(config))
    return checks


def render(checks: list[Check], width: int = 80) -> str:
    """The report: one line per check (``LEVEL name  detail``), the fix indented below,
    then a summary line; lines wrapped at ``width``."""
    import textwrap

    name_w = min(18, max((len(c.name) for c in checks), default=4))
    lines = []
    for c in checks:
        head = f"{c.level:<4} {c.name:<{name_w}} "
        body = textwrap.wrap(_clean(c.detail), max(20, width - len(head))) or [""]
        lines.append(head + body[0])
        lines += [" " * len(head) + b for b in body[1:]]
        if c.fix:
            fix = textwrap.wrap("fix: " + _clean(c.fix), max(20, width - len(head)))
            lines += [" " * len(head) + f for f in fix]
    counts = {lvl: sum(c.level == lvl for c in checks) for lvl in LEVELS}
    lines.append(", ".join(f"{n} {lvl.lower()}" for lvl, n in counts.items() if n))
    return "\n".join(lines) + "\n"


def exit_code(checks: list[Check]) -> int:
    """0 nothing WARN or FAIL, 1 a WARN, 2 a FAIL."""
    levels = {c.level for c in checks}
    return 2 if "FAIL" in levels else 1 if "WARN" in levels else 0


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.probe:  # the child: JSON lines for the parent
        for c in probe(args.config, args.unit_path or os.environ.get("PATH", SYSTEMD_PATH)):
            print(json.dumps(c.to_dict()))
        return 0
    unit_dirs = tuple(args.unit_dir) if args.unit_dir else UNIT_DIRS
    checks = diagnose(unit_dirs, args.config)
    if args.json:
        print(json.dumps([c.to_dict() for c in checks], indent=2))
    else:
        width = shutil.get_terminal_size((80, 24)).columns if sys.stdout.isatty() else 80
        sys.stdout.write(render(checks, width))
    if args.bundle:
        from hetpatrol.doctor_bundle import write_bundle

        write_bundle(
            Path(args.bundle),
            checks,
            args.config
            or (unit_settings(unit_dirs) or UnitSettings("", "", (), (), "", None, "")).config,
            redact=not args.no_redact,
        )
        print(f"bundle: {args.bundle}", file=sys.stderr)
    return exit_code(checks)


def add_doctor_parser(sub: Any) -> None:
    """Register ``hetpatrol doctor`` on the CLI's subparsers."""
    p = sub.add_parser(
        "doctor",
        help="can the daemon, as its unit runs it, see what the patrol needs? exit 0/1/2",
        description="Run as root on an installed node: reads hetpatrol.service and checks, "
        "as the unit's user, groups and capabilities, the vendor device nodes and tools, "
        "/dev/kmsg, the state and log directories, scontrol, the drain helper's socket "
        "and /metrics. One line per check, with its fix. Exit 0 ok, 1 warning, 2 failure.",
    )
    p.add_argument("--config", help="config file (default: the unit's --config)")
    p.add_argument("--json", action="store_true", help="the checks as JSON")
    p.add_argument("--bundle", metavar="FILE", help="also write a support tarball (.tar.gz)")
    p.add_argument(
        "--no-redact",
        action="store_true",
        help="keep user and job names in the bundle (default: replaced)",
    )
    p.add_argument("--unit-dir", action="append", help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--unit-path", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_doctor)
