"""The job-start guard's logic (``hetpatrol prolog``): may this job start on its cards?

Slurm runs ``Prolog=`` on the compute node before every job (as SlurmdUser, normally
root); a non-zero exit drains the node and requeues the job. So this must be fast and
must never hang: it reads the running daemon's last verdict (the state file that
:mod:`hetpatrol.exporters.state` writes atomically after every patrol), finds the cards
allocated to the job, and fails only when

- the verdict is missing, unreadable or stale (same limit as ``hetpatrol check``:
  3 patrol intervals + 10 s unless ``max_age`` is given; a patrol time more than 300 s
  in the future is not trusted), unless the daemon marked it ``stopped`` (a clean stop:
  then its age fails no job, and a verdict of an earlier boot lets every job through),
  or
- an allocated card's action is in ``block_on`` (default: reset_card, reboot_node,
  isolate_card, replace_card), or any card or node finding says ``reboot_node`` and the
  job holds at least one card of the node.

Which cards (Slurm facts, checked in slurm.conf(5) of Slurm 22.05, section "Prolog and
Epilog Scripts", and in recorded outputs, fixtures/slurm):

- ``SLURM_JOB_GPUS``: "The GPU IDs of GPUs in the job allocation (if any). Available in
  the Prolog and Epilog" -- the GRES index (IDX) of the ``gpu`` GRES. ``SLURM_STEP_GPUS``
  (task environment) is the same for a step. ``CUDA_VISIBLE_DEVICES`` is not set in the
  Prolog; in a step it may be renumbered by cgroup device constraints, so its numbers are
  used only when neither Slurm variable is there (UUID entries ``GPU-...`` are exact).
- Ascend: ``ASCEND_VISIBLE_DEVICES`` (Ascend Docker Runtime, device IDs) or
  ``ASCEND_RT_VISIBLE_DEVICES`` (the CANN runtime's visible logical devices).
- Any vendor's GRES: ``squeue --json`` (Slurm 21.08 and later; 22.05 lists every job,
  squeue(1): "All other formatting and filtering arguments will be ignored"): the job's
  record (by ``job_id``), its ``gres_detail`` list (one string per host,
  ``gpu:a100:2(IDX:0-1),ascend:910b:1(IDX:3)``) paired with its hosts
  (``job_resources``), see :func:`parse_squeue_json`. It is run only when a card with a
  blocking action has a GRES the environment did not cover. The text of
  ``scontrol show job -d`` is never read: a job name, comment or work directory is free
  text that can hold ``Nodes=<node> GRES=...(IDX:3)``, even a newline and a whole forged
  detail line, indistinguishable from Slurm's own (seen on slurmctld 22.05; a user could
  drain any node through the Prolog). Without ``--json`` (older Slurm) the job's other
  GRES are unknown: the job is let through, said in the line.

IDX -> card: Slurm numbers the devices of one GRES name on a node 0, 1, ... in gres.conf
``File=`` order (or the order AutoDetect found them); hetpatrol takes the cards of that
GRES name in (index, chip) order, which is the same order when ``File=/dev/nvidia[0-7]``
follows the NVML index (the usual case) and, for Ascend, ``/dev/davinci[0-7]`` the NPU
ID. An IDX with no card is reported, never a reason to fail (a mapping fault must not
drain a cluster).

Nothing here imports yaml, jsonschema, prometheus_client or pynvml. A state file whose
cards or findings lack the daemon's ``action`` (none the daemon writes) makes the
vendors' fault tables load, with their plugins (``VendorInfo.actions``).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from hetpatrol.actions.apply import drain_reason
from hetpatrol.actions.findings import card_action, finding_action, why_text
from hetpatrol.actions.vocabulary import (
    DEFAULT_DRAIN_ACTIONS,
    REBOOT_NODE,
    ActionVerdict,
    is_action,
)
from hetpatrol.exporters.state import STATE_SCHEMA_PREFIX, boot_clock
from hetpatrol.healthcheck import (
    UntrustedStateFile,
    boot_age,
    read_trusted_state,
    stale_limit,
    stopped_mark,
    utc_text,
    verdict_age,
)

EXIT_PASS = 0
EXIT_FAIL = 1

GPU_GRES = "gpu"
ASCEND = "ascend"


# ------------------------------------------------------------------- allocation
def parse_index_list(text: str | None) -> frozenset[int] | None:
    """``0,1`` / ``0-3,7`` -> the numbers; ``""``, ``N/A``, ``(null)`` -> empty; None when
    the text is something else (a UUID list, garbage)."""
    if text is None:
        return None
    body = text.strip()
    if body.lower() in ("", "n/a", "(null)", "none", "nodevfiles"):
        return frozenset()
    out: set[int] = set()
    for part in body.split(","):
        part = part.strip()
        # ASCII digits only: "١" (Arabic-Indic one) is no GPU index
        m = re.fullmatch(r"([0-9]{1,6})(?:-([0-9]{1,6}))?", part)
        if not m:
            return None
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo or hi - lo > 4096:
            return None
        out.update(range(lo, hi + 1))
    return frozenset(out)


class Allocation(NamedTuple):
    """The cards of one job on this node, as Slurm names them.

    ``by_gres``: GRES name (lower case) -> IDX numbers; ``uuids``: GPU UUIDs
    (lower case); ``ascend_ids``: Ascend device IDs; ``sources``: where each part came
    from (``SLURM_JOB_GPUS``, ``scontrol`` ...); ``errors``: text that could not be read.
    """

    by_gres: Mapping[str, frozenset[int]] = {}  # never mutated
    uuids: frozenset[str] = frozenset()
    ascend_ids: frozenset[int] | None = None
    sources: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not any(self.by_gres.values()) and not self.uuids and not self.ascend_ids

    def covers(self, gres: str | None, vendor: str | None) -> bool:
        """True when this allocation says which cards of ``gres`` / ``vendor`` the job
        has (even "none")."""
        if gres and gres.lower() in self.by_gres:
            return True
        if vendor == ASCEND and self.ascend_ids is not None:
            return True
        return vendor == "nvidia" and bool(self.uuids)

    def merged(self, other: Allocation) -> Allocation:
        """This allocation with ``other``'s GRES names added (this one wins per name)."""
        by = dict(other.by_gres)
        by.update(self.by_gres)
        return Allocation(
            by,
            self.uuids | other.uuids,
            self.ascend_ids if self.ascend_ids is not None else other.ascend_ids,
            self.sources + other.sources,
            self.errors + other.errors,
        )


