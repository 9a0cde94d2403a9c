"""``hetpatrol epilog``: after a job, one quick patrol of the cards it held.

Slurm runs ``Epilog=`` on the node when a job ends (as SlurmdUser, root); a non-zero exit
drains the node (slurm.conf(5), Epilog: "If the Epilog fails (returns a non-zero exit
code), this will result in the node being set to a DRAIN state"). A fault the job caused
(an XID in the kernel log, a GPU gone, rows to remap) is then seen before the next job
lands on that card, not up to one patrol interval later.

Steps, bounded by ``--timeout`` (a hard limit: hetpatrol running out of time lets the
node be, as the prolog does):

1. the job's cards: :func:`hetpatrol.slurm.jobguard.epilog_cards` on the daemon's state
   file (the environment's ``SLURM_JOB_GPUS`` / ``CUDA_VISIBLE_DEVICES`` /
   ``ASCEND_VISIBLE_DEVICES``, else Slurm's ``gres_detail`` of ``squeue --json``, never
   text a user chose);
2. one patrol of this node (every enabled collector, the kernel log within its window),
   without writing the daemon's JSONL log or state file;
3. each held card found again (by UUID, serial or bus id, else vendor/index/chip): its
   action (:func:`hetpatrol.actions.findings.card_action`). A card whose action is in
   ``--block-on`` (default: the drain actions) drains the node with hetpatrol's reason
   (``hetpatrol: reset_card nvidia/6 ...``) and exits 0 (a non-zero Epilog makes
   slurmctld replace that reason with "Epilog error"); when the drain cannot be set, it
   exits 1 and Slurm drains the node itself. A held card the patrol no longer lists is
   judged by the daemon's own rule for the same input (the ``card_missing`` finding of
   :func:`hetpatrol.patrol.cards_no_longer_listed`): ``reboot_node`` when the output is
   whole (it fell off the bus), ``watch`` when the collector's output was damaged (a
   garbled row, a tool error: no proof it is gone); a card whose collector did not
   answer ok is not judged. When the job's cards cannot be told (no ``SLURM_JOB_GPUS``,
   no IDX in the finished job's record), every card of the node is looked at.

No state file, no card of the job, nothing bad: exit 0. Held cards no collector read
(NVML absent, a vendor tool failing) are named with the collector's state and error, still
exit 0 and no drain. Prints one line.

Node findings of the patrol are not judged here: the Epilog's patrol is a single patrol,
the first of its own counts. In particular a card on the PCI bus that its tool does not
list (``pci_unwatched``, :mod:`hetpatrol.checks.pci_census`) is critical only after
``pci_census.unlisted_patrols`` patrols in a row of the daemon (one answer may be an
``nvidia-smi -r`` in progress); in this one patrol it is "1 of N", never a drain. Such a
card is no card the job held (its tool never listed it); a held card its tool stops
listing is the ``card_missing`` rule above.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hetpatrol.actions.apply import drain_reason
from hetpatrol.actions.findings import card_action
from hetpatrol.actions.vocabulary import (
    DEFAULT_DRAIN_ACTIONS,
    ActionVerdict,
    parse_action,
    worst_verdict,
)
from hetpatrol.collector import STATE_OK
from hetpatrol.exporters.state import STATE_SCHEMA_PREFIX
from hetpatrol.healthcheck import UntrustedStateFile, read_trusted_state
from hetpatrol.patrol import card_identities, card_missing_finding, cards_no_longer_listed
from hetpatrol.report import PatrolReport
from hetpatrol.schema import CardRecord
from hetpatrol.slurm.jobguard import (
    EXIT_FAIL,
    EXIT_PASS,
    card_name,
    epilog_cards,
    run_scontrol,
)

Patrol = Callable[[], "PatrolReport"]


def _record(card: Mapping[str, Any]) -> CardRecord:
    """The identity of a state file's card line, as a record (what names it)."""

    def text(key: str) -> str | None:
        value = card.get(key)
        return value if isinstance(value, str) and value else None

    index = card.get("index")
    chip = card.get("chip")
    return CardRecord(
        vendor=str(card.get("vendor")),
        index=index if isinstance(index, int) and not isinstance(index, bool) else -1,
        chip=chip if isinstance(chip, int) and not isinstance(chip, bool) else None,
        uuid=text("uuid"),
        serial=text("serial"),
        bus_id=text("bus_id"),
    )


