"""The daemon's config check in a child process, so that ``jsonschema`` never becomes
part of the daemon's resident memory (see :mod:`hetpatrol.json_schema`).

:func:`load_config_isolated` reads the file once, hands its text to
:func:`main` in a child (the same interpreter, importing hetpatrol from where this
process does, never from the working directory), which runs
:func:`hetpatrol.config.load_config` on it (every check, the schema's included) and
answers one JSON line: ``{"ok": true, "reads": [[path, sha256], ...]}`` or ``{"error":
{"message", "path", "line", "key"}, "errors": [{...}, ...], "unshown": N}`` (every error
said, in order, the first one again, and how many more were found). The parent then
builds the config from the same text with the schema checks skipped, or raises the
child's :class:`~hetpatrol.config.ConfigError` as its own (every error it said). The
files the config names (the baseline file...) are read by both processes: where the
parent's bytes differ from the child's (a file replaced in between), the parent checks
in its own process.
A child that cannot run or answers nonsense makes the parent check in its own process
(the answer is then the same; only the memory differs).

The last "ok" is kept: a SIGHUP whose config text is byte for byte the one a child
passed, and whose files read again here (the baseline file, a plugin's profiles parsed
again because their stat changed) have bytes that child read, starts no child (an
interpreter start, ~0.4 s). Any other byte makes a child check it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from hetpatrol.config import Config, ConfigError, load_config
from hetpatrol.json_schema import checked_elsewhere
from hetpatrol.yaml_document import read_document, recording_reads

#: the directory this process imports hetpatrol from: the child imports the same one
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
#: the child's program. Not ``-m``: that puts the working directory first on sys.path, so
#: a ``hetpatrol`` (or ``yaml``...) there would be imported instead of this process's
#: (``-P``, which prevents it, is Python 3.11+). ``-c`` puts ``''`` (the cwd) first: it is
#: replaced by the parent's package root.
_CHILD_CODE = (
    "import sys; sys.path[0] = sys.argv[1]; "
    "from hetpatrol.config_check import main; sys.exit(main())"
)
#: seconds the child may take (an interpreter start, PyYAML, jsonschema, the checks:
#: about 1 s). Past it the parent checks in its own process (the same answer). Kept well
#: under what the watchdog allows a reload: the daemon vouches for a reload for its
#: patrol budget, at least ``Daemon.watchdog_slack_seconds`` (10) + the hang margin (1),
#: so a stalled child must not hold the reload longer than that, or systemd's watchdog
#: (WatchdogSec=30s) kills a daemon that only had to keep its running config.
CHILD_TIMEOUT_SECONDS = 5.0


def load_config_isolated(path: str | os.PathLike[str] | None) -> Config:
    """:func:`~hetpatrol.config.load_config` of ``path`` (None: the bundled file), its
    schema checks run in a child process. Raises :class:`ConfigError` as it does.

    A child's "ok" is kept for the text it checked and the files it read (their
    SHA-256): a reload whose config text is the same and whose every file this process
    reads again has bytes that child read (see :func:`_build_checked`) asks no new child.
    Only the last "ok" is kept; an error is never kept (the child says it again)."""
    text = None  # the bundled file: read by both processes from the package
    if path is not None:
        try:
            text = read_document(Path(path))
        except Exception:  # noqa: BLE001 - load_config says what is wrong with the file
            return load_config(path)
    key = (None if path is None else str(path), _digest(text))
    global _last_ok
    if _last_ok is not None and _last_ok[0] == key:
        config = _build_checked(path, text, _last_ok[1])
        if config is not None:
            return config
    answer = _ask_child(path, text)
    if answer is None:
        return load_config(path, text=text)
    if "error" in answer:
        raise _child_error(answer)
    config = _build_checked(path, text, answer["reads"])
    if config is None:  # data the schema would refuse, or a file replaced: check it here
        return load_config(path, text=text)
    _last_ok = (key, answer["reads"])
    return config


#: the last child's "ok": ((path, SHA-256 of the text it was given), [[path, sha256],
#: ...] of the files it read)
_last_ok: tuple[tuple[str | None, str | None], list] | None = None


def _digest(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def _build_checked(
    path: str | os.PathLike[str] | None, text: str | None, reads: list
) -> Config | None:
    """The config of ``text`` built here with the schema checks skipped, or None unless
    each file this process read for it has bytes the child read (``reads``).

    The config's own text is the one the child checked; a file it names (the baseline
    file, a plugin's profiles) is read again here. Unless each such file read here has
    the bytes the child read, the schema must be checked here after all: a file replaced
    in between must not pass unchecked. (A file this process did not read again, the
    bundled file or a plugin's profiles it keeps parsed while their stat is unchanged,
    is not compared: the child's list may be longer.) None as well when the build fails
    (data the schema would have refused)."""
    try:
        with checked_elsewhere(), recording_reads() as mine:
            config = load_config(path, text=text)
    except Exception:  # noqa: BLE001 - the caller checks it in this process or a child
        return None
    if any(read not in reads for read in mine):
        return None
    return config


def _child_error(answer: dict) -> ConfigError:
    """The :class:`ConfigError` a child answered: each error it said (``errors``, or the
    one ``error`` of an older child), and the count it left out."""
    said = answer.get("errors")
    if not (isinstance(said, list) and said and all(_error_shaped(e) for e in said)):
        said = [answer["error"]]
    unshown = answer.get("unshown")
    errors = [
        ConfigError(e["message"], path=e.get("path"), line=e.get("line"), key=e.get("key"))
        for e in said
    ]
    return ConfigError.of(errors, unshown if isinstance(unshown, int) and unshown > 0 else 0)


def _error_shaped(e: object) -> bool:
    return isinstance(e, dict) and isinstance(e.get("message"), str)


def _ask_child(path: str | os.PathLike[str] | None, text: str | None) -> dict | None:
    request = json.dumps({"path": None if path is None else str(path), "text": text})
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD_CODE, _PACKAGE_ROOT],
            input=request,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_SECONDS,
            check=False,
        )
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    if not isinstance(answer, dict):
        return None
    reads = answer.get("reads")
    if (
        answer.get("ok") is True
        and isinstance(reads, list)
        and all(isinstance(r, list) and all(isinstance(x, str) for x in r) for r in reads)
    ):
        return answer
    if _error_shaped(answer.get("error")):
        return answer
    return None


def main() -> int:
    """The child: one JSON request on stdin, one JSON answer on stdout: ``{"ok": true,
    "reads": [[path, sha256], ...]}`` (the files it read besides the text it was given,
    :func:`~hetpatrol.yaml_document.recording_reads`) or ``{"error": {...}}``."""
    request = json.load(sys.stdin)
    try:
        with recording_reads() as reads:
            load_config(request["path"], text=request["text"])
    except ConfigError as exc:
        said = [
            {"message": e.message, "path": e.path, "line": e.line, "key": e.key} for e in exc.errors
        ]
        print(json.dumps({"error": said[0], "errors": said, "unshown": exc.unshown}))
        return 0
    print(json.dumps({"ok": True, "reads": reads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
