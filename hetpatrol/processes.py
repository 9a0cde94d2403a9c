"""Who uses a card: process -> user -> Slurm job, read from ``/proc``.

- user: the real uid of ``/proc/<pid>/status`` (``Uid:`` line, what psutil reads too),
  named through the password database; a uid without a name is kept as its number;
- Slurm job: the cgroup path in ``/proc/<pid>/cgroup``, and only a path where Slurm
  itself puts a job's processes, matched from the hierarchy's root. A user can make
  cgroups of their own (systemd delegates ``user@<uid>.service`` to its user), named
  like Slurm's; one of those must never credit a card to someone else's job.

cgroup layouts Slurm uses (each line as ``/proc/<pid>/cgroup`` shows it)::

    v2        0::/system.slice/slurmstepd.scope/job_<id>/step_<s>/user/task_<n>
    v2        0::/system.slice/<node>_slurmstepd.scope/job_<id>/...   (several slurmd)
    v1        <n>:memory:/slurm/uid_<uid>/job_<id>/step_<s>[/task_<k>]
    v1        <n>:memory:/slurm_<node>/uid_<uid>/job_<id>/step_<s>/...
    26.05+    0::/system.slice/slurmstepd.scope/<SLUID>/step_<s>/user/task_<n>
              (unless CgroupJobIdPaths=yes; a SLUID looks like ``s5K1KKYAYG5D00``)

v2: Slurm's cgroup/v2 plugin (``src/plugins/cgroup/v2/cgroup_v2.c``,
``_set_int_cg_ns()``) puts the stepd scope at ``<init>/system.slice/
[<node>_]slurmstepd.scope``, where ``<init>`` is the directory of pid 1's cgroup
(``_get_init_cg_path()``: ``/`` on a host, ``/docker.slice/docker-<id>.scope`` inside a
container), and a job's processes in ``job_<id>/step_<s>/user/task_<n>`` (its hierarchy
comment: ``user`` holds the tasks, ``task_special`` included; ``slurm`` beside it holds
the slurmstepds, never credited). Only the unified line (``0::``) is read for it.
v1: ``CgroupPrepend`` (``/slurm``, or ``/slurm_%n`` in a ``MULTIPLE_SLURMD`` build,
``src/common/cgroup.c``; not settable in cgroup.conf) then ``uid_<uid>/job_<id>/
step_<s>`` in each controller's hierarchy (``src/plugins/cgroup/v1/xcgroup.c``,
``xcgroup_create_hierarchy``); the ``uid_<uid>`` must be the process's own real uid,
else the line credits no job. Debian's slurmd is such a build: with one slurmd,
proctrack/cgroup + task/cgroup (22.05.8) put a job's tasks in ``6:freezer:/slurm_
<NodeName>/uid_0/job_<id>/step_batch`` (and ``step_0``...; the same in ``cpuset`` with
ConstrainCores, no ``task_`` level), the slurmstepd in the job's freezer directory
(tests/test_stray_process.py, on the real daemons). Other sites report the same:
``/sys/fs/cgroup/cpuacct/slurm_<host>`` (ceems-dev/ceems#284), ``nodename_slurmstepd.
scope`` on v2 with 22.05 on Debian 12 (plazonic/cgroup_exporter#8).

``/proc/<pid>/environ`` is never read: ``SLURM_JOB_ID`` there is whatever the process
(its user) set, so a process outside Slurm's cgroups has no job, and a SLUID directory
is reported as the SLUID.

Not attributed (``user`` and ``job_id`` stay ``None``): pid 0 and 1 and kernel threads
(``Kthread: 1`` in ``status``, Linux 6.4+, or a parent pid of 2, ``kthreadd``). No
vendor tool on the host names init or a kernel thread as a card's user; such a pid
comes from another pid namespace (a tool answering inside a container), and crediting
root (init's owner) with that card memory would be a false attribution. A root
process outside any job (``nvidia-persistenced``, a root daemon) keeps ``user``
``root`` and no job: its real owner, and no user's job usage.

A numeric job id wins over a SLUID. A process that exited, or whose files cannot be
read, keeps its pid with ``user``/``job_id`` ``None``; that is never an error for the
card. The proc root is injectable (tests build cgroup trees in a temporary directory).
"""

from __future__ import annotations

import pwd
import re
from collections.abc import Iterable
from pathlib import Path

from hetpatrol.schema import ProcessInfo

PROC_ROOT = Path("/proc")

# v2: [<node>_]slurmstepd.scope under <init>/system.slice (cgroup_v2.c, _set_int_cg_ns),
# then the job directory, a step, and the step's "user" part with a task in it
_V2_SCOPE = r"/system\.slice/(?:[^/]+_)?slurmstepd\.scope/"
_V2_TASK = r"/step_[^/]+/user/task_[^/]+(?:/|$)"
_CGROUP_V2_JOB_RE = re.compile(_V2_SCOPE + r"job_(\d+)" + _V2_TASK)
# 26.05 SLUID directory in place of job_<id>
_CGROUP_SLUID_RE = re.compile(_V2_SCOPE + r"(s[0-9A-Za-z]{8,})" + _V2_TASK)
# v1: CgroupPrepend (/slurm, /slurm_<node>) at the hierarchy's root (src/common/cgroup.c),
# then uid_<uid>/job_<id>/step_<s> (src/plugins/cgroup/v1/xcgroup.c)
_CGROUP_V1_JOB_RE = re.compile(r"/slurm(?:_[^/]+)?/uid_(\d+)/job_(\d+)/step_[^/]+(?:/|$)")
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


