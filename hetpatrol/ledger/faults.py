"""``hetpatrol ledger faults FILE|DIR...``: the jobs that ran on a card that faulted.

Reads the daemon's JSONL files (``patrol.jsonl`` and its rotated copies, in any order)
and its state files (``state.json``: the recent fault events the daemon keeps), or
directories of them (one state file per node, gathered by an operator; the files in
it, not below, names starting with a dot left out), told apart by each document's
schema (``hetpatrol.state/...``: a state file). It keeps each card fault event
(``kind: "event"``, ``event`` ``xid`` or ``kernel``) with its ``jobs``: the Slurm jobs
on the card when the fault was read (:meth:`hetpatrol.patrol.Patroller._jobs_on_events`).
One row per job: the job id, then each fault (time, node, card, XID or reason,
severity). An event seen in a JSONL file and in a state file (or in two copies), or a
kernel record a restarted daemon read again (same node and the daemon's own key of the
record, :func:`hetpatrol.actions.fault_events.record_key`: boot id and ``kmsg_seq``, or
a text kernel log's ``log_record``), counts once. Events without jobs (``jobs: []``:
none on the card; no ``jobs``: written before the field existed, or on a card that was
not one of the patrol's; ``null`` with ``jobs_unknown``: a record older than the
daemon's first read of the cards' jobs) are counted as such, never credited to a job.

The files may sit in a shared directory: only files owned by root, the user running
the command or the daemon's user (``hetpatrol``), and not writable by their group or
others, are read, and only such users' symbolic links are followed (the state-file
rule of ``check``); ``--trust-owner USER`` adds an owner (a service user the files are
gathered as). Each file left out is said on stderr with why and counted ("N file(s)
not trusted"; ``untrusted_files`` in JSON). A FIFO or device is not read, a line is
read up to 1 MiB (a state file up to 64 MiB and 2,000,000 JSON values), a file whose
first line is not a JSON object (a ``daemon.log``, a README) is left out (said on stderr,
counted as a file not the daemon's: "N file(s) not the daemon's", ``foreign_files``), a
directory's first 100,000 entries are read (more is said); past 64 MiB of
one line, or a read that fails, the rest of that file is left out and said. ``-`` (or
``/dev/stdin``) is standard input, read with the same bounds (``zcat
patrol.jsonl.2.gz | hetpatrol ledger faults -``). A gzip file (logrotate's
``patrol.jsonl.N.gz``, told by its magic bytes, in a directory too) is read through
the stdlib's gzip with the same bounds on its decompressed lines, no more than 2 GiB
decompressed and, past its first 16 MiB, no more than 250 bytes per compressed byte
(the daemon's logs compress 75:1 at most: a gzip bomb is cut there, said). Only the
daemon's own structured fields are read; a line that is not JSON (after a file's
first), a line over the bound, or an event whose fields have the wrong types, is skipped
and counted ("N line(s) skipped").
Names are printed without control characters (:func:`hetpatrol.node_view.printable`).
Exit 0 no fault with a job, 1 at least one, 65 when no file could be read (files left out
as not the daemon's, such as a README or an .xz archive, are none).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import re
import sys
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hetpatrol.actions.fault_events import FAULT_EVENTS, kept_event, record_key
from hetpatrol.exporters.state import STATE_READ_MAX, STATE_SCHEMA_PREFIX
from hetpatrol.healthcheck import trusted_uids
from hetpatrol.node_view import printable
from hetpatrol.output import plain_help
from hetpatrol.safe_files import UnsafeRead, open_for_reading

#: the longest line looked at (a patrol line of a big node is far below it)
MAX_LINE = 1 << 20
#: most files read from one directory
MAX_DIR_FILES = 100_000
#: how a state file's compact JSON starts (its writer puts ``schema`` first: the head of
#: :func:`hetpatrol.exporters.state.state_bytes`); only such a first line is read past
#: ``MAX_LINE``
_STATE_HEAD = re.compile(rb'\s*\{\s*"schema"\s*:\s*"hetpatrol\.state/')
#: most JSON values in one document decoded (a state file's first line): the 64-NPU
#: replay's state file has about 7,000, 10,000 kept events of 64 jobs each about 800,000;
#: decoded, a value costs up to ~70 bytes (an empty object), so a 64 MiB line of ``{},``
#: (22 million values, 1.7 GB decoded) is refused before it is decoded
MAX_DOCUMENT_VALUES = 2_000_000
EX_DATAERR = 65


#: the type each field read may have (absent or null is fine; bool is no int)
_FIELD_TYPES: dict[str, type] = {
    "run_id": str,
    "seq": int,
    "ts": str,
    "node": str,
    "vendor": str,
    "index": int,
    "uuid": str,
    "bus_id": str,
    "xid": int,
    "reason": str,
    "severity": str,
    "boot_id": str,
    "kmsg_seq": int,
    "log_record": str,
}


def _well_typed(event: Mapping[str, Any]) -> bool:
    """Whether every field this command reads is absent, null or of its type."""
    for key, kind in _FIELD_TYPES.items():
        value = event.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            return False
    return True


def _card(event: Mapping[str, Any]) -> str:
    if isinstance(event.get("vendor"), str) and isinstance(event.get("index"), int):
        return f"{event['vendor']}/{event['index']}"
    for key in ("uuid", "bus_id"):
        if isinstance(event.get(key), str):
            return event[key]
    return "unknown card"


def _what(event: Mapping[str, Any]) -> str:
    if isinstance(event.get("xid"), int):
        return f"xid {event['xid']}"
    return str(event.get("reason") or event.get("event"))


def _state_events(doc: Mapping[str, Any], counts: dict[str, int]) -> Iterator[dict[str, Any]]:
    """The kept fault events of a state document, as event dicts with the node's name
    (an entry of the wrong types skipped and counted)."""
    counts["state_files"] += 1
    node = doc.get("node") if isinstance(doc.get("node"), str) else None
    kept = doc.get("fault_events")
    if kept is None:
        return
    if not isinstance(kept, list):
        counts["skipped"] += 1
        return
    for entry in kept:
        event = kept_event(entry) if isinstance(entry, Mapping) else None
        if event is None:
            counts["skipped"] += 1
            continue
        yield {**event, "kind": "event", "node": node}


def faults_by_job(
    lines: Iterable[str | Mapping[str, Any]],
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """(job id -> its faults, counts of ``events``, ``without_jobs``, ``skipped``,
    ``state_files``) from JSONL ``lines`` (text, or a document already decoded: a state
    file's). A fault is ``{ts, node, card, what, severity}``; one event seen twice (a
    file and its rotated copy overlapping, a JSONL line and a state file's kept event)
    counts once."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    counts = {"events": 0, "without_jobs": 0, "skipped": 0, "state_files": 0}
    seen: set[tuple] = set()
    for doc in _documents(lines, counts):
        if doc.get("kind") != "event" or doc.get("event") not in FAULT_EVENTS:
            continue
        if not _well_typed(doc):  # a field of the wrong type: a forged or foreign line
            counts["skipped"] += 1
            continue
        # the kernel record itself, by the daemon's own rule (one record kept once): read
        # again by a restarted daemon, or in a JSONL line and a state file, it is one
        # fault; two records of one patrol on one card (the same run, seq, read time, card
        # and fault: a text log's records are timed when read) are two. A line without
        # it (written before the record names) is one event of one patrol.
        record = record_key(doc)
        if record is not None:
            key: tuple = (doc.get("node"), *record)
        else:
            key = (doc.get("run_id"), doc.get("seq"), doc.get("ts"), _card(doc), _what(doc))
        if key in seen:
            continue
        seen.add(key)
        counts["events"] += 1
        ids = doc.get("jobs")
        if ids is not None and (
            not isinstance(ids, list) or not all(isinstance(j, str) for j in ids)
        ):
            counts["skipped"] += 1
            continue
        if not ids:  # no job on the card (``[]``), or not known (``null``, older lines)
            counts["without_jobs"] += 1
            continue
        fault = {
            "ts": doc.get("ts"),
            "node": doc.get("node"),
            "card": _card(doc),
            "what": _what(doc),
            "severity": doc.get("severity"),
        }
        for job in ids:
            jobs.setdefault(job, []).append(fault)
    return jobs, counts


def _documents(
    lines: Iterable[str | Mapping[str, Any]], counts: dict[str, int]
) -> Iterator[Mapping[str, Any]]:
    for line in lines:
        if isinstance(line, Mapping):
            doc: Any = line
        elif not line.strip():
            continue
        else:
            try:
                doc = json.loads(line) if len(line) <= MAX_LINE else None
            except (ValueError, RecursionError):
                doc = None
        if not isinstance(doc, dict):
            counts["skipped"] += 1
            continue
        schema = doc.get("schema")
        if isinstance(schema, str) and schema.startswith(STATE_SCHEMA_PREFIX):
            yield from _state_events(doc, counts)
        else:
            yield doc


def render_text(jobs: Mapping[str, list[dict[str, Any]]], counts: Mapping[str, int]) -> str:
    out = []
    for job in sorted(jobs, key=lambda j: (len(j), j)):
        out.append(f"job {printable(job)}")
        for f in sorted(jobs[job], key=lambda f: str(f["ts"])):
            out.append(
                "  "
                + " ".join(printable(str(f[k])) for k in ("ts", "node", "card", "what", "severity"))
            )
    states = f", {counts['state_files']} state file(s)" if counts.get("state_files") else ""
    if counts.get("untrusted_files"):  # said on stderr, file by file, with why
        states += f", {counts['untrusted_files']} file(s) not trusted (left out)"
    if counts.get("foreign_files"):  # said on stderr too: a daemon.log, a README
        states += f", {counts['foreign_files']} file(s) not the daemon's (left out)"
    out.append(
        f"{len(jobs)} job(s) on faulted cards; {counts['events']} fault event(s), "
        f"{counts['without_jobs']} without jobs, {counts['skipped']} line(s) skipped{states}"
    )
    return "\n".join(out) + "\n"


def _files(paths: Iterable[str], errors: list[str]) -> Iterator[str]:
    """Each path given, a directory's files (sorted, no dot files) in its place."""
    for path in paths:
        try:
            is_dir = os.path.isdir(path) and not os.path.islink(path)
        except OSError:
            is_dir = False
        if not is_dir:
            yield path
            continue
        try:
            with os.scandir(path) as entries:
                listed = [e.name for e in itertools.islice(entries, MAX_DIR_FILES + 1)]
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror or exc}")
            continue
        if len(listed) > MAX_DIR_FILES:  # said, never a silent part of the directory
            del listed[MAX_DIR_FILES:]
            errors.append(
                f"{path}: more than {MAX_DIR_FILES} entries: only the first {MAX_DIR_FILES} "
                "the directory lists are read"
            )
        names = sorted(n for n in listed if not n.startswith("."))
        for name in names:
            yield os.path.join(path, name)