def parse_job_env(env: Mapping[str, str]) -> Allocation:
    """The job's cards from the Prolog / Epilog / task environment (see the module
    docstring for which variable wins). Never raises; unreadable values go to
    ``errors``."""
    by: dict[str, frozenset[int]] = {}
    uuids: set[str] = set()
    ascend: frozenset[int] | None = None
    sources: list[str] = []
    errors: list[str] = []
    for name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        if name in env:
            idx = parse_index_list(env[name])
            if idx is None:
                errors.append(f"{name}={env[name][:80]!r} is not a list of GPU IDs")
                continue
            by[GPU_GRES] = idx
            sources.append(name)
            break
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        items = [i.strip() for i in cvd.split(",") if i.strip()]
        found = [i for i in items if i.upper().startswith(("GPU-", "MIG-"))]
        if found:
            uuids.update(i.lower() for i in found)
            sources.append("CUDA_VISIBLE_DEVICES")
        elif GPU_GRES not in by:
            idx = parse_index_list(cvd)
            if idx is None:
                errors.append(f"CUDA_VISIBLE_DEVICES={cvd[:80]!r} is not readable")
            else:
                by[GPU_GRES] = idx
                sources.append("CUDA_VISIBLE_DEVICES")
    for name in ("ASCEND_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"):
        if name in env:
            idx = parse_index_list(env[name])
            if idx is None:
                errors.append(f"{name}={env[name][:80]!r} is not a list of device IDs")
                continue
            ascend = idx
            sources.append(name)
            break
    return Allocation(by, frozenset(uuids), ascend, tuple(sources), tuple(errors))


_IDX_RE = re.compile(r"\(IDX:(?P<idx>[^)]*)\)")
#: most bytes of ``squeue --json`` looked at (22.05 lists every job of the cluster)
SQUEUE_JSON_MAX = 64 * 1024 * 1024


