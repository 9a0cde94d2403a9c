"""JSON Schema checks of the config and baseline files, with ``jsonschema`` imported
only where a check runs.

``jsonschema`` (with ``referencing``, ``rpds`` and its format checkers) adds ~6 MB to a
process that imports it, and nothing frees that afterwards. The daemon checks its config
at start and on SIGHUP only, so it runs the check in a child process
(:mod:`hetpatrol.config_check`) and then builds the same text here under
:func:`checked_elsewhere`, where these functions find no error without importing
anything. Every other command checks in its own process, as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_checked_elsewhere: ContextVar[bool] = ContextVar("checked_elsewhere", default=False)


@contextmanager
def checked_elsewhere() -> Iterator[None]:
    """Within this block the schema checks pass without running: the same text was
    checked by :func:`hetpatrol.config.load_config` in another process."""
    token = _checked_elsewhere.set(True)
    try:
        yield
    finally:
        _checked_elsewhere.reset(token)


def iter_errors(schema: dict[str, Any], data: Any) -> list:
    """Every ``jsonschema.ValidationError`` of ``data`` against ``schema`` (draft
    2020-12), in the validator's order; none under :func:`checked_elsewhere`."""
    if _checked_elsewhere.get():
        return []
    import jsonschema

    return list(jsonschema.Draft202012Validator(schema).iter_errors(data))


def best_error(schema: dict[str, Any], data: Any):
    """The error ``jsonschema.validate`` would raise (its ``best_match``), or None."""
    errors = iter_errors(schema, data)
    if not errors:
        return None
    from jsonschema.exceptions import best_match

    return best_match(errors)