def init_cgroup_root(text: str | None) -> str:
    """The cgroup v2 directory Slurm's stepd scope lives under, from the text of
    ``/proc/1/cgroup``: the directory of pid 1's cgroup (``0::/init.scope`` -> ``""``,
    the root; ``0::/docker.slice/docker-1.scope/init.scope`` -> that container's
    directory), as ``_get_init_cg_path()`` in Slurm's cgroup_v2.c computes it. ``""``
    when unreadable or not cgroup v2."""
    for line in (text or "").splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "" and path.startswith("/"):
            parent = path.rsplit("/", 1)[0] if path != "/" else ""
            return parent.rstrip("/")
    return ""


def job_from_cgroup(text: str, uid: int | None = None, init_root: str = "") -> str | None:
    """Slurm job id (or 26.05 SLUID) from the text of ``/proc/<pid>/cgroup``; None if
    the process is not in a job's cgroup as Slurm makes it.

    ``uid``: the process's real uid; a v1 ``uid_<n>`` path of another uid (or any, when
    ``uid`` is None) credits no job. ``init_root``: :func:`init_cgroup_root`, the v2
    directory the stepd scope sits under (``""``: the root). Each path must start at
    the hierarchy's root with Slurm's layout (see the module); a numeric ``job_<id>``
    on any line beats a SLUID."""
    sluid = None
    v2_prefix = init_root.rstrip("/")
    for line in text.splitlines():
        hid, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep and sep2 and hid.isdigit()):
            continue  # not a /proc/<pid>/cgroup line
        if hid == "0" and controllers == "":  # the unified (v2) hierarchy
            if not path.startswith(v2_prefix + "/"):
                continue
            tail = path[len(v2_prefix) :]
            m = _CGROUP_V2_JOB_RE.match(tail)
            if m:
                return m.group(1)
            m = _CGROUP_SLUID_RE.match(tail)
            if m and sluid is None:
                sluid = m.group(1)
            continue
        m = _CGROUP_V1_JOB_RE.match(path)
        if m and uid is not None and int(m.group(1)) == uid:
            return m.group(2)
    return sluid


def uid_from_status(text: str) -> int | None:
    """The real uid in the text of ``/proc/<pid>/status`` (``Uid:`` line), or None."""
    m = _UID_RE.search(text)
    return int(m.group(1)) if m else None


def user_from_status(text: str) -> str | None:
    """The user name of the real uid in ``/proc/<pid>/status`` (the uid if unnamed)."""
    uid = uid_from_status(text)
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # gone (ENOENT, ESRCH), not ours (EACCES)
        return None


def started_boot_seconds(pid: int, proc_root: Path | None = None) -> float | None:
    """Seconds after boot the process ``pid`` started: ``starttime`` (field 22 of
    ``/proc/<pid>/stat``, clock ticks after boot, proc(5)) over ``SC_CLK_TCK``; None
    when it has exited or the line cannot be read. The fields are counted after the
    last ``)``: the process's name before it is its own (spaces, parentheses)."""
    import os

    text = _read_text((proc_root or PROC_ROOT) / str(pid) / "stat")
    if text is None:
        return None
    fields = text.rpartition(")")[2].split()  # from field 3 (state) on
    try:
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return None


def lookup(pid: int, proc_root: Path | None = None) -> tuple[str | None, str | None]:
    """(user, job_id) of a local pid; (None, None) when it has exited or is unreadable,
    and for pid 0/1 and kernel threads (never a card user's process, see the module).
    The job comes from Slurm's cgroup layout alone (:func:`job_from_cgroup`)."""
    if pid <= 1:
        return None, None
    root = proc_root or PROC_ROOT
    base = root / str(pid)
    status = _read_text(base / "status")
    if status is not None and is_kernel_thread(pid, status):
        return None, None
    user = user_from_status(status) if status is not None else None
    cgroup = _read_text(base / "cgroup")
    if cgroup is None:
        return user, None
    uid = uid_from_status(status) if status is not None else None
    init_root = init_cgroup_root(_read_text(root / "1" / "cgroup"))
    return user, job_from_cgroup(cgroup, uid, init_root)


def enrich(procs: Iterable[ProcessInfo], proc_root: Path | None = None) -> None:
    """Fill ``user`` and ``job_id`` in place for processes that exist on this host."""
    for p in procs:
        if p.user is None and p.job_id is None:
            p.user, p.job_id = lookup(p.pid, proc_root)
