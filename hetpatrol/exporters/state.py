"""The state file: the last verdict, written atomically after every patrol.

Read by ``hetpatrol check`` (Slurm ``HealthCheckProgram``) and ``hetpatrol status``
without touching the daemon or any vendor tool. Written to a temporary file in the same
directory, flushed, then renamed over the old one, so a reader sees the old or the new
file, never half of one. Temporary files a killed writer left behind are removed before a
process first writes the file.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time

from hetpatrol.exporters import PRIVATE_FILE_MODE

TYPE_CHECKING = False  # not typing's: `check` imports this module, keep it light
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

    from hetpatrol.report import PatrolReport

STATE_SCHEMA = "hetpatrol.state/1"
#: what every version of the state file's schema starts with
STATE_SCHEMA_PREFIX = "hetpatrol.state/"
#: this boot's random id (proc(5): ``/proc/sys/kernel/random/boot_id``)
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_clock(boot_id_path: str = BOOT_ID_PATH) -> tuple[str, float] | None:
    """(this boot's id, seconds since boot on ``CLOCK_BOOTTIME``), or None where either
    cannot be read. ``CLOCK_BOOTTIME`` is one clock for every process of the boot and
    is never stepped (clock_gettime(2)): the age of a verdict read on it does not jump
    with the wall clock."""
    try:
        with open(boot_id_path, encoding="ascii") as f:
            boot_id = f.read(64).strip()
        seconds = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, AttributeError):
        return None
    return (boot_id, seconds) if boot_id else None


def state_document(
    report: PatrolReport, interval_seconds: float, *, cards: bool = True
) -> dict[str, Any]:
    """The state file's content: node verdict, collectors, the escalation counts, the
    recent card fault events with their jobs (``fault_events``:
    :mod:`hetpatrol.actions.fault_events`) and every card line (these two decoded; left
    out with ``cards=False``)."""
    doc = {
        "schema": STATE_SCHEMA,
        "node": report.node,
        "seq": report.seq,
        "finished": report.finished,
        "interval_seconds": interval_seconds,
        "health": report.health,
        "exit_code": report.exit_code,
        "collectors": {s.name: s.to_dict() for s in report.collectors},
        "findings": [f.to_dict() for f in report.node_findings],
        "action": report.action,
        # escalation counts by card identity: a restarted daemon goes on from them
        "escalation": report.escalation,
    }
    from hetpatrol.collector import job_env_declarations  # here: `check` reads, never writes

    # the variables that name a job's cards, as the plugins declare them (VendorInfo.
    # job_env): the Prolog reads them here and imports no plugin
    doc["job_env"] = job_env_declarations()
    boot_doc = (getattr(report, "node_checks", None) or {}).get("boot")
    if isinstance(boot_doc, dict):
        # the boot the patrol ran in (hetpatrol.boot): a daemon restarted within it goes
        # on counting its patrols (post-boot grace) and keeps the links learned in it
        doc["boot"] = boot_doc
    boot = boot_clock()
    if boot is not None:
        # the patrol's end on this boot's clock: staleness survives a wall clock step
        doc["boot_id"] = boot[0]
        doc["finished_boot"] = round(boot[1] - max(0.0, time.time() - report.finished), 3)
    gres_doc = (getattr(report, "node_checks", None) or {}).get("gres")
    if isinstance(gres_doc, dict) and isinstance(gres_doc.get("order"), dict):
        # GRES names of several types: the IDX order of their devices, from the node's
        # registered Gres= (hetpatrol.slurm.inventory.gres_order): the Prolog maps by it
        doc["gres_order"] = gres_doc["order"]
    if cards:
        doc["fault_events"] = json.loads(getattr(report, "fault_events", "[]"))
        doc["cards"] = [json.loads(line) for line in report.card_lines]
    return doc


#: targets whose stale temporary files this process has already removed
_swept: set[Path] = set()


def _sweep_stale_temps(path: Path) -> None:
    """Remove ``.<name>.*.tmp`` files a killed earlier writer left beside ``path``.

    Done once per target and process, before its first write: a SIGKILL between
    ``mkstemp`` and ``rename`` leaves one behind, and restarts would pile them up.
    """
    if path in _swept:
        return
    import glob  # here: `check` reads state files and never sweeps

    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:
            stale.unlink()
        except OSError:  # gone already, or not ours (a sticky directory): leave it
            pass
    _swept.add(path)


def write_atomic(path: Path, data: bytes, *, make_parents: bool = False, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``rename`` (atomic on POSIX).

    The file gets ``mode`` whatever the umask: 0644 by default (the node_exporter
    textfile, read by another user), :data:`~hetpatrol.exporters.PRIVATE_FILE_MODE` for
    the state file.

    Only a regular file (or nothing) at ``path`` is replaced: a device, FIFO, socket or
    directory there raises ``OSError`` (EEXIST) and is left alone. A symbolic link
    there, another user's file, or a directory on the way that another user owns or can
    write (without the sticky bit) raises :class:`~hetpatrol.safe_files.UnsafePath`
    (EPERM, saying why; see :mod:`hetpatrol.safe_files`). A missing parent directory
    raises ``FileNotFoundError`` unless ``make_parents`` (the daemon's own state and
    textfile directories) creates it. The temporary file is made by ``mkstemp``
    (``O_CREAT | O_EXCL | O_NOFOLLOW``, a random name) in the same directory.
    """
    from hetpatrol.safe_files import check_directory, check_replaceable, make_directories

    if make_parents:
        shared = make_directories(path.parent, path)
    else:
        shared = check_directory(path.parent, path)
    check_replaceable(path, shared)
    _sweep_stale_temps(path)
    import tempfile  # here: 5 ms of imports `hetpatrol check` (a reader) never needs

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)  # the descriptor: never a path looked up again
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_state(path: Path, report: PatrolReport, interval_seconds: float) -> None:
    """Write the state document of ``report`` to ``path`` atomically, mode
    :data:`~hetpatrol.exporters.PRIVATE_FILE_MODE` like the JSONL log: it holds the same
    per-process users and Slurm jobs. Raises OSError."""
    write_atomic(
        path, state_bytes(report, interval_seconds), make_parents=True, mode=PRIVATE_FILE_MODE
    )