def squeue_argv(scontrol: str) -> list[str]:
    """``squeue --json`` beside ``scontrol`` (same directory when it is a path)."""
    head, sep, _tail = scontrol.rpartition("/")
    return [f"{head}{sep}squeue" if sep else "squeue", "--json"]


def _job_nodes(record: Mapping[str, Any]) -> list[str]:
    """The job's hosts in Slurm's order of ``gres_detail``: Slurm pairs
    ``gres_detail_str[i]`` with the i-th host of ``job_resrcs->nodes``
    (``hostlist_shift`` in ``slurm_sprint_job_info()``, src/api/job_info.c, 22.05; the
    openapi/v0.0.38 dump copies both lists as they are). 22.05 also names each host in
    ``job_resources.allocated_nodes[i].nodename``: when both are there they must agree.
    Raises ValueError when neither is readable or they differ."""
    from hetpatrol.slurm.gres import expand_hostlist  # the squeue path only

    res = record.get("job_resources")
    if not isinstance(res, Mapping):
        raise ValueError("no job_resources (the job holds no node)")
    nodes = res.get("nodes")
    if isinstance(nodes, Mapping):  # later data_parser versions: {"list": "n[1-2]", ...}
        nodes = nodes.get("list")
    names = expand_hostlist(nodes) if isinstance(nodes, str) and nodes else None
    listed = res.get("allocated_nodes")
    if isinstance(listed, list) and listed:
        named = [
            n.get("nodename", n.get("name")) if isinstance(n, Mapping) else None for n in listed
        ]
        if all(isinstance(n, str) and n for n in named):
            if names is not None and names != named:
                raise ValueError(f"job_resources.nodes {nodes!r} and allocated_nodes differ")
            names = named  # type: ignore[assignment]
    if not names:
        raise ValueError("job_resources names no host")
    return names


def parse_squeue_json(text: str, job: str, node: str) -> Allocation:
    """The GRES indexes that Slurm gave job ``job`` on ``node``, from ``squeue --json``.

    Only Slurm's structured fields are read: the record whose ``job_id`` is ``job``, its
    ``gres_detail`` (one string per host, ``gpu:a100:2(IDX:0-1),ascend:910b:1(IDX:3)``:
    the text of ``scontrol show job -d``'s ``GRES=``) and its hosts (:func:`_job_nodes`).
    Nothing a user chose (job name, comment, work directory: free text that may hold
    ``Nodes=... GRES=...(IDX:3)`` and even a newline) is looked at. A GRES name on the
    node's entry without IDX is recorded with no index. Never raises: what cannot be
    read is in ``errors`` (then the job's cards are unknown, never guessed)."""
    from hetpatrol.slurm.gres import split_top  # the squeue path only

    def fail(why: str) -> Allocation:
        return Allocation(sources=("squeue --json",), errors=(f"squeue --json: {why}",))

    if len(text) > SQUEUE_JSON_MAX:
        return fail(f"output larger than {SQUEUE_JSON_MAX} bytes")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return fail(f"not JSON ({type(exc).__name__})")
    jobs = doc.get("jobs") if isinstance(doc, Mapping) else None
    if not isinstance(jobs, list):
        return fail("no jobs list")
    mine = [
        j
        for j in jobs
        if isinstance(j, Mapping)
        and not isinstance(j.get("job_id"), bool)
        and isinstance(j.get("job_id"), int)
        and str(j["job_id"]) == str(job).strip()
    ]
    if len(mine) != 1:
        return fail(f"{len(mine)} records of job {str(job)[:20]!r}")
    record = mine[0]
    detail = record.get("gres_detail")
    if not isinstance(detail, list) or not all(isinstance(d, str) for d in detail):
        return fail("gres_detail is not a list of strings")
    if not detail:  # no GRES at all on any node (22.05 dumps [] then)
        return Allocation({}, sources=("squeue --json",))
    try:
        hosts = _job_nodes(record)
    except (ValueError, RecursionError) as exc:
        return fail(str(exc))
    if len(hosts) != len(detail):
        return fail(f"{len(detail)} gres_detail entries for {len(hosts)} hosts")
    by: dict[str, set[int]] = {}
    errors: list[str] = []
    for host, gres in zip(hosts, detail, strict=True):
        if host != node:
            continue
        for item in split_top(gres):
            name = re.split(r"[:(]", item, maxsplit=1)[0].strip().lower()
            if not name or name in ("(null)", "n/a"):
                continue
            slot = by.setdefault(name, set())
            im = _IDX_RE.search(item)
            if im is None:
                continue
            idx = parse_index_list(im.group("idx"))
            if idx is None:
                errors.append(f"GRES item {item[:80]!r}: IDX not readable")
                continue
            slot.update(idx)
    return Allocation(
        {k: frozenset(v) for k, v in by.items()},
        sources=("squeue --json",),
        errors=tuple(errors),
    )


