"""``hetpatrol doctor --bundle FILE``: a support tarball of one node.

The ``.tar.gz`` holds, under ``hetpatrol-doctor-<node>/``:

- ``doctor.json``: the doctor's checks (:class:`hetpatrol.doctor.Check` dicts);
- ``versions.txt``: hetpatrol, Python, the kernel (``uname``), ``/etc/os-release``;
- ``config.yaml``: the config file the unit runs (as it is on disk);
- ``config-effective.yaml``: the config as it is used (the bundled config, its plugins'
  profiles and the site file laid over them, or the bundled one alone when no file is
  given: :func:`hetpatrol.config.effective_document`), its first lines naming those
  files; redacted as ``config.yaml`` is;
- ``state.json`` and ``patrol.jsonl`` (its last :data:`JSONL_LINES` lines, at most
  :data:`JSONL_BYTES` read from its end; the state file at most :data:`STATE_BYTES`):
  the daemon's files, where readable and trusted as ``check`` trusts a state file (no
  other user's file, directory or symlink on the way; else ``<name>.error`` says why);
- ``replay/``: one patrol's tool outputs, recorded as a ``--replay`` scenario
  (:data:`hetpatrol.tool.RECORD_DIR_ENV`; plus ``nvidia-smi-q.xml`` where ``nvidia-smi``
  is installed), and ``once.json``, that patrol as ``hetpatrol once --format json``.

**Redaction** (unless ``redact=False``): every value of a ``user``, ``user_name``,
``account``, ``job_name`` or ``comment`` key in the JSON files becomes ``user-N`` /
``account-N`` / ``job-N`` (the same name, the same placeholder), and those names (from
every file) and the login names of ``/etc/passwd`` (uid >= 1000) are replaced as whole
words in every text file and every other JSON string and key (a process name
``/home/alice/bin/python``). Job ids, bus ids and card serials stay: support needs them.
"""

from __future__ import annotations

import io
import json
import os
import platform
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

JSONL_LINES = 200
JSONL_BYTES = 4 * 1024 * 1024
#: most bytes of the state file taken (the daemon's is a few hundred KiB at most)
STATE_BYTES = 16 * 1024 * 1024
#: key -> placeholder prefix
_REDACT_KEYS = {
    "user": "user",
    "user_name": "user",
    "account": "account",
    "job_name": "job",
    "comment": "comment",
}


class _Redactor:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.names: dict[str, str] = {}
        self._pattern: tuple[int, re.Pattern[str]] | None = None  # (names, their regex)
        if enabled:
            for entry in pwd.getpwall():
                if entry.pw_uid >= 1000 and entry.pw_name not in ("nobody",):
                    self._name(entry.pw_name, "user")

    def _name(self, value: str, prefix: str) -> str:
        if value not in self.names:
            n = sum(v.startswith(prefix + "-") for v in self.names.values()) + 1
            self.names[value] = f"{prefix}-{n}"
        return self.names[value]

    def collect(self, doc: Any) -> None:
        """Learn the names of ``doc``'s redacted keys (before any text is redacted: a
        name seen only in a later file still goes from an earlier one)."""
        if not self.enabled:
            return
        todo = [doc]
        while todo:  # no recursion: a deep document is no RecursionError here
            item = todo.pop()
            if isinstance(item, dict):
                for k, v in item.items():
                    if k in _REDACT_KEYS and isinstance(v, str) and v:
                        self._name(v, _REDACT_KEYS[k])
                    elif isinstance(v, (dict, list)):
                        todo.append(v)
            elif isinstance(item, list):
                todo.extend(v for v in item if isinstance(v, (dict, list)))

    def json(self, doc: Any) -> Any:
        """``doc`` with each redacted key's value replaced and every other string
        redacted as text (a process name ``/home/alice/bin/python`` names its user)."""
        if not self.enabled:
            return doc
        if isinstance(doc, dict):
            out = {}
            for k, v in doc.items():
                if k in _REDACT_KEYS and isinstance(v, str) and v:
                    out[self.text(k)] = self._name(v, _REDACT_KEYS[k])
                else:
                    out[self.text(k)] = self.json(v)
            return out
        if isinstance(doc, list):
            return [self.json(v) for v in doc]
        if isinstance(doc, str):
            return self.text(doc)
        return doc

    def text(self, text: str) -> str:
        if not self.enabled or not self.names:
            return text
        if self._pattern is None or self._pattern[0] != len(self.names):
            names = sorted(self.names, key=len, reverse=True)
            alt = "|".join(map(re.escape, names))
            self._pattern = (len(self.names), re.compile(rf"(?<![\w.-])({alt})(?![\w-])"))
        return self._pattern[1].sub(lambda m: self.names[m.group(1)], text)


def _open_daemon_file(path: Path) -> BinaryIO:
    """``path`` opened for reading as ``check`` and the Prolog open a state file
    (:func:`hetpatrol.healthcheck.resolve_trusted`): reached only through root's, the
    daemon user's or our own directories and symlinks, the file itself opened without
    following a link, a regular file owned by one of them and writable by no one else.
    The doctor runs as root: a link another user left at the log's path (``/tmp`` in a
    config) must not put ``/etc/shadow`` in a tarball sent to support. Raises
    :class:`~hetpatrol.healthcheck.UntrustedStateFile` (why) or ``OSError``."""
    from hetpatrol.healthcheck import UntrustedStateFile, resolve_trusted, trusted_uids
    from hetpatrol.healthcheck import _refuse_writable as refuse_writable

    trusted = trusted_uids()
    real = resolve_trusted(path, trusted)
    # O_NONBLOCK: a FIFO left there does not hang the open
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedStateFile(f"{real} is not a regular file")
        refuse_writable(real, st, trusted)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _head(path: Path) -> bytes:
    """At most :data:`STATE_BYTES` of ``path`` (:func:`_open_daemon_file`); ValueError
    when it is longer."""
    with _open_daemon_file(path) as f:
        data = f.read(STATE_BYTES + 1)
    if len(data) > STATE_BYTES:
        raise ValueError(f"{path} is larger than {STATE_BYTES} bytes: not included")
    return data