class _Endless(Exception):
    """A line ran past :data:`MAX_SKIP` bytes without a newline."""


#: most bytes of one over-long line read past (to find the next line): no line the daemon
#: writes is near it, and a sparse file of terabytes without a newline, or a regular
#: file of /proc that has no end (``/proc/self/pagemap``), must not be read to its end
MAX_SKIP = 64 * 1024 * 1024


def _skip_rest(fh: Any, read: int) -> None:
    """Read to the end of an over-long line (``read`` bytes of it read already); raises
    :class:`_Endless` past :data:`MAX_SKIP` bytes of it."""
    while (rest := fh.readline(1 << 20)) and not rest.endswith(b"\n"):
        read += len(rest)
        if read > MAX_SKIP:
            raise _Endless


def _read_line(fh: Any, limit: int) -> bytes | None:
    """The next line up to ``limit`` bytes; a longer one is read to its end (at most
    :data:`MAX_SKIP` bytes, else :class:`_Endless`) and given as ``b"\\0"`` (counted
    skipped, never parsed); None at the end."""
    line = fh.readline(limit + 1)
    if not line:
        return None
    if len(line) > limit and not line.endswith(b"\n"):
        _skip_rest(fh, len(line))
        return b"\0"
    return line


def _values_bound(data: bytes) -> int:
    """An upper bound of the JSON values in ``data``: every value but the first follows
    a ``,``, a ``:`` or a ``[`` (counted in C, before anything is decoded)."""
    return 1 + data.count(b",") + data.count(b":") + data.count(b"[")


