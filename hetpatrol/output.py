"""Standard output for the commands whose exit code means something (Nagios, Slurm).

A reader that goes away early (``hetpatrol once | head -1``) closes the pipe: the next
write raises ``BrokenPipeError``. That is no failure of the command: the rest of the
output is dropped and the command still exits with its own code.
"""

from __future__ import annotations

import os
import sys


def silence_stdout() -> None:
    """Point file descriptor 1 at ``/dev/null``, so that what is left in ``sys.stdout``'s
    buffer (flushed again at exit) goes nowhere instead of raising once more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real descriptor (a test's capture)
        pass
    finally:
        os.close(devnull)


def write_stdout(text: str) -> bool:
    """Write ``text`` to ``sys.stdout`` and flush it. False when the reader closed the
    pipe (the text is dropped, stdout silenced); never raises ``BrokenPipeError``."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        return False
    return True


def plain_help(doc: str | None) -> str:
    """A module docstring as ``--help`` text: reStructuredText markup (````x````,
    ``:func:`x````) shown as plain text."""
    import re  # here: `check` writes its line and needs no help text

    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc or "")
    return text.replace("``", "")