# ---------------------------------------------------------------------- verdict
def card_name(card: Mapping[str, Any]) -> str:
    """``nvidia/3`` or ``ascend/0/1`` (vendor/index[/chip]), as drain reasons name cards."""
    name = f"{card.get('vendor')}/{card.get('index')}"
    return name + (f"/{card['chip']}" if card.get("chip") is not None else "")


def _verdict_of(item: Mapping[str, Any], findings: Sequence[Any] | None) -> ActionVerdict:
    """The action of a card line or a node finding: its ``action`` (and
    ``action_source``/``action_code``/``action_reason``) fields when the daemon wrote
    them, else derived from its findings (Ascend codes are unknown then: no YAML here)."""
    action = item.get("action")
    if is_action(action):
        code = item.get("action_code")
        return ActionVerdict(
            str(action),
            str(item.get("action_source") or "state"),
            str(code) if code else None,
            str(item.get("action_reason") or ""),
        )
    if findings is None:
        return finding_action(item, levels={})
    return card_action([f for f in findings if isinstance(f, Mapping)], levels={})


def _sort_key(card: Mapping[str, Any]) -> tuple[int, int]:
    def num(x: Any) -> int:
        return x if isinstance(x, int) and not isinstance(x, bool) else 1 << 30

    return num(card.get("index")), num(card.get("chip"))


def match_cards(
    cards: Sequence[Mapping[str, Any]], alloc: Allocation
) -> tuple[list[Mapping[str, Any]], list[str]]:
    """(the state's card lines the job holds, the references that matched no card)."""
    matched: list[Mapping[str, Any]] = []
    missing: list[str] = []

    def add(card: Mapping[str, Any]) -> None:
        if all(card is not c for c in matched):
            matched.append(card)

    for gres, idxs in sorted(alloc.by_gres.items()):
        group = sorted(
            (c for c in cards if str(c.get("gres") or "").lower() == gres), key=_sort_key
        )
        for i in sorted(idxs):
            if i < len(group):
                add(group[i])
            else:
                missing.append(f"{gres} IDX {i}")
    for uuid in sorted(alloc.uuids):
        hit = [c for c in cards if str(c.get("uuid") or "").lower() == uuid]
        if hit:
            add(hit[0])
        else:
            missing.append(f"uuid {uuid}")
    if alloc.ascend_ids:
        group = sorted((c for c in cards if c.get("vendor") == ASCEND), key=_sort_key)
        for i in sorted(alloc.ascend_ids):
            if i < len(group):
                add(group[i])
            else:
                missing.append(f"ascend device {i}")
    return matched, missing


class GuardDecision(NamedTuple):
    """``exit_code`` 0 (start the job) or 1 (fail: Slurm drains and requeues);
    ``reason``: one line, starting ``hetpatrol:`` when failing (the drain reason);
    ``cards``: the matched card names; ``unmatched``: allocation references with no card."""

    exit_code: int
    reason: str
    cards: tuple[str, ...] = ()
    unmatched: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_PASS


def _bad_cards(
    cards: Sequence[Mapping[str, Any]], block_on: frozenset[str]
) -> list[tuple[Mapping[str, Any], ActionVerdict]]:
    out = []
    for card in cards:
        findings = card.get("findings")
        verdict = _verdict_of(card, findings if isinstance(findings, list) else [])
        if verdict.action in block_on:
            out.append((card, verdict))
    return out


