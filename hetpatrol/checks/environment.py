"""Environment crosstalk: global library paths that mix vendor stacks on one node.

On a node with both NVIDIA and Ascend cards, a library path set for every process makes
one vendor's jobs load the other vendor's libraries (or an old copy of their own):
CUDA and CANN both ship ``libhccl``-, ``libnccl``- and ``libopenblas``-style names, and a
job that worked on a single-vendor node fails here. Two shapes are looked for:

- ``library_path_mix``: the system-wide loader paths (``/etc/ld.so.conf`` and
  ``/etc/ld.so.conf.d/*.conf``) list both CUDA and CANN library trees;
- ``global_ld_library_path``: ``LD_LIBRARY_PATH`` set for every login in
  ``/etc/environment``, ``/etc/profile`` or ``/etc/profile.d/*.sh`` (or CANN's
  ``set_env.sh`` sourced there) naming a vendor library tree.

Each is a node finding (``environment.severity``, warning) naming the files. Reading
(:func:`scan`) and judging (:func:`judge`) are apart; :class:`EnvironmentCheck` is the
node check the patrol runs, re-reading the files every ``environment.interval_seconds``.
All paths are under ``environment.root`` (``/``), so a test can build a fake root; a
replay reads ``<replay dir>/root`` when present, and nothing otherwise.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetpatrol.checks.facts import NodeCheckResult
from hetpatrol.collector import CollectorStatus
from hetpatrol.config_file import SEVERITY_OR_OFF
from hetpatrol.schema import HEALTH_WARNING, CardRecord, Finding

NAME = "environment"
TOP_SCHEMA: dict[str, Any] = {
    "environment": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "enabled": {"type": "boolean"},
            "root": {"type": "string", "minLength": 1},
            "interval_seconds": {"type": "number", "minimum": 0},
            "severity": SEVERITY_OR_OFF,
            "cuda_patterns": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "cann_patterns": {"type": "array", "items": {"type": "string", "minLength": 1}},
        },
    },
}


@dataclass(frozen=True)
class EnvironmentSettings:
    """The ``environment`` section: global library paths that mix vendor stacks."""

    enabled: bool = True
    root: str = "/"
    interval_seconds: float = 300.0
    severity: str | None = HEALTH_WARNING
    cuda_patterns: tuple[str, ...] = ("cuda",)
    cann_patterns: tuple[str, ...] = ("ascend", "cann")


def build_top(data: Mapping[str, Any]) -> EnvironmentSettings:
    """The ``environment`` section of the config file's top level ``data``."""
    section = data.get("environment")
    s = section or {}
    base = EnvironmentSettings()
    return EnvironmentSettings(
        enabled=bool(s.get("enabled", base.enabled)),
        root=str(s.get("root", base.root)),
        interval_seconds=float(s.get("interval_seconds", base.interval_seconds)),
        severity=s.get("severity", base.severity),
        cuda_patterns=tuple(s.get("cuda_patterns", base.cuda_patterns)),
        cann_patterns=tuple(s.get("cann_patterns", base.cann_patterns)),
    )


REPLAY_ROOT = "root"
# An assignment of LD_LIBRARY_PATH anywhere in a shell command line: at its start, after
# ``export``/``declare -x``/``typeset -x`` (with other names before it), or after ``;``,
# ``&&``, ``||``, ``then``, ``do``: ``export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_...}``
# (NVIDIA's CUDA Installation Guide for Linux, "Environment Setup", as /etc/profile.d/
# cuda.sh files copy it), ``if [ -d ... ]; then export LD_LIBRARY_PATH=...; fi``,
# ``export PATH=... LD_LIBRARY_PATH=...``. pam_env's /etc/environment is ``KEY=value``.
_LDLP_RE = re.compile(
    r"(?:^|[;&|(]|\bthen\b|\bdo\b|\s)\s*LD_LIBRARY_PATH\+?="
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s;&|]*)"
)
_SOURCE_RE = re.compile(r"^\s*(?:source|\.)\s+(?P<file>\S*(?:set_env\.sh|setenv\.bash))")
_MAX_FILE_BYTES = 256 * 1024


@dataclass
class EnvironmentFacts:
    """What the files say: loader paths per file, and global LD_LIBRARY_PATH settings."""

    root: str
    ld_paths: dict[str, list[str]] = field(default_factory=dict)  # file -> dirs
    ld_library_path: dict[str, list[str]] = field(default_factory=dict)  # file -> values
    unreadable: dict[str, str] = field(default_factory=dict)


