"""The fixed action vocabulary: what an operator should do about a finding.

Operators act on "reset this GPU" or "take this card out", not on "critical". Every
finding gets exactly one of these words; a card's action is the highest of its
findings' actions, in this order (each word includes what the ones before it do for
the card)::

    none < watch < restart_job < reset_card < reboot_node < isolate_card < replace_card

=============  ==========================================================================
word           meaning (and the vendor words mapped to it)
=============  ==========================================================================
none           nothing to do: informational (NVIDIA ``IGNORE``, NVML recovery action
               ``NONE``, MindCluster ``NotHandleFault``).
watch          keep the card in service and look: a code hetpatrol does not know, a
               sub-health state (``SubHealthFault``), a threshold warning, a sympathetic
               XID whose primary carries the action. Never used to drain.
restart_job    the job that ran on the card must be restarted; the card stays in service
               (``RESTART_APP``, ``XID_154_EVAL`` without an XID 154, NVML ``DRAIN_P2P``,
               ``RestartRequest``, ``RestartBusiness``).
reset_card     drain the card's work and reset it (``nvidia-smi -r``, ``npu-smi set -t
               reset``): ``RESET_GPU``, ``WORKFLOW_XID_48``, NVML ``GPU_RESET``,
               ``DRAIN_AND_RESET``, ``BUS_RESET``, ``FreeRestartNPU``, ``RestartNPU``.
reboot_node    reboot the node (``RESTART_BM``, NVML ``NODE_REBOOT`` / ``SYSTEM_REBOOT``, a
               driver/library mismatch). Resets every card of the node.
isolate_card   take the card out of service until a person looked at it; it survives a
               reboot (``CONTACT_SUPPORT``, ``CHECK_MECHANICALS``, ``SeparateNPU``,
               ``PreSeparateNPU``, ``ManuallySeparateNPU``).
replace_card   the card is broken for good: RMA (row remapping failure, a repeated
               double-bit ECC error).
=============  ==========================================================================

Why seven words: they are the distinct things a site's automation or on-call person
does, from cheapest to dearest. ``isolate_card`` sits above ``reboot_node`` because a
reboot does not bring an isolated card back; ``replace_card`` is final.

Pure data and functions: no import beyond the standard library (the Slurm prolog
imports this module before every job).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

NONE = "none"
WATCH = "watch"
RESTART_JOB = "restart_job"
RESET_CARD = "reset_card"
REBOOT_NODE = "reboot_node"
ISOLATE_CARD = "isolate_card"
REPLACE_CARD = "replace_card"

#: every action word, lowest first (the order :func:`highest` uses)
ACTIONS: tuple[str, ...] = (
    NONE,
    WATCH,
    RESTART_JOB,
    RESET_CARD,
    REBOOT_NODE,
    ISOLATE_CARD,
    REPLACE_CARD,
)
_RANK = {a: i for i, a in enumerate(ACTIONS)}

#: one line per word, for ``--help``, the README and the Prometheus HELP text
MEANING: dict[str, str] = {
    NONE: "nothing to do (informational)",
    WATCH: "keep in service and look; unknown codes and warnings",
    RESTART_JOB: "restart the job that ran on the card; the card stays in service",
    RESET_CARD: "drain the card's work and reset the card",
    REBOOT_NODE: "reboot the node",
    ISOLATE_CARD: "take the card out of service until someone looked at it",
    REPLACE_CARD: "the card is broken for good: replace it (RMA)",
}

#: the actions the drain policy drains on by default (issue 13: "default: reset_card,
#: reboot_node, isolate_card, replace_card")
DEFAULT_DRAIN_ACTIONS: frozenset[str] = frozenset(
    {RESET_CARD, REBOOT_NODE, ISOLATE_CARD, REPLACE_CARD}
)


def is_action(word: object) -> bool:
    """True when ``word`` is one of :data:`ACTIONS` (exact, lower case)."""
    return isinstance(word, str) and word in _RANK


def rank(action: str) -> int:
    """Position of ``action`` in :data:`ACTIONS` (0 = none). Raises ValueError otherwise."""
    try:
        return _RANK[action]
    except (KeyError, TypeError):
        raise ValueError(f"not an action word: {action!r} (one of {', '.join(ACTIONS)})") from None


def highest(actions: Iterable[str], default: str = NONE) -> str:
    """The highest of ``actions`` (``default`` for none). A word outside the vocabulary
    raises ValueError: a typo must not silently rank as nothing."""
    best = default
    for a in actions:
        if rank(a) > rank(best):
            best = a
    return best


def parse_action(text: object) -> str:
    """A config value to an action word: case and ``-``/space folded (``Reset-Card`` ->
    ``reset_card``). Raises ValueError naming the allowed words."""
    if not isinstance(text, str):
        raise ValueError(f"an action must be a string, got {text!r}")
    word = text.strip().lower().replace("-", "_").replace(" ", "_")
    rank(word)
    return word


class ActionVerdict(NamedTuple):
    """One action with where it came from.

    ``action``: a word of :data:`ACTIONS`; ``source``: which table decided
    (``nvidia_xid``, ``nvml_recovery``, ``ascend_level``, ``finding``, ``override``,
    ``escalation``, ``unknown``); ``code``: the raw vendor code or check name it was
    looked up by (kept for unknown codes, so nothing is lost); ``reason``: one short
    human sentence (the vendor bucket or level, the rule). A NamedTuple, not a
    dataclass: ``dataclasses`` imports ``inspect``, milliseconds the prolog lacks.
    """

    action: str
    source: str
    code: str | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, str | None]:
        return {
            "action": self.action,
            "source": self.source,
            "code": self.code,
            "reason": self.reason,
        }


def worst_verdict(verdicts: Iterable[ActionVerdict], default: ActionVerdict | None = None):
    """The verdict with the highest action (the first of equals); ``default`` when
    ``verdicts`` is empty."""
    best = None
    for v in verdicts:
        if best is None or rank(v.action) > rank(best.action):
            best = v
    return default if best is None else best
