"""Hung driver evidence: vendor tools and collector threads in uninterruptible sleep.

A vendor tool (or this daemon's own collector thread inside a vendor library: NVML,
DCMI) that the driver holds in uninterruptible sleep cannot be killed; when it stays so
patrol after patrol the driver is wedged and only a reboot frees it. This module reads,
for each such task, proc(5)'s ``/proc/<pid>/stat`` (field 3 ``state``: "D Waiting in
uninterruptible disk sleep"; field 22 ``starttime``, which with the pid names the
process across patrols) and ``/proc/<pid>/wchan`` ("the symbolic name corresponding to
the location in the kernel where the process is sleeping"; ``0`` or empty when the
kernel hides it).

Which tasks: the processes whose ``comm`` is a program a vendor plugin declares
(:attr:`hetpatrol.collector.VendorInfo.tool_dirs`: ``npu-smi``, ``hccn_tool``,
``rocm-smi`` ...) run by root or by this daemon's own user (the real uid, the first
number of the ``Uid:`` line of ``/proc/<pid>/status``), and, on the host, this daemon's
collector worker threads (``/proc/self/task/<tid>``). A comm is text its user chose
(``prctl(PR_SET_NAME)``, a binary of that name) and any user can hold a process in D
state without a driver fault (a ``vfork()`` parent waits in ``kernel_clone`` in state D
until its child ends; a read on the user's own FUSE mount waits in D), so another
user's process, or one whose real uid cannot be read, is never evidence: it would let
a user drain and reboot the node (``check:collector_hung`` lasting -> ``reboot_node``).
The real uid, not the owner of ``/proc/<pid>`` (root's for a process its user made
non-dumpable) nor the effective uid (root's for a setuid program). A replay directory
stands in for ``/`` (``<replay>/proc/<pid>/stat``, ``status``, ``wchan``). Never
raises: a process gone between two reads is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: most bytes read of one stat or wchan file
READ_MAX = 4096
#: most tasks named in one finding (a fleet of stuck tools says the same thing)
MAX_NAMED = 8


@dataclass(frozen=True)
class StuckTask:
    """A task seen in D state: ``pid`` (a tid for a thread of this daemon), ``comm``,
    ``wchan`` (None: hidden or unreadable), ``owner`` (the collector it belongs to, None
    when not known), ``patrols`` in a row it has been seen in D."""

    pid: int
    comm: str
    wchan: str | None
    owner: str | None
    patrols: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "comm": self.comm,
            "state": "D",
            "wchan": self.wchan,
            "collector": self.owner,
            "patrols": self.patrols,
        }

    def describe(self) -> str:
        where = f"wchan {self.wchan}" if self.wchan else "wchan hidden"
        who = f"{self.owner} collector thread" if self.comm == "" else self.comm
        return f"{who} pid {self.pid} in D state for {self.patrols} patrols ({where})"


def _read(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            return fh.read(READ_MAX).decode("ascii", errors="replace")
    except OSError:
        return None


def parse_stat(text: str) -> tuple[str, str, int] | None:
    """(comm, state, starttime) of a ``/proc/<pid>/stat`` line; None when garbled. The
    comm is between the first ``(`` and the last ``)`` (it may hold both)."""
    head, sep, rest = text.partition("(")
    comm, sep2, tail = rest.rpartition(")")
    fields = tail.split()
    if not sep or not sep2 or len(fields) < 20 or not head.strip().isdigit():
        return None
    try:
        return comm, fields[0], int(fields[19])
    except ValueError:
        return None


def real_uid(directory: Path) -> int | None:
    """The real uid of the process of ``directory`` (``/proc/<pid>``): the first number
    of the ``Uid:`` line of its ``status`` (proc(5): "Real, effective, saved set, and
    filesystem UIDs"); None when unreadable or garbled."""
    text = _read(directory / "status")
    for line in (text or "").splitlines():
        if line.startswith("Uid:"):
            first = line[4:].split()[:1]
            return int(first[0]) if first and first[0].isdigit() else None
    return None


def _task(directory: Path) -> tuple[str, str, int, str | None] | None:
    text = _read(directory / "stat")
    parsed = parse_stat(text) if text is not None else None
    if parsed is None:
        return None
    wchan = _read(directory / "wchan")
    wchan = (wchan or "").strip()
    wchan = "".join(c for c in wchan if c.isprintable())[:64]
    return (*parsed, None if wchan in ("", "0") else wchan)


def scan(
    root: Path, programs: Mapping[str, str], threads: Mapping[int, str]
) -> list[tuple[tuple[int, int], StuckTask]]:
    """Every task in D state now: the processes under ``root/proc`` whose comm is in
    ``programs`` (program -> plugin) and whose real uid is root's or this process's,
    and ``threads`` (tid -> collector) of this process (read under
    ``/proc/self/task``; only when ``root`` is ``/``). Each with
    its key (pid, starttime); ``patrols`` is 1."""
    out: list[tuple[tuple[int, int], StuckTask]] = []
    trusted = {0, os.getuid()}
    proc = Path(root) / "proc"
    try:
        pids = [int(e.name) for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        pids = []
    for pid in sorted(pids):
        # comm is cut to 15 bytes (TASK_COMM_LEN 16): a longer program name matches cut
        task = _task(proc / str(pid))
        if task is None or task[1] != "D":
            continue
        owner = next((p for name, p in programs.items() if name[:15] == task[0]), None)
        if owner is None or real_uid(proc / str(pid)) not in trusted:
            continue  # a comm another user chose is no evidence (see the module)
        out.append(((pid, task[2]), StuckTask(pid, task[0], task[3], owner, 1)))
    if Path(root) == Path("/"):
        for tid, collector in sorted(threads.items()):
            task = _task(Path(f"/proc/self/task/{tid}"))
            if task is not None and task[1] == "D":
                out.append(((tid, task[2]), StuckTask(tid, "", task[3], collector, 1)))
    return out


class HungToolWatch:
    """Counts, per task (pid, starttime), the patrols in a row it was seen in D state;
    :meth:`observe` returns those seen in at least ``patrols`` in a row."""

    def __init__(self, patrols: int = 3) -> None:
        self.patrols = patrols
        self._seen: dict[tuple[int, int], int] = {}

    @property
    def candidates(self) -> bool:
        """Whether the last scan found a task in D state (the next must look again)."""
        return bool(self._seen)

    def observe(self, found: Iterable[tuple[tuple[int, int], StuckTask]]) -> list[StuckTask]:
        seen: dict[tuple[int, int], int] = {}
        out = []
        for key, task in found:
            n = self._seen.get(key, 0) + 1
            seen[key] = n
            if n >= self.patrols:
                out.append(StuckTask(task.pid, task.comm, task.wchan, task.owner, n))
        self._seen = seen
        return out


def evidence(stuck: list[StuckTask]) -> str:
    """The words a ``collector_hung`` finding gains: each task, at most
    :data:`MAX_NAMED`."""
    named = "; ".join(t.describe() for t in stuck[:MAX_NAMED])
    more = f"; {len(stuck) - MAX_NAMED} more" if len(stuck) > MAX_NAMED else ""
    return f"in uninterruptible sleep (the driver holds it; a reboot frees it): {named}{more}"
