"""The JSONL patrol log: whole lines or nothing, rotation that loses no line.

- Each line is one ``os.write()`` on an ``O_APPEND`` descriptor, so concurrent readers
  (``tail -f``) and a crash never see two lines interleaved. A short write (disk full
  mid-line) is cut back with ``ftruncate`` so no torn line stays behind.
- A torn last line left by a crash (SIGKILL mid-write, power loss) is cut off when the
  sink opens the file; every whole line before it is kept.
- Size-based rotation happens between patrols (``patrol.jsonl`` -> ``.1`` -> ... ->
  ``.N``). An external logrotate that renames the file is followed: the sink notices the
  path now names another inode (or nothing) and reopens; :meth:`JsonlSink.reopen` does
  the same on SIGHUP.
- Write failures (ENOSPC, EACCES, EROFS...) are counted per lost line, logged once per
  episode (:class:`~hetpatrol.exporters.failures.WriteFailures`), and writing resumes by
  itself when the cause is gone.
- The file is opened with ``O_NOFOLLOW`` in a directory only root and the daemon's user
  can change (or a sticky one, where the file must be the daemon's own): a symlink or
  another user's file there is refused (:mod:`hetpatrol.safe_files`), counted and logged
  like any write failure, never followed to someone else's file.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from hetpatrol.exporters import PRIVATE_FILE_MODE
from hetpatrol.exporters.failures import WriteFailures
from hetpatrol.logs import get_logger
from hetpatrol.safe_files import open_for_append

log = get_logger("hetpatrol.jsonl")

_TAIL_CHUNK = 64 * 1024


def repair_torn_tail(path: Path) -> int:
    """Cut a partial last line (no trailing newline) off ``path``.

    Returns the number of bytes removed (0 when the file ends cleanly, is empty or
    missing). Lines before the torn one are untouched. A symbolic link at ``path`` is
    never followed (OSError ELOOP); a FIFO, device or socket is left alone (0).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return 0
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0  # not a file: the sink's open refuses it
        return _repair_fd(fd)
    finally:
        os.close(fd)


def _repair_fd(fd: int) -> int:
    """:func:`repair_torn_tail` on an open regular file. Returns the bytes removed."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    if os.pread(fd, 1, size - 1) == b"\n":
        return 0
    pos = size
    keep = 0
    while pos > 0:
        start = max(0, pos - _TAIL_CHUNK)
        chunk = os.pread(fd, pos - start, start)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            keep = start + nl + 1
            break
        pos = start
    os.ftruncate(fd, keep)
    return size - keep


class JsonlSink:
    """Appends JSONL lines to ``path`` with rotation; never raises on I/O trouble.

    ``max_bytes`` 0 disables size rotation (use logrotate). ``backups`` rotated files are
    kept. :attr:`write_errors` and :attr:`lines_written` feed the Prometheus counters.
    """

    def __init__(self, path: Path, max_bytes: int = 0, backups: int = 5):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.failures = WriteFailures("jsonl")
        self.lines_written = 0
        self.repaired_bytes = 0
        self._fd: int | None = None
        self._ino: tuple[int, int] | None = None
        self._size = 0

    @property
    def write_errors(self) -> int:
        """Lines that could not be written since start."""
        return self.failures.errors

    # ------------------------------------------------------------------ open/close
    def _open(self) -> None:
        # one descriptor, checked before anything is cut or written: a symlink at the
        # path (ELOOP) or in a directory another user owns or can write is refused
        # (UnsafePath, see hetpatrol.safe_files), never followed to someone else's file;
        # O_NONBLOCK: a FIFO (or device) put at the path must not block the daemon
        fd = open_for_append(self.path, PRIVATE_FILE_MODE)
        try:
            removed = _repair_fd(fd)
            if removed:
                self.repaired_bytes += removed
                log.warning("jsonl_torn_tail_repaired", path=str(self.path), bytes_removed=removed)
            os.set_blocking(fd, True)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._ino, self._size = fd, (st.st_dev, st.st_ino), st.st_size

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            finally:
                self._fd = None

    def reopen(self) -> None:
        """Close and reopen the path (after an external rotation; on SIGHUP)."""
        self.close()

    def _moved(self) -> bool:
        try:
            st = os.lstat(self.path)  # a link put there is another inode: reopened, refused
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != self._ino

    # ---------------------------------------------------------------------- rotate
    def _rotate(self) -> None:
        if self.backups <= 0:
            assert self._fd is not None
            os.ftruncate(self._fd, 0)  # the file open and checked, never the path again
            self.close()
            return
        self.close()
        for i in range(self.backups - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))

    # ----------------------------------------------------------------------- write
    def _cut_short_write(self, written: int) -> None:
        """A write that took ``written`` bytes of a line (disk full mid-line): cut those
        bytes off again and raise ENOSPC, so the line is absent, never torn.

        The line began ``written`` bytes before the file's end as the kernel has it now
        (``O_APPEND`` wrote it there), not at the size this sink last saw: a
        ``copytruncate`` rotation since then shrank the file, and truncating to the old
        size would pad it with NUL bytes around the torn line. When even the cut fails,
        the descriptor is closed by the caller and the next open cuts the torn tail."""
        assert self._fd is not None
        end = os.fstat(self._fd).st_size
        os.ftruncate(self._fd, max(0, end - written))
        self._size = max(0, end - written)
        raise OSError(errno.ENOSPC, "short write (no space left on device)")

    def write_lines(self, lines: Sequence[str]) -> int:
        """Append ``lines`` (each ending in a newline), one ``write()`` each.

        Returns how many were written. Lines that could not be written are counted in
        :attr:`write_errors`; the first failure of an episode is logged, and the recovery.
        """
        done = 0
        try:
            if self._fd is not None and self._moved():
                self.close()
            if self._fd is None:
                self._open()
            datas = [line.encode() for line in lines]  # UTF-8, once per line
            batch = sum(len(data) for data in datas)
            if self.max_bytes and self._size and self._size + batch > self.max_bytes:
                self._rotate()
                self._open()
            assert self._fd is not None
            for data in datas:
                n = os.write(self._fd, data)
                if n != len(data):
                    self._cut_short_write(n)
                self._size += n
                done += 1
        except OSError as exc:
            self.failures.failed(self.path, exc, len(lines) - done)
            self.close()
        else:
            self.failures.succeeded(self.path)
        self.lines_written += done
        return done
