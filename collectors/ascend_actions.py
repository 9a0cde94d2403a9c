"""Huawei Ascend's fault tables, declared to the core through ``VendorInfo.actions``
(:class:`hetpatrol.collector.VendorActions`; :mod:`hetpatrol.actions.findings` reads
them without naming the vendor):

- ``ascend_fault_code`` findings (``value``: ``{"<8 hex digits>": count}``): each npu-smi
  error code by its MindCluster level, :func:`hetpatrol.collectors.ascend_levels.code_action`,
  in the caller's code table or, given none, the bundled
  ``config/ascend_fault_codes.yaml`` (read once, on first use, with ``yaml``); an
  override ``ascend:<CODE>`` wins;
- the RoCE checks of :mod:`hetpatrol.collectors.ascend_detail` (``roce_link_down``,
  ``roce_net_health``, ``roce_optical``) critical -> isolate_card: cables and optics
  need a person (as the XID catalog's CHECK_MECHANICALS); ``roce_link_flaps`` -> watch;
- ``vendor_health`` words (npu-smi's Health): ``alarm`` / ``warning`` -> watch (the
  Error Codes carry the action: MindCluster handles a chip by its fault codes, not by
  the health word); ``critical`` (the urgent alarm) -> reset_card: without its codes
  read (detail sweep off, ``-t health`` failed) it must still take the chip out of
  service, as a verdict of critical did before actions existed;
- escalation keys of an ``ascend_fault_code`` finding, any severity (MindCluster counts
  every listed code): ``ascend:<CODE>`` and, for a code in the table,
  ``ascend_level:<level>``.

Importing this module reads nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from hetpatrol.actions.vocabulary import ISOLATE_CARD, RESET_CARD, WATCH, ActionVerdict
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


def fault_code_keys(code: str, levels: Mapping[str, str]) -> list[str]:
    """The escalation keys one code holds while present: ``ascend:<CODE>`` and
    ``ascend_level:<level>`` when ``levels`` lists it."""
    upper = str(code).strip().upper()
    keys = [f"ascend:{upper}"]
    if upper in levels:
        keys.append(f"ascend_level:{levels[upper]}")
    return keys


ACTIONS = VendorActions(
    code_actions={"ascend_fault_code": fault_code_action},
    code_table=bundled_levels,
    check_actions={
        "roce_link_down": {"warning": WATCH, "critical": ISOLATE_CARD, "*": WATCH},
        "roce_net_health": {"warning": WATCH, "critical": ISOLATE_CARD, "*": WATCH},
        "roce_link_flaps": {"*": WATCH},
        "roce_optical": {"warning": WATCH, "critical": ISOLATE_CARD, "*": WATCH},
    },
    health_actions={"alarm": WATCH, "critical": RESET_CARD, "warning": WATCH},
    code_keys={"ascend_fault_code": fault_code_keys},
)
