"""A path resolved one component at a time, each symbolic link and directory on the way
shown to the caller before it is followed: the walk under
:func:`hetpatrol.healthcheck.resolve_trusted` (state files ``check`` and the Prolog
believe) and :func:`hetpatrol.safe_files.open_for_reading` (files ``ledger faults`` reads
from shared directories).

Standard library only (``check`` imports this before every health check).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

#: most symbolic links followed on the way to a file (Linux's own limit, MAXSYMLINKS)
MAX_SYMLINKS = 40


def resolve_checked(
    path: str | os.PathLike[str],
    on_link: Callable[[str, os.stat_result], None],
    on_dir: Callable[[str, os.stat_result], None] | None = None,
) -> str:
    """``path`` (made absolute against the working directory) resolved component by
    component. ``on_link(here, lstat)`` is called for each symbolic link before it is
    followed, ``on_dir(here, lstat)`` for each directory on the way to the last
    component (``/`` included); either raises to refuse. Returns the real path of the
    last component, which is not itself checked (the caller opens it ``O_NOFOLLOW`` and
    checks what it opened). Raises what the callbacks raise, ``NotADirectoryError`` for
    a file on the way, or OSError (a missing component; ELOOP past
    :data:`MAX_SYMLINKS` links)."""
    text = os.fspath(path)
    if not text.startswith("/"):
        text = f"{os.getcwd()}/{text}"
    todo = list(reversed(text.split("/")))
    done = "/"
    if on_dir is not None:
        on_dir(done, os.stat(done))
    hops = 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            done = os.path.dirname(done)
            continue
        here = os.path.join(done, name)
        st = os.lstat(here)
        if stat.S_ISLNK(st.st_mode):
            on_link(here, st)
            hops += 1
            if hops > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, "too many symbolic links", os.fspath(path))
            target = os.readlink(here)
            if target.startswith("/"):
                done = "/"
            todo.extend(reversed(target.split("/")))
            continue
        if on_dir is not None and any(t not in ("", ".") for t in todo):  # on the way
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", here)
            on_dir(here, st)
        done = here
    return done
