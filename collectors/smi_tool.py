"""One bounded run of a vendor ``*-smi`` tool, shared by the table/JSON plugins
(:mod:`hetpatrol.collectors.rocm_family`, ``hygon``, ``amd``, ``cambricon``, ``enflame``,
``iluvatar``, ``kunlunxin``, ``gaudi``), and :class:`SmiToolCollector`, the collector that
runs one such tool once per patrol and hands its output to the plugin's parser.

The rules are npu-smi's (:class:`hetpatrol.collectors.ascend.AscendCollector`): the tool
runs once per patrol under ``timeout_seconds`` (:func:`hetpatrol.tool.run_tool` kills its
process group when it hangs); a missing program is an absent stack, not a failure; a hung
tool, a non-zero exit, a runaway output or empty output raise
:class:`~hetpatrol.collector.CollectorError` with the raw text kept, never "0 cards, ok".
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from hetpatrol.collector import STATE_ABSENT, Collector, CollectorError, CollectResult
from hetpatrol.schema import CardRecord
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


class SmiToolCollector(Collector):
    """A vendor plugin that runs one ``*-smi`` command once per patrol.

    Options (``collectors.<name>``): ``command`` (argv list or shell-quoted string;
    default :meth:`default_argv`, i.e. :attr:`default_command`) and ``timeout_seconds``
    (default :attr:`default_timeout_seconds`, 10). ``replay_dir`` swaps the run for the
    recorded output (:func:`default_runner`); tests may set ``runner``.

    :meth:`collect` runs ``command`` through :func:`run_once`: a missing program is an
    ``absent`` result (the :class:`Absent` text as ``error``); a hung, failed, runaway or
    empty run raises :class:`CollectorError` (raw kept). The output goes to
    :meth:`result`, which by default calls the plugin's :meth:`parse` hook and turns its
    problems into the result's ``error`` (``"<tool>: p1; p2; p3"``, the first three) with
    the whole output as ``raw``; :meth:`parse` raises :class:`CollectorError` (raw kept)
    when the output holds no card table. Plugins whose result needs more (a second
    family filter, a truncation note) override :meth:`result`.
    """

    #: the tool's argv when ``command`` is not configured
    default_command: ClassVar[Sequence[str]] = ()
    #: ``timeout_seconds`` when not configured, in seconds
    default_timeout_seconds: ClassVar[float] = 10
    #: the tool's name as it prefixes the result's ``error`` (``"efsmi"``)
    tool: ClassVar[str] = ""

    def __init__(self, options: Mapping[str, Any], *, replay_dir: Path | None = None):
        super().__init__(options, replay_dir=replay_dir)
        self.command = argv_option(self.options, "command", self.default_argv())
        self.timeout_seconds = float(
            self.options.get("timeout_seconds", self.default_timeout_seconds)
        )
        self.runner = default_runner(self.replay_dir)

    def default_argv(self) -> Sequence[str]:
        """The argv run when ``command`` is not configured (after ``self.options`` is
        set, so an option may shape it): :attr:`default_command`."""
        return self.default_command

    def parse(self, text: str) -> tuple[list[CardRecord], list[str]]:
        """``(records, problems)`` of the tool's output: one record per card, and what
        could not be read (each a short phrase). Raises :class:`CollectorError`
        (``raw=text``) when no card table is found."""
        raise NotImplementedError

    def result(self, text: str) -> CollectResult:
        """The :class:`CollectResult` of one run's output: :meth:`parse`'s records;
        with problems, ``raw=text`` and ``error`` = ``"<tool>: "`` + the first three."""
        records, problems = self.parse(text)
        return problem_result(self.name, text, records, problems, self.tool)

    def collect(self) -> CollectResult:
        """Run ``command`` once; ``absent`` without the program; :class:`CollectorError`
        (raw kept) when it hung, failed or printed no card table."""
        try:
            text = run_once(self.runner, self.command, self.timeout_seconds)
        except Absent as exc:
            return CollectResult(self.name, state=STATE_ABSENT, error=str(exc))
        return self.result(text)


def problem_result(
    name: str,
    text: str,
    records: list[CardRecord],
    problems: Sequence[str],
    label: str,
    keep_raw: bool = False,
) -> CollectResult:
    """``CollectResult(name, records)``; when there are ``problems`` (or ``keep_raw``),
    with ``raw=text`` and ``error`` = ``f"{label}: "`` + the first three joined by ``; ``."""
    result = CollectResult(name, records=records)
    if problems or keep_raw:
        result.raw = text
        result.error = f"{label}: " + "; ".join(problems[:3])
    return result
