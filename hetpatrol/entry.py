"""The ``hetpatrol`` executable: a light front door to :mod:`hetpatrol.cli`.

Slurm runs ``hetpatrol check --state-path P`` on every node at every
``HealthCheckInterval``; importing the whole command line (config validation with
jsonschema, the collectors, prometheus-client) costs ~10 times the work of the
check itself. This module answers that one form, ``check`` with only ``--state-path`` and
``--max-age``, from :mod:`hetpatrol.healthcheck` alone, and hands every other command
line, unchanged, to :func:`hetpatrol.cli.main` (which also parses ``check`` in full: its
``--help``, ``--config`` and usage errors).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

#: the options of ``check`` this fast path understands; anything else goes to the CLI
_FAST_CHECK_OPTIONS = ("--state-path", "--max-age")


def _fast_check_args(argv: Sequence[str]) -> dict[str, str] | None:
    """``{"--state-path": P, "--max-age": S}`` from a ``check`` argument list made only
    of those two options (``--opt value`` or ``--opt=value``, each at most once, the state
    path given); None for anything else."""
    found: dict[str, str] = {}
    items = list(argv)
    while items:
        item = items.pop(0)
        name, eq, value = item.partition("=")
        if name not in _FAST_CHECK_OPTIONS or name in found:
            return None
        if not eq:
            if not items:
                return None
            value = items.pop(0)
        found[name] = value
    return found if found.get("--state-path") else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hetpatrol`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["prolog"]:  # Slurm runs it before every job: the guard's imports only
        from hetpatrol.slurm.jobguard import cli_main as prolog_main

        return prolog_main(args[1:])
    if args[:1] == ["task-prolog"]:  # before every task: job_gres's imports only
        from hetpatrol.slurm.task_prolog import cli_main as task_prolog_main

        return task_prolog_main(args[1:])
    if args[:1] == ["check"]:
        fast = _fast_check_args(args[1:])
        if fast is not None:
            from hetpatrol.healthcheck import run_check

            max_age = fast.get("--max-age")
            code = run_check(fast["--state-path"], max_age)
            if code is not None:
                return code
    from hetpatrol.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