def _decode(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None


#: most DECOMPRESSED bytes read from one gzip file (logrotate's ``patrol.jsonl.N.gz``).
#: The daemon writes ~25 KB a patrol at 16 cards (docs/deploy.md), 8,640 patrols a day at
#: the default 10 s: the shipped ``daily`` rotation makes ~216 MB files; 64 cards (~100 KB
#: a patrol) ~870 MB, an NVLink event storm (the 8-card ``nvlink-storm`` replay: ~46 KB a
#: patrol) ~400 MB at 8 cards. 2 GiB holds the largest of these with a margin of two.
MAX_GZIP_BYTES = 2 << 30
#: most decompressed bytes per compressed byte read (past :data:`GZIP_RATIO_FLOOR`). The
#: daemon's lines compress about 74:1 at most: the 16-card ``healthy-mixed`` replay, the
#: same values every patrol, measured patrol after patrol with gzip -6 (the first patrols
#: 47:1; the ``nvlink-storm`` replay 19:1; real, changing values less; one patrol copied
#: byte for byte but its time and seq, more alike than any daemon's, 110:1). Deflate packs up
#: to 1032:1 (zlib's technical details, "Maximum Compression Factor"), so a gzip bomb
#: passes this ratio within its first bytes and is cut there, said: at most
#: ``GZIP_RATIO_FLOOR`` + 250 bytes decompressed per byte of the file, never 2 GiB from
#: a few megabytes
MAX_GZIP_RATIO = 250
#: decompressed bytes always allowed before the ratio is applied (gzip's header and the
#: first read of 128 KiB make the ratio of a file's start meaningless)
GZIP_RATIO_FLOOR = 16 << 20
#: the names read as standard input (``zcat patrol.jsonl.2.gz | ... faults -``)
STDIN_NAMES = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})
_GZIP_MAGIC = b"\x1f\x8b"  # RFC 1952 section 2.3.1: ID1 ID2


