"""Write failures of a sink: every one counted, each episode logged once.

A full disk or a read-only log directory makes every patrol's write fail until an
operator acts. Logging each failed line (or patrol) would flood the journal, and logging
only the very first failure of the process would hide a second outage. So a sink logs
``<what>_write_failed`` when an episode starts (or its cause, the errno, changes) and
``<what>_write_resumed`` with the episode's failure count when a write succeeds again.
The JSONL sink, the state file and the node_exporter textfile all behave this way.
"""

from __future__ import annotations

import errno
import os

from hetpatrol.logs import get_logger

log = get_logger("hetpatrol.sink")


def describe(exc: OSError) -> str:
    """``ENOSPC: No space left on device`` style text of an I/O error."""
    name = errno.errorcode.get(exc.errno or 0, "E?")
    return f"{name}: {exc.strerror or exc}"


class WriteFailures:
    """Failure bookkeeping of one sink (``what`` names it in the log events)."""

    def __init__(self, what: str):
        self.what = what
        #: failures since start (lines for the JSONL sink, files for the others)
        self.errors = 0
        self._failing: int | None = None  # errno of the current episode
        self._episode_errors = 0

    @property
    def failing(self) -> bool:
        """True while the last write failed."""
        return self._failing is not None

    def failed(self, path: os.PathLike[str] | str, exc: OSError, count: int = 1) -> None:
        """Count ``count`` failures; log when an episode starts or its cause changes."""
        self.errors += count
        self._episode_errors += count
        code = exc.errno or 0
        if self._failing != code:
            log.error(
                f"{self.what}_write_failed",
                path=str(path),
                error=describe(exc),
                lost=count,
                note="logged once until writing resumes",
            )
            self._failing = code

    def succeeded(self, path: os.PathLike[str] | str) -> None:
        """A write went through: log the end of a failure episode, if one was open."""
        if self._failing is not None:
            log.info(f"{self.what}_write_resumed", path=str(path), failures=self._episode_errors)
            self._failing = None
            self._episode_errors = 0
