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
   judged by the daemon's own rule for the same input (:func:`card_missing_verdict`, the
   ``card_missing`` rule of :func:`hetpatrol.patrol.missing_verdicts`), see below; a card
   whose collector did not answer ok is not judged. When the job's cards cannot be told
   (no ``SLURM_JOB_GPUS``, no IDX in the finished job's record), every card of the node
   is looked at.

A held card no longer listed. The Epilog's patrol is one patrol, and one short list is
no proof a card is gone (a card reset or a driver reload in progress, a partial answer):
the daemon makes it critical only after ``missing_patrols`` (3) patrols in a row or with
a second, independent signal about the same card. The Epilog decides the same way, from
what it has: the daemon's count for that card in the state file (``boot.missing_cards``,
only when the state file's boot is this patrol's boot and its verdict fresh, of a daemon
that did not mark its stop: a count frozen hours ago is no patrols in a row with this
read; a card the daemon already counts
as gone is looked at as held too) plus its own read, which is one more patrol; or the
corroboration (:func:`hetpatrol.patrol.missing_evidence`) of its own patrol: the kernel
log's off-the-bus event (XID 79, "fallen off the bus") on the card's bus id in this boot
(its own read of the log and the daemon's ``boot.off_bus``), or its own PCI census
without the card's bus id. Either way ``reboot_node`` (a drain); else ``watch``, no
drain: the daemon's patrols go on counting and drain when the rule says. A damaged
output of the collector (a garbled row, a tool error: no proof it is gone) is ``watch``.

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
from dataclasses import dataclass
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
from hetpatrol.healthcheck import (
    UntrustedStateFile,
    read_trusted_state,
    stopped_mark,
    verdict_age,
)
from hetpatrol.patrol import (
    card_identities,
    card_missing_finding,
    cards_no_longer_listed,
    missing_evidence,
    missing_key,
    missing_verdicts,
)
from hetpatrol.report import PatrolReport
from hetpatrol.schema import CardRecord
from hetpatrol.slurm.jobguard import (
    EXIT_FAIL,
    EXIT_PASS,
    _seconds,
    card_name,
    epilog_cards,
    run_scontrol,
)

Patrol = Callable[[], "PatrolReport"]


@dataclass(frozen=True)
class EpilogPatrol:
    """What ``hetpatrol epilog``'s command runs: ``run`` (the one patrol) and
    ``missing_patrols()``, the config's ``missing_patrols`` (the count a held card no
    longer listed needs before it is critical), asked after ``run``."""

    run: Patrol
    missing_patrols: Callable[[], int] = lambda: 3


def _same_boot(doc: Mapping[str, Any], report: PatrolReport) -> Mapping[str, Any]:
    """The state file's ``boot`` object when it names the boot the Epilog's patrol ran
    in (both boot ids read and equal), else ``{}``: another boot's counts say nothing
    of this one."""
    mine = (report.node_checks or {}).get("boot")
    theirs = doc.get("boot")
    if not isinstance(mine, Mapping) or not isinstance(theirs, Mapping):
        return {}
    if mine.get("boot_id") is None or mine.get("boot_id") != theirs.get("boot_id"):
        return {}
    return theirs


def _counting(doc: Mapping[str, Any]) -> bool:
    """Whether the daemon's counts in ``doc`` run up to the Epilog's read: a verdict
    ``hetpatrol check`` calls fresh (:func:`hetpatrol.healthcheck.verdict_age`, on this
    boot's clock) of a daemon that did not mark its stop. A count frozen in the state
    file of a daemon stopped or dead hours ago is no patrols "in a row" with this read:
    before, 2 such patrols plus the Epilog's one short list (a card reset in a
    maintenance while the daemon was stopped) drained the node."""
    if stopped_mark(doc) is not None:
        return False
    _age, stale = verdict_age(doc)
    return not stale


def card_missing_verdict(
    vendor: str,
    before: CardRecord,
    error: str | None,
    report: PatrolReport,
    doc: Mapping[str, Any],
    missing_patrols: int = 3,
) -> tuple[ActionVerdict, str]:
    """(the action, the rule's words: ``"1 of 3 patrols"``) for a held card ``before``
    that the Epilog's patrol ``report`` no longer lists (see the module docstring):
    ``reboot_node`` when the daemon's count in the state file ``doc`` (same boot, a
    fresh verdict of a running daemon: :func:`_counting`) plus this patrol reaches
    ``missing_patrols``, or when this patrol's kernel log (with the
    daemon's ``boot.off_bus``) or PCI census corroborates it; ``watch`` otherwise and
    for a damaged output (``error``)."""
    boot = _same_boot(doc, report)
    key = missing_key(before)
    entry = (boot.get("missing_cards") or {}).get(key) if _counting(doc) else None
    daemon = entry.get("patrols") if isinstance(entry, Mapping) else None
    count = (daemon if isinstance(daemon, int) and not isinstance(daemon, bool) else 0) + 1
    off_bus: dict[str, str] = {}
    for source in (
        boot.get("off_bus"),
        ((report.node_checks or {}).get("boot") or {}).get("off_bus"),
    ):
        if isinstance(source, Mapping):
            off_bus.update({str(k): v for k, v in source.items() if isinstance(v, str)})
    why = missing_evidence(before, report.census, off_bus)
    evidence = {key: why} if why is not None else None
    missing = card_missing_finding(
        vendor, [before], error, patrols=missing_patrols, counts={key: count}, evidence=evidence
    )
    assert missing is not None
    (verdict,) = missing_verdicts(
        [before], error, patrols=missing_patrols, counts={key: count}, evidence=evidence
    )
    return card_action([missing], levels=None), verdict.note


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
    held: Sequence[Mapping[str, Any]],
    report: PatrolReport,
    block_on: frozenset[str],
    doc: Mapping[str, Any] | None = None,
    missing_patrols: int = 3,
) -> tuple[list[tuple[str, ActionVerdict]], list[str], list[str]]:
    """(the held cards whose action is in ``block_on``, with it; the names of held cards
    the patrol read fine; the held cards no longer listed that do not drain yet, each
    named with the rule's words: ``"nvidia/3 no longer listed (1 of 3 patrols;
    watch)"``). ``report``: the Epilog's one patrol; ``doc``: the daemon's state file.

    The daemon's judgment, for the same input: a held card the patrol no longer lists
    (:func:`hetpatrol.patrol.cards_no_longer_listed`) is judged by the daemon's
    ``card_missing`` rule, :func:`card_missing_verdict` (``reboot_node`` at
    ``missing_patrols`` patrols with the daemon's count, or corroborated; else
    ``watch``, and ``watch`` when the collector's output was damaged, a garbled row or a
    tool error); a card whose collector did not answer ok this time is not judged; a
    card read again, by its findings' action."""
    bad: list[tuple[str, ActionVerdict]] = []
    fine: list[str] = []
    watched: list[str] = []
    status = {c.name: c for c in report.collectors}
    for old in held:
        vendor = str(old.get("vendor"))
        collector = status.get(vendor)
        if collector is None or collector.state != STATE_OK:
            continue  # that vendor's collector read nothing this time: no verdict on it
        before = _record(old)
        records = [c for c in report.cards if c.vendor == vendor]
        gone = cards_no_longer_listed(records, [before])
        name = card_name(old)
        if gone:
            verdict, words = card_missing_verdict(
                vendor, before, collector.error, report, doc or {}, missing_patrols
            )
            if verdict.action not in block_on:
                watched.append(f"{name} no longer listed ({words.strip('()')}; {verdict.action})")
                continue
        else:
            ids = set(card_identities(before))
            now = next((c for c in records if ids & set(card_identities(c))), None)
            if now is None:  # read without identity at its position (a garbled row)
                now = next(c for c in records if c.key == before.key)
            verdict = card_action(list(now.findings), levels=None)
        if verdict.action in block_on:
            bad.append((name, verdict))
        else:
            fine.append(name)
    return bad, fine, watched


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
    missing_patrols: int | Callable[[], int] = 3,
) -> tuple[int, str]:
    """(exit code, one line). ``patrol`` runs one patrol and returns its report;
    ``missing_patrols``: the config's (see :func:`card_missing_verdict`), or a function
    that gives it once the patrol ran.
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
    cards = [c for c in doc.get("cards") or [] if isinstance(c, Mapping)]
    # the cards the daemon counts as gone (their count goes on here) are candidates too
    boot = doc.get("boot") if isinstance(doc.get("boot"), Mapping) else {}
    missing = boot.get("missing_cards") if isinstance(boot.get("missing_cards"), Mapping) else {}
    known = {i for c in cards for i in card_identities(_record(c))}
    for entry in missing.values():
        if isinstance(entry, Mapping) and not known & set(card_identities(_record(entry))):
            cards.append(entry)
    held, alloc = epilog_cards(
        env,
        {**doc, "cards": cards},
        timeout=max(0.1, timeout / 3),
        runner=runner,
        scontrol=scontrol,
    )
    note = ""
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
    need = missing_patrols() if callable(missing_patrols) else missing_patrols
    bad, fine, watched = judge_held(held, report, block_on, doc, need)
    unread = _unread(
        held, report, {n for n, _ in bad} | set(fine) | {w.split(" ", 1)[0] for w in watched}
    )
    if watched:
        note += "; " + ", ".join(watched) + ": not drained"
    if not bad and not fine and not watched:
        # nothing read is no verdict: exit 0 and no drain (an absent NVML or a failing
        # npu-smi is the daemon's finding, not proof the job broke a card)
        return EXIT_PASS, f"hetpatrol epilog: no card of the job could be read: {unread}{note}"
    if unread:
        note += f"; not read: {unread}"
    if not bad:
        said = f"{', '.join(fine)} fine after the job" if fine else "no card to drain for"
        return EXIT_PASS, f"hetpatrol epilog: {said}{note}"
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


def add_epilog_parser(sub: Any, patrol_factory: Callable[[Any], EpilogPatrol]) -> None:
    """Register ``hetpatrol epilog``; ``patrol_factory(args)`` gives the one patrol and
    the config's ``missing_patrols`` (an :class:`EpilogPatrol`)."""
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
    p.add_argument(
        "--timeout",
        type=_seconds,  # the prolog's: inf and nan were a traceback (exit 1: "Epilog error")
        default=30.0,
        metavar="S",
        help="hard time limit in seconds (default: %(default)g); past it exit 0, no drain",
    )
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
            epilog_patrol = patrol_factory(args)
            code, line = run_epilog(
                os.environ,
                args.state_path,
                epilog_patrol.run,
                missing_patrols=epilog_patrol.missing_patrols,
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