def _read(path: Path, facts: EnvironmentFacts, shown: str) -> list[str]:
    """The meaningful lines of a regular file (opened without blocking: a FIFO or a
    device there is noted as unreadable, never waited on), up to ``_MAX_FILE_BYTES``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                facts.unreadable[shown] = "not a regular file"
                return []
            data = f.read(_MAX_FILE_BYTES)
    except FileNotFoundError:
        return []
    except OSError as exc:
        facts.unreadable[shown] = exc.strerror or str(exc)
        return []
    lines = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def scan(root: str | Path) -> EnvironmentFacts:
    """Read the loader config and the global login environment under ``root``."""
    base = Path(root)
    facts = EnvironmentFacts(root=str(base))

    def shown(path: Path) -> str:
        return "/" + str(path.relative_to(base)) if path.is_relative_to(base) else str(path)

    etc = base / "etc"
    conf_files = [etc / "ld.so.conf"]
    conf_dir = etc / "ld.so.conf.d"
    if conf_dir.is_dir():
        conf_files += sorted(conf_dir.glob("*.conf"))
    for path in conf_files:
        dirs = [
            line
            for line in _read(path, facts, shown(path))
            if not line.startswith("include ") and not line.startswith("hwcap ")
        ]
        if dirs:
            facts.ld_paths[shown(path)] = dirs
    login = [etc / "environment", etc / "profile"]
    profile_d = etc / "profile.d"
    if profile_d.is_dir():
        login += sorted(profile_d.glob("*.sh"))
    for path in login:
        values = []
        for line in _read(path, facts, shown(path)):
            found = [m.group("value").strip("'\"") for m in _LDLP_RE.finditer(line)]
            if found:
                values.extend(found)
                continue
            m = _SOURCE_RE.match(line)
            if m:
                values.append(f"(sources {m.group('file')})")
        if values:
            facts.ld_library_path[shown(path)] = values
    return facts


def _matches(text: str, patterns: Sequence[str]) -> bool:
    low = text.lower()
    return any(p.lower() in low for p in patterns)


def judge(facts: EnvironmentFacts, settings: EnvironmentSettings) -> list[Finding]:
    """Node findings for ``facts`` (empty when the library paths are clean)."""
    if settings.severity is None:
        return []
    out = []

    def vendor_dirs(patterns: Sequence[str]) -> dict[str, list[str]]:
        found = {
            f: [d for d in dirs if _matches(d, patterns)] for f, dirs in facts.ld_paths.items()
        }
        return {f: dirs for f, dirs in found.items() if dirs}

    cuda = vendor_dirs(settings.cuda_patterns)
    cann = vendor_dirs(settings.cann_patterns)
    if cuda and cann:
        files = sorted(set(cuda) | set(cann))
        out.append(
            Finding(
                "library_path_mix",
                settings.severity,
                "system-wide loader paths mix vendor stacks: CUDA in "
                + ", ".join(f"{f} ({', '.join(cuda[f])})" for f in sorted(cuda))
                + "; CANN in "
                + ", ".join(f"{f} ({', '.join(cann[f])})" for f in sorted(cann))
                + ": keep vendor libraries out of ld.so.conf.d, set them per job",
                value=files,
            )
        )
    vendor = {
        f: values
        for f, values in facts.ld_library_path.items()
        if any(
            _matches(v, (*settings.cuda_patterns, *settings.cann_patterns))
            or v.startswith("(sources")
            for v in values
        )
    }
    if vendor:
        out.append(
            Finding(
                "global_ld_library_path",
                settings.severity,
                "LD_LIBRARY_PATH with vendor libraries is set for every login in "
                + ", ".join(f"{f} ({'; '.join(v)})" for f, v in sorted(vendor.items()))
                + ": it overrides the loader for the other vendor's jobs too; set it per job",
                value=sorted(vendor),
            )
        )
    return out


class EnvironmentCheck:
    """The node check: reads the files every ``environment.interval_seconds``."""

    name = "environment"

    def __init__(self, replay_dir: Path | None = None, clock=time.monotonic):
        self.replay_dir = replay_dir
        self._clock = clock
        self._cached: tuple[float, str, EnvironmentFacts] | None = None

    def root_for(self, settings: EnvironmentSettings) -> str | None:
        if self.replay_dir is None:
            return settings.root
        root = Path(self.replay_dir) / REPLAY_ROOT
        return str(root) if root.is_dir() else None

    def run(
        self, cards: Sequence[CardRecord], collectors: Sequence[CollectorStatus], config: Any
    ) -> NodeCheckResult | None:
        settings: EnvironmentSettings = config.top[NAME]
        if not settings.enabled:
            return None
        root = self.root_for(settings)
        if root is None:
            return NodeCheckResult(data={"state": "absent", "root": None})
        now = self._clock()
        cached = self._cached
        if cached is None or cached[1] != root or now - cached[0] >= settings.interval_seconds:
            cached = (now, root, scan(root))
            self._cached = cached
        facts = cached[2]
        findings = judge(facts, settings)
        data: dict[str, Any] = {
            "state": "ok",
            "root": root,
            "ld_paths": facts.ld_paths,
            "ld_library_path": facts.ld_library_path,
        }
        if facts.unreadable:
            data["unreadable"] = facts.unreadable
        return NodeCheckResult(findings=tuple(findings), data=data)