def needs_scontrol(
    doc: Mapping[str, Any] | None,
    env_alloc: Allocation,
    block_on: frozenset[str] = DEFAULT_DRAIN_ACTIONS,
) -> bool:
    """True when asking ``squeue --json`` could change the answer: a card of the
    verdict has a blocking action and the environment does not say whether the job
    holds cards of that card's GRES. False for a stale or missing verdict (that fails
    anyway) and when no card blocks (the common case: no scontrol at all)."""
    if not isinstance(doc, Mapping):
        return False
    cards = [c for c in doc.get("cards") or [] if isinstance(c, Mapping)]
    for card, _verdict in _bad_cards(cards, block_on):
        if not env_alloc.covers(str(card.get("gres") or "") or None, card.get("vendor")):
            return True
    return False


def decide(
    doc: Mapping[str, Any] | None,
    alloc: Allocation,
    *,
    now: float,
    max_age: float | None = None,
    block_on: frozenset[str] = DEFAULT_DRAIN_ACTIONS,
    read_error: str | None = None,
    boot: tuple[str, float] | None = None,
) -> GuardDecision:
    """Pass or fail one job (see the module docstring). ``doc``: the state document, or
    None when it could not be read (``read_error`` says why); ``boot``: this boot's id
    and clock, the verdict's age is read on it (see ``healthcheck.verdict_age``).
    Never raises."""
    # any hetpatrol.state/N: adding fields (the actions) may bump N; a state file from
    # before that has no "action" fields and is judged by its findings
    schema = doc.get("schema") if isinstance(doc, Mapping) else None
    if not isinstance(schema, str) or not schema.startswith(STATE_SCHEMA_PREFIX):
        why = read_error or "no hetpatrol verdict"
        return GuardDecision(EXIT_FAIL, f"hetpatrol: no verdict: {why}")
    age, stale = verdict_age(doc, now, max_age, boot=boot)
    if not math.isfinite(age):
        return GuardDecision(
            EXIT_FAIL, f"hetpatrol: stale verdict: impossible patrol time {doc.get('finished')!r}"
        )
    stopped = stopped_mark(doc)
    said = ""
    if stopped is not None:
        # A daemon stopped cleanly said so (systemctl stop: an upgrade, an admin): its
        # silence is no sign of a sick node, so its age never fails a job (the fleet is
        # not drained while the service is down; `check` says UNKNOWN "stopped at T").
        # Its last verdict still refuses a card it found needing a drain action in this
        # boot: stopping the service repaired nothing. One from an earlier boot says
        # nothing of the cards now (a reboot resets them): the job goes through.
        said = f"hetpatrol stopped at {utc_text(stopped[0])} ({stopped[1]})"
        if boot_age(doc, boot) is None:
            return GuardDecision(
                EXIT_PASS, f"{said}, its last verdict not of this boot: job let through"
            )
    elif stale:
        return GuardDecision(
            EXIT_FAIL,
            f"hetpatrol: stale verdict: last patrol {age:.0f} s ago "
            f"(max {stale_limit(doc, max_age):.0f} s)",
        )
    cards = [c for c in doc.get("cards") or [] if isinstance(c, Mapping)]
    held, missing = match_cards(cards, alloc)
    names = tuple(card_name(c) for c in held)
    blocking = _bad_cards(held, block_on)
    if held and not blocking:
        # a node that needs a reboot takes no accelerator job, whichever card said so
        node_items: list[tuple[str, ActionVerdict]] = [
            (card_name(card), verdict)
            for card, verdict in _bad_cards(cards, frozenset({REBOOT_NODE}))
        ]
        for f in doc.get("findings") or []:
            if isinstance(f, Mapping):
                verdict = _verdict_of(f, None)
                if verdict.action == REBOOT_NODE:
                    # the daemon's form: <action> node <check> <the finding's message>
                    why = why_text(f.get("message")) or verdict.reason
                    verdict = verdict._replace(code=f"check:{f.get('check')}", reason=why)
                    node_items.append(("node", verdict))
        if node_items:
            where, verdict = node_items[0]
            return GuardDecision(EXIT_FAIL, drain_reason(where, verdict), names, tuple(missing))
    if blocking:
        card, verdict = blocking[0]
        reason = drain_reason(card_name(card), verdict)
        if len(blocking) > 1:
            more = ", ".join(f"{card_name(c)} {v.action}" for c, v in blocking[1:])
            reason = drain_reason(card_name(card), verdict, f"{verdict.reason}; also {more}")
        return GuardDecision(EXIT_FAIL, reason, names, tuple(missing))
    held_text = ", ".join(names) or "none held"
    if not names and alloc.errors:  # the job's cards could not be told: say so
        held_text = f"cards unknown ({'; '.join(alloc.errors)}): job let through"
    text = f"job cards ok: {held_text} (patrol {doc.get('seq')}, {age:.0f} s ago)"
    if missing:
        text += f"; not in the verdict: {', '.join(missing)}"
    if said:
        text += f"; {said}: judged by its last verdict"
    return GuardDecision(EXIT_PASS, text, names, tuple(missing))


