"""Huawei Ascend's fault tables, declared to the core through ``VendorInfo.actions``
(:class:`hetpatrol.collector.VendorActions`; :mod:`hetpatrol.actions.findings` reads
them without naming the vendor):

- ``ascend_fault_code`` findings (``value``: ``{"<8 hex digits>": count}``): each npu-smi
  error code by its MindCluster level, :func:`hetpatrol.collectors.ascend_levels.code_action`,
  in the caller's code table or, given none, the bundled
  ``config/ascend_fault_codes.yaml`` (read once, on first use, with ``yaml``); an
  override ``ascend:<CODE>`` wins.

Importing this module reads nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from hetpatrol.actions.vocabulary import ActionVerdict
from hetpatrol.collector import VendorActions
from hetpatrol.collectors import ascend_levels

_levels_cache: dict[str, str] | None = None


def bundled_levels() -> dict[str, str]:
    """The bundled code -> MindCluster level table, read once (imports yaml on first
    call); raises OSError / ValueError as
    :func:`~hetpatrol.collectors.ascend_levels.load_code_levels`."""
    global _levels_cache
    if _levels_cache is None:
        _levels_cache = ascend_levels.load_code_levels()
    return _levels_cache


def fault_code_action(
    code: str,
    severity: str,
    message: str | None,
    levels: Mapping[str, str] | None,
    overrides: Mapping[str, str] | None,
) -> ActionVerdict:
    """The action of one code of an ``ascend_fault_code`` finding (``levels`` None: the
    bundled table)."""
    table = bundled_levels() if levels is None else levels
    return ascend_levels.code_action(str(code), table, overrides)


ACTIONS = VendorActions(
    code_actions={"ascend_fault_code": fault_code_action},
    code_table=bundled_levels,
)
