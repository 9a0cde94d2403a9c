"""Who uses a card: process -> user -> Slurm job, read from ``/proc``.

- user: the real uid of ``/proc/<pid>/status`` (``Uid:`` line, what psutil reads too),
  named through the password database; a uid without a name is kept as its number;
- Slurm job: the cgroup path in ``/proc/<pid>/cgroup``, else ``SLURM_JOB_ID`` in
  ``/proc/<pid>/environ`` (readable by root only).

cgroup layouts Slurm uses::

    v2        0::/system.slice/slurmstepd.scope/job_<id>/step_<n>/user/task_0
    v2        0::/system.slice/<node>_slurmstepd.scope/job_<id>/...   (several slurmd)
    v1        <n>:memory:/slurm/uid_<uid>/job_<id>/step_<n>/task_<k>
    v1        <n>:memory:/slurm_<node>/uid_<uid>/job_<id>/...
    26.05+    0::/system.slice/slurmstepd.scope/<SLUID>/step_0/...     (unless
              CgroupJobIdPaths=yes; a SLUID looks like ``s5K1KKYAYG5D00``)

Not attributed (``user`` and ``job_id`` stay ``None``): pid 0 and 1 and kernel threads
(``Kthread: 1`` in ``status``, Linux 6.4+, or a parent pid of 2, ``kthreadd``). No
vendor tool on the host names init or a kernel thread as a card's user; such a pid
comes from another pid namespace (a tool answering inside a container), and crediting
root (init's owner) with that card memory would be a false attribution. A root
process outside any job (``nvidia-persistenced``, a root daemon) keeps ``user``
``root`` and no job: its real owner, and no user's job usage.

A numeric job id wins: with the SLUID form the job id comes from ``SLURM_JOB_ID`` when
the environment is readable, else the SLUID itself is the ``job_id``. A process that
exited, or whose files cannot be read, keeps its pid with ``user``/``job_id`` ``None``;
that is never an error for the card. The proc root is injectable (tests build cgroup
trees in a temporary directory).
"""

from __future__ import annotations

import pwd
import re
from collections.abc import Iterable
from pathlib import Path

from hetpatrol.schema import ProcessInfo

PROC_ROOT = Path("/proc")

_SCOPE = r"/(?:[^/]*_)?slurmstepd\.scope/"
_CGROUP_V2_JOB_RE = re.compile(_SCOPE + r"job_(\d+)(?:/|$)")
_CGROUP_V1_JOB_RE = re.compile(r"/slurm(?:_[^/]*)?/uid_\d+/job_(\d+)(?:/|$)")
# 26.05 SLUID directory: not "system" (slurmstepd's own cgroup), not "job_<id>".
_CGROUP_SLUID_RE = re.compile(_SCOPE + r"(s[0-9A-Za-z]{8,})(?:/|$)")
_ENV_JOB_RE = re.compile(rb"(?:^|\x00)SLURM_JOB_ID=([0-9]+)(?:\x00|$)")
_UID_RE = re.compile(r"^Uid:\s+(\d+)", re.MULTILINE)
_PPID_RE = re.compile(r"^PPid:\s+(\d+)", re.MULTILINE)
_KTHREAD_RE = re.compile(r"^Kthread:\s+1\s*$", re.MULTILINE)
#: kthreadd, the parent of every kernel thread
_KTHREADD_PID = 2


def is_kernel_thread(pid: int, status: str) -> bool:
    """True for kthreadd and its children, from the text of ``/proc/<pid>/status``."""
    if pid == _KTHREADD_PID or _KTHREAD_RE.search(status):
        return True
    m = _PPID_RE.search(status)
    return m is not None and int(m.group(1)) == _KTHREADD_PID


def job_from_cgroup(text: str) -> str | None:
    """Slurm job id (or 26.05 SLUID) from the text of ``/proc/<pid>/cgroup``; None if
    the process is not in a job. A numeric ``job_<id>`` on any line beats a SLUID."""
    sluid = None
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _CGROUP_V2_JOB_RE.search(path) or _CGROUP_V1_JOB_RE.search(path)
        if m:
            return m.group(1)
        m = _CGROUP_SLUID_RE.search(path)
        if m and sluid is None:
            sluid = m.group(1)
    return sluid


def job_from_environ(data: bytes) -> str | None:
    """``SLURM_JOB_ID`` from the raw bytes of ``/proc/<pid>/environ`` (root only)."""
    m = _ENV_JOB_RE.search(data)
    return m.group(1).decode() if m else None


def user_from_status(text: str) -> str | None:
    """The user name of the real uid in ``/proc/<pid>/status`` (the uid if unnamed)."""
    m = _UID_RE.search(text)
    if not m:
        return None
    uid = int(m.group(1))
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # gone (ENOENT, ESRCH), not ours (EACCES)
        return None


def lookup(pid: int, proc_root: Path | None = None) -> tuple[str | None, str | None]:
    """(user, job_id) of a local pid; (None, None) when it has exited or is unreadable,
    and for pid 0/1 and kernel threads (never a card user's process, see the module)."""
    if pid <= 1:
        return None, None
    base = (proc_root or PROC_ROOT) / str(pid)
    status = _read_text(base / "status")
    if status is not None and is_kernel_thread(pid, status):
        return None, None
    user = user_from_status(status) if status is not None else None
    cgroup = _read_text(base / "cgroup")
    job = job_from_cgroup(cgroup) if cgroup is not None else None
    if job is None or not job.isdigit():
        try:
            env_job = job_from_environ((base / "environ").read_bytes())
        except OSError:
            env_job = None
        job = env_job or job
    return user, job


def enrich(procs: Iterable[ProcessInfo], proc_root: Path | None = None) -> None:
    """Fill ``user`` and ``job_id`` in place for processes that exist on this host."""
    for p in procs:
        if p.user is None and p.job_id is None:
            p.user, p.job_id = lookup(p.pid, proc_root)