def _tail(path: Path) -> str:
    with _open_daemon_file(path) as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - JSONL_BYTES))
        data = f.read(JSONL_BYTES)
    lines = data.decode("utf-8", "replace").splitlines()
    if size > JSONL_BYTES:
        lines = lines[1:]  # the first is cut
    return "\n".join(lines[-JSONL_LINES:]) + "\n"


class _Line(str):
    """A patrol.jsonl line that is no JSON (kept as text)."""


def _versions() -> str:
    from hetpatrol import __version__

    u = platform.uname()
    lines = [
        f"hetpatrol {__version__}",
        f"python {platform.python_version()} ({sys.executable})",
        f"kernel {u.system} {u.release} {u.version} {u.machine}",
        f"time {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
    ]
    try:
        lines.append(Path("/etc/os-release").read_text().strip())
    except OSError:
        lines.append("/etc/os-release: unreadable")
    return "\n".join(lines) + "\n"


def _record_patrol(directory: Path, config: str | None) -> str:
    """One patrol with its tool outputs recorded into ``directory``; its JSON."""
    from hetpatrol.tool import RECORD_DIR_ENV

    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, RECORD_DIR_ENV: str(directory)}
    argv = [sys.executable, "-m", "hetpatrol.cli", "once", "--format", "json"]
    if config:
        argv += ["--config", config]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
        out = res.stdout
    except subprocess.TimeoutExpired:
        out = '{"error": "the patrol did not complete in 180 s"}'
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            res = subprocess.run([smi, "-q", "-x"], capture_output=True, timeout=60)
            (directory / "nvidia-smi-q.xml").write_bytes(res.stdout)
        except (subprocess.TimeoutExpired, OSError):
            pass
    return out


def _effective_config(config: str | None) -> str:
    """``config-effective.yaml``'s text: a comment naming the files laid, then the
    effective config as YAML (or a comment saying why there is none)."""
    import yaml

    from hetpatrol.config import ConfigError, effective_document

    try:
        doc, sources = effective_document(Path(config) if config else None)
    except (ConfigError, OSError) as exc:
        said = exc.report() if isinstance(exc, ConfigError) else [str(exc)]
        return "# no effective config:\n" + "".join(f"#   {line}\n" for line in said)
    head = "".join(f"#   {s}\n" for s in sources)
    body = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return (
        "# the config as hetpatrol uses it, laid from: the bundled config, the plugins'\n"
        "# profiles for vendors it writes none for, then the site file (its values win):\n"
        f"{head}{body}"
    )


def write_bundle(path: Path, checks: list[Any], config: str | None, *, redact: bool = True) -> Path:
    """Write the tarball to ``path`` (see the module docstring); returns ``path``.

    Raises ``OSError`` when ``path`` cannot be written."""
    from hetpatrol.config import load_config

    r = _Redactor(redact)
    # name -> JSON document or text, redacted only when every name is known
    files: dict[str, Any] = {}
    texts: dict[str, str] = {}
    files["doctor.json"] = [c.to_dict() for c in checks]
    texts["versions.txt"] = _versions()
    node = platform.node() or "node"
    try:
        cfg = load_config(Path(config) if config else None)
    except Exception:  # noqa: BLE001 - the doctor's own lines say why
        cfg = None
    if config:
        try:
            texts["config.yaml"] = Path(config).read_text()
        except OSError as exc:
            texts["config.yaml"] = f"# unreadable: {exc}\n"
    texts["config-effective.yaml"] = _effective_config(config)
    jsonl: list[Any] = []  # patrol.jsonl: a document a line, or a line that is none
    if cfg is not None:
        node = cfg.node or node
        for name, p in (("state.json", cfg.state_path), ("patrol.jsonl", cfg.jsonl_path)):
            if not p:
                continue
            try:
                if name == "state.json":
                    files[name] = json.loads(_head(Path(p)))
                else:
                    for line in _tail(Path(p)).splitlines():
                        try:
                            jsonl.append(json.loads(line))
                        except ValueError:
                            jsonl.append(_Line(line))
            except FileNotFoundError:
                continue
            except (OSError, ValueError, RecursionError) as exc:
                texts[name + ".error"] = f"{exc}\n"
    with tempfile.TemporaryDirectory() as tmp:
        replay = Path(tmp) / "replay"
        once = _record_patrol(replay, config)
        try:
            files["replay/once.json"] = json.loads(once)
        except (ValueError, RecursionError):
            texts["replay/once.json"] = once
        for f in sorted(replay.iterdir()):
            if f.is_file():
                texts[f"replay/{f.name}"] = f.read_text("utf-8", "replace")
    for doc in [*files.values(), *jsonl]:
        r.collect(doc)
    out: dict[str, bytes] = {}
    for name, doc in files.items():
        out[name] = json.dumps(r.json(doc), indent=2 if name == "doctor.json" else 1).encode()
    if jsonl:
        lines = [r.text(x) if isinstance(x, _Line) else json.dumps(r.json(x)) for x in jsonl]
        out["patrol.jsonl"] = ("\n".join(lines) + "\n").encode()
    for name, text in texts.items():
        out[name] = r.text(text).encode()
    top = "hetpatrol-doctor-" + re.sub(r"[^\w.-]", "_", node)
    # created new (never through a link someone left there), 0600: it holds node data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in out.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            tar.addfile(info, io.BytesIO(data))
    return path
