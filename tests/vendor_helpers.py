"""Stand-ins for a tool-based vendor plugin's ``runner`` (``hetpatrol.tool.run_tool``'s
signature, ``(argv, timeout) -> ToolOutput``), shared by the tests/test_vendor_*.py files.

An answer is one of: text (the tool's stdout, exit code 0, empty stderr), a
:class:`~hetpatrol.tool.ToolOutput` returned as it is (hung, non-zero exit...), or an
exception class raised with ``argv[0]`` (``FileNotFoundError``: the program is missing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from hetpatrol.collector import STATE_ABSENT, CollectorError, CollectResult
from hetpatrol.tool import ToolOutput


def answer(argv: Sequence[str], output: object) -> ToolOutput:
    """``output`` as the run of ``argv`` (see the module docstring)."""
    if isinstance(output, type) and issubclass(output, BaseException):
        raise output(argv[0])
    if isinstance(output, ToolOutput):
        return output
    return ToolOutput(tuple(argv), output, "", 0, False, 0.01)


def runner_for(outputs: dict[tuple[str, ...], object]):
    """A runner answering each argv from ``outputs``; an argv not in it is a missing
    program (``FileNotFoundError``)."""

    def run(argv, timeout):
        return answer(argv, outputs.get(tuple(argv), FileNotFoundError))

    return run


def collect_with(cls, output: object, *, argv: Sequence[str] | None = None, **options):
    """``cls(options).collect()`` with every run answered by ``output``; ``argv``, when
    given, is asserted to be what the plugin ran (the query the sample was read with)."""
    collector = cls(options)

    def run(call, timeout):
        if argv is not None:
            assert tuple(call) == tuple(argv)
        return answer(call, output)

    collector.runner = run
    result: CollectResult = collector.collect()
    return result


def assert_error_with_raw(collect: Callable, output: object) -> CollectorError:
    """``collect(output)`` raises :class:`CollectorError` with the raw text kept; the
    error is returned for further checks."""
    with pytest.raises(CollectorError) as err:
        collect(output)
    assert err.value.raw is not None, f"raw text lost: {err.value}"
    return err.value


def assert_hung_and_missing(collect: Callable, argv: Sequence[str], partial: str) -> None:
    """A run of ``argv`` killed as hung after printing ``partial`` raises a ``hung``
    :class:`CollectorError` with ``partial`` as ``raw``; a missing program is ``absent``."""
    err = assert_error_with_raw(collect, ToolOutput(tuple(argv), partial, "", None, True, 10.0))
    assert (err.hung, err.raw) == (True, partial)
    result = collect(FileNotFoundError)
    assert result.state == STATE_ABSENT, (result.state, result.error)