class _TooLarge(Exception):
    """A gzip file decompressed past :data:`MAX_GZIP_BYTES`, or past
    :data:`MAX_GZIP_RATIO` times what was read of it (``ratio`` True; ``out`` and
    ``read``: the decompressed and compressed bytes at the cut)."""

    def __init__(self, ratio: bool = False, out: int = 0, read: int = 0) -> None:
        super().__init__(ratio, out, read)
        self.ratio, self.out, self.read = ratio, out, read


class _Counted:
    """A file's ``read`` counting the bytes it gave (the compressed bytes gzip read)."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        self.count += len(data)
        return data


class _Bounded:
    """A gzip stream's ``readline``/``read`` that raise :class:`_TooLarge` once more than
    ``limit`` decompressed bytes were asked of it (each call asks at most one byte past
    what is left, so no more than ``limit + 1`` bytes are ever decompressed), or once
    the bytes decompressed pass ``floor + ratio *`` the compressed bytes ``raw`` (a
    :class:`_Counted`) gave: at most one call's size (1 MiB, a state file's 64 MiB)
    past that."""

    def __init__(self, fh: Any, limit: int, raw: _Counted, ratio: int, floor: int) -> None:
        self._fh = fh
        self._left = limit
        self._out = 0
        self._raw, self._ratio, self._floor = raw, ratio, floor

    def _take(self, data: bytes) -> bytes:
        self._left -= len(data)
        if self._left < 0:
            raise _TooLarge
        self._out += len(data)
        if self._out > self._floor + self._ratio * self._raw.count:
            raise _TooLarge(True, self._out, self._raw.count)
        return data

    def readline(self, size: int) -> bytes:
        return self._take(self._fh.readline(min(size, self._left + 1)))

    def read(self, size: int) -> bytes:
        return self._take(self._fh.read(min(size, self._left + 1)))


def _read_file(
    path: str,
    errors: list[str],
    readable: list[str],
    owners: frozenset[int] | None = None,
    untrusted: list[str] | None = None,
    left_out: list[str] | None = None,
) -> Iterator[str | dict]:
    """The documents of one JSONL or state file (see the module docstring): a first line
    that starts as a state file does (``{"schema":"hetpatrol.state/``, the writer's first
    key) is read up to ``STATE_READ_MAX`` bytes, an indented document whole up to that
    bound, and decoded here when it holds at most :data:`MAX_DOCUMENT_VALUES` values;
    every other line is read up to ``MAX_LINE`` (a longer one is skipped, never held).
    ``owners``: the uids whose files and links are believed (:func:`trusted_owners`); a
    file refused for its owner, its mode or a link on the way goes into ``untrusted``,
    one that is none of the daemon's (a ``daemon.log``, a README) into ``left_out``."""
    left_out = [] if left_out is None else left_out
    if path in STDIN_NAMES:  # the user's own pipe or file: read as a file is, same bounds
        fd, path = os.dup(sys.stdin.fileno()), "(stdin)"
        os.set_blocking(fd, True)
    else:
        try:
            fd = open_for_reading(Path(path), owners)
        except UnsafeRead as exc:
            errors.append(f"{exc} (left out: {TRUST_HINT})")
            if untrusted is not None:
                untrusted.append(path)
            return
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror or exc}")
            return
    try:
        with os.fdopen(fd, "rb") as raw:
            if raw.peek(2)[:2] != _GZIP_MAGIC:
                yield from _file_documents(path, raw, errors, readable, left_out)
                return
            # logrotate's `compress` copy (gzip(1)): read through the stdlib's gzip, its
            # decompressed bytes bounded (MAX_GZIP_BYTES, MAX_GZIP_RATIO) beside the
            # bounds of each line
            counted = _Counted(raw)
            with gzip.GzipFile(fileobj=counted, mode="rb") as gz:
                bounded = _Bounded(gz, MAX_GZIP_BYTES, counted, MAX_GZIP_RATIO, GZIP_RATIO_FLOOR)
                yield from _file_documents(path, bounded, errors, readable, left_out)
    except _Endless:
        errors.append(f"{path}: a line over {MAX_SKIP} bytes: the rest of the file left out")
        yield "\0"
    except _TooLarge as cut:
        if cut.ratio:
            errors.append(
                f"{path}: {cut.out} bytes decompressed from {cut.read}, more than "
                f"{MAX_GZIP_RATIO} times as many (the daemon's logs compress 75:1 at most: "
                "a gzip bomb, no log the daemon wrote): the rest of the file left out"
            )
        else:
            errors.append(
                f"{path}: more than {MAX_GZIP_BYTES} bytes decompressed (no log the daemon "
                "wrote): the rest of the file left out"
            )
        yield "\0"
    except (EOFError, zlib.error) as exc:  # a gzip copy cut short or damaged
        errors.append(f"{path}: a damaged gzip file ({exc}): the rest of the file left out")
        yield "\0"
    except OSError as exc:  # EIO of a failing disk, a file of /proc; gzip.BadGzipFile
        errors.append(f"{path}: {exc.strerror or exc}: the rest of the file left out")


