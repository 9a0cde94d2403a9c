"""``reboot-history.json``: the reboot-survival history on disk, beside the state file.

Written by the daemon after a patrol that added to it, and by ``hetpatrol history
clear``; both under an exclusive ``flock(2)`` on ``reboot-history.json.lock`` and both
re-read the file first, so an operator's clear is never overwritten by a daemon that read
the file before it (the daemon applies its last patrol's observations again onto what it
re-read). Written atomically, mode PRIVATE_FILE_MODE, like the state file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from hetpatrol.actions.reboot_history import (
    HISTORY_FILE,
    HISTORY_SCHEMA,
    RebootHistory,
    SurvivalRule,
)
from hetpatrol.exporters import PRIVATE_FILE_MODE
from hetpatrol.exporters.state import write_atomic
from hetpatrol.logs import get_logger
from hetpatrol.safe_files import UnsafePath, open_for_lock, own_file_check

log = get_logger("hetpatrol.exporters")

#: most bytes read of the history file (MAX_CARDS x families x boots is far less)
HISTORY_READ_MAX = 16 * 1024 * 1024


def history_path(state_path: Path) -> Path:
    """Where the history lives: :data:`HISTORY_FILE` in the state file's directory."""
    return Path(state_path).parent / HISTORY_FILE


#: longest wait for the history lock (seconds): its holder is the daemon or ``history
#: clear``, each holding it for one read and one write; one stopped while holding it
#: (SIGSTOP, a debugger) must not stop the other for ever
LOCK_WAIT_SECONDS = 10.0


@contextlib.contextmanager
def locked(path: Path, wait_seconds: float | None = None) -> Iterator[None]:
    """Hold ``flock(LOCK_EX)`` on ``<path>.lock`` (created PRIVATE_FILE_MODE) for the
    block, opened by :func:`hetpatrol.safe_files.open_for_lock`: no symlink followed,
    and another user's lock file (made first in a sticky directory: its owner could hold
    the lock for ever and stop every patrol) is refused. Waits at most ``wait_seconds``
    (default :data:`LOCK_WAIT_SECONDS`) for another holder. Raises OSError
    (:class:`~hetpatrol.safe_files.UnsafePath`; ``TimeoutError`` when the lock stayed
    held that long)."""
    if wait_seconds is None:
        wait_seconds = LOCK_WAIT_SECONDS
    lock = Path(f"{path}.lock")
    fd = open_for_lock(lock, PRIVATE_FILE_MODE)
    try:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        errno.ETIMEDOUT,
                        f"held by another process for more than {wait_seconds:g} s",
                        str(lock),
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def read_history(path: Path, now: float, rule: SurvivalRule | None = None) -> RebootHistory:
    """The history in ``path`` as of ``now``; empty when missing, unreadable, damaged
    or another schema (never raises for the file's content). Each but a missing file
    is said in the log (``history_unreadable`` with why; the next write starts
    afresh). A file this user could not have written (another user's, made first in a
    sticky directory; a symlink; in a directory another user can change:
    :func:`hetpatrol.safe_files.own_file_check`) is never believed: empty, logged as
    ``history_refused`` (a forged history would make a card ``replace_card``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            own_file_check(path)(os.fstat(fd))
            data = fh.read(HISTORY_READ_MAX + 1)
        if len(data) > HISTORY_READ_MAX:
            raise ValueError(f"larger than {HISTORY_READ_MAX} bytes")
        try:
            doc = json.loads(data.decode("utf-8"))
        except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("schema") != HISTORY_SCHEMA:
            raise ValueError(f"not a {HISTORY_SCHEMA} document")
    except FileNotFoundError:
        doc = None  # no history yet
    except UnsafePath as exc:
        doc = _say(path, "history_refused", str(exc))
    except OSError as exc:
        why = "a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        doc = _say(path, "history_refused", why)
    except RecursionError:
        doc = _say(path, "history_unreadable", "nested too deep")
    except ValueError as exc:
        doc = _say(path, "history_unreadable", str(exc)[:200])
    else:
        _said.pop(str(path), None)
    return RebootHistory.from_dict(doc, now, rule)


#: path -> the last thing said about it (said once until it changes: the daemon reads
#: the file every patrol that has a critical card)
_said: dict[str, tuple[str, str]] = {}


def _say(path: Path, event: str, why: str) -> None:
    if _said.get(str(path)) != (event, why):
        _said[str(path)] = (event, why)
        log.warning(event, path=str(path), error=why)


def write_history(path: Path, history: RebootHistory) -> None:
    """Write ``history`` to ``path`` atomically (mode PRIVATE_FILE_MODE). Raises OSError."""
    data = json.dumps(history.to_dict(), separators=(",", ":")).encode() + b"\n"
    write_atomic(path, data, make_parents=True, mode=PRIVATE_FILE_MODE)


def sync_history(path: Path, history: RebootHistory, now: float) -> RebootHistory:
    """Under the lock: re-read ``path``, apply ``history``'s last patrol onto it, write it
    when that added anything. Returns the history to go on with (what is on disk).
    Raises OSError when the file cannot be written."""
    with locked(path):
        current = read_history(path, now, history.rule)
        current.last = history.last
        named = False
        for identity, _families, _boot, _now in history.last:
            known = history.names.get(identity)
            if known and current.names.get(identity) != known:
                current.names[identity] = known
                named = True
        if current.replay(history.last) or named or not path.exists():
            write_history(path, current)
        return current
