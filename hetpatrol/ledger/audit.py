"""Can this Slurm meter each card type separately? A check of the configuration.

Rules, from slurm.conf(5) (Slurm 22.05, https://slurm.schedmd.com/slurm.conf.html):

* ``AccountingStorageTRES``: billing, cpu, energy, mem, node, fs/disk, pages and vmem are
  always tracked; a GRES only when listed. ``gres/gpu`` tracks allocated GPUs of any type;
  ``gres/gpu:tesla`` only the GPUs of that type. Without the typed name, Slurm keeps no
  per-type record (and ``GrpTRESMins=gres/gpu:tesla=...`` has nothing to count); without
  the untyped name, a request without a type "will be accounted for as either
  gres/gpu:tesla or gres/gpu:volta, although the accounting may not match the actual GPU
  type allocated". The TRES are set up at slurmctld start: a change needs a restart.
* ``TRESBillingWeights`` (per partition): without it a job is billed by its CPUs; a weight
  for ``GRES/gpu`` prices every GPU alike. Card types priced apart need
  ``GRES/gpu:a100=...`` entries (the weight is the site's choice; the line shows ``<w>``).

Input: the text of ``scontrol show config``, ``scontrol show node -o`` and ``scontrol
show partition -o``; output: :class:`Finding`\\ s with the exact line to put in slurm.conf.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hetpatrol.ledger.slurm_state import node_gres_types, parse_key_values, parse_partitions
from hetpatrol.ledger.tres import NOT_CARDS
from hetpatrol.slurm.gres import hostlist_contains

#: TRES Slurm always tracks (slurm.conf(5), AccountingStorageTRES)
DEFAULT_TRES = ("cpu", "mem", "energy", "node", "billing", "fs/disk", "vmem", "pages")


@dataclass(frozen=True)
class Finding:
    """``severity`` ``error`` (per-type metering impossible) or ``warning`` (metering works
    but prices or attributes card types wrongly); ``fix`` the slurm.conf line to use."""

    severity: str
    check: str
    message: str
    fix: str | None = None

    def to_dict(self) -> dict:
        return {
            "severity": self.severity,
            "check": self.check,
            "message": self.message,
            "fix": self.fix,
        }


def card_gres(node_gres: Mapping[str, Mapping[str, frozenset[str]]]) -> dict[str, set[str]]:
    """GRES name -> its types over all nodes, non-card GRES (gpumem, mps, ...) left out."""
    out: dict[str, set[str]] = {}
    for per in node_gres.values():
        for name, types in per.items():
            if name not in NOT_CARDS:
                out.setdefault(name, set()).update(types)
    return out


def audit(config_text: str, nodes_text: str, partitions_text: str = "") -> list[Finding]:
    """Findings for the cluster described by the three ``scontrol show`` outputs."""
    config = parse_key_values(config_text)
    node_gres = node_gres_types(nodes_text)
    gres = card_gres(node_gres)
    findings: list[Finding] = []
    raw = config.get("AccountingStorageTRES", "")
    tracked = [t.strip() for t in raw.split(",") if t.strip() and t.strip() != "(null)"]
    tracked_lc = {t.lower() for t in tracked}
    missing: list[str] = []
    for name in sorted(gres):
        if f"gres/{name}" not in tracked_lc:
            missing.append(f"gres/{name}")
        for gtype in sorted(gres[name]):
            if f"gres/{name}:{gtype}" not in tracked_lc:
                missing.append(f"gres/{name}:{gtype}")
    if missing:
        keep = [t for t in tracked if t.lower() not in DEFAULT_TRES]
        line = "AccountingStorageTRES=" + ",".join(keep + missing)
        typed_missing = [m for m in missing if ":" in m]
        untyped_missing = [m for m in missing if ":" not in m]
        if typed_missing:
            findings.append(
                Finding(
                    "error",
                    "accounting_storage_tres",
                    f"AccountingStorageTRES lacks {', '.join(typed_missing)}: Slurm keeps no "
                    "per-type record of these cards, so their time cannot be metered per "
                    "type from accounting (the ledger can only guess the type from the "
                    "node) and limits on them (GrpTRESMins=...) count nothing",
                    line + "   # in slurm.conf, then restart slurmctld",
                )
            )
        for untyped in untyped_missing:
            has_typed = any(t.startswith(untyped + ":") for t in tracked_lc)
            findings.append(
                Finding(
                    "warning" if has_typed else "error",
                    "accounting_storage_tres",
                    f"AccountingStorageTRES lacks {untyped}: "
                    + (
                        "a job that asks for these cards without a type is recorded under "
                        "one of the tracked types, which may not be the type it got"
                        if has_typed
                        else "no time of these cards is recorded at all"
                    ),
                    line + "   # in slurm.conf, then restart slurmctld",
                )
            )
    partitions = parse_partitions(partitions_text)
    for pname, fields in sorted(partitions.items()):
        pnodes = fields.get("Nodes", "")
        types: dict[str, set[str]] = {}
        for node, per in node_gres.items():
            if pnodes and hostlist_contains(pnodes, node):
                for name, ts in per.items():
                    if name not in NOT_CARDS:
                        types.setdefault(name, set()).update(ts)
        if not types:
            continue
        weights_raw = fields.get("TRESBillingWeights", "")
        weights = {w.partition("=")[0].strip().lower() for w in weights_raw.split(",") if "=" in w}
        unpriced = [
            f"GRES/{name}:{t}"
            for name in sorted(types)
            for t in sorted(types[name])
            if f"gres/{name}:{t}" not in weights
        ]
        if not unpriced:
            continue
        if not weights_raw:
            what = "has no TRESBillingWeights: jobs are billed by CPUs alone"
        else:
            what = f"TRESBillingWeights={weights_raw} does not weight {', '.join(unpriced)}"
        new = (
            ",".join([w for w in weights_raw.split(",") if w] or ["CPU=1.0"])
            + ","
            + ",".join(f"{u}=<w>" for u in unpriced)
        )
        findings.append(
            Finding(
                "warning",
                "tres_billing_weights",
                f"partition {pname} {what}; card types are not priced apart (fairshare and "
                "billing limits treat an hour of every card alike)",
                f'PartitionName={pname} ... TRESBillingWeights="{new}"   '
                "# <w>: the price of one card of that type, the site's choice",
            )
        )
    if not gres:
        findings.append(
            Finding("warning", "no_cards", "no node has a card GRES (scontrol show node)")
        )
    return findings


def exit_code(findings: list[Finding]) -> int:
    """0 nothing, 1 warnings only, 2 an error."""
    if any(f.severity == "error" for f in findings):
        return 2
    return 1 if findings else 0
