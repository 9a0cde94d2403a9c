"""Who uses a card: process -> user (psutil) -> Slurm job (cgroup path, then environ).

A process that has exited or cannot be read keeps its pid with ``user``/``job_id``
``None``; it is never an error for the card.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import psutil

from hetpatrol.schema import ProcessInfo

# cgroup v2: .../system.slice/[<node>_]slurmstepd.scope/job_<id>/step_<n>/...
# cgroup v1: /sys/fs/cgroup/<ctrl>/slurm/uid_<u>/job_<id>/step_<n>/...
# Slurm 26.05 names the job directory by its SLUID unless CgroupJobIdPaths=yes:
#   .../slurmstepd.scope/job_<SLUID>/...  (SLUIDs are alphanumeric, e.g. "sXXXXXXXXXXXX")
_CGROUP_JOB_RE = re.compile(r"/(?:slurmstepd\.scope|slurm[^/]*/uid_\d+)/job_([0-9A-Za-z]+)(?:/|$)")
_ENV_JOB_RE = re.compile(rb"(?:^|\x00)SLURM_JOB_ID=([0-9]+)(?:\x00|$)")


def job_from_cgroup(text: str) -> str | None:
    """Slurm job id (or SLUID) from the text of ``/proc/<pid>/cgroup``; None if not a job."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _CGROUP_JOB_RE.search(path)
        if m:
            return m.group(1)
    return None


def job_from_environ(data: bytes) -> str | None:
    """``SLURM_JOB_ID`` from the raw bytes of ``/proc/<pid>/environ`` (root only)."""
    m = _ENV_JOB_RE.search(data)
    return m.group(1).decode() if m else None


def lookup(pid: int, proc_root: Path = Path("/proc")) -> tuple[str | None, str | None]:
    """(user, job_id) of a local pid; (None, None) when it has exited or is unreadable."""
    user = None
    try:
        user = psutil.Process(pid).username()
    except (psutil.Error, KeyError, OSError):
        pass
    job = None
    try:
        job = job_from_cgroup((proc_root / str(pid) / "cgroup").read_text())
    except OSError:
        pass
    if job is None:
        try:
            job = job_from_environ((proc_root / str(pid) / "environ").read_bytes())
        except OSError:
            pass
    return user, job


def enrich(procs: Iterable[ProcessInfo]) -> None:
    """Fill ``user`` and ``job_id`` in place for processes that exist on this host."""
    for p in procs:
        if p.user is None and p.job_id is None:
            p.user, p.job_id = lookup(p.pid)
