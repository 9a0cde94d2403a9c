"""Fabric: a GPU's registration with its NVLink fabric (NVSwitch systems: HGX/DGX
A100, H100, H200, B200; GB200/GB300 NVL), from the record's ``fabric`` (the NVIDIA
plugin reads ``nvmlDeviceGetGpuFabricInfoV``; a replay ``<fabric>`` of ``nvidia-smi -q
-x``).

Why: on an NVSwitch system the fabric manager trains the NVLinks and registers every
GPU with the fabric after each boot; "the CUDA initialization process can only begin
after the GPUs complete their registration process with the NVLink fabric", and an
application started before (or with the fabric manager not running) fails with
``cudaErrorSystemNotReady`` (CUDA error 802, "system not yet initialized"); "if a GPU
fails to register with the fabric, it will lose its NVLink peer-to-peer capability"
(NVIDIA Fabric Manager User Guide, docs.nvidia.com/datacenter/tesla/
fabric-manager-user-guide/, "NVSwitch and NVLink Initialization" and "GPU Fabric
Registration"). The GPU's other readings stay normal meanwhile (NVSentinel issue #883 /
#889: a fabric manager dead after maintenance for 20 days unnoticed, ``fabric.state``
"In Progress" throughout).

Findings (per card):

- ``fabric_not_ready``: the state is ``Not Started`` or ``In Progress`` (not
  ``Completed``);
- ``fabric_error``: ``Completed`` with a status other than ``Success``
  (``InsufficientResources``: Azure/azhpc-images PR #506; ``Unknown``:
  aws/eks-node-monitoring-agent issue #141);
- ``fabric_health``: a health summary ``Unhealthy`` or ``Limited Capacity`` (newer
  drivers; kubernetes-sigs/dra-driver-nvidia-gpu issue #626: Completed, Success and
  "Summary: Unhealthy").

A card whose state is ``Not Supported`` or not read (PCIe boards print ``N/A``; NVML
answers NotSupported) never gets one. The per-patrol judgement (:func:`evaluate`) is
at most ``warning``: one reading is never enough for critical. :class:`FabricWatch`,
run by the patrol after the judge, counts per card identity the consecutive patrols a
``fabric_not_ready`` / ``fabric_error`` was seen and raises it to its configured
severity once it held ``patrols`` patrols in a row after the post-boot grace
(``post_boot_grace_patrols`` of the card class, shared with the interconnect checks:
the fabric manager registers the GPUs while the links train). Within the grace it stays
a warning with "post-boot grace k of N" in its message.

Config (each profile and ``defaults``)::

    fabric:
      not_ready: critical   # severity once it lasts (null: off)
      error: critical
      health: warning
      patrols: 3            # consecutive patrols before not_ready / error take their severity
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetpatrol.actions.escalation import card_identity
from hetpatrol.checks.facts import CardFacts
from hetpatrol.config_file import SEVERITY_OR_OFF
from hetpatrol.schema import (
    _RANK,
    HEALTH_CRITICAL,
    HEALTH_WARNING,
    CardRecord,
    Finding,
    worst,
)

NAME = "fabric"
NOT_READY = "fabric_not_ready"
ERROR = "fabric_error"
HEALTH = "fabric_health"
#: the findings :class:`FabricWatch` raises once they last
LASTING = frozenset({NOT_READY, ERROR})
#: states that mean the card has no fabric to register with
NO_FABRIC = ("Not Supported",)
COMPLETED = "Completed"
#: health summaries that are a finding (NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
#: _LIMITED_CAPACITY)
BAD_HEALTH = ("Unhealthy", "Limited Capacity")
#: the interconnect checks' key (hetpatrol.checks.interconnect), read here as well
GRACE_KEY = "post_boot_grace_patrols"

PROFILE_SCHEMA: dict[str, Any] = {
    NAME: {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "not_ready": SEVERITY_OR_OFF,
            "error": SEVERITY_OR_OFF,
            "health": SEVERITY_OR_OFF,
            "patrols": {"type": "integer", "minimum": 1, "maximum": 10000},
        },
    }
}


@dataclass(frozen=True)
class FabricSettings:
    """One card class's fabric settings (see the module docstring)."""

    not_ready: str | None = HEALTH_CRITICAL
    error: str | None = HEALTH_CRITICAL
    health: str | None = HEALTH_WARNING
    patrols: int = 3
    #: the card class's post-boot grace (``post_boot_grace_patrols``, default 6)
    post_boot_grace_patrols: int = 6


def build_profile(
    defaults: Mapping[str, Any], profile: Mapping[str, Any] | None, where: tuple
) -> FabricSettings:
    """Settings of a profile: built-in < ``defaults`` < the profile."""
    values: dict[str, Any] = {}
    for section in (defaults or {}, profile or {}):
        values |= section.get(NAME) or {}
        if GRACE_KEY in section:
            values[GRACE_KEY] = int(section[GRACE_KEY])
    return FabricSettings(**values)


