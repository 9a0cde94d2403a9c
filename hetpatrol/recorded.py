"""A recorded cluster: the cluster commands (``fleet``, ``audit-slurm``, ``ledger audit``)
run on it with ``--replay DIR`` instead of asking a live Slurm and Prometheus.

``DIR`` holds (tests/record_cluster_sample.py writes it from the real test cluster):

- ``commands.json``: ``{"commands": [{"argv": ["scontrol", "-d", "-o", "show", "node"],
  "returncode": 0, "stdout": "FILE", "stderr": "TEXT"}, ...]}``: each Slurm command as it
  ran, its exit code, its stdout in ``DIR/FILE`` and its stderr.
- ``prometheus.json``: ``{"answers": {"PROMQL": ANSWER, ...}}``: Prometheus's whole JSON
  answer (``POST /api/v1/query``) to each exact query the commands make.
- the cluster's ``gres.conf`` / ``cgroup.conf`` when it has them (read instead of the
  ones beside the recorded ``SLURM_CONF``, which is a path on the recording machine).

A command asked for that is not recorded fails as a missing program would (exit 127,
stderr says so); a query not recorded is an error answer of Prometheus's shape. Files
are read as regular files only (no FIFO, device, directory or symlink), at most
:data:`FILE_MAX` bytes; a recorded ``stdout`` is a file name inside ``DIR``, no path.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from hetpatrol.tool import ToolOutput

#: Most bytes of one recorded file read (a 10,000-node JSON node list is ~50 MB).
FILE_MAX = 256 * 1024 * 1024


class RecordingError(ValueError):
    """The recording is not readable: the message names the file and what is wrong."""


def _read(path: Path) -> str:
    """The text of a regular file (no FIFO, device or directory), at most FILE_MAX bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordingError(f"{path}: not a regular file")
        if st.st_size > FILE_MAX:
            raise RecordingError(f"{path}: larger than {FILE_MAX} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(FILE_MAX + 1).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _json(path: Path) -> dict:
    try:
        doc = json.loads(_read(path))
    except ValueError as exc:  # JSONDecodeError is a ValueError
        if isinstance(exc, RecordingError):
            raise
        raise RecordingError(f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RecordingError(f"{path}: a JSON {type(doc).__name__}, not an object")
    return doc


class Recording:
    """The recording in ``root`` (a directory of the layout above).

    ``RecordingError`` (a ``ValueError``) when ``root`` is not a directory or its
    ``commands.json`` is missing or malformed; ``prometheus.json`` is optional."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        if not self.root.is_dir():
            raise RecordingError(f"{self.root}: not a directory of a recorded cluster")
        try:
            doc = _json(self.root / "commands.json")
        except FileNotFoundError:
            raise RecordingError(f"{self.root}: no commands.json: not a recorded cluster") from None
        cmds = doc.get("commands")
        if not isinstance(cmds, list):
            raise RecordingError(f"{self.root}/commands.json: no 'commands' list")
        self.commands: dict[tuple[str, ...], dict] = {}
        for i, c in enumerate(cmds):
            argv = c.get("argv") if isinstance(c, dict) else None
            if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
                raise RecordingError(f"{self.root}/commands.json: commands[{i}]: no argv list")
            self.commands[tuple(argv)] = c
        self.answers: dict[str, object] = {}
        prom = self.root / "prometheus.json"
        if prom.exists():
            answers = _json(prom).get("answers")
            if not isinstance(answers, dict):
                raise RecordingError(f"{prom}: no 'answers' object")
            self.answers = answers

    def run(self, argv: Sequence[str], timeout: float = 0.0) -> ToolOutput:
        """The recorded run of ``argv`` (its program matched by base name: a recorded
        ``scontrol show config`` answers ``env SLURM_CONF=x /usr/bin/scontrol show
        config`` too); exit 127 with a message when it was not recorded."""
        argv = list(argv)
        i = 0
        if argv and os.path.basename(argv[0]) == "env":  # env VAR=x prog ...
            i = 1
            while i < len(argv) and "=" in argv[i]:
                i += 1
        key = (os.path.basename(argv[i]) if i < len(argv) else "", *argv[i + 1 :])
        rec = self.commands.get(key)
        if rec is None:
            return self._failed(argv, f"{' '.join(key)}: not in the recording {self.root}", 127)
        out = rec.get("stdout")
        stdout = ""
        if isinstance(out, str) and out:
            # a plain file name inside DIR: a recording names no path elsewhere
            if out != os.path.basename(out) or out.startswith("."):
                return self._failed(
                    argv, f"recorded stdout {out!r}: not a file name in {self.root}"
                )
            try:
                stdout = _read(self.root / out)
            except (OSError, RecordingError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                return self._failed(argv, f"recorded stdout {self.root / out}: {why}")
        rc = rec.get("returncode")
        return ToolOutput(
            tuple(argv), stdout, str(rec.get("stderr") or ""), rc if isinstance(rc, int) else 1,
            False, 0.0,
        )  # fmt: skip

    @staticmethod
    def _failed(argv: Sequence[str], why: str, code: int = 1) -> ToolOutput:
        return ToolOutput(tuple(argv), "", why + "\n", code, False, 0.0)

    def answer(self, expr: str) -> bytes:
        """Prometheus's recorded JSON answer to ``expr``; an error answer of its shape
        (``status: error``) when the query was not recorded."""
        if expr in self.answers:
            return json.dumps(self.answers[expr]).encode()
        return json.dumps(
            {
                "status": "error",
                "errorType": "not_recorded",
                "error": f"query not in the recording {self.root}/prometheus.json",
            }
        ).encode()

    def file(self, name: str) -> Path | None:
        """``DIR/name`` when the recording has that file (``gres.conf``, ``cgroup.conf``)."""
        path = self.root / name
        return path if path.is_file() else None
