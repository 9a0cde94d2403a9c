"""A job's cards on one node as Slurm names them: from the job's environment and from
the job's one record in slurmctld, never from the whole queue nor from text a user
chose where a structured field exists.

Shared by the Prolog and Epilog (:mod:`hetpatrol.slurm.jobguard`, which says which
variable wins), the card -> job map (:mod:`hetpatrol.slurm.card_jobs`) and the TaskProlog
(:mod:`hetpatrol.slurm.task_prolog`, run before every task: so this module imports only
:mod:`json`, :mod:`os`, :mod:`re` and, on the paths that read Slurm's answers,
:mod:`hetpatrol.slurm.gres`, :mod:`subprocess` and :mod:`time`).

One job's record (:func:`ask_job`, :func:`job_query`): ``squeue --json --jobs=ID`` from
Slurm 23.02.3 (read by :func:`parse_squeue_json` from its structured fields), ``scontrol
-d show job ID`` before (22.05's ``squeue --json`` ignores ``--jobs=`` and lists every
job), read by :func:`parse_show_job_detail` from Slurm's own per-node block only, and only
when every block of that shape in the text agrees. Threat boundary of that text: the
job's owner writes its name and comment, printed raw beside Slurm's block; a copy of the
block that says otherwise makes the readings differ and the job's cards unknown (never
the copied ones), so a user can make only their own job's cards unknown. What each
caller does with unknown cards is in its module (TaskProlog: no variable; Prolog: the
job goes through; Epilog: every card looked at; daemon: the card a process of that job
is on not judged).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

GPU_GRES = "gpu"


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

    ``by_gres``: GRES name (lower case) -> IDX numbers; ``uuids``: card UUIDs
    (lower case); ``vendor_ids``: vendor -> the numbers of its cards in (index, chip)
    order (a ``vendor_order`` variable, :class:`hetpatrol.collector.JobEnvVar`);
    ``sources``: where each part came from (``SLURM_JOB_GPUS``, ``scontrol`` ...);
    ``errors``: text that could not be read; ``uuid_vendors``: the vendors whose
    variables gave the UUIDs; ``numbered``: the GRES names whose vendor variable
    (``ids: gres_idx``, e.g. ``CUDA_VISIBLE_DEVICES``) listed numbers, not UUIDs. In the
    Prolog and Epilog Slurm sets that variable itself, to each device's ``unique_id``,
    else its index (``gres_common_epilog_set_env``, gres_common.c 22.05): AutoDetect=nvml
    gives every MIG device its UUID, so numbers there mean the devices are gres.conf
    lines (seen on slurmd 22.05: ``CUDA_VISIBLE_DEVICES=MIG-...`` from AutoDetect's
    records, ``=3`` from ``MultipleFiles=`` lines; tests/test_mig_gres_idx.py).
    """

    by_gres: Mapping[str, frozenset[int]] = {}  # never mutated
    uuids: frozenset[str] = frozenset()
    vendor_ids: Mapping[str, frozenset[int]] = {}  # never mutated
    sources: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    uuid_vendors: frozenset[str] = frozenset()
    numbered: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return (
            not any(self.by_gres.values()) and not self.uuids and not any(self.vendor_ids.values())
        )

    def covers(self, gres: str | None, vendor: str | None) -> bool:
        """True when this allocation says which cards of ``gres`` / ``vendor`` the job
        has (even "none")."""
        if gres and gres.lower() in self.by_gres:
            return True
        if vendor is not None and vendor in self.vendor_ids:
            return True
        return vendor is not None and vendor in self.uuid_vendors and bool(self.uuids)

    def merged(self, other: Allocation) -> Allocation:
        """This allocation with ``other``'s GRES names and vendors added (this one wins
        per name)."""
        by = dict(other.by_gres)
        by.update(self.by_gres)
        ids = dict(other.vendor_ids)
        ids.update(self.vendor_ids)
        return Allocation(
            by,
            self.uuids | other.uuids,
            ids,
            self.sources + other.sources,
            self.errors + other.errors,
            self.uuid_vendors | other.uuid_vendors,
            self.numbered | other.numbered,
        )


