"""Run a command with one of its streams on a pseudo-terminal (as in tmux or a shell),
for the tests of what hetpatrol prints on a terminal: widths, colour, progress lines."""

from __future__ import annotations

import os
import pty
import subprocess
from collections.abc import Mapping, Sequence


def run_on_pty(
    argv: Sequence[str],
    env: Mapping[str, str],
    timeout: float = 60,
    stream: str = "stdout",
) -> tuple[int, str]:
    """(exit code, what ``stream`` showed) of ``argv`` run with ``stream`` (``stdout`` or
    ``stderr``) on a pseudo-terminal and the other stream discarded; ``\\r\\n`` read as
    ``\\n``. The output is read until the terminal's other end closes (EIO), then the
    process is waited for at most ``timeout`` seconds (TimeoutExpired past that)."""
    main, tty = pty.openpty()
    where = {"stdout": tty, "stderr": subprocess.DEVNULL}
    if stream == "stderr":
        where = {"stdout": subprocess.DEVNULL, "stderr": tty}
    try:
        proc = subprocess.Popen(list(argv), env=dict(env), **where)
    finally:
        os.close(tty)
    out = bytearray()
    try:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the terminal's other end closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(main)
    return proc.wait(timeout=timeout), out.decode().replace("\r\n", "\n")