# ------------------------------------------------------------------------- I/O
def read_state_bounded(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state file, read as ``hetpatrol check`` reads it (non-blocking, regular files
    only, bounded, and only one that root, the daemon's user or this user owns and alone
    can write, reached through no one else's symlink or directory:
    :func:`hetpatrol.healthcheck.read_trusted_state`), whatever the version of its
    ``hetpatrol.state/N`` schema. Raises OSError, ValueError or
    :class:`~hetpatrol.healthcheck.UntrustedStateFile` (a ValueError)."""
    return read_trusted_state(path, accept=STATE_SCHEMA_PREFIX)


Runner = Callable[[Sequence[str], float], str]


def run_scontrol(argv: Sequence[str], timeout: float) -> str:
    """Run scontrol (or squeue) with a hard timeout; stdout text (at most
    :data:`SQUEUE_JSON_MAX` + 1 bytes: one more than :func:`parse_squeue_json` takes, so
    an overlong output is refused, not cut into something else). Raises OSError /
    subprocess.SubprocessError (timeout, non-zero exit)."""
    import subprocess  # only when scontrol is needed: the common pass path skips it

    res = subprocess.run(
        list(argv), capture_output=True, timeout=timeout, check=True, stdin=subprocess.DEVNULL
    )
    return res.stdout[: SQUEUE_JSON_MAX + 1].decode("utf-8", "replace")


def guard(
    env: Mapping[str, str],
    state_path: str | os.PathLike[str],
    *,
    block_on: frozenset[str] = DEFAULT_DRAIN_ACTIONS,
    max_age: float | None = None,
    timeout: float = 5.0,
    runner: Runner = run_scontrol,
    scontrol: str = "scontrol",
    clock: Callable[[], float] = time.time,
) -> GuardDecision:
    """One prolog run: read the verdict, the environment, ``squeue --json`` (beside
    ``scontrol``) only if :func:`needs_scontrol`; never raises, never runs longer than
    ``timeout`` seconds in squeue. The node name is ``SLURMD_NODENAME``, else the
    state's ``node``."""
    start = time.monotonic()
    doc: dict[str, Any] | None = None
    error = None
    try:
        doc = read_state_bounded(state_path)
    except FileNotFoundError:
        error = f"no state file {state_path}: is the hetpatrol daemon running?"
    except UntrustedStateFile as exc:
        # not the daemon's verdict: failing would let whoever wrote it drain the node
        return GuardDecision(
            EXIT_PASS, f"untrusted state file {state_path}: {exc}: job let through"
        )
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        error = f"cannot read {state_path}: {getattr(exc, 'strerror', None) or exc}"
    alloc = parse_job_env(env)
    try:
        if needs_scontrol(doc, alloc, block_on):
            job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
            node = env.get("SLURMD_NODENAME") or str((doc or {}).get("node") or "")
            left = timeout - (time.monotonic() - start)
            if job and node and left > 0.05:
                import subprocess

                try:
                    text = runner(squeue_argv(scontrol), left)
                    alloc = alloc.merged(parse_squeue_json(text, str(job), node))
                except (OSError, subprocess.SubprocessError, ValueError) as exc:
                    alloc = alloc.merged(
                        Allocation(errors=(f"squeue --json: {type(exc).__name__}: {exc}",))
                    )
        boot = boot_clock() if clock is time.time else None  # a given clock is a test's
        return decide(
            doc,
            alloc,
            now=clock(),
            max_age=max_age,
            block_on=block_on,
            read_error=error,
            boot=boot,
        )
    except Exception as exc:  # noqa: BLE001 - a guard bug must not drain the cluster
        return GuardDecision(
            EXIT_PASS, f"guard error, job let through: {type(exc).__name__}: {exc}"
        )


def job_card_names(doc: Mapping[str, Any], alloc: Allocation) -> list[str]:
    """The names (``nvidia/3``) of the state's cards the job holds: what ``hetpatrol
    epilog`` patrols after the job."""
    cards = [c for c in doc.get("cards") or [] if isinstance(c, Mapping)]
    return [card_name(c) for c in match_cards(cards, alloc)[0]]


class _HardLimit(BaseException):  # noqa: N818 - not an error: the clock ran out
    pass


def prolog_main(
    env: Mapping[str, str],
    state_path: str | os.PathLike[str],
    *,
    block_on: frozenset[str] = DEFAULT_DRAIN_ACTIONS,
    max_age: float | None = None,
    timeout: float = 5.0,
    set_reason: bool = True,
    scontrol: str = "scontrol",
    runner: Runner = run_scontrol,
    write: Callable[[str], object] | None = None,
) -> int:
    """The whole ``hetpatrol prolog``: :func:`guard` under a hard time limit, and on a
    failure the node's drain reason set to hetpatrol's before exiting 1.

    Slurm drains the node and requeues the job when the Prolog exits non-zero; its own
    reason would be "Prolog error". Setting ``State=DRAIN Reason=<ours>`` first (the
    Prolog runs as SlurmdUser, root) keeps hetpatrol's reason: checked on slurmd 22.05,
    the node shows ``Reason=hetpatrol: ...`` and the job ``launch failed requeued held``
    (Slurm holds it unless ``SchedulerParameters=nohold_on_prolog_fail``).

    The hard limit (``timeout`` seconds, SIGALRM when on the main thread) lets the job
    through with a message: hetpatrol running out of time is no fault of the cards.
    ``write``: where the one-line verdict goes (default stdout). Returns the exit code.
    """
    import signal
    import threading

    out = write or (lambda s: os.write(1, s.encode("utf-8", "replace")))
    start = time.monotonic()
    use_alarm = threading.current_thread() is threading.main_thread() and timeout >= 1

    def expire(_sig: int, _frame: object) -> None:
        raise _HardLimit

    old = signal.signal(signal.SIGALRM, expire) if use_alarm else None
    if use_alarm:
        signal.alarm(int(math.ceil(timeout)) + 1)
    try:
        try:
            decision = guard(
                env,
                state_path,
                block_on=block_on,
                max_age=max_age,
                timeout=timeout,
                runner=runner,
                scontrol=scontrol,
            )
            if not decision.ok and set_reason:
                node = env.get("SLURMD_NODENAME")
                left = timeout - (time.monotonic() - start)
                if node and left > 0.05:
                    argv = [scontrol, "update", f"NodeName={node}", "State=DRAIN"]
                    try:
                        runner([*argv, f"Reason={decision.reason}"], left)
                    except Exception as exc:  # noqa: BLE001 - Slurm's own reason remains
                        decision = decision._replace(
                            reason=f"{decision.reason} (reason not set: {type(exc).__name__})"
                        )
        except _HardLimit:
            decision = GuardDecision(
                EXIT_PASS, f"hard time limit {timeout:g} s hit: job let through"
            )
    finally:
        if use_alarm:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    out(decision.reason.replace("\n", " ") + "\n")
    return decision.exit_code


def epilog_cards(
    env: Mapping[str, str],
    doc: Mapping[str, Any],
    *,
    timeout: float = 10.0,
    runner: Runner = run_scontrol,
    scontrol: str = "scontrol",
) -> tuple[list[Mapping[str, Any]], Allocation]:
    """The state's card lines the finished job held, for ``hetpatrol epilog``'s one quick
    patrol of them (XIDs the job caused show up there). The environment first
    (``SLURM_JOB_GPUS`` is "Available in the Prolog and Epilog", slurm.conf(5)); when it
    does not cover every GRES name of the node's cards, ``squeue --json`` (the job
    record is still there while the Epilog runs, but Slurm 22.05 has already emptied its
    ``gres_detail`` entry then: every card is looked at, see :mod:`hetpatrol.slurm.epilog`).
    Never raises; returns (cards, the allocation used, whose ``errors`` say what could not
    be read)."""
    alloc = parse_job_env(env)
    cards = [c for c in doc.get("cards") or [] if isinstance(c, Mapping)]
    uncovered = [
        c for c in cards if not alloc.covers(str(c.get("gres") or "") or None, c.get("vendor"))
    ]
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    node = env.get("SLURMD_NODENAME") or str(doc.get("node") or "")
    if uncovered and job and node:
        import subprocess

        try:
            text = runner(squeue_argv(scontrol), timeout)
            alloc = alloc.merged(parse_squeue_json(text, str(job), node))
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            alloc = alloc.merged(
                Allocation(errors=(f"squeue --json: {type(exc).__name__}: {exc}",))
            )
    return match_cards(cards, alloc)[0], alloc


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (below 10**9), as ``check --max-age``."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 10**9:  # also nan and inf
        raise argparse.ArgumentTypeError(f"{text!r}: a positive number of seconds")
    return value


def cli_main(argv: Sequence[str] | None = None) -> int:
    """``hetpatrol-prolog`` / ``hetpatrol prolog``: parse the arguments, run
    :func:`prolog_main` with the process environment. Kept here, not in hetpatrol.cli,
    whose imports (the config loader, the collectors) cost more than the whole guard.

    ``--state-path`` defaults to ``$HETPATROL_STATE_PATH``; Slurm runs the Prolog with
    no search path, so ``--scontrol`` should be absolute (default: ``scontrol`` found in
    ``/usr/bin``, ``/usr/local/bin``, ``/opt/slurm/bin``, else the bare name).
    """
    import argparse

    from hetpatrol.actions.vocabulary import parse_action

    class FailOpen(argparse.ArgumentParser):
        """A Prolog that exits non-zero drains the node: a usage error of hetpatrol's own
        (a bad Prolog= line) must not drain every node of the cluster. It is said on
        stderr (slurmd's log) and the job goes through."""

        def error(self, message: str):  # type: ignore[override]
            self.print_usage(sys.stderr)
            self.exit(EXIT_PASS, f"{self.prog}: error: {message}: job let through\n")

    p = FailOpen(
        prog="hetpatrol prolog",
        description="Slurm Prolog: fail (drain + requeue) when a card of this job needs "
        "an action in --block-on, or the daemon's verdict is stale; else exit 0.",
    )
    p.add_argument(
        "--state-path",
        default=os.environ.get("HETPATROL_STATE_PATH"),
        metavar="P",
        help="the daemon's state file (default: $HETPATROL_STATE_PATH)",
    )
    p.add_argument(
        "--max-age",
        type=_seconds,
        default=None,
        metavar="S",
        help="stale after S seconds (default: check's, 3 patrol intervals + 10 s)",
    )
    p.add_argument("--timeout", type=_seconds, default=5.0, metavar="S", help="hard time limit")
    p.add_argument(
        "--block-on",
        default=",".join(sorted(DEFAULT_DRAIN_ACTIONS)),
        help="comma-separated action words (default: %(default)s)",
    )
    p.add_argument(
        "--scontrol",
        default=None,
        help="scontrol to run (absolute path); squeue is run from its directory",
    )
    p.add_argument("--no-set-reason", action="store_true", help="leave Slurm's own reason")
    args = p.parse_args(argv)
    if not args.state_path:
        p.error("--state-path (or HETPATROL_STATE_PATH) is required")
    try:
        block_on = frozenset(parse_action(w) for w in args.block_on.split(",") if w.strip())
    except ValueError as exc:
        p.error(f"--block-on: {exc}")
    scontrol = args.scontrol
    if scontrol is None:
        scontrol = next(
            (
                f"{d}/scontrol"
                for d in ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin")
                if os.access(f"{d}/scontrol", os.X_OK)
            ),
            "scontrol",
        )
    return prolog_main(
        os.environ,
        args.state_path,
        block_on=block_on,
        max_age=args.max_age,
        timeout=max(0.1, min(args.timeout, 60.0)),
        set_reason=not args.no_set_reason,
        scontrol=scontrol,
    )
