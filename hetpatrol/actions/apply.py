"""Putting it together for one patrol: findings -> actions, escalation in and out.

The functions the patrol / exporters call (the wiring is the coordinator's):

- :func:`state_keys`: the escalation keys a card's findings hold this patrol;
- :func:`judge_card`: one card's action (its findings' default actions with the config's
  overrides, raised by escalation), and the action of each finding;
- :func:`action_fields`: the flat fields a card line / finding dict carries
  (``action``, ``action_source``, ``action_code``, ``action_reason``);
- :func:`drain_reason`: ``hetpatrol: reset_card nvidia/3 xid 79 ...`` (the drain and
  prolog reason text).

Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from hetpatrol.actions import findings as finding_table
from hetpatrol.actions.vocabulary import NONE, ActionVerdict, worst_verdict

if TYPE_CHECKING:  # the prolog imports this module: no dataclasses on its path
    from hetpatrol.actions.escalation import Escalation

_QUIET = {"ok", "info"}
#: Slurm keeps a node reason of any length, but sinfo and scontrol show it on one line
REASON_MAX = 200


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def state_keys(findings: Iterable[Any], levels: Mapping[str, str]) -> set[str]:
    """Keys present on a card this patrol: ``check:<name>`` for each finding above
    ``info``; for a check whose plugin declares ``code_keys`` (``VendorInfo.actions``),
    the keys of each code in its ``value`` at any severity (Ascend's
    ``ascend_fault_code``: ``ascend:<CODE>`` and ``ascend_level:<level>``, as MindCluster
    counts every listed code)."""
    keys: set[str] = set()
    code_keys = None
    for f in findings:
        check = str(_get(f, "check") or "")
        severity = str(_get(f, "severity") or "")
        if severity not in _QUIET:
            keys.add(f"check:{check}")
        value = _get(f, "value")
        if check in finding_table.CHECK_ACTIONS or not isinstance(value, Mapping):
            continue
        if code_keys is None:
            code_keys = finding_table.vendor_tables().code_keys
        fn = code_keys.get(check)
        if fn is not None:
            for code in value:
                keys.update(fn(str(code), levels))
    return keys


def judge_card(
    findings: Iterable[Any],
    *,
    identity: str | None = None,
    escalation: Escalation | None = None,
    now: float | None = None,
    overrides: Mapping[str, str] | None = None,
    levels: Mapping[str, str] | None = None,
) -> tuple[ActionVerdict, list[ActionVerdict]]:
    """(the card's action, one action per finding in order).

    The card's action is the highest of its findings' actions and of the escalations in
    force for ``identity`` (when ``escalation`` and ``now`` are given; feed the
    escalation first: :meth:`Escalation.observe_present` with :func:`state_keys`, and
    :meth:`Escalation.observe_event` per kernel-log episode). ``levels``: the Ascend code
    table (default: the bundled one)."""
    items = list(findings)
    table = finding_table.bundled_levels() if levels is None else levels
    per = [finding_table.finding_action(f, levels=table, overrides=overrides) for f in items]
    raised: list[ActionVerdict] = []
    if escalation is not None and identity is not None and now is not None:
        raised = escalation.actions(identity, now)
    best = worst_verdict(per + raised, ActionVerdict(NONE, "finding", None, "no finding"))
    return best, per  # type: ignore[return-value]


def action_fields(verdict: ActionVerdict) -> dict[str, str | None]:
    """``{"action", "action_source", "action_code", "action_reason"}`` for a record."""
    return {
        "action": verdict.action,
        "action_source": verdict.source,
        "action_code": verdict.code,
        "action_reason": verdict.reason,
    }


def drain_reason(where: str, verdict: ActionVerdict, detail: str = "") -> str:
    """``hetpatrol: <action> <where> <code> <detail or reason>`` on one line, at most
    :data:`REASON_MAX` characters: ``hetpatrol: reset_card nvidia/3 xid 79 ...``.
    Whitespace runs and non-printable characters (control, format and bidi characters)
    become one space."""
    code = verdict.code or ""
    # "xid:79" reads "xid 79"; a check's code is its name alone ("check:" says nothing)
    code = code.removeprefix("check:").replace(":", " ", 1)
    text = " ".join(
        p for p in ("hetpatrol:", verdict.action, where, code, detail or verdict.reason) if p
    )
    # one line of printable text: the root drain helper refuses any argument with a
    # character str.isprintable() refuses (ESC, DEL, C1, bidi controls; slurmctld would
    # store and print it raw), so a vendor's text with one must not block the drain
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def kernel_event_key(xid: int | None, reason: str | None) -> str:
    """The escalation key of one kernel-log event: ``xid:<n>`` or ``kernel:<reason>``."""
    return f"xid:{xid}" if xid is not None else f"kernel:{reason}"


def action_counts(actions: Iterable[str]) -> dict[str, int]:
    """How many cards have each action word, every word present (0 included): the
    low-cardinality node gauge ``hetpatrol_cards_by_action{action=...}``. A word outside
    the vocabulary raises ValueError."""
    from hetpatrol.actions.vocabulary import ACTIONS, rank

    counts = dict.fromkeys(ACTIONS, 0)
    for a in actions:
        rank(a)
        counts[a] += 1
    return counts