def judge_held(
    held: Sequence[Mapping[str, Any]], report: PatrolReport, block_on: frozenset[str]
) -> tuple[list[tuple[str, ActionVerdict]], list[str]]:
    """(the held cards whose action is in ``block_on``, with it; the names of held cards
    the patrol read fine). ``report``: the Epilog's one patrol.

    The daemon's judgment, for the same input: a held card the patrol no longer lists is
    judged by the daemon's rule (:func:`hetpatrol.patrol.cards_no_longer_listed`, its
    ``card_missing`` finding: ``critical`` -> ``reboot_node``, ``unknown`` -> ``watch``
    when the collector's output was damaged, a garbled row or a tool error); a card
    whose collector did not answer ok this time is not judged; a card read again, by
    its findings' action."""
    bad: list[tuple[str, ActionVerdict]] = []
    fine: list[str] = []
    status = {c.name: c for c in report.collectors}
    for old in held:
        vendor = str(old.get("vendor"))
        collector = status.get(vendor)
        if collector is None or collector.state != STATE_OK:
            continue  # that vendor's collector read nothing this time: no verdict on it
        before = _record(old)
        records = [c for c in report.cards if c.vendor == vendor]
        gone = cards_no_longer_listed(records, [before])
        missing = card_missing_finding(vendor, gone, collector.error)
        if missing is not None:
            verdict = card_action([missing], levels=None)
        else:
            ids = set(card_identities(before))
            now = next((c for c in records if ids & set(card_identities(c))), None)
            if now is None:  # read without identity at its position (a garbled row)
                now = next(c for c in records if c.key == before.key)
            verdict = card_action(list(now.findings), levels=None)
        name = card_name(old)
        if verdict.action in block_on:
            bad.append((name, verdict))
        else:
            fine.append(name)
    return bad, fine


def _unread(held: Sequence[Mapping[str, Any]], report: PatrolReport, judged: set[str]) -> str:
    """The held cards not judged, each vendor's with its collector's state and error
    (``"nvidia/0, nvidia/1 (nvidia: error: NVML Shared Library Not Found)"``); "" when
    every held card was judged. Control characters of the tool's text are removed."""
    status = {c.name: c for c in report.collectors}
    by_vendor: dict[str, list[str]] = {}
    for card in held:
        name = card_name(card)
        if name not in judged:
            by_vendor.setdefault(str(card.get("vendor")), []).append(name)
    parts = []
    for vendor, names in by_vendor.items():
        c = status.get(vendor)
        why = "collector not run" if c is None else c.state + (f": {c.error}" if c.error else "")
        why = " ".join("".join(ch if ch.isprintable() else " " for ch in why).split())
        parts.append(f"{', '.join(names)} ({vendor}: {why[:160]})")
    return "; ".join(parts)


def run_epilog(
    env: Mapping[str, str],
    state_path: str | os.PathLike[str],
    patrol: Patrol,
    *,
    block_on: frozenset[str] = DEFAULT_DRAIN_ACTIONS,
    set_reason: bool = True,
    scontrol: str = "scontrol",
    timeout: float = 30.0,
    runner: Callable[[Sequence[str], float], str] = run_scontrol,
) -> tuple[int, str]:
    """(exit code, one line). ``patrol`` runs one patrol and returns its report.
    Never raises for what it reads; the caller bounds the whole run in time."""
    start = time.monotonic()
    try:
        doc = read_trusted_state(state_path, accept=STATE_SCHEMA_PREFIX)
    except FileNotFoundError:
        return EXIT_PASS, f"hetpatrol epilog: no state file {state_path}: nothing to check"
    except UntrustedStateFile as exc:
        return (
            EXIT_PASS,
            f"hetpatrol epilog: untrusted state file {state_path}: {exc}: nothing checked",
        )
    except (OSError, ValueError) as exc:
        return EXIT_PASS, f"hetpatrol epilog: cannot read {state_path}: {exc}: nothing checked"
    held, alloc = epilog_cards(
        env, doc, timeout=max(0.1, timeout / 3), runner=runner, scontrol=scontrol
    )
    note = ""
    cards = [c for c in doc.get("cards") or [] if isinstance(c, Mapping)]
    told = all(alloc.covers(str(c.get("gres") or "") or None, c.get("vendor")) for c in cards)
    if not held and told:
        return EXIT_PASS, "hetpatrol epilog: the job held no card of this node"
    if not held:
        # the job's cards cannot be told (no SLURM_JOB_GPUS, no IDX left in the finished
        # job's record): every card of the node is looked at, since the next job may
        # land on any of them
        held = cards
        why = "; ".join(alloc.errors) or "not in the environment nor in scontrol's record"
        note = f" (the job's cards unknown: {why}; every card looked at)"
        if not held:
            return EXIT_PASS, f"hetpatrol epilog: no card in the verdict{note}"
    report = patrol()
    bad, fine = judge_held(held, report, block_on)
    unread = _unread(held, report, {n for n, _ in bad} | set(fine))
    if not bad and not fine:
        # nothing read is no verdict: exit 0 and no drain (an absent NVML or a failing
        # npu-smi is the daemon's finding, not proof the job broke a card)
        return EXIT_PASS, f"hetpatrol epilog: no card of the job could be read: {unread}{note}"
    if unread:
        note += f"; not read: {unread}"
    if not bad:
        return EXIT_PASS, f"hetpatrol epilog: {', '.join(fine)} fine after the job{note}"
    where = ",".join(name for name, _ in bad)
    reason = drain_reason(where, worst_verdict(v for _, v in bad))
    node = env.get("SLURMD_NODENAME") or str(doc.get("node") or "")
    left = timeout - (time.monotonic() - start)
    if set_reason and node and left > 0.05:
        argv = [scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]
        try:
            runner(argv, left)
        except Exception as exc:  # noqa: BLE001 - exit 1: Slurm drains ("Epilog error")
            return EXIT_FAIL, reason + f" (reason not set: {type(exc).__name__})"
        # drained with hetpatrol's reason: exit 0, or slurmctld would replace that reason
        # with its own "Epilog error" (seen on slurmctld 22.05)
        return EXIT_PASS, reason
    return EXIT_FAIL, reason


