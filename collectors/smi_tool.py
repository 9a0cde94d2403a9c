"""One bounded run of a vendor ``*-smi`` tool, shared by the table/JSON plugins
(:mod:`hetpatrol.collectors.rocm_family`, ``hygon``, ``amd``, ``cambricon``).

The rules are npu-smi's (:class:`hetpatrol.collectors.ascend.AscendCollector`): the tool
runs once per patrol under ``timeout_seconds`` (:func:`hetpatrol.tool.run_tool` kills its
process group when it hangs); a missing program is an absent stack, not a failure; a hung
tool, a non-zero exit, a runaway output or empty output raise
:class:`~hetpatrol.collector.CollectorError` with the raw text kept, never "0 cards, ok".
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from typing import Any

from hetpatrol.collector import CollectorError
from hetpatrol.tool import ReplayTool, ToolOutput, run_tool

#: How much of a runaway (size-capped) tool output is kept as ``raw``.
RAW_KEEP = 64 * 1024

Runner = Callable[[Sequence[str], float], ToolOutput]


class Absent(Exception):
    """The tool is not installed: no such vendor stack on this node."""


def argv_option(options: dict[str, Any], key: str, default: Sequence[str]) -> list[str]:
    """``options[key]`` as an argv list (a shell-quoted string is split), else ``default``."""
    command = options.get(key, list(default))
    if isinstance(command, str):
        command = shlex.split(command)
    return [str(part) for part in command]


def default_runner(replay_dir) -> Runner:
    """:func:`run_tool`, or the replay directory's recorded outputs when one is set."""
    return ReplayTool(replay_dir).run if replay_dir is not None else run_tool


def run_once(runner: Runner, argv: Sequence[str], timeout: float) -> str:
    """Run ``argv`` once; its stdout when it exited 0 and printed something.

    Raises :class:`Absent` when the program does not exist, and
    :class:`CollectorError` when it could not be run, hung (``hung=True``, the partial
    stdout as ``raw``), printed more than the cap, exited non-zero or printed nothing
    (``raw`` = stdout + stderr).
    """
    label = " ".join([argv[0].rsplit("/", 1)[-1], *argv[1:3]])
    try:
        out = runner(argv, timeout)
    except FileNotFoundError as exc:
        raise Absent(f"{argv[0]} not found: {exc}") from exc
    except PermissionError as exc:
        raise CollectorError(f"{argv[0]} cannot be run: {exc}") from exc
    if out.hung:
        raise CollectorError(f"{label} hung: killed after {timeout:g}s", raw=out.stdout, hung=True)
    if out.truncated:
        raise CollectorError(
            f"{label} printed more than {len(out.stdout)} bytes: killed, output cut "
            "(first part kept as raw)",
            raw=out.stdout[:RAW_KEEP],
        )
    raw = out.stdout + (("\n" + out.stderr) if out.stderr.strip() else "")
    if out.returncode != 0:
        raise CollectorError(f"{label} exited with code {out.returncode}: {excerpt(raw)}", raw=raw)
    if not out.stdout.strip():
        raise CollectorError(f"{label} printed nothing: {excerpt(raw)}", raw=raw)
    return out.stdout


def excerpt(text: str, limit: int = 240) -> str:
    """The first non-blank lines of ``text``, joined with ``; `` and cut at ``limit``."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return "(no output)"
    out = "; ".join(lines[:3])
    return out if len(out) <= limit else out[:limit] + "..."
