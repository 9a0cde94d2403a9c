"""Running a vendor tool (``npu-smi``, ``hccn_tool``...) safely, or replaying its output.

A vendor tool may hang forever on a dying card. :func:`run_tool` starts it in its own
process group and kills the whole group (SIGKILL) at the timeout, so neither the tool
nor anything it spawned survives, and reaps it so no zombie is left behind. A descendant
that left the group (``setsid``) is killed too while its parent chain to the tool still
stands; one orphaned before the timeout is out of reach (the unit's cgroup ends it at
stop).

Both output pipes are read in the calling thread (``poll(2)`` through
:mod:`selectors`: no reader thread per run), in chunks up to a cap (:data:`STDOUT_CAP`,
:data:`STDERR_CAP`): a tool that prints more (a runaway loop printing gigabytes) is
killed the same way, and the result keeps what was read with ``truncated=True``, so the
daemon's memory stays bounded. The tool's own exit ends the run too: a background child
it left holding a pipe (a daemon it started) is not waited for until the timeout (the
tool's answer and exit code are kept, ``hung`` False) but killed with the group. After
a kill the pipes are still read for up to 5 s (what the tool wrote last), then closed.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class ToolOutput:
    """Result of one tool run.

    ``stdout``/``stderr`` are decoded as UTF-8 with undecodable bytes replaced (garbage
    must reach the parser, which keeps it as raw text, not crash the decode).
    ``returncode`` is ``None`` when the tool hung and was killed (``hung`` is then True).
    ``truncated`` is True when the tool printed more than the cap and was killed: only
    the first part of its output is kept (a real vendor table is far below the cap).
    """

    argv: tuple[str, ...]
    stdout: str
    stderr: str
    returncode: int | None
    hung: bool
    duration_seconds: float
    truncated: bool = False


#: Most bytes of a tool's stdout / stderr kept; a tool printing more is killed.
STDOUT_CAP = 16 * 1024 * 1024
STDERR_CAP = 1024 * 1024
_CHUNK = 64 * 1024
#: how long the pipes are still read after a kill (what the killed tool wrote last)
_DRAIN_SECONDS = 5.0
#: how often a tool whose pipes are still open is looked at for its exit (``waitid``)
_EXIT_POLL_SECONDS = 0.1
#: how long the pipes are still read once the tool has exited (a background child it
#: left may hold them open: that child is then killed, the tool's answer kept)
_AFTER_EXIT_SECONDS = 0.2
#: poll(2): no descriptor to create and close per run, unlike epoll
_Selector = getattr(selectors, "PollSelector", selectors.SelectSelector)


def _decode(data: bytes | bytearray | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the tool's process group, and every descendant found through the process
    table first: one that moved itself into a session of its own (``setsid``) has left
    the group but is still the tool's child."""
    try:
        escaped = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        escaped = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for child in escaped:
        try:
            child.kill()
        except psutil.Error:
            pass


def run_tool(
    argv: Sequence[str],
    timeout_seconds: float,
    *,
    stdout_cap: int = STDOUT_CAP,
    stderr_cap: int = STDERR_CAP,
) -> ToolOutput:
    """Run ``argv`` with no stdin, capture its output (capped), kill its process group
    on timeout or when it prints more than the cap.

    Raises ``FileNotFoundError`` when the program does not exist (the vendor stack is
    absent) and ``PermissionError`` when it cannot be executed.
    """
    start = time.monotonic()
    deadline = start + timeout_seconds
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    out, err = bytearray(), bytearray()
    pipes = {proc.stdout.fileno(): (out, stdout_cap), proc.stderr.fileno(): (err, stderr_cap)}
    code: int | None = None
    with _Selector() as sel:
        for fd in pipes:
            sel.register(fd, selectors.EVENT_READ)
        # read both pipes in this thread until EOF on both, the deadline, a cap, or the
        # tool's own exit (then what it left behind, holding a pipe, is not waited for)
        over, exited = _read_until(sel, pipes, deadline, pid=proc.pid)
        held = bool(sel.get_map())  # a pipe still open
        hung = not over and held and not exited
        if exited and held and not over:
            # The tool exited (its answer and exit code are in) but a background child
            # it started still holds a pipe: the tool is not hung, and its output is
            # not lost by waiting for that child until the timeout. The child is killed
            # with the group (as at a timeout); an escapee out of reach is left to the
            # unit's cgroup, its pipe end closed here.
            kill_tree(proc)
            code = proc.wait()
        elif not hung and not over:
            try:
                code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung = True
        if hung or over:
            kill_tree(proc)
            # Children in the group may hold the pipes open; after SIGKILL they close.
            # What was written before is still read, up to the cap; an escapee out of
            # reach that keeps a pipe open is given up after the grace.
            drain_until = time.monotonic() + _DRAIN_SECONDS
            over = _read_until(sel, pipes, drain_until, stop_at_cap=False)[0] or over
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                proc.kill()
                proc.wait()
            code = None if hung else proc.returncode
    proc.stdout.close()
    proc.stderr.close()
    if RECORD_DIR_ENV in os.environ:
        _record(Path(os.environ[RECORD_DIR_ENV]), argv, bytes(out))
    return ToolOutput(
        argv=tuple(argv),
        stdout=_decode(out),
        stderr=_decode(err),
        returncode=code,
        hung=hung,
        duration_seconds=time.monotonic() - start,
        truncated=over,
    )


