"""Huawei Ascend's fault tables, declared to the core through ``VendorInfo.actions``
(:class:`hetpatrol.collector.VendorActions`; :mod:`hetpatrol.actions.findings` reads
them without naming the vendor):

- ``ascend_fault_code`` findings (``value``: ``{"<8 hex digits>": count}``): each npu-smi
  error code by its MindCluster level, :func:`hetpatrol.collectors.ascend_levels.code_action`,
  in the caller's code table or, given none, the bundled
  ``collectors/ascend_fault_codes.yaml`` (read once, on first use, with ``yaml``); an
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
  ``ascend_level:<level>``;
- escalation rules over those keys (:data:`FREQUENCY_RULES`, :data:`DURATION_RULES`):
  MindCluster's ``faultCustomization.json`` defaults and its fault levels, each citing
  its row.

Importing this module reads nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from hetpatrol.actions.escalation import DAY, DurationRule, FrequencyRule
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


# MindCluster, Ascend Device Plugin faultCustomization.json (gitcode.com/Ascend/
# mind-cluster, component/ascend-device-plugin/build/faultCustomization.json), the
# "FaultFrequency" defaults: these codes twice in 86400 s -> ManuallySeparateNPU.
_ASCEND_TWICE_A_DAY = (  # noqa: SIM905 - kept as the JSON rows
    "80C98000 80B78000 80B58000 80A18008 80A38008 80A58008 80B98000 80B98008 80BB8000 "
    "80BB8008 80BD8000 80BD8008 80C78008 80C98008 80CB8008 80CD8008 80CF8008 80D98008 "
    "80DF8008 80DE1801 80E01801 80E18008 80E38008 80E39200 80E3A202 80E3A203 80E78000 "
    "80E78008 80F18000 80F18008 80F38008 80F78008 81318008 81338008 813B8008 81478008 "
    "81578008 815F8008 81938008 81958008 81978008"
).split()

#: Repeats of fault codes (keys ``ascend:<CODE>``) that raise a chip's action
#: (:mod:`hetpatrol.actions.escalation`), each with its source.
FREQUENCY_RULES: tuple[FrequencyRule, ...] = (
    FrequencyRule(
        "ascend_twice_a_day",
        frozenset(f"ascend:{c}" for c in _ASCEND_TWICE_A_DAY),
        2,
        DAY,
        ISOLATE_CARD,
        source="MindCluster faultCustomization.json FaultFrequency: TimeWindow 86400, "
        "Times 2, ManuallySeparateNPU",
    ),
    FrequencyRule(
        "ascend_80E18005",
        frozenset({"ascend:80E18005"}),
        3,
        DAY,
        ISOLATE_CARD,
        source="MindCluster faultCustomization.json FaultFrequency: 80E18005, TimeWindow "
        "86400, Times 3, ManuallySeparateNPU",
    ),
    FrequencyRule(
        "ascend_81078603",
        frozenset({"ascend:81078603"}),
        5,
        DAY,
        ISOLATE_CARD,
        release_seconds=2 * DAY,
        source="MindCluster faultCustomization.json FaultFrequency: 81078603, TimeWindow "
        "86400, Times 5, ManuallySeparateNPU, ReleaseTimeWindow 172800",
    ),
)

#: Faults (keys ``ascend:<CODE>``, ``ascend_level:<level>``) that raise a chip's action
#: when they last, each with its source.
DURATION_RULES: tuple[DurationRule, ...] = (
    DurationRule(
        "ascend_81078603_lasting",
        frozenset({"ascend:81078603"}),
        20.0,
        ISOLATE_CARD,
        recover_seconds=60.0,
        source="MindCluster faultCustomization.json FaultDuration: 81078603, FaultTimeout "
        "20, RecoverTimeout 60, PreSeparateNPU",
    ),
    DurationRule(
        "ascend_restart_request_lasting",
        frozenset({"ascend_level:RestartRequest"}),
        60.0,
        ISOLATE_CARD,
        source="MindCluster fault levels (dlug_api_035): a RestartRequest fault that "
        "lasts more than 60 s isolates the processor",
    ),
)


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
    frequency_rules=FREQUENCY_RULES,
    duration_rules=DURATION_RULES,
)