def add_epilog_parser(sub: Any, patrol_factory: Callable[[Any], Patrol]) -> None:
    """Register ``hetpatrol epilog``; ``patrol_factory(args)`` gives the one patrol."""
    import argparse

    p = sub.add_parser(
        "epilog",
        help="Slurm Epilog: one quick patrol of the finished job's cards; exit 0 (a card "
        "needing an action drains with hetpatrol's reason), 1 when the reason could not be set",
        description=(
            "Slurm Epilog: after a job, one quick patrol of the cards it held. Exit 0 (a "
            "card needing a drain action drains the node with hetpatrol's reason); 1 when "
            'that reason could not be set (Slurm then drains the node: "Epilog error").'
        ),
    )
    p.add_argument("--config", type=Path, default=None, help="config file (default: bundled)")
    p.add_argument("--replay", type=Path, default=None, metavar="DIR", help="replay DIR")
    p.add_argument("--node", default=None, help="node name (overrides the config)")
    p.add_argument(
        "--state-path",
        default=os.environ.get("HETPATROL_STATE_PATH"),
        metavar="P",
        help="the daemon's state file (default: $HETPATROL_STATE_PATH)",
    )
    p.add_argument(
        "--block-on",
        default=",".join(sorted(DEFAULT_DRAIN_ACTIONS)),
        help="comma-separated action words that drain (default: %(default)s)",
    )
    p.add_argument("--timeout", type=float, default=30.0, metavar="S", help="hard limit")
    p.add_argument(
        "--scontrol",
        default="scontrol",
        help="scontrol (absolute in slurm.conf); squeue is run from its directory",
    )
    p.add_argument("--no-set-reason", action="store_true", help="leave Slurm's own reason")

    def cmd(args: argparse.Namespace) -> int:
        import signal

        if not args.state_path:
            p.error("--state-path (or HETPATROL_STATE_PATH) is required")
        try:
            block_on = frozenset(parse_action(w) for w in args.block_on.split(",") if w.strip())
        except ValueError as exc:
            p.error(f"--block-on: {exc}")

        def expire(_sig: int, _frame: object) -> None:
            raise TimeoutError

        old = signal.signal(signal.SIGALRM, expire)
        signal.alarm(max(1, int(args.timeout) + 1))
        try:
            code, line = run_epilog(
                os.environ,
                args.state_path,
                patrol_factory(args),
                block_on=block_on,
                set_reason=not args.no_set_reason,
                scontrol=args.scontrol,
                timeout=args.timeout,
            )
        except TimeoutError:
            code, line = EXIT_PASS, f"hetpatrol epilog: hard limit {args.timeout:g} s hit"
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        print(line.replace("\n", " "))
        return code

    p.set_defaults(func=cmd)