def _capped(severity: str) -> str:
    """``severity`` at most ``warning`` (one patrol's judgement)."""
    return severity if _RANK[severity] <= _RANK[HEALTH_WARNING] else HEALTH_WARNING


def evaluate(record: CardRecord, settings: FabricSettings, facts: CardFacts) -> list[Finding]:
    """This patrol's fabric findings of ``record``, each at most ``warning`` (see
    :class:`FabricWatch` for critical). None for a card without a fabric: ``fabric``
    null, its state null or ``Not Supported``."""
    fabric = record.fabric
    if not record.read_ok or not fabric:
        return []
    state = fabric.get("state")
    if state is None or state in NO_FABRIC:
        return []
    out: list[Finding] = []
    status = fabric.get("status")
    if state != COMPLETED and settings.not_ready is not None:
        out.append(
            Finding(
                NOT_READY,
                _capped(settings.not_ready),
                f"fabric registration {state} (not Completed): CUDA work on this GPU fails "
                "with cudaErrorSystemNotReady until the fabric manager has registered it; "
                "is nvidia-fabricmanager running?",
                value=state,
                threshold=COMPLETED,
            )
        )
    elif state == COMPLETED and status not in (None, "Success") and settings.error is not None:
        out.append(
            Finding(
                ERROR,
                _capped(settings.error),
                f"fabric registration completed with status {status} (Success expected): "
                f"the GPU has no working NVLink fabric (clique {fabric.get('clique_id')}, "
                f"cluster {fabric.get('cluster_uuid')})",
                value=status,
                threshold="Success",
            )
        )
    summary = fabric.get("health_summary")
    if summary in BAD_HEALTH and settings.health is not None:
        bandwidth = fabric.get("bandwidth")
        out.append(
            Finding(
                HEALTH,
                settings.health,
                f"fabric health {summary}"
                + (f" (bandwidth {bandwidth})" if bandwidth else "")
                + ": NVLink fabric degraded; see the fabric manager's log",
                value=summary,
                threshold="Healthy",
            )
        )
    return out


class FabricWatch:
    """Consecutive patrols of each card's ``fabric_not_ready`` / ``fabric_error``, by
    card identity (:func:`hetpatrol.actions.escalation.card_identity`), never position.

    :meth:`observe` is called once per patrol with the judged records, the config and
    ``boot_patrols(card)`` (the patrols of this boot as the card's checks saw them, 0:
    not counted): a finding that held ``patrols`` patrols in a row, outside the card
    class's post-boot grace, takes its configured severity (and the card's health is
    raised with it); a card read with a fabric state and neither finding starts again at
    0. The two count as one streak: a GPU going from ``In Progress`` to ``Completed``
    with an error (and back) has had no working fabric in any of those patrols. A card
    whose fabric was not read this patrol (the card or its fabric call failed: no
    ``fabric`` or no state) keeps its count, as one the patrol did not list does: an
    answer that is not there is no registration."""

    def __init__(self) -> None:
        #: card identity -> consecutive patrols a LASTING finding was seen
        self.seen: dict[str, int] = {}

    def observe(
        self, cards: Sequence[CardRecord], config: Any, boot_patrols: Callable[[CardRecord], int]
    ) -> None:
        listed = {card_identity(rec) for rec in cards}
        now = {k: v for k, v in self.seen.items() if k not in listed}  # not in this patrol
        for rec in cards:
            mine = [f for f in rec.findings if f.check in LASTING]
            fabric = rec.fabric if rec.read_ok else None
            if not mine:
                if (not fabric or fabric.get("state") is None) and card_identity(rec) in self.seen:
                    now[card_identity(rec)] = self.seen[card_identity(rec)]  # unknown: kept
                continue
            profile = config.profile_for(rec.vendor, rec.card_type, rec.model)
            settings = profile.checks.get(NAME)
            if settings is None:
                continue
            ident = card_identity(rec)
            patrols = boot_patrols(rec)
            grace = settings.post_boot_grace_patrols
            in_grace = 0 < patrols <= grace
            count = now[ident] = self.seen.get(ident, 0) + 1
            for f in mine:
                wanted = settings.not_ready if f.check == NOT_READY else settings.error
                if wanted is None or _RANK[wanted] <= _RANK[f.severity]:
                    continue
                if in_grace:
                    f.message += (
                        f" (post-boot grace {patrols} of {grace} patrols: the fabric manager "
                        f"registers the GPUs after a boot; {wanted} if it lasts)"
                    )
                elif count < settings.patrols:
                    f.message += (
                        f" ({count} of {settings.patrols} patrols in a row: {wanted} if it lasts)"
                    )
                else:
                    f.severity = wanted
                    f.message += f" (for {count} patrols in a row)"
                    rec.health = worst(rec.health, wanted)
        self.seen = now
