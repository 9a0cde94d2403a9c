"""Opening the files hetpatrol writes without following anyone else's links.

The lowest layer (no hetpatrol import): every writer uses it, the JSONL log, the state
file, the node_exporter textfile, the daemon's claim (lock) files, ``baseline --write``
and the ledger's quota textfile.

The threat: a path in a directory another user can change. When ``/tmp/hetpatrol`` was
made by someone else, that user can put a symlink ``patrol.jsonl -> /home/victim/x``
there, and a daemon that follows it appends patrol lines to the victim's file (or
truncates it to its pid, for the lock). The rules, after OpenSSH's ``StrictModes`` and
the kernel's ``fs.protected_symlinks`` (``Documentation/admin-guide/sysctl/fs.rst``):

- every directory on the way to the file, along the path as given and along its
  resolved path, is owned by root or by this process's effective user, and is not
  writable by others, nor by a group with a login user in it (one of uid ``UID_MIN``
  and up that is not this user: Ubuntu's ``root:syslog`` 0775 ``/var/log`` is fine),
  unless it has the sticky bit (``/tmp``): there nobody may rename or delete another
  user's entry (``unlink(2)``, EPERM);
- a symbolic link on the way is owned by root or by this user (a link another user
  made in ``/tmp`` is refused, as ``protected_symlinks`` would);
- the file itself is opened with ``O_NOFOLLOW`` (a symlink there fails with ELOOP) and
  must be a regular file owned by root or this user, with one link (a hard link to a
  victim's file, made in a sticky directory, is refused);
- a new file is made with ``O_CREAT | O_EXCL``: a name that appears meanwhile is never
  opened instead.

A refusal raises :class:`UnsafePath` (an ``OSError``, errno EPERM) whose message names
the path and why.

Reading a file another user may have put in a shared directory (the JSONL logs and state
files an operator gathered for ``hetpatrol ledger faults``): :func:`open_for_reading`
follows only the symbolic links root or this user made, and never blocks on a FIFO.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from hetpatrol.path_walk import resolve_checked

__all__ = [
    "UnsafePath",
    "check_directory",
    "make_directories",
    "open_for_append",
    "open_for_lock",
    "check_opened",
    "check_owned",
    "check_replaceable",
    "UnsafeRead",
    "open_for_reading",
    "check_trusted_file",
    "own_file_check",
]

#: the flags every writer adds: never follow a link at the file, never pass the fd on
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    """A path hetpatrol refuses to write: ``errno`` EPERM, ``filename`` the path, the
    message says which directory, link or file and why."""

    def __init__(self, path: str | os.PathLike, why: str):
        super().__init__(errno.EPERM, why, str(path))

    def __str__(self) -> str:
        return f"refusing to write {self.filename}: {self.strerror}"


def _trusted_owner(uid: int) -> bool:
    return uid == 0 or uid == os.geteuid()


def _owner_name(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _uid_min() -> int:
    """The first uid of login users: ``UID_MIN`` of ``/etc/login.defs`` (1000)."""
    try:
        with open("/etc/login.defs", encoding="utf-8", errors="replace") as f:
            for line in f:
                words = line.split()
                if len(words) >= 2 and words[0] == "UID_MIN" and words[1].isdigit():
                    return int(words[1])
    except OSError:
        pass
    return 1000


def group_members(gid: int) -> set[int] | None:
    """The uids in group ``gid``: its member list and every account whose primary group
    it is (the local password and group databases, as NSS gives them). None when the
    group or a member is unknown."""
    import grp
    import pwd

    try:
        group = grp.getgrgid(gid)
        uids = {pwd.getpwnam(name).pw_uid for name in group.gr_mem}
    except KeyError:
        return None
    uids.update(p.pw_uid for p in pwd.getpwall() if p.pw_gid == gid)
    return uids


#: gid -> (monotonic time the answer expires, trusted): the group databases are read
#: once a minute at most, not at every write of every patrol
_group_answers: dict[int, tuple[float, bool]] = {}
GROUP_CACHE_SECONDS = 60.0


def _group_trusted(gid: int) -> bool:
    """True when every member of group ``gid`` is root, this user or a system account
    (uid below ``UID_MIN``): Ubuntu's ``/var/log`` is ``root:syslog`` 0775, and the
    syslog daemon's group is no other *user*. A group with a login user in it, or one
    that cannot be looked up, is not. The answer is kept for
    :data:`GROUP_CACHE_SECONDS`."""
    import time

    now = time.monotonic()
    cached = _group_answers.get(gid)
    if cached is not None and cached[0] > now:
        return cached[1]
    members = group_members(gid)
    limit = _uid_min()
    trusted = members is not None and all(_trusted_owner(u) or u < limit for u in members)
    _group_answers[gid] = (now + GROUP_CACHE_SECONDS, trusted)
    return trusted


def _check_one_directory(target: Path, d: str, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(target, f"{d} is not a directory")
    if not _trusted_owner(st.st_uid):
        raise UnsafePath(
            target, f"directory {d} is owned by {_owner_name(st.st_uid)}, not root or this user"
        )
    if st.st_mode & stat.S_ISVTX:
        return  # /tmp: nobody renames or deletes another user's entry there
    if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not _group_trusted(st.st_gid)):
        who = "others" if st.st_mode & stat.S_IWOTH else f"its group {_group_name(st.st_gid)}"
        raise UnsafePath(
            target,
            f"directory {d} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}, "
            "no sticky bit): another user could replace the file with a link",
        )


def _group_name(gid: int) -> str:
    try:
        import grp

        return f"gid {gid} ({grp.getgrgid(gid).gr_name})"
    except KeyError:
        return f"gid {gid}"


def _prefixes(path: Path) -> list[str]:
    parts = Path(os.path.abspath(path)).parts
    return [os.path.join(*parts[: i + 1]) for i in range(len(parts))]


def check_directory(directory: Path, target: Path | None = None) -> bool:
    """Check that nobody but root and this user can change what ``directory`` holds.

    Returns True when the directory is shared (writable by others with the sticky bit,
    or by a group: the file must then be this user's own, see :func:`check_opened`),
    False when only root and this user may write there. Raises :class:`UnsafePath` (naming
    ``target``, the file to be written, when given) or ``OSError`` (a missing
    directory: FileNotFoundError).
    """
    target = target if target is not None else directory
    seen: set[str] = set()
    for prefix in _prefixes(directory):
        st = os.lstat(prefix)
        if stat.S_ISLNK(st.st_mode) and not _trusted_owner(st.st_uid):
            raise UnsafePath(
                target, f"{prefix} is a symbolic link owned by {_owner_name(st.st_uid)}"
            )
        # every real directory the kernel walks to reach this prefix
        for d in _prefixes(Path(os.path.realpath(prefix))):
            if d not in seen:
                seen.add(d)
                _check_one_directory(target, d, os.stat(d))
    final = os.stat(directory)
    return bool(final.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def make_directories(directory: Path, target: Path | None = None) -> bool:
    """Create ``directory`` (mode 0755 before the umask) and its missing parents, each
    only inside a directory :func:`check_directory` accepts; then check it all.

    Returns what :func:`check_directory` returns. Raises :class:`UnsafePath`, or
    ``OSError`` when a directory cannot be made (read-only file system, EACCES).
    """
    directory = Path(os.path.abspath(directory))
    missing: list[Path] = []
    existing = directory
    while not os.path.lexists(existing):
        missing.append(existing)
        existing = existing.parent
    if missing:
        check_directory(existing, target)
        for d in reversed(missing):
            try:
                os.mkdir(d, 0o755)
            except FileExistsError:
                pass  # made meanwhile: checked below like the rest
    return check_directory(directory, target)


def check_opened(fd: int, path: Path, shared: bool) -> os.stat_result:
    """Check the file open on ``fd`` (opened from ``path``): a regular file owned by
    root or this user, and, in a ``shared`` (sticky) directory, this user's own with
    one link. Returns its ``fstat``; raises :class:`UnsafePath` or ``OSError``
    (EINVAL: not a regular file: a FIFO, device or socket)."""
    st = os.fstat(fd)
    check_owned(st, path, shared)
    return st


def check_owned(st: os.stat_result, path: Path, shared: bool) -> None:
    """:func:`check_opened` on a file's ``fstat`` ``st``: a regular file owned by root
    or this user, this user's own with one link in a ``shared`` directory. Raises
    :class:`UnsafePath` or ``OSError`` (EINVAL: not a regular file)."""
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    if not _trusted_owner(st.st_uid) or (shared and st.st_uid != os.geteuid()):
        raise UnsafePath(path, f"the file is owned by {_owner_name(st.st_uid)}")
    if shared and st.st_nlink != 1:
        raise UnsafePath(path, f"the file has {st.st_nlink} hard links in a shared directory")


def own_file_check(path: Path):
    """For reading back a file this program writes (its state file, its history): a
    check of the opened file's ``fstat`` that raises :class:`UnsafePath` unless it is
    one :func:`check_opened` would accept for writing, in a directory
    :func:`check_directory` accepts. In a sticky directory (``/tmp``) any user can make
    the name first: their file is never believed. Raises :class:`UnsafePath` or OSError
    at once for the directory."""
    path = Path(path)
    shared = check_directory(path.parent, path)

    def verify(st: os.stat_result) -> None:
        check_owned(st, path, shared)

    return verify


def _open_checked(path: Path, flags: int, mode: int, *, create_dirs: bool) -> int:
    path = Path(path)
    if create_dirs:
        shared = make_directories(path.parent, path)
    else:
        shared = check_directory(path.parent, path)
    try:  # a new file: O_EXCL, so that a name made meanwhile is never opened instead
        fd = os.open(path, flags | NOFOLLOW | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        fd = _open_existing(path, flags)
    try:
        check_opened(fd, path, shared)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_existing(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise UnsafePath(path, "it is a symbolic link") from None
        raise


def open_for_append(path: Path, mode: int, *, create_dirs: bool = True) -> int:
    """Open ``path`` for appending (``O_RDWR | O_APPEND``, ``O_NONBLOCK`` so that a FIFO
    never blocks; the caller sets the fd blocking once it is checked), creating it with
    ``mode`` (and, with ``create_dirs``, its directory) when missing. Returns the fd.
    Raises :class:`UnsafePath` (a link, another user's file or directory) or OSError."""
    flags = os.O_RDWR | os.O_APPEND | os.O_NONBLOCK
    return _open_checked(path, flags, mode, create_dirs=create_dirs)


def open_for_lock(path: Path, mode: int = 0o644) -> int:
    """Open (or create) a lock file read-write under the same rules as
    :func:`open_for_append`. Returns the fd; raises :class:`UnsafePath` or OSError."""
    return _open_checked(path, os.O_RDWR | os.O_NONBLOCK, mode, create_dirs=True)


def check_replaceable(path: Path, shared: bool) -> None:
    """Before a ``rename`` over ``path``: nothing there, or a regular file of root or
    this user (this user's own in a shared directory). A link there is refused, never
    followed nor replaced. Raises :class:`UnsafePath`, or OSError (EEXIST) for a device,
    FIFO, socket or directory."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(path, "it is a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EEXIST, "not a regular file: refusing to replace it", str(path))
    if not _trusted_owner(st.st_uid) or (shared and st.st_uid != os.geteuid()):
        raise UnsafePath(path, f"the file is owned by {_owner_name(st.st_uid)}")


class UnsafeRead(UnsafePath):
    """A path hetpatrol refuses to read (a symbolic link another user made): ``errno``
    EPERM, the message says which link and whose."""

    def __str__(self) -> str:
        return f"refusing to read {self.filename}: {self.strerror}"


def _resolve_own_links(path: Path, owners: frozenset[int] | None = None) -> str:
    """``path`` resolved component by component, following only the symbolic links
    owned by root or this user (as ``fs.protected_symlinks`` does in a sticky
    directory, here everywhere; :func:`hetpatrol.path_walk.resolve_checked`), or by one
    of ``owners`` when given. Raises :class:`UnsafeRead` or OSError (a missing
    component, a loop)."""

    def on_link(here: str, st: os.stat_result) -> None:
        if not (_trusted_owner(st.st_uid) if owners is None else st.st_uid in owners):
            raise UnsafeRead(path, f"{here} is a symbolic link owned by {_owner_name(st.st_uid)}")

    return resolve_checked(os.path.abspath(os.fspath(path)), on_link)


def check_trusted_file(st: os.stat_result, path: Path, owners: frozenset[int]) -> None:
    """A file read from a shared directory is believed only when one of ``owners`` (uids)
    owns it and nobody else may change it: not writable by its group or by others (the
    rule of :func:`hetpatrol.healthcheck.read_trusted_state` for state files). Raises
    :class:`UnsafeRead` saying whose it is or who may write it."""
    if st.st_uid not in owners:
        raise UnsafeRead(
            path, f"the file is owned by {_owner_name(st.st_uid)}, not a trusted owner"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "others" if st.st_mode & stat.S_IWOTH else f"its group {_group_name(st.st_gid)}"
        raise UnsafeRead(
            path, f"the file is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
        )


def open_for_reading(path: Path, owners: frozenset[int] | None = None) -> int:
    """Open ``path`` read-only without following another user's symbolic link anywhere
    on the way (:func:`_resolve_own_links`; the last component opened ``O_NOFOLLOW``)
    and without blocking (``O_NONBLOCK``: a FIFO put there is refused, never waited
    on). With ``owners`` (uids), only their links are followed and the file must be one
    of theirs, not writable by group or others (:func:`check_trusted_file`). Returns the
    fd of a regular file. Raises :class:`UnsafeRead`, or OSError (missing, unreadable;
    EINVAL: not a regular file)."""
    real = _resolve_own_links(Path(path), owners)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link put there since it was resolved
            raise UnsafeRead(path, "it is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if owners is not None:
            check_trusted_file(st, Path(path), owners)
    except BaseException:
        os.close(fd)
        raise
    return fd
