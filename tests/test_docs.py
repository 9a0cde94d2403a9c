"""The README and docs/ say what runs: every shell block marked runnable is run.

A fenced ``sh`` block right after ``<!-- runnable -->`` holds commands run one by one
from the repository root (``bash -c``) with this interpreter's scripts first on the PATH
(``.venv/bin/`` in a command stands for them: the suite itself is that install), a
private ``$HOME`` and ``NO_COLOR``; ``/tmp/`` paths land in the test's own temp dir. A
command's expected exit code is its comment's ``# exit N`` (0 without one).
``<!-- runnable: daemon -->`` marks the quick start's ``hetpatrol run``: it is started
(on a free port), must serve ``/metrics`` and write its state file, and the README's other
runnable blocks run while it does (``status`` and ``check`` read it); SIGTERM then must
stop it with exit 0.

``<!-- output -->`` before a fenced block whose first line is ``$ hetpatrol ...`` marks
an example of a command's output: the command (its ``# comment`` dropped) is run the same
way, in a pipe (no ``COLUMNS``: the full width), and its stdout must be the rest of the
block, only what truly varies normalised (:func:`normalise`: durations such as
``0.033 s``, ages such as ``12 s ago``, the test's temp dir).

Every relative link in them must lead to a file that exists and, with ``#anchor``, to a
heading of that file.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"<!-- runnable(?P<kind>: daemon)? -->\n```sh\n(?P<body>.*?)```", re.S)
_EXIT = re.compile(r"#\s*exit (\d+)")
_OUTPUT = re.compile(r"<!-- output -->\n```[a-z]*\n\$ (?P<cmd>[^\n]*)\n(?P<out>.*?)```", re.S)
#: what varies between two runs of one command: (pattern, replacement)
_VARIES = [
    (re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|s)\b(?! ago)"), "<duration>"),
    (re.compile(r"\b\d+(?:\.\d+)? ?(?:s|m|min|h|d) ago\b"), "<age> ago"),
]


def output_blocks() -> list[tuple[str, str, str]]:
    """(page, command, the output shown) of every output block."""
    out = []
    for page in PAGES:
        for m in _OUTPUT.finditer(page.read_text()):
            out.append((page.relative_to(REPO).as_posix(), m["cmd"], m["out"]))
    return out


def normalise(text: str, tmp: Path | None = None) -> str:
    """``text`` with what varies between runs replaced by a placeholder (and the temp
    dir by ``/tmp``)."""
    if tmp is not None:
        text = text.replace(f"{tmp}/", "/tmp/")
    for pattern, repl in _VARIES:
        text = pattern.sub(repl, text)
    return text


def runnable_blocks(kind: str = "") -> list[tuple[str, str]]:
    """(page, block text) of every runnable block of that kind ("" or ": daemon")."""
    out = []
    for page in PAGES:
        for m in _BLOCK.finditer(page.read_text()):
            if (m["kind"] or "") == kind:
                out.append((page.relative_to(REPO).as_posix(), m["body"]))
    return out


def commands(block: str) -> list[tuple[str, int]]:
    """(command, expected exit code) per line of a block; comments and blanks skipped."""
    out = []
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _EXIT.search(line)
        out.append((line, int(m[1]) if m else 0))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def localise(command: str, tmp: Path, port: int | None = None) -> str:
    """The command as the test runs it: this environment's scripts for ``.venv/bin/``, the
    test's temp dir for ``/tmp/``, a free port for the quick start's 9477."""
    command = command.replace(".venv/bin/", "").replace("/tmp/", f"{tmp}/")
    if port is not None:
        command = command.replace("127.0.0.1:9477", f"127.0.0.1:{port}")
    return command


def shell_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env.update(
        HOME=str(tmp / "home"),
        NO_COLOR="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    (tmp / "home").mkdir(exist_ok=True)
    return env


def run_block(page: str, block: str, tmp: Path, env: dict[str, str]) -> None:
    for command, expected in commands(block):
        run = subprocess.run(
            ["bash", "-c", localise(command, tmp)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == expected, (
            f"{page}: `{command}` exited {run.returncode}, the docs say {expected}\n"
            f"{run.stdout[-2000:]}{run.stderr[-2000:]}"
        )


def test_the_docs_have_runnable_blocks():
    assert len(runnable_blocks(": daemon")) == 1
    assert sum(len(commands(b)) for _, b in runnable_blocks()) >= 8


def test_the_quick_start_runs_and_the_readmes_commands_say_their_exit_codes(tmp_path):
    ((page, block),) = runnable_blocks(": daemon")
    ((daemon_line, _),) = commands(block)
    # the install steps before the last `&&` are what this suite's environment already is
    daemon = daemon_line.rsplit("&&", 1)[-1].strip()
    assert daemon.startswith(".venv/bin/hetpatrol run --replay fixtures/nodes/healthy-mixed")
    port = free_port()
    env = shell_env(tmp_path)
    proc = subprocess.Popen(
        ["bash", "-c", "exec " + localise(daemon, tmp_path, port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    state = tmp_path / "home" / ".local" / "state" / "hetpatrol" / "state.json"
    try:
        deadline = time.monotonic() + 60
        while not state.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "no state file after 60 s"
            time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert b"hetpatrol_card_health" in r.read()
        assert (state.parent / "patrol.jsonl").stat().st_size > 0
        for where, body in runnable_blocks():
            if where == "README.md":
                run_block(where, body, tmp_path, env)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


@pytest.mark.parametrize(
    ("page", "block"),
    [b for b in runnable_blocks() if b[0] != "README.md"],
    ids=lambda v: v if v.endswith(".md") else "",
)
def test_runnable_blocks_of_the_docs(page, block, tmp_path):
    run_block(page, block, tmp_path, shell_env(tmp_path))


def test_the_docs_have_output_blocks():
    pages = {page for page, _, _ in output_blocks()}
    assert {"README.md", "docs/fleet.md", "docs/ledger.md"} <= pages


@pytest.mark.parametrize(
    ("page", "command", "shown"), output_blocks(), ids=lambda v: v if v.endswith(".md") else ""
)
def test_output_blocks_are_the_commands_real_output(page, command, shown, tmp_path):
    """The example is what the command prints now, byte for byte but for durations,
    ages and temp paths."""
    line = command.split(" #", 1)[0].strip()
    assert line.startswith("hetpatrol "), f"{page}: output block of {command!r}"
    env = shell_env(tmp_path)
    env.pop("COLUMNS", None)  # a pipe: the full width, as a reader copying it sees
    run = subprocess.run(
        ["bash", "-c", localise(line, tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    got, want = normalise(run.stdout, tmp_path), normalise(shown)
    assert got == want, (
        f"{page}: `{line}` (exit {run.returncode}) prints something else than the docs "
        f"show; its output:\n{run.stdout}{run.stderr[-2000:]}"
    )


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m[1]) for m in re.finditer(r"^#{1,6} (.*)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_somewhere(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name}: link to {target}: no such heading"
