"""Running a vendor tool (``npu-smi``, ``hccn_tool``...) safely, or replaying its output.

A vendor tool may hang forever on a dying card. :func:`run_tool` starts it in its own
process group and kills the whole group (SIGKILL) at the timeout, so neither the tool
nor anything it spawned survives, and reaps it so no zombie is left behind. A descendant
that left the group (``setsid``) is killed too while its parent chain to the tool still
stands; one orphaned before the timeout is out of reach (the unit's cgroup ends it at
stop).

Its output is read in chunks up to a cap (:data:`STDOUT_CAP`, :data:`STDERR_CAP`): a tool
that prints more (a runaway loop printing gigabytes) is killed the same way, and the
result keeps what was read with ``truncated=True``, so the daemon's memory stays bounded.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
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


def _decode(data: bytes | bytearray | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def _read_capped(pipe, cap: int, buf: bytearray, over: threading.Event, done: queue.Queue):
    """Read ``pipe`` into ``buf`` in chunks until EOF or ``cap`` bytes (``over`` set)."""
    try:
        while True:
            chunk = pipe.read1(_CHUNK)
            if not chunk:
                break
            room = cap - len(buf)
            if len(chunk) > room:
                buf += chunk[:room]
                over.set()
                break
            buf += chunk
    except (OSError, ValueError):  # pragma: no cover - pipe closed under us
        pass
    finally:
        done.put(None)


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
    over = threading.Event()
    done: queue.Queue = queue.Queue()
    readers = [
        threading.Thread(target=_read_capped, args=(pipe, cap, buf, over, done), daemon=True)
        for pipe, cap, buf in ((proc.stdout, stdout_cap, out), (proc.stderr, stderr_cap, err))
    ]
    for t in readers:
        t.start()
    hung = False
    finished = 0
    while finished < 2 and not over.is_set():  # a reader ends at EOF or at its cap
        try:
            done.get(timeout=max(0.0, deadline - time.monotonic()))
            finished += 1
        except queue.Empty:
            hung = True
            break
    code: int | None = None
    if not hung and not over.is_set():
        try:
            code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
    if hung or over.is_set():
        kill_tree(proc)
        # Children in the group may hold the pipes open; after SIGKILL they close.
        for t in readers:
            t.join(timeout=5)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()
            proc.wait()
        code = None if hung else proc.returncode
    texts = []
    for pipe, t, buf in zip((proc.stdout, proc.stderr), readers, (out, err), strict=True):
        if t.is_alive():  # a reader still blocked (an escapee holds the pipe) keeps it,
            buf = buf[:]  # and may still append: decode a copy
        else:
            pipe.close()
        texts.append(_decode(buf))
    return ToolOutput(
        argv=tuple(argv),
        stdout=texts[0],
        stderr=texts[1],
        returncode=code,
        hung=hung,
        duration_seconds=time.monotonic() - start,
        truncated=over.is_set(),
    )


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