def _file_documents(
    path: str, fh: Any, errors: list[str], readable: list[str], left_out: list[str]
) -> Iterator[str | dict]:
    """:func:`_read_file`'s documents of the open file ``fh``; ``path`` goes into
    ``readable`` when the file is the daemon's (an empty log, rotated a moment ago,
    too: read, nothing in it), never for a README or an archive of another kind, and
    into ``left_out`` when the whole file is left out as none of the daemon's (its first
    line no JSON object, a document of more than :data:`MAX_DOCUMENT_VALUES` values)."""
    first = fh.readline(MAX_LINE + 1)
    if not first:
        readable.append(path)
        return
    if len(first) > MAX_LINE and not first.endswith(b"\n"):
        if _STATE_HEAD.match(first):  # a state file: one line of up to STATE_READ_MAX
            first += fh.readline(STATE_READ_MAX + 1 - len(first))
        if not _STATE_HEAD.match(first) or len(first) > STATE_READ_MAX:
            _skip_rest(fh, len(first))
            first = b"\0"  # too long for what it starts as: skipped, never parsed
    indented = first.strip() == b"{"  # `status --json > node.json`: one document
    if indented:
        first += fh.read(STATE_READ_MAX + 1 - len(first))
    if _values_bound(first) > MAX_DOCUMENT_VALUES:
        errors.append(
            f"{path}: more than {MAX_DOCUMENT_VALUES} JSON values in one document "
            "(no state file the daemon writes): left out"
        )
        left_out.append(path)
        return
    if indented:
        readable.append(path)
        doc = _decode(first) if len(first) <= STATE_READ_MAX else None
        yield doc if isinstance(doc, dict) else "\0"
        return
    if first == b"\0":
        readable.append(path)
        yield "\0"
    else:
        doc = _decode(first)
        if not isinstance(doc, dict):  # a README, an archive (.xz, .zst): not read
            errors.append(f"{path}: not a JSONL log or state file (left out)")
            left_out.append(path)  # a file left out, not a line of the daemon's skipped
            return
        readable.append(path)
        yield doc
    while (line := _read_line(fh, MAX_LINE)) is not None:
        yield line.decode("utf-8", "replace")