def job_env_of(doc: Any) -> list[Mapping[str, Any]] | None:
    """The state document's ``job_env`` rows (the plugins' :class:`~hetpatrol.collector.
    JobEnvVar` declarations, as :func:`hetpatrol.collector.job_env_declarations` writes
    them), those of a readable shape; None when the document has no such list."""
    rows = doc.get("job_env") if isinstance(doc, Mapping) else None
    if not isinstance(rows, list):
        return None
    out = []
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        name, vendor, ids = row.get("name"), row.get("vendor"), row.get("ids")
        gres, prefixes = row.get("gres"), row.get("uuid_prefixes") or []
        if not (isinstance(name, str) and name and isinstance(vendor, str) and vendor):
            continue
        if ids not in ("vendor_order", "gres_idx") or not isinstance(prefixes, list):
            continue
        if ids == "gres_idx" and not (isinstance(gres, str) and gres):
            continue
        if all(isinstance(x, str) and x for x in prefixes):
            out.append(row)
    return out


def parse_job_env_rows(env: Mapping[str, str], job_env: Sequence[Mapping[str, Any]]) -> Allocation:
    """The job's cards from the Prolog / Epilog / task environment (see the module
    docstring for which variable wins): Slurm's ``SLURM_JOB_GPUS`` / ``SLURM_STEP_GPUS``,
    then the vendors' variables ``job_env`` (rows of :func:`job_env_of`) in their order
    (:func:`hetpatrol.slurm.jobguard.parse_job_env` gives the installed plugins' rows
    where the state file has none: this module sits below the plugin machinery). Never
    raises; unreadable values go to ``errors``."""
    by: dict[str, frozenset[int]] = {}
    uuids: set[str] = set()
    vendor_ids: dict[str, frozenset[int]] = {}
    uuid_vendors: set[str] = set()
    numbered: set[str] = set()
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
    for row in job_env_of({"job_env": list(job_env)}):
        name, vendor = str(row["name"]), str(row["vendor"])
        text = env.get(name)
        if text is None:
            continue
        prefixes = tuple(p.upper() for p in row.get("uuid_prefixes") or ())
        items = [i.strip() for i in text.split(",") if i.strip()]
        found = [i for i in items if prefixes and i.upper().startswith(prefixes)]
        if found:
            uuids.update(i.lower() for i in found)
            uuid_vendors.add(vendor)
            sources.append(name)
        elif row["ids"] == "gres_idx":
            gres = str(row["gres"]).lower()
            idx = parse_index_list(text)
            if idx is not None and idx:
                numbered.add(gres)
            if gres in by:  # Slurm's own variable (or an earlier one) said it
                continue
            if idx is None:
                errors.append(f"{name}={text[:80]!r} is not readable")
            else:
                by[gres] = idx
                sources.append(name)
        elif vendor not in vendor_ids:  # the first of the vendor's variables wins
            idx = parse_index_list(text)
            if idx is None:
                errors.append(f"{name}={text[:80]!r} is not a list of device IDs")
                continue
            vendor_ids[vendor] = idx
            sources.append(name)
    return Allocation(
        by,
        frozenset(uuids),
        vendor_ids,
        tuple(sources),
        tuple(errors),
        frozenset(uuid_vendors),
        frozenset(numbered),
    )


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
    openapi/v0.0.38 dump copies both lists as they are). The host list is
    ``job_resources.nodes``: a string up to data_parser v0.0.40 (22.05 to 23.11,
    recorded in fixtures/slurm/job-json-23.02.8-*, -23.11.10-*), an object from v0.0.41
    (24.05 on: ``nodes.list``, with ``nodes.allocation[i].name`` per host; recorded in
    fixtures/slurm/job-json-24.05.3-* to -25.05.4-*). Each host is named a second time
    (``allocated_nodes[i].nodename`` up to v0.0.40, ``nodes.allocation[i].name`` from
    v0.0.41): when both are there they must agree, in order. Raises ValueError when
    neither is readable or they differ."""
    from hetpatrol.slurm.gres import expand_hostlist  # the squeue path only

    res = record.get("job_resources")
    if not isinstance(res, Mapping):
        raise ValueError("no job_resources (the job holds no node)")
    nodes = res.get("nodes")
    listed = res.get("allocated_nodes")
    if isinstance(nodes, Mapping):  # data_parser v0.0.41 on: {"list": "n[1-2]", ...}
        listed = nodes.get("allocation")
        nodes = nodes.get("list")
    names = expand_hostlist(nodes) if isinstance(nodes, str) and nodes else None
    if isinstance(listed, list) and listed:
        named = [
            n.get("nodename", n.get("name")) if isinstance(n, Mapping) else None for n in listed
        ]
        if all(isinstance(n, str) and n for n in named):
            if names is not None and names != named:
                what = "allocated_nodes" if "allocated_nodes" in res else "nodes.allocation"
                raise ValueError(f"job_resources.nodes {nodes!r} and {what} differ")
            names = named  # type: ignore[assignment]
    if not names:
        raise ValueError("job_resources names no host")
    return names


def parse_squeue_json(text: str, job: str, node: str) -> Allocation:
    """The GRES indexes that Slurm gave job ``job`` on ``node``, from ``squeue --json``.

    Only Slurm's structured fields are read: the record whose ``job_id`` is ``job``, its
    ``gres_detail`` (one string per host, ``gpu:a100:2(IDX:0-1),ascend:910b:1(IDX:3)``:
    the text of ``scontrol show job -d``'s ``GRES=``, read by
    :func:`gres_detail_indices`) and its hosts (:func:`_job_nodes`).
    Nothing a user chose (job name, comment, work directory: free text that may hold
    ``Nodes=... GRES=...(IDX:3)`` and even a newline) is looked at. Read the same for
    data_parser v0.0.38 (22.05) to v0.0.43 (25.05): the fields read (``job_id`` a
    plain integer, ``gres_detail`` strings, ``job_resources``) kept their shapes but for
    the host list (:func:`_job_nodes`); the ``{"set", "infinite", "number"}`` objects
    of v0.0.40 on wrap none of them (a ``job_id`` in one is no job id: "0 records").
    Never raises: what cannot be
    read is in ``errors`` (then the job's cards are unknown, never guessed)."""

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
        if host == node:
            gres_detail_indices(gres, by, errors)
    return Allocation(
        {k: frozenset(v) for k, v in by.items()},
        sources=("squeue --json",),
        errors=tuple(errors),
    )


def gres_detail_indices(gres: str, by: dict[str, set[int]], errors: list[str]) -> None:
    """Add the indexes of one host's GRES detail string (squeue --json's
    ``gres_detail`` entry, the ``GRES=`` of ``scontrol show job -d``'s per-node line;
    both are ``gres_detail_str[i]``, src/api/job_info.c) to ``by`` (GRES name, lower
    case -> indexes); what cannot be read goes to ``errors`` and that GRES name is left
    out of ``by`` (its cards unknown, never "none").

    Slurm writes one item per GRES name and type (``gres_ctld_job_build_details()``,
    src/slurmctld/gres_ctld.c 22.05-23.11; ``gres_stepmgr_job_build_details()``,
    src/stepmgr/gres_stepmgr.c from 24.05), always with a parenthesis:

    - ``NAME[:TYPE]:COUNT(IDX:LIST)``: the devices' bitmap (``gpu:a100:2(IDX:0-1)``,
      untyped ``gpu:1(IDX:0)``, a type with no device here ``gpu:h200:0(IDX:)``;
      recorded 22.05 to 25.05, fixtures/slurm/README.md). The IDX of every type of one
      name count in one list (``gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)``, 24.11.5).
    - ``NAME[:TYPE](CNT:N)``: N held with no device bitmap on this node: which cards is
      not known (an error when N > 0).
    - ``NAME[:TYPE]:COUNT(A/B,...)``: a shared GRES (``shard``, ``mps``;
      ``_build_shared_gres_details()`` of gres_stepmgr.c, not in 22.05's gres_ctld.c):
      one ``allocated/available`` pair per device
      of the node in index order; the devices with A > 0 are the job's.

    Anything else (no parenthesis, another spec) is an error."""
    from hetpatrol.slurm.gres import split_top  # the squeue / scontrol paths only

    failed: set[str] = set()
    for item in split_top(gres):
        name = re.split(r"[:(]", item, maxsplit=1)[0].strip().lower()
        if not name or name in ("(null)", "n/a"):
            continue
        why, idx = _detail_item(item)
        if idx is None:
            errors.append(f"GRES item {item[:80]!r}: {why}")
            failed.add(name)
            continue
        by.setdefault(name, set()).update(idx)
    for name in failed:
        by.pop(name, None)


_DETAIL_ITEM = re.compile(r"(?P<head>[^()]*)\((?P<spec>[^()]*)\)")
_SHARED_PAIR = re.compile(r"([0-9]{1,12})/([0-9]{1,12})")


def _detail_item(item: str) -> tuple[str, frozenset[int] | None]:
    """(why, indexes) of one item of :func:`gres_detail_indices`; indexes None when
    they cannot be told (``why`` says so)."""
    m = _DETAIL_ITEM.fullmatch(item.strip())
    if m is None:
        return "no (IDX:...) part: the job's devices of it unknown", None
    spec = m.group("spec").strip()
    if spec.startswith("IDX:"):
        idx = parse_index_list(spec[4:])
        return ("IDX not readable", None) if idx is None else ("", idx)
    if spec.startswith("CNT:"):
        count = spec[4:].strip()
        if count == "0":
            return "", frozenset()
        return f"{_shown(count, 12)} held with no device index (CNT:): which cards unknown", None
    pairs = spec.split(",")
    shared = [_SHARED_PAIR.fullmatch(p.strip()) for p in pairs]
    if pairs and all(shared):
        return "", frozenset(i for i, p in enumerate(shared) if p and int(p.group(1)) > 0)
    return f"({_shown(spec, 40)}) is no IDX, CNT nor shared-device list", None


def _shown(text: str, most: int) -> str:
    """``text`` without control characters, at most ``most`` characters: the per-node
    ``GRES=`` of ``scontrol show job -d`` may come from a forged block in the job's name
    (the readings agree, so its errors are kept), which may hold terminal escapes."""
    return "".join(ch for ch in text if ch.isprintable())[:most]


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


#: where Slurm's commands are looked for when no path is given (Slurm runs the Prolog
#: and TaskProlog with a search path of its own, or none)
SLURM_BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin")


def find_scontrol() -> str:
    """``scontrol`` in the first of :data:`SLURM_BIN_DIRS` that has it, else the bare
    name (found on ``PATH`` when run)."""
    return next(
        (f"{d}/scontrol" for d in SLURM_BIN_DIRS if os.access(f"{d}/scontrol", os.X_OK)),
        "scontrol",
    )


#: the first Slurm whose ``squeue --json`` keeps ``--jobs=`` (one job, one
#: slurm_load_job()): squeue(1) of slurm-23-02-3-1 "Formatting options are ignored;
#: however, filtering arguments are still used"; up to slurm-23-02-2-1 "All other
#: formatting and filtering arguments will be ignored" (doc/man/man1/squeue.1)
JSON_ONE_JOB_SINCE = (23, 2, 3)
#: ``scontrol --version``: ``slurm 23.11.4``, Debian's ``slurm-wlm 22.05.8``
_VERSION = re.compile(r"slurm(?:-wlm)? ([0-9]{1,4})\.([0-9]{1,2})\.([0-9]{1,3})(?![0-9])")
#: the lines of one job's per-node block in ``scontrol -d show job``, each of the exact
#: shape slurm_sprint_job_info() prints (src/api/job_info.c 20.11-23.02: "Line 15"
#: ``NumNodes=``, ``TRES=`` (23.02: ``ReqTRES=``/``AllocTRES=``), ``Socks/Node=``, with
#: details ``JOB_GRES=`` and one ``  Nodes=%s CPU_IDs=%s Mem=%u GRES=%s`` line per group
#: of hosts, then "Line 18" ``MinCPUsNode=``); ``line_end`` is "\n   "
_BLOCK_START = re.compile(r"   NumNodes=\S+ NumCPUs=\S+ NumTasks=\S+ CPUs/Task=\S+ ReqB:S:C:T=\S+")
_BLOCK_END = re.compile(r"   MinCPUsNode=\S+ MinMemory(?:Node|CPU)=\S+ MinTmpDiskNode=\S+")
_BLOCK_OTHER = re.compile(
    r"   (?:(?:Req|Alloc)?TRES=\S*|JOB_GRES=\S*"
    r"|Socks/Node=\S+ NtasksPerN:B:S:C=\S+ (?:Core|Thread)Spec=\S+)"
)
_NODE_LINE = re.compile(r"     Nodes=(?P<nodes>\S+) CPU_IDs=\S* Mem=[0-9]+ GRES=(?P<gres>\S*)")
SHOW_JOB = "scontrol show job -d"


def slurm_version(text: str) -> tuple[int, int, int] | None:
    """``slurm-wlm 22.05.8`` (``scontrol --version``'s first line) -> ``(22, 5, 8)``; None
    when the text names no Slurm version."""
    m = _VERSION.match(text.split("\n", 1)[0].strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def job_query(scontrol: str, job: str, version: tuple[int, int, int]) -> list[str]:
    """The command that gives job ``job``'s GRES indices in one single-job answer from
    slurmctld (module docstring): ``squeue --json --jobs=ID`` (beside ``scontrol``) from
    :data:`JSON_ONE_JOB_SINCE`, else ``scontrol -d show job ID``."""
    if version >= JSON_ONE_JOB_SINCE:
        return [*squeue_argv(scontrol), f"--jobs={job}"]
    return [scontrol, "-d", "show", "job", job]


def parse_show_job_detail(text: str, job: str, node: str) -> Allocation:
    """The GRES indexes Slurm gave job ``job`` on ``node`` from ``scontrol -d show job
    ID`` text (Slurm 23.02.2 and earlier, where no one-job JSON exists).

    Read: the record must begin ``JobId=<job> ``; each block from a line of exactly
    Slurm's ``NumNodes=`` shape to one of its ``MinCPUsNode=`` shape whose every line in
    between is one of Slurm's (``TRES=``, ``Socks/Node=``, ``JOB_GRES=``, the per-node
    ``     Nodes=HOSTLIST CPU_IDs=.. Mem=.. GRES=..`` lines); a block with any other
    line inside is not one. The node's entry (its name in ``Nodes=``' host list) gives
    the indexes (:func:`hetpatrol.slurm.job_gres.gres_detail_indices`). Lines are split
    at ``\n`` only (Slurm's line end; a ``\r`` in a name is not one). Slurm's own
    block is always there whole (free text is printed before or after it); when more
    than one block is found and they say different things for this node, nothing is
    taken: ``errors`` says so (the threat boundary: module docstring). Never raises."""
    from hetpatrol.slurm.gres import hostlist_contains  # this path only

    def fail(why: str) -> Allocation:
        return Allocation(sources=(SHOW_JOB,), errors=(f"{SHOW_JOB}: {why}",))

    if len(text) > SQUEUE_JSON_MAX:
        return fail(f"output larger than {SQUEUE_JSON_MAX} bytes")
    lines = text.split("\n")
    if not lines[0].startswith(f"JobId={job} "):
        return fail(f"the output does not begin with job {job}'s record")
    blocks: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] | None = None
    for line in lines:
        if _BLOCK_START.fullmatch(line):
            current = []  # an open block before this one was no block of Slurm's
        elif current is None:
            continue
        elif _BLOCK_END.fullmatch(line):
            blocks.append(current)
            current = None
        elif m := _NODE_LINE.fullmatch(line):
            current.append((m.group("nodes"), m.group("gres")))
        elif not _BLOCK_OTHER.fullmatch(line):
            current = None  # a line Slurm does not print here: not its block
    if not blocks:
        return fail("no per-node block (NumNodes= ... MinCPUsNode= lines of Slurm's shape)")
    readings = []
    errors: list[str] = []
    for block in blocks:
        by: dict[str, set[int]] = {}
        for nodes, gres in block:
            try:
                here = hostlist_contains(nodes, node)
            except (ValueError, RecursionError):
                here = False
                errors.append(f"Nodes={nodes[:80]!r} is not a host list")
            if here:
                gres_detail_indices(gres, by, errors)
        readings.append({k: frozenset(v) for k, v in by.items()})
    if any(r != readings[0] for r in readings[1:]):
        return fail(
            f"{len(readings)} per-node blocks that differ for {node} (a job name or "
            "comment copying Slurm's lines?)"
        )
    return Allocation(readings[0], sources=(SHOW_JOB,), errors=tuple(dict.fromkeys(errors)))


#: the first line of an array's own record in ``scontrol show job``: ``JobId=1
#: ArrayJobId=1 ArrayTaskId=1 JobName=...`` (slurm_sprint_job_info(), src/api/job_info.c:
#: the ids before the name, so no text a user chose)
_ARRAY_HEAD = re.compile(r"JobId=([0-9]+) ArrayJobId=([0-9]+) ArrayTaskId=([0-9]+) ")


def array_task_query(text: str, job: str) -> str | None:
    """``J_T`` when ``scontrol -d show job J`` answered for array ``J``'s own record
    (array task ``T``, one number): slurm_load_job() of an array's id answers every
    record of the array (recorded on 22.05, fixtures/slurm/README.md), whose blocks then
    disagree; ``scontrol -d show job J_T`` prints that task's record only. None
    otherwise."""
    m = _ARRAY_HEAD.match(text.split("\n", 1)[0])
    if m and m.group(1) == job == m.group(2) and "\nJobId=" in text:
        return f"{job}_{m.group(3)}"
    return None


def parse_job_answer(text: str, job: str, node: str, version: tuple[int, int, int]) -> Allocation:
    """The answer of :func:`job_query` for ``version`` read by its own rule:
    :func:`parse_squeue_json` (from :data:`JSON_ONE_JOB_SINCE`) or
    :func:`parse_show_job_detail`. Never raises."""
    if version >= JSON_ONE_JOB_SINCE:
        return parse_squeue_json(text, job, node)
    return parse_show_job_detail(text, job, node)


def _last_line(err: bytes | str | None) -> str:
    """The last line of a command's stderr (``slurm_load_jobs error: Invalid job id
    specified``), printable and at most 200 characters; ``no message`` when empty."""
    text = err.decode("utf-8", "replace") if isinstance(err, bytes) else (err or "")
    lines = text.strip().splitlines()
    return "".join(ch for ch in lines[-1] if ch.isprintable())[:200] if lines else "no message"


def ask_job(
    scontrol: str,
    job: str,
    node: str,
    *,
    timeout: float,
    runner: Runner | None = None,
    version: tuple[int, int, int] | None = None,
) -> Allocation:
    """Job ``job``'s GRES indexes on ``node`` in one single-job answer of slurmctld
    (``REQUEST_JOB_INFO_SINGLE``), never the whole queue: ``scontrol --version`` (local,
    no RPC; skipped when ``version`` is given), then :func:`job_query`'s command, read by
    :func:`parse_job_answer`. ``runner(argv, seconds) -> stdout`` (default
    :func:`run_scontrol`); ``timeout`` seconds for both commands together. Never raises:
    what fails is in ``errors`` (``scontrol --version: ...``, ``squeue --json: ...``,
    ``scontrol show job -d: ...``) and the job's cards are then unknown."""
    import subprocess  # a query is run: the TaskProlog's common path runs one anyway
    import time

    run = runner or run_scontrol
    deadline = time.monotonic() + timeout

    def fail(why: str) -> Allocation:
        return Allocation(errors=(why,))

    if version is None:
        try:
            said = run([scontrol, "--version"], timeout)
        except subprocess.CalledProcessError as exc:
            return fail(f"scontrol --version: exit {exc.returncode}: {_last_line(exc.stderr)}")
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return fail(f"scontrol --version: {type(exc).__name__}: {exc}")
        version = slurm_version(said)
        if version is None:
            return fail(f"scontrol --version said {said[:60]!r}: no Slurm version")
    argv = job_query(scontrol, job, version)
    what = "squeue --json" if version >= JSON_ONE_JOB_SINCE else SHOW_JOB
    left = deadline - time.monotonic()
    if left <= 0:
        return fail(f"{what}: no time left of {timeout:g} s")
    try:
        text = run(argv, left)
    except subprocess.CalledProcessError as exc:  # Slurm's own words: why it refused
        return fail(f"{what}: exit {exc.returncode}: {_last_line(exc.stderr)}")
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return fail(f"{what}: {type(exc).__name__}: {exc}")
    alloc = parse_job_answer(text, job, node, version)
    task = array_task_query(text, job) if alloc.errors and what == SHOW_JOB else None
    left = deadline - time.monotonic()
    if task is not None and left > 0:
        try:  # the array's own record alone (one more single-job answer)
            text = run([scontrol, "-d", "show", "job", task], left)
        except subprocess.CalledProcessError as exc:
            return fail(f"{what} {task}: exit {exc.returncode}: {_last_line(exc.stderr)}")
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return fail(f"{what} {task}: {type(exc).__name__}: {exc}")
        alloc = parse_show_job_detail(text, job, node)
    return alloc
