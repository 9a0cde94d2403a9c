"""Reading the cluster commands' inputs without trusting them: files and option values.

:func:`read_regular` is how ``fleet --slurm-nodes``, ``audit-slurm --slurm-conf`` (and
its Includes), ``--gres-conf`` and ``--cgroup-conf`` read a file: opened without
blocking (``O_NONBLOCK``: a FIFO is never waited on), regular files only (a FIFO, a
device such as ``/dev/zero`` or a directory is refused before any read), at most
:data:`READ_MAX` bytes (the size is checked before reading). The same rules as
``hetpatrol.exporters.state.read_state`` and ``hetpatrol.yaml_document.read_document``,
with a bound that fits a 10,000-node ``scontrol --json show node`` document.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import stat
import sys

#: Most bytes read from one input file or stdin (a 10,000-node JSON node list is ~50 MB).
READ_MAX = 256 * 1024 * 1024
#: Largest ``--timeout`` in seconds (a day: a socket or subprocess timeout must fit).
TIMEOUT_MAX = 86400.0


def _bounded(read, limit: int, name: str) -> bytes:
    chunks, total = [], 0
    while total <= limit:
        chunk = read(min(1 << 20, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes: not read", name)
    return b"".join(chunks)


def read_regular(path: str | os.PathLike[str], limit: int = READ_MAX) -> str:
    """The text of the regular file at ``path`` (UTF-8, undecodable bytes replaced), or
    of stdin for ``-``.

    ``OSError`` (the path in its ``filename``) when it cannot be opened, is not a
    regular file (FIFO, device, directory, socket) or holds more than ``limit`` bytes.
    """
    name = os.fspath(path)
    if str(name) == "-":
        return _bounded(sys.stdin.buffer.read, limit, "<stdin>").decode("utf-8", "replace")
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(st.st_mode)
                else "a FIFO"
                if stat.S_ISFIFO(st.st_mode)
                else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "not a regular file"
            )
            raise OSError(errno.EINVAL, f"{kind}, not a regular file: not read", name)
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes: not read", name)
        raw = _bounded(lambda n: os.read(fd, n), limit, name)
    finally:
        os.close(fd)
    return raw.decode("utf-8", "replace")


def timeout_seconds(text: str) -> float:
    """``--timeout``: seconds in (0, :data:`TIMEOUT_MAX`]; anything else (``nan``,
    ``inf``, ``1e999``, ``0``, ``-1``) is a usage error (``argparse.ArgumentTypeError``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number of seconds") from None
    if not (math.isfinite(value) and 0 < value <= TIMEOUT_MAX):
        raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds in (0, {TIMEOUT_MAX:.0f}]")
    return value