def _lines(
    paths: Iterable[str],
    errors: list[str],
    readable: list[str],
    owners: frozenset[int] | None = None,
    untrusted: list[str] | None = None,
    left_out: list[str] | None = None,
) -> Iterator[str | dict]:
    for path in _files(paths, errors):
        yield from _read_file(path, errors, readable, owners, untrusted, left_out)


#: said with every file left out as not trusted
TRUST_HINT = "only files of root, this user and the daemon's user are read; --trust-owner adds one"


def trusted_owners(extra: Iterable[int] = ()) -> frozenset[int]:
    """The uids whose files (and symbolic links) ``ledger faults`` believes: those of
    :func:`hetpatrol.healthcheck.trusted_uids` (root, this user, the daemon's user
    ``hetpatrol`` where it exists: the state-file rule) and ``extra``
    (``--trust-owner``)."""
    return trusted_uids() | frozenset(extra)


def owner_uid(text: str) -> int:
    """``--trust-owner``'s value: a user name (the password database) or a numeric uid.
    Raises ``argparse.ArgumentTypeError`` for a name no user has."""
    if text.isascii() and text.isdigit():
        return int(text)
    import pwd

    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise argparse.ArgumentTypeError(f"no user named {printable(text)!s}") from None


def cmd_faults(args: argparse.Namespace) -> int:
    """``ledger faults``: see the module docstring."""
    errors: list[str] = []
    readable: list[str] = []
    untrusted: list[str] = []
    left_out: list[str] = []
    owners = trusted_owners(getattr(args, "trust_owner", None) or ())
    lines = _lines(args.jsonl, errors, readable, owners, untrusted, left_out)
    jobs, counts = faults_by_job(lines)
    counts["untrusted_files"] = len(untrusted)
    counts["foreign_files"] = len(left_out)
    for error in errors:
        print(f"hetpatrol ledger faults: {printable(error)}", file=sys.stderr)
    if not readable:
        return EX_DATAERR
    if args.format == "json":
        sys.stdout.write(json.dumps({"jobs": jobs, "counts": counts}, indent=2) + "\n")
    else:
        sys.stdout.write(render_text(jobs, counts))
    return 1 if jobs else 0


def add_parser(lsub: Any) -> None:
    """Register ``faults`` on the ``ledger`` subparsers ``lsub``."""
    p = lsub.add_parser(
        "faults",
        help="the jobs that ran on a card that faulted (the daemons' JSONL or state files)",
        # argparse's own formatter wraps it to the terminal (every --help fits 80 columns)
        description=plain_help(__doc__.split("\n\n", 1)[1]),
    )
    p.add_argument(
        "jsonl",
        nargs="+",
        metavar="FILE|DIR",
        help=(
            "patrol.jsonl and its rotated copies (.gz too), state files, directories of "
            "them; - for standard input"
        ),
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--trust-owner",
        action="append",
        type=owner_uid,
        default=[],
        metavar="USER",
        help=(
            "also read the files (and follow the links) of USER (a name or uid; repeat "
            "for more), e.g. the service user a site gathers files as"
        ),
    )
    p.set_defaults(func=cmd_faults)
