"""``hetpatrol doctor --bundle FILE``: a support tarball of one node.

The ``.tar.gz`` holds, under ``hetpatrol-doctor-<node>/``:

- ``doctor.json``: the doctor's checks (:class:`hetpatrol.doctor.Check` dicts);
- ``versions.txt``: hetpatrol, Python, the kernel (``uname``), ``/etc/os-release``;
- ``config.yaml``: the config file the unit runs (as it is on disk);
- ``state.json`` and ``patrol.jsonl`` (its last :data:`JSONL_LINES` lines, at most
  :data:`JSONL_BYTES` read from its end): the daemon's files, where readable;
- ``replay/``: one patrol's tool outputs, recorded as a ``--replay`` scenario
  (:data:`hetpatrol.tool.RECORD_DIR_ENV`; plus ``nvidia-smi-q.xml`` where ``nvidia-smi``
  is installed), and ``once.json``, that patrol as ``hetpatrol once --format json``.

**Redaction** (unless ``redact=False``): every value of a ``user``, ``user_name``,
``account``, ``job_name`` or ``comment`` key in the JSON files becomes ``user-N`` /
``account-N`` / ``job-N`` (the same name, the same placeholder), and those names and the
login names of ``/etc/passwd`` (uid >= 1000) are replaced as whole words in every text
file. Job ids, bus ids and card serials stay: support needs them.
"""

from __future__ import annotations

import io
import json
import os
import platform
import pwd
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

JSONL_LINES = 200
JSONL_BYTES = 4 * 1024 * 1024
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
        if enabled:
            for entry in pwd.getpwall():
                if entry.pw_uid >= 1000 and entry.pw_name not in ("nobody",):
                    self._name(entry.pw_name, "user")

    def _name(self, value: str, prefix: str) -> str:
        if value not in self.names:
            n = sum(v.startswith(prefix + "-") for v in self.names.values()) + 1
            self.names[value] = f"{prefix}-{n}"
        return self.names[value]

    def json(self, doc: Any) -> Any:
        if not self.enabled:
            return doc
        if isinstance(doc, dict):
            out = {}
            for k, v in doc.items():
                if k in _REDACT_KEYS and isinstance(v, str) and v:
                    out[k] = self._name(v, _REDACT_KEYS[k])
                else:
                    out[k] = self.json(v)
            return out
        if isinstance(doc, list):
            return [self.json(v) for v in doc]
        return doc

    def text(self, text: str) -> str:
        if not self.enabled or not self.names:
            return text
        names = sorted(self.names, key=len, reverse=True)
        pattern = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, names)) + r")(?![\w-])")
        return pattern.sub(lambda m: self.names[m.group(1)], text)


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - JSONL_BYTES))
        data = f.read()
    lines = data.decode("utf-8", "replace").splitlines()
    if size > JSONL_BYTES:
        lines = lines[1:]  # the first is cut
    return "\n".join(lines[-JSONL_LINES:]) + "\n"


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


def write_bundle(path: Path, checks: list[Any], config: str | None, *, redact: bool = True) -> Path:
    """Write the tarball to ``path`` (see the module docstring); returns ``path``.

    Raises ``OSError`` when ``path`` cannot be written."""
    from hetpatrol.config import load_config

    r = _Redactor(redact)
    files: dict[str, bytes] = {}
    files["doctor.json"] = json.dumps([c.to_dict() for c in checks], indent=2).encode()
    files["versions.txt"] = _versions().encode()
    node = platform.node() or "node"
    try:
        cfg = load_config(Path(config) if config else None)
    except Exception:  # noqa: BLE001 - the doctor's own lines say why
        cfg = None
    if config:
        try:
            files["config.yaml"] = r.text(Path(config).read_text()).encode()
        except OSError as exc:
            files["config.yaml"] = f"# unreadable: {exc}\n".encode()
    if cfg is not None:
        node = cfg.node or node
        for name, p in (("state.json", cfg.state_path), ("patrol.jsonl", cfg.jsonl_path)):
            if not p or not Path(p).is_file():
                continue
            try:
                if name == "state.json":
                    doc = r.json(json.loads(Path(p).read_text()))
                    files[name] = json.dumps(doc, indent=1).encode()
                else:
                    lines = []
                    for line in _tail(Path(p)).splitlines():
                        try:
                            lines.append(json.dumps(r.json(json.loads(line))))
                        except ValueError:
                            lines.append(r.text(line))
                    files[name] = ("\n".join(lines) + "\n").encode()
            except (OSError, ValueError) as exc:
                files[name + ".error"] = f"{exc}\n".encode()
    with tempfile.TemporaryDirectory() as tmp:
        replay = Path(tmp) / "replay"
        once = _record_patrol(replay, config)
        try:
            files["replay/once.json"] = json.dumps(r.json(json.loads(once)), indent=1).encode()
        except ValueError:
            files["replay/once.json"] = r.text(once).encode()
        for f in sorted(replay.iterdir()):
            if f.is_file():
                files[f"replay/{f.name}"] = r.text(f.read_text("utf-8", "replace")).encode()
    top = "hetpatrol-doctor-" + re.sub(r"[^\w.-]", "_", node)
    # created new (never through a link someone left there), 0600: it holds node data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            tar.addfile(info, io.BytesIO(data))
    return path
