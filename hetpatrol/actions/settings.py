"""The ``actions:`` config section, as data: JSON schema, defaults and a parser.

Not yet wired into :mod:`hetpatrol.config` (the coordinator merges it)::

    actions:
      overrides:            # per code or check: an action word
        "xid:13": watch
        "ascend:80E18402": reset_card
        "check:temperature": watch
      drain_on: [reset_card, reboot_node, isolate_card, replace_card]
      escalation:           # each list replaces the default list when given
        frequency:
          - {name: xid48_repeat, keys: ["xid:48"], times: 2, window_seconds: 86400,
             action: replace_card}
        duration:
          - {name: collector_hung_lasting, keys: ["check:collector_hung"],
             fault_seconds: 600, recover_seconds: 0, action: reboot_node}
      prolog:
        block_on: [reset_card, reboot_node, isolate_card, replace_card]
        timeout_seconds: 5
      reboot_survival:      # the same critical fault on a card in reboots + 1 boots
        enabled: true       # -> replace_card (hetpatrol.actions.reboot_history)
        reboots: 2
        window_seconds: 2592000
      fault_events:         # card fault events with their jobs kept in the state file
        max_events: 100     # (hetpatrol.actions.fault_events)
        max_age_seconds: 604800

Override keys: ``xid:<number>``, ``ascend:<8 hex digits>``, ``kernel:<reason>``
(``fallen_off_bus``, ``reset_required``, ``rm_init_adapter_failed``),
``nvml_recovery:<value>``, ``check:<check name>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetpatrol.actions.escalation import EscalationRules, rules_from_config
from hetpatrol.actions.fault_events import FaultEventRule
from hetpatrol.actions.fault_events import rule_from_config as fault_rule_from_config
from hetpatrol.actions.reboot_history import SurvivalRule, rule_from_config
from hetpatrol.actions.vocabulary import ACTIONS, DEFAULT_DRAIN_ACTIONS, parse_action

_ACTION_ENUM = {"enum": list(ACTIONS)}
_KEY_RE = re.compile(
    r"^(xid:\d+|ascend:[0-9A-Fa-f]{8}|kernel:[a-z_]+|nvml_recovery:\d+|check:[a-z0-9_]+)$"
)

#: JSON schema of the section (merged into the config schema by the coordinator)
ACTIONS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "overrides": {
            "type": "object",
            "propertyNames": {"pattern": _KEY_RE.pattern},
            "additionalProperties": _ACTION_ENUM,
        },
        "drain_on": {"type": "array", "items": _ACTION_ENUM, "uniqueItems": True},
        "escalation": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "frequency": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "keys", "times", "window_seconds", "action"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "keys": {"type": "array", "items": {"type": "string"}},
                            "times": {"type": "integer", "minimum": 1},
                            "window_seconds": {"type": "number", "exclusiveMinimum": 0},
                            "release_seconds": {"type": ["number", "null"], "minimum": 0},
                            "action": _ACTION_ENUM,
                        },
                    },
                },
                "duration": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "keys", "fault_seconds", "action"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "keys": {"type": "array", "items": {"type": "string"}},
                            "fault_seconds": {"type": "number", "minimum": 0},
                            "recover_seconds": {"type": "number", "minimum": 0},
                            "action": _ACTION_ENUM,
                        },
                    },
                },
            },
        },
        "reboot_survival": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "enabled": {"type": "boolean"},
                "reboots": {"type": "integer", "minimum": 1, "maximum": 100},
                "window_seconds": {"type": "number", "exclusiveMinimum": 0},
            },
        },
        "fault_events": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_events": {"type": "integer", "minimum": 0, "maximum": 10000},
                "max_age_seconds": {"type": "number", "exclusiveMinimum": 0},
            },
        },
        "prolog": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "block_on": {"type": "array", "items": _ACTION_ENUM, "uniqueItems": True},
                "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 60},
            },
        },
    },
}


@dataclass(frozen=True)
class ActionSettings:
    """The parsed section. ``drain_on``/``block_on``: action words; ``overrides``: key ->
    action word; ``escalation``: the rule set; ``prolog_timeout_seconds``: hard limit;
    ``fault_events``: the bounds of the fault events kept in the state file."""

    overrides: Mapping[str, str] = field(default_factory=dict)
    drain_on: frozenset[str] = DEFAULT_DRAIN_ACTIONS
    block_on: frozenset[str] = DEFAULT_DRAIN_ACTIONS
    escalation: EscalationRules = field(default_factory=EscalationRules)
    prolog_timeout_seconds: float = 5.0
    reboot_survival: SurvivalRule = field(default_factory=SurvivalRule)
    #: the card fault events kept in the state file: how many, how old
    fault_events: FaultEventRule = field(default_factory=FaultEventRule)


def parse_actions_section(section: Mapping[str, Any] | None) -> ActionSettings:
    """Parse the ``actions:`` mapping (None = all defaults). Raises ValueError naming
    the bad key or value."""
    if not section:
        return ActionSettings()
    if not isinstance(section, Mapping):
        raise ValueError("actions: must be a mapping")
    unknown = set(section) - set(ACTIONS_SCHEMA["properties"])
    if unknown:
        raise ValueError(f"actions: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    overrides: dict[str, str] = {}
    for key, value in (section.get("overrides") or {}).items():
        text = str(key).strip()
        if not _KEY_RE.match(text):
            raise ValueError(
                f"actions.overrides: {key!r} is not xid:<n>, ascend:<8 hex>, kernel:<reason>, "
                "nvml_recovery:<n> or check:<name>"
            )
        if text.startswith("ascend:"):
            text = "ascend:" + text[len("ascend:") :].upper()
        try:
            overrides[text] = parse_action(value)
        except ValueError as exc:
            raise ValueError(f"actions.overrides.{key}: {exc}") from None

    def words(name: str, default: frozenset[str]) -> frozenset[str]:
        raw = section.get(name) if name != "block_on" else (section.get("prolog") or {}).get(name)
        if raw is None:
            return default
        try:
            return frozenset(parse_action(w) for w in raw)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"actions.{name}: {exc}") from None

    prolog = section.get("prolog") or {}
    timeout = float(prolog.get("timeout_seconds", 5.0))
    if not 0 < timeout <= 60:
        raise ValueError("actions.prolog.timeout_seconds must be in (0, 60]")
    return ActionSettings(
        overrides=overrides,
        drain_on=words("drain_on", DEFAULT_DRAIN_ACTIONS),
        block_on=words("block_on", DEFAULT_DRAIN_ACTIONS),
        escalation=rules_from_config(section.get("escalation")),
        prolog_timeout_seconds=timeout,
        reboot_survival=rule_from_config(section.get("reboot_survival")),
        fault_events=fault_rule_from_config(section.get("fault_events")),
    )
