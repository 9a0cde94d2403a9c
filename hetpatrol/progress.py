"""What a long cluster command is doing, for a person watching it: one line on stderr.

Only when stderr is a terminal (and the caller has not turned it off, as ``--json`` and
the machine formats do): a pipe, a log file or a cron mail gets nothing. The line is
rewritten in place (``\\r``) and erased (``\\r`` + ``ESC [K``, erase to the end of the
line, ECMA-48 EL) when the step ends, so the command's own output starts on a clean line.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TextIO

_ERASE = "\r\033[K"


def _on(stream: TextIO, enabled: bool) -> bool:
    try:
        return enabled and stream.isatty()
    except (AttributeError, ValueError):  # closed or not a file
        return False


@contextlib.contextmanager
def progress(
    message: str, *, enabled: bool = True, stream: TextIO | None = None
) -> Iterator[Callable[[str], None]]:
    """Show ``message`` (with ``...``) on ``stream`` (default stderr) while the block runs,
    erased after it. Yields ``update(text)``, which shows ``message: text`` instead (a
    count of records read). Nothing is written unless ``enabled`` and the stream is a
    terminal."""
    out = stream if stream is not None else sys.stderr
    if not _on(out, enabled):
        yield lambda text: None
        return

    def update(text: str) -> None:
        out.write(f"{_ERASE}{message}: {text}")
        out.flush()

    out.write(f"{_ERASE}{message}...")
    out.flush()
    try:
        yield update
    finally:
        out.write(_ERASE)
        out.flush()