def state_bytes(report: PatrolReport, interval_seconds: float) -> bytes:
    """The state file's bytes: :func:`state_document` as compact JSON, with the card
    lines put in as the JSONL sink wrote them and the kept fault events as the patroller
    encoded them when they last changed (already JSON: not decoded and encoded again
    every patrol)."""
    head = state_document(report, interval_seconds, cards=False)
    text = json.dumps(head, separators=(",", ":"))
    cards = ",".join(line.rstrip("\n") for line in report.card_lines)
    faults = getattr(report, "fault_events", "[]")
    return f'{text[:-1]},"fault_events":{faults},"cards":[{cards}]}}\n'.encode()


def mark_stopped(path: Path, reason: str, *, now: float | None = None) -> None:
    """Add ``"stopped": {"at": <s since the epoch>, "reason": <reason>, "pid": <pid>}``
    to the state file at ``path`` (its verdict, the last patrol's, is kept as it is):
    the daemon's word, on a clean stop (SIGTERM, SIGINT), that no patrol follows.
    ``check``, ``status`` and ``prolog`` read it (:func:`hetpatrol.healthcheck.stopped_mark`);
    the next daemon clears it when it starts (:func:`clear_stopped`). ``reason``: the signal's
    name (``SIGTERM``). Raises OSError or ValueError (no state file of this schema)."""
    doc = read_state(path, verify=lambda st: None)  # verify: a last symlink not followed
    doc["stopped"] = {
        "at": round(time.time() if now is None else now, 3),
        "reason": reason,
        "pid": os.getpid(),
    }
    data = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
    write_atomic(path, data, mode=PRIVATE_FILE_MODE)


def clear_stopped(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` (the state file at ``path`` as a starting daemon read and trusted
    it) back without its ``stopped`` mark: a daemon runs again, so "no patrol follows"
    is no longer true. Until its first patrol the verdict is the last one and ages as
    any verdict does (a daemon that dies before then, a crash in its first patrol, is a
    silent daemon again, not a stopped one). Raises OSError."""
    kept = {k: v for k, v in doc.items() if k != "stopped"}
    data = (json.dumps(kept, separators=(",", ":")) + "\n").encode()
    write_atomic(path, data, mode=PRIVATE_FILE_MODE)


#: Most bytes a state file may have (a real one is tens of KB).
STATE_READ_MAX = 64 * 1024 * 1024


def read_state(
    path: Path,
    accept: str = STATE_SCHEMA,
    *,
    verify: Callable[[os.stat_result], None] | None = None,
) -> dict[str, Any]:
    """Read a state file without blocking: at most :data:`STATE_READ_MAX` bytes.

    ``accept``: the schema it must have (a prefix, such as :data:`STATE_SCHEMA_PREFIX`,
    when it ends with ``/``). ``verify``: called with the opened file's ``fstat`` before
    a byte is read (it raises to refuse the file); with it, a symlink as the last
    component is not followed (``O_NOFOLLOW``: the caller resolved the path itself, see
    :func:`hetpatrol.healthcheck.read_trusted_state`). Raises OSError (missing,
    unreadable, not a regular file: a FIFO or device is never read) or ValueError (larger
    than the bound, not JSON, nested too deep, another schema, refused by ``verify``).
    """
    nofollow = os.O_NOFOLLOW if verify is not None else 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | nofollow)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if verify is not None:
            verify(st)
        data = fh.read(STATE_READ_MAX + 1)
    if len(data) > STATE_READ_MAX:
        raise ValueError(f"{path} is larger than {STATE_READ_MAX} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError(f"{path} is nested too deep to be a state file") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    ok = isinstance(schema, str) and (
        schema.startswith(accept) if accept.endswith("/") else schema == accept
    )
    if not ok:
        raise ValueError(f"{path} is not a hetpatrol state file")
    return doc
