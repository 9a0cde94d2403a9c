"""Which Slurm node states hetpatrol may drain or resume a node in.

``scontrol show node`` prints ``State=<BASE>[+<FLAG>...]``: the base state and the flag
names come from Slurm's own tables (``node_states[]`` and ``node_state_flags[]`` in
``src/common/slurm_protocol_defs.c``, bits in ``slurm/slurm.h``, SchedMD/slurm tag
``slurm-22-05-11-1``; ``State=`` is ``node_state_string_complete()`` in
``src/api/node_info.c``). A flag bit that Slurm's table does not name prints as ``?``.

The decision is per base state and per flag, for each action (drain, resume); a node is
acted on only when its base state *and every one* of its flags allow the action. A base
state or flag not in these tables (a newer Slurm, a ``?``) is never acted on: the caller
says so once (the event's ``detail``). The same table is in docs/slurm.md ("Slurm node
states") and is used by the daemon (:mod:`hetpatrol.slurm.drain`) and by the root helper
(:mod:`hetpatrol.scontrol_helper`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetpatrol.slurm.gres import NodeInfo

DRAIN = "drain"
RESUME = "resume"

#: Every reason hetpatrol sets starts with this; a reason that does not is someone else's.
REASON_PREFIX = "hetpatrol:"


def ours(reason: str | None) -> bool:
    """True when a Slurm reason was set by hetpatrol."""
    return reason is not None and reason.startswith(REASON_PREFIX)


def foreign_reason(info: NodeInfo) -> str | None:
    """Why the node's reason is not hetpatrol's to replace or clear; None when it is ours
    or the node has neither a reason nor the DRAIN flag.

    A DRAIN flag without a reason is someone else's drain too: once drained with our
    reason it would read as ours, and be resumed.
    """
    if info.reason is not None and not ours(info.reason):
        by = f" by {info.reason_user}" if info.reason_user else ""
        return f"node already has a reason set{by}: {info.reason!r}; left untouched"
    if info.reason is None and info.drained:
        return "node is drained without a reason, so not by hetpatrol; left untouched"
    return None


@dataclass(frozen=True)
class StateRule:
    """May hetpatrol drain / resume a node in this base state or with this flag, and why."""

    drain: bool
    resume: bool
    why: str


#: Base states (``NODE_STATE_BASE`` values, slurm.h 22.05; ``INVALID`` is what
#: ``node_state_base_string()`` prints for a value outside the table).
BASE_STATES: dict[str, StateRule] = {
    "IDLE": StateRule(True, True, "up, no jobs"),
    "MIXED": StateRule(True, True, "up, some CPUs allocated"),
    "ALLOCATED": StateRule(True, True, "up, fully allocated"),
    "DOWN": StateRule(False, False, "down: Slurm or an admin took it out, with its reason"),
    "ERROR": StateRule(False, False, "unused by Slurm (kept for old plugins)"),
    "FUTURE": StateRule(False, False, "not yet in service"),
    "UNKNOWN": StateRule(False, False, "slurmctld has not heard from slurmd yet"),
    "INVALID": StateRule(False, False, "a base state Slurm itself does not name"),
}

#: State flags (``node_state_flags[]``, slurm_protocol_defs.c 22.05, names as printed).
FLAGS: dict[str, StateRule] = {
    "DRAIN": StateRule(True, True, "drained or draining (whose: the reason says)"),
    "COMPLETING": StateRule(True, True, "jobs finishing; a drain lets them finish"),
    "PLANNED": StateRule(True, True, "the backfill scheduler plans a job here"),
    "CLOUD": StateRule(True, True, "a cloud node (power states are flags of their own)"),
    "DYNAMIC_NORM": StateRule(True, True, "a dynamic node registered by slurmd -Z"),
    "PERFCTRS": StateRule(True, True, "a job uses the network performance counters"),
    "RESERVED": StateRule(False, False, "in an advanced reservation: its owner decides"),
    "MAINTENANCE": StateRule(False, False, "in a maintenance reservation"),
    "FAIL": StateRule(False, False, "set failing by an admin"),
    "NOT_RESPONDING": StateRule(False, False, "slurmd not responding: Slurm acts itself"),
    "INVALID_REG": StateRule(False, False, "slurmd registration refused by slurmctld"),
    "REBOOT_REQUESTED": StateRule(False, False, "a reboot is pending"),
    "REBOOT_ISSUED": StateRule(False, False, "rebooting"),
    "POWERED_DOWN": StateRule(False, False, "power saving: off"),
    "POWERING_UP": StateRule(False, False, "power saving: booting"),
    "POWERING_DOWN": StateRule(False, False, "power saving: shutting down"),
    "POWER_DOWN": StateRule(False, False, "an admin asked for power down"),
    "POWER_UP": StateRule(False, False, "an admin asked for power up"),
    "DYNAMIC_FUTURE": StateRule(False, False, "a dynamic node not yet registered"),
    "RESUME": StateRule(False, False, "a resume in progress"),
    # not in 22.05's table: later releases (slurm.h on master) name these bits
    "POWER_DRAIN": StateRule(False, False, "power down as soon as jobs end (newer Slurm)"),
    "REBOOT_CANCEL": StateRule(False, False, "a reboot being cancelled (newer Slurm)"),
    "BLOCKED": StateRule(False, False, "blocked by an exclusive topology job (newer Slurm)"),
}


def may(info: NodeInfo, action: str) -> str | None:
    """None when hetpatrol may ``action`` (:data:`DRAIN` or :data:`RESUME`) ``info``,
    else why not: the base state or flags that forbid it, and those it does not know."""
    base = info.base_state
    words = [base, *sorted(info.flags)]
    unknown = [w for w in words[:1] if w not in BASE_STATES]
    unknown += [f for f in words[1:] if f not in FLAGS]
    rules = [BASE_STATES.get(base)] + [FLAGS.get(f) for f in words[1:]]
    refused = [
        w for w, r in zip(words, rules, strict=True) if r is not None and not getattr(r, action)
    ]
    if not unknown and not refused:
        return None
    why = []
    if refused:
        why.append("no " + action + " in " + "/".join(refused))
    if unknown:
        why.append("unknown to hetpatrol: " + "/".join(unknown))
    return f"Slurm state {info.state or '(none)'} is not one hetpatrol acts on ({'; '.join(why)})"


#: What slurmctld appends to the reason of a node rebooted with ``nextstate=DOWN`` once
#: it registers after the reboot (scontrol(1), ``reboot``: 'The reason will be appended
#: with: "reboot issued" when the reboot is issued; "reboot complete" when the node
#: registers and has a "nextstate" of "DOWN"'; seen on slurmctld 22.05.8 as
#: ``<reason> : reboot issued : reboot complete``).
REBOOT_COMPLETE = ": reboot complete"


def rebooted_by_us(info: NodeInfo) -> str | None:
    """None when the node is DOWN after a reboot hetpatrol asked for and Slurm has said
    it is complete (``DOWN``, no flag, our reason ending in :data:`REBOOT_COMPLETE`):
    the one DOWN node hetpatrol may bring back (``State=RESUME``). Else why not."""
    if not ours(info.reason):
        return f"reason {info.reason!r} is not hetpatrol's"
    if info.base_state != "DOWN" or info.flags:
        return f"Slurm state {info.state} is not DOWN after a completed reboot"
    if not (info.reason or "").endswith(REBOOT_COMPLETE):
        return f"Slurm has not said the reboot is complete (reason {info.reason!r})"
    return None