def _exited(pid: int) -> bool:
    """Whether the child ``pid`` has ended, without reaping it (``WNOWAIT``): its pid
    stays its own, so :func:`kill_tree` cannot hit a process that reused it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # pragma: no cover - reaped elsewhere
        return True


def _read_until(
    sel: selectors.BaseSelector,
    pipes: dict,
    deadline: float,
    *,
    stop_at_cap: bool = True,
    pid: int | None = None,
) -> tuple[bool, bool]:
    """Read the pipes registered in ``sel`` into their buffers (``pipes``: fd ->
    (buffer, cap)) in chunks until EOF on all or ``deadline``; a pipe is unregistered at
    its EOF, or at its cap (its buffer then keeps exactly ``cap`` bytes). With ``pid``,
    the process is also looked at every :data:`_EXIT_POLL_SECONDS` (``waitid``, not
    reaped); once it has exited the pipes are read for :data:`_AFTER_EXIT_SECONDS` more
    at most. Returns (a pipe reached its cap, at once with ``stop_at_cap``; the process
    was seen to exit)."""
    capped = exited = False
    next_look = time.monotonic() + _EXIT_POLL_SECONDS
    while sel.get_map():
        now = time.monotonic()
        if pid is not None and now >= next_look:
            next_look = now + _EXIT_POLL_SECONDS
            if _exited(pid):
                exited, pid = True, None
                deadline = min(deadline, now + _AFTER_EXIT_SECONDS)
        remaining = deadline - now
        if remaining <= 0:
            break
        wait = remaining if pid is None else min(remaining, max(0.0, next_look - now))
        for key, _ in sel.select(wait):
            try:
                chunk = os.read(key.fd, _CHUNK)
            except OSError:  # pragma: no cover - the pipe failed under us: as at EOF
                chunk = b""
            if not chunk:
                sel.unregister(key.fd)
                continue
            buf, cap = pipes[key.fd]
            room = cap - len(buf)
            if len(chunk) > room:
                buf += chunk[:room]
                sel.unregister(key.fd)
                capped = True
                if stop_at_cap:
                    return True, exited
                continue
            buf += chunk
    return capped, exited


#: When set, :func:`run_tool` also writes each tool's stdout (as read: within the cap) to
#: this directory under its :func:`replay_file_name`: one patrol recorded becomes a
#: ``--replay`` scenario (``hetpatrol doctor --bundle``). Unset in the daemon.
RECORD_DIR_ENV = "HETPATROL_RECORD_DIR"


def _record(directory: Path, argv: Sequence[str], stdout: bytes) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / replay_file_name(argv)).write_bytes(stdout)
    except OSError:
        pass  # a recording is a support aid: the patrol itself goes on


def replay_file_name(argv: Sequence[str]) -> str:
    """File name of a recorded command in a replay directory: argv joined with ``_``.

    ``["npu-smi", "info", "-t", "health", "-i", "0"]`` -> ``npu-smi_info_-t_health_-i_0.txt``.
    The program is taken by its base name, so a configured absolute path replays too.
    """
    parts = [Path(argv[0]).name, *argv[1:]]
    return "_".join(parts) + ".txt"


#: Historical short names accepted for the main commands of a replay directory.
REPLAY_ALIASES = {"npu-smi_info.txt": "npu-smi-info.txt"}


class ReplayTool:
    """Answers tool runs from recorded outputs in a directory (the ``--replay`` boundary).

    ``run(argv, timeout)`` returns the file's text as stdout with exit code 0. A missing
    recording behaves as a missing program (``FileNotFoundError``), which is how a node
    without that vendor's stack looks in production.
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def path_for(self, argv: Sequence[str]) -> Path | None:
        name = replay_file_name(argv)
        for candidate in (name, REPLAY_ALIASES.get(name)):
            if candidate and (self.directory / candidate).is_file():
                return self.directory / candidate
        return None

    def run(self, argv: Sequence[str], timeout_seconds: float) -> ToolOutput:
        path = self.path_for(argv)
        if path is None:
            name = replay_file_name(argv)
            also = f" (or {REPLAY_ALIASES[name]})" if name in REPLAY_ALIASES else ""
            raise FileNotFoundError(f"no recording {name}{also} in {self.directory}")
        start = time.monotonic()
        text = _decode(path.read_bytes())
        return ToolOutput(tuple(argv), text, "", 0, False, time.monotonic() - start)
