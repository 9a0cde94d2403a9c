"""Running a vendor tool (``npu-smi``, ``hccn_tool``...) safely, or replaying its output.

A vendor tool may hang forever on a dying card. :func:`run_tool` starts it in its own
process group and kills the whole group (SIGKILL) at the timeout, so neither the tool
nor anything it spawned survives, and reaps it so no zombie is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ToolOutput:
    """Result of one tool run.

    ``stdout``/``stderr`` are decoded as UTF-8 with undecodable bytes replaced (garbage
    must reach the parser, which keeps it as raw text, not crash the decode).
    ``returncode`` is ``None`` when the tool hung and was killed (``hung`` is then True).
    """

    argv: tuple[str, ...]
    stdout: str
    stderr: str
    returncode: int | None
    hung: bool
    duration_seconds: float


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def run_tool(argv: Sequence[str], timeout_seconds: float) -> ToolOutput:
    """Run ``argv`` with no stdin, capture its output, kill its process group on timeout.

    Raises ``FileNotFoundError`` when the program does not exist (the vendor stack is
    absent) and ``PermissionError`` when it cannot be executed.
    """
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_seconds)
        hung = False
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        hung = True
        code = None
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # Children in the group may hold the pipes open; after SIGKILL they close.
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - pipe held by an escapee
            proc.kill()
            out, err = b"", b""
            proc.wait()
    return ToolOutput(
        argv=tuple(argv),
        stdout=_decode(out),
        stderr=_decode(err),
        returncode=code,
        hung=hung,
        duration_seconds=time.monotonic() - start,
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
