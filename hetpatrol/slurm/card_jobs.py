"""Which Slurm jobs each card of this node is allocated to, asked of slurmctld one job
at a time, never as the whole queue.

Slurm 22.05's ``squeue --json`` ignores every filter and answers with the whole queue
(squeue(1) 22.05: "All other formatting and filtering arguments will be ignored"; about
3 KB a job): asked by every node once a minute that is a whole-queue dump many times a
second on slurmctld at fleet scale, and past a few thousand jobs more than the daemon's
output cap. So :class:`CardJobs` learns *which* jobs run on this node locally and asks
slurmctld only for those, once each:

1. **Which jobs** (no RPC): the job directories Slurm's own cgroup plugin makes on this
   node, at the depth Slurm makes them and nowhere else (:func:`local_slurm_jobs`): v1
   ``<root>/<controller>/slurm[_<NodeName>]/uid_<uid>/job_<id>`` (``CgroupPrepend``
   ``/slurm`` or ``/slurm_%n``, src/common/cgroup.c; ``uid_%u/job_%u``,
   src/plugins/cgroup/v1/xcgroup.c), v2 ``<root><init>/system.slice/[<NodeName>_]
   slurmstepd.scope/job_<id>`` (src/plugins/cgroup/v2/cgroup_v2.c, ``_set_int_cg_ns()``;
   ``<init>`` from ``/proc/1/cgroup``, :func:`hetpatrol.processes.init_cgroup_root`),
   plus the job ids of the cards' processes (their cgroup, :mod:`hetpatrol.processes`).
   Such a directory exists while the job has a step on the node: slurmstepd removes it
   at the job's end (cgroup_v1.c / cgroup_v2.c, ``cgroup_p_step_destroy``; seen on the
   real slurmd 22.05, tests/test_stray_process.py). And, under every ProctrackType, the
   step sockets slurmstepd makes in ``SlurmdSpoolDir`` (``<NodeName>_<job>.<step>
   [.<het component>]``, the names Slurm's own ``stepd_available()`` lists for
   ``scontrol listpids`` and slurmd; :func:`spool_slurm_jobs`: names only, never
   connecting, only root's/SlurmUser's/SlurmdUser's sockets in a directory no one else
   can write, at most :data:`SPOOL_MAX_ENTRIES` entries). A socket goes at its step's
   end, so a job is listed while it has a step here (seen on the real slurmd 22.05,
   tests/test_card_jobs_spool.py). Under ``proctrack/cgroup`` the two are united: a
   job in either is asked, keyed by its cgroup directory's inode where it has one, else
   by its first step socket's (extern, else batch, else the lowest step).
2. **Its cards** (one ``REQUEST_JOB_INFO_SINGLE`` per job id newly seen): the query of
   :func:`hetpatrol.slurm.job_gres.job_query` for the installed Slurm (``scontrol
   --version``, local): ``squeue --json --jobs=ID`` from 23.02.3, ``scontrol -d show job
   ID`` (Slurm's own per-node block, :func:`hetpatrol.slurm.job_gres.
   parse_show_job_detail`) before; IDX -> card is :func:`hetpatrol.slurm.jobguard.
   match_cards` (the cards of one GRES name in (index, chip) order; on a GPU in MIG mode
   its MIG devices, each mapped to its GPU; several types in the registered ``Gres=``
   order, :attr:`CardJobs.gres_order`; where Slurm's order cannot be told,
   :func:`hetpatrol.slurm.jobguard.unmapped_gres`, the cards of that GRES name have
   unknown jobs, never "none"). The answer is kept while the job's directory is the same
   one (its inode: a requeued job that runs here again gets a new directory and is asked
   again). An
   allocation does not change while the job runs on the node: the Slurm FAQ ("Can I
   change my job's size after it has started?", https://slurm.schedmd.com/faq.html)
   shrinks a running job by whole nodes (``scontrol update JobId=.. NumNodes=..``; a
   node released ends the job's steps there, and its directory) and grows one only by
   merging the nodes of another job submitted with ``--dependency=expand:``; a query
   that fails (no answer: a timeout, an error exit) is asked again after
   ``retry_seconds``. An answer that was read and refused (a forged block that makes the
   readings differ, an IDX that cannot be read) is the job owner's text and says the same
   when asked again: it is asked again after ``retry_seconds`` doubled for each such
   answer in a row, at most :data:`REFUSED_RETRY_MAX_SECONDS` (before, every minute for
   the job's life: a user's array of jobs with a copied block in their names cost
   slurmctld one single-job RPC a minute per job instead of one per job). So is a job
   slurmctld answers it will not show (:data:`INVALID_JOB_ID`: another user's job under
   ``PrivateData=jobs``, the same answer for the job's life).

Trust (the text path of Slurm 23.02.2 and earlier): ``scontrol -d show job J`` prints J's
name, comment and paths raw, so J's owner can write lines of Slurm's shape. Slurm's own
block is always there whole, and a forged one that says otherwise makes the readings
differ: then J's allocation is unknown (never the forged one; :attr:`error` names J). A
job's answer only ever credits cards to that job, so another user's job and processes
are judged from their own jobs' answers; a card on which a process of a job with an
unknown allocation runs is not judged (``jobs_of`` None), the others are. So J's owner
can make only the cards of J's own processes unjudged (J's own escaped process among
them: a limit of the 22.05 text, said in ``card_jobs_unread``), never another user's
process stray: a site that maps ``stray_process`` to a drain is drained by no forgery
(``stray_process`` is ``watch`` by default). The job ids that are looked up come from
directories only root makes (the job's user cannot make one at that depth, seen on the
real slurmd 22.05) and from the processes' cgroups.

Whether a process is in its job can be told only where Slurm puts every task of a step
in the step's cgroup: ``ProctrackType=proctrack/cgroup``
(``src/plugins/proctrack/cgroup/proctrack_cgroup.c``: ``proctrack_p_create`` makes the
step's cgroup, ``proctrack_p_add`` puts each task in it). ``proctrack/linuxproc`` and
``proctrack/pgid`` make none (slurm.conf(5): they "can fail to identify all processes
associated with a job"; a real 22.05 slurmd with linuxproc leaves a job's ``sleep`` in
no Slurm cgroup, tests/test_stray_process.py). :class:`CardJobs` reads ``ProctrackType``
from ``scontrol show config`` (beside the same command, every ``config_cache_seconds``).
Without ``proctrack/cgroup`` nothing is asked per patrol and
:meth:`CardJobs.stray_jobs_of` is None for every card (stray_process not judged,
:attr:`CardJobs.stray_note` says why); the allocation is read only when a card fault
event needs its jobs (:meth:`CardJobs.fault_jobs_of`): the jobs from the step sockets,
each new one asked once as above. Only where no socket listing can be had at all
(``SlurmdSpoolDir`` unknown, holding ``%h``, missing, not root's/SlurmUser's, writable
by others, past :data:`SPOOL_MAX_ENTRIES` entries; or the Slurm version unread) is the
whole queue read, ``squeue --json`` (the one query that names a node's jobs without a
job id), at most once per ``fault_read_seconds``; :attr:`CardJobs.spool_error` says why.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from hetpatrol.path_walk import resolve_checked
from hetpatrol.processes import PROC_ROOT, init_cgroup_root
from hetpatrol.schema import CardRecord
from hetpatrol.slurm.inventory import tool_error
from hetpatrol.slurm.job_gres import (
    JSON_ONE_JOB_SINCE,
    SHOW_JOB,
    Allocation,
    array_task_query,
    job_query,
    parse_job_answer,
    parse_show_job_detail,
    slurm_version,
)
from hetpatrol.slurm.jobguard import (
    SQUEUE_JSON_MAX,
    _job_nodes,
    match_cards,
    parse_squeue_json,
    squeue_argv,
    unmapped_gres,
)
from hetpatrol.tool import run_tool

#: job states in which a job holds its cards (squeue(1), JOB STATE CODES)
HOLDING_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING"})
#: the ProctrackType that puts every task of a step in the step's cgroup (see above)
CGROUP_PROCTRACK = "proctrack/cgroup"


def proctrack_type(text: str) -> str | None:
    """``ProctrackType`` of ``scontrol show config`` (``ProctrackType           =
    proctrack/cgroup``), lower-case, printable and at most 64 characters (it goes into a
    message); None when the output names none."""
    value = config_value(text, "ProctrackType")
    return value.lower()[:64] if value else None


#: ``PrivateData`` words that hide other users' jobs: slurm.conf(5) 22.05 "jobs:
#: Prevents users from viewing jobs or job steps belonging to other users" (``all`` of
#: older releases too)
PRIVATE_JOBS = frozenset({"jobs", "all"})


def config_value(text: str, key: str) -> str | None:
    """The value of ``key`` in ``scontrol show config`` (``PrivateData             =
    jobs``; keys case-insensitive), printable and at most 200 characters; None when the
    output names it not."""
    for line in text.splitlines():
        k, sep, value = line.partition("=")
        if sep and k.strip().lower() == key.lower() and value.strip():
            return "".join(ch for ch in value.strip() if ch.isprintable())[:200]
    return None


def private_jobs(text: str) -> frozenset[str]:
    """The words of ``PrivateData`` (``accounts,jobs`` -> ``{accounts, jobs}``; ``none``
    or no line: empty) of ``scontrol show config``, lower-case."""
    value = (config_value(text, "PrivateData") or "").lower()
    words = {w.strip() for w in value.split(",") if w.strip()}
    return frozenset(words - {"none", "(null)"})


def slurm_user_uid(text: str, key: str = "SlurmUser") -> int | None:
    """The uid of ``SlurmUser`` (``SlurmUser               = root(0)``, scontrol show
    config 22.05; ``key`` ``SlurmdUser`` the same way), None when not printed so."""
    m = re.fullmatch(r"\S*\(([0-9]{1,10})\)", config_value(text, key) or "")
    return int(m.group(1)) if m else None


def lists_other_users(text: str, uid: int) -> bool:
    """True when ``squeue --json`` ``text`` lists a job whose ``user_id`` is not
    ``uid``: the reader sees other users' jobs (PrivateData does not hide them from it:
    an operator or admin, slurm.conf(5))."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return False
    jobs = doc.get("jobs") if isinstance(doc, Mapping) else None
    return any(
        isinstance(j, Mapping)
        and isinstance(j.get("user_id"), int)
        and not isinstance(j.get("user_id"), bool)
        and j["user_id"] != uid
        for j in (jobs if isinstance(jobs, list) else ())
    )


def _states(record: Mapping[str, Any]) -> set[str]:
    state = record.get("job_state")
    if isinstance(state, str):
        return {state.upper()}
    if isinstance(state, list):
        return {s.upper() for s in state if isinstance(s, str)}
    return set()


def _card_key(card: CardRecord) -> dict[str, Any]:
    return {
        "vendor": card.vendor,
        "index": card.index,
        "chip": card.chip,
        "gres": card.gres,
        "uuid": card.uuid,
        "model": card.model,
        # MIG devices: Slurm's IDX counts them (jobguard._slurm_devices)
        "partitions": [p.to_dict() for p in card.partitions],
    }


def card_jobs(
    text: str,
    node: str,
    cards: Sequence[CardRecord],
    gres_order: Mapping[str, Any] | None = None,
) -> tuple[dict[int, frozenset[str]], str | None]:
    """(position of each card in ``cards`` -> its job ids, error). The jobs are those of
    ``squeue --json`` ``text`` that hold cards on ``node``; an unreadable output is
    ``({}, why)``. A job whose GRES cannot be read is named in the error and left out.
    A job whose IDX cannot be mapped to cards (a node in MIG mode where Slurm's order is
    not known, :func:`~hetpatrol.slurm.jobguard.unmapped_gres`) is named in the error and
    the cards of that GRES name are left out of the answer: their jobs are unknown (the
    job is on one of them), never "none". ``gres_order``: the IDX order of GRES names of
    several types (the state file's ``gres_order``)."""
    if len(text) > SQUEUE_JSON_MAX:
        return {}, f"squeue --json: output larger than {SQUEUE_JSON_MAX} bytes"
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return {}, f"squeue --json: not JSON ({type(exc).__name__})"
    jobs = doc.get("jobs") if isinstance(doc, Mapping) else None
    if not isinstance(jobs, list):
        return {}, "squeue --json: no jobs list"
    keys = [_card_key(c) for c in cards]
    out: dict[int, set[str]] = {i: set() for i in range(len(cards))}
    errors: list[str] = []
    unknown: set[int] = set()
    for record in jobs:
        if not isinstance(record, Mapping) or not (_states(record) & HOLDING_STATES):
            continue
        job_id = record.get("job_id")
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            continue
        try:
            if node not in _job_nodes(record):
                continue
        except (ValueError, RecursionError):
            continue
        alloc = parse_squeue_json(json.dumps({"jobs": [record]}), str(job_id), node)
        if alloc.errors:
            errors.append(f"job {job_id}: {'; '.join(alloc.errors)}")
            continue
        for gres, why in unmapped_gres(keys, alloc, gres_order).items():
            errors.append(f"job {job_id}: {gres} IDX not mapped to cards: {why}")
            unknown.update(i for i, k in enumerate(keys) if str(k["gres"] or "").lower() == gres)
        matched, _missing = match_cards(keys, alloc, gres_order)
        for card in matched:
            out[next(i for i, k in enumerate(keys) if k is card)].add(str(job_id))
    answer = {i: frozenset(v) for i, v in out.items() if i not in unknown}
    return answer, ("; ".join(errors) or None)


#: where the cgroup hierarchies are mounted (cgroup.conf(5) CgroupMountpoint default)
CGROUP_ROOT = Path("/sys/fs/cgroup")
_JOB_DIR = re.compile(r"job_([0-9]{1,12})")
_UID_DIR = re.compile(r"uid_[0-9]{1,10}")


def _dirs(path: Path) -> list[os.DirEntry[str]]:
    """The subdirectories of ``path`` (none when it is missing or unreadable), without
    following symlinks."""
    try:
        with os.scandir(path) as it:
            return [e for e in it if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def local_slurm_jobs(
    node: str, cgroup_root: Path = CGROUP_ROOT, proc_root: Path | None = None
) -> dict[str, int]:
    """The Slurm jobs with a step on this node, from the job directories Slurm's cgroup
    plugins make (module docstring): job id -> the inode of its directory (a new
    directory for the same id, a requeued job run here again, is a new inode). Only
    Slurm's own depth is looked at: v1 ``<root>/<controller>/{slurm,slurm_<node>}/
    uid_<n>/job_<id>``, v2 ``<root><init>/system.slice/{slurmstepd.scope,
    <node>_slurmstepd.scope}/job_<id>``; none found is ``{}`` (no job here, or no
    hierarchy of Slurm's yet). No RPC, no process started; never raises."""
    found: dict[str, int] = {}
    init = ""
    if (cgroup_root / "cgroup.controllers").is_file():  # the unified (v2) hierarchy
        try:
            text = (proc_root or PROC_ROOT).joinpath("1", "cgroup").read_text()
            init = init_cgroup_root(text)
        except OSError:
            init = ""
    v2_base = cgroup_root / init.lstrip("/") / "system.slice"
    for scope in ("slurmstepd.scope", f"{node}_slurmstepd.scope"):
        for e in _dirs(v2_base / scope):
            m = _JOB_DIR.fullmatch(e.name)
            if m:
                found.setdefault(m.group(1), e.inode())
    for controller in sorted(_dirs(cgroup_root), key=lambda e: e.name):
        for prepend in ("slurm", f"slurm_{node}"):
            for uid in _dirs(Path(controller.path) / prepend):
                if not _UID_DIR.fullmatch(uid.name):
                    continue
                for e in _dirs(Path(uid.path)):
                    m = _JOB_DIR.fullmatch(e.name)
                    if m:
                        found.setdefault(m.group(1), e.inode())
    return found


#: the longest wait before a job whose answer was refused is asked again
REFUSED_RETRY_MAX_SECONDS = 3600.0

#: step ids slurmstepd gives a job's own steps (slurm/slurm.h 22.05 to 25.05:
#: ``SLURM_PENDING_STEP`` 0xfffffffd, ``SLURM_EXTERN_CONT`` 0xfffffffc,
#: ``SLURM_BATCH_SCRIPT`` 0xfffffffb, ``SLURM_INTERACTIVE_STEP`` 0xfffffffa); every other
#: number is an srun step. Any of them is a step of the job running on this node.
EXTERN_STEP, BATCH_STEP = 0xFFFFFFFC, 0xFFFFFFFB
#: most entries of SlurmdSpoolDir read (its sockets, ``job<NNNNN>`` script directories,
#: ``cred_state``, the hwloc topology): past it the listing is incomplete, so refused
SPOOL_MAX_ENTRIES = 20000


def _step_socket(node: str) -> re.Pattern[str]:
    """The name slurmstepd gives a step's socket in SlurmdSpoolDir: ``<NodeName>_<job>.
    <step>[.<het component>]``. Made by ``_domain_socket_create()``
    (src/slurmd/slurmstepd/req.c, 22.05.8 lines 215-219, 25.05.5 lines 229-233:
    ``"%s/%s_%u.%u", dir, nodename, job_id, step_id`` then ``".%u", step_het_comp``
    when set; ``nodename`` is ``conf->node_name``, the NodeName, req.c 22.05.8 line 305:
    the real slurmd 22.05 of a NodeName that is not its host name names it so,
    fixtures/slurm/slurmd-spool-ls-l-22.05.txt)
    and listed by name by ``stepd_available()`` (src/common/stepd_api.c, 22.05.8 lines
    462-469 and 529-585; the same pattern in 23.02.7, 23.11.10, 24.05.8, 25.05.5 and
    master at 284c3b95f0:
    ``"^" nodename "_([[:digit:]]*)\\.([[:digit:]]*)\\.{0,1}([[:digit:]]*)$"``). Slurm's
    own pattern takes the NodeName as a regex and empty numbers (read as 0); this one
    takes the NodeName literally and only numbers of 1 to 10 digits."""
    return re.compile(re.escape(node) + r"_([0-9]{1,10})\.([0-9]{1,10})(?:\.([0-9]{1,10}))?")


def _untrusted_dir(here: str, st: os.stat_result, trusted: frozenset[int], last: bool) -> str:
    """Why directory ``here`` cannot hold Slurm's own sockets ('' when it can): not owned
    by ``trusted``, or writable by group or others (on the way to it: unless sticky,
    where no one renames another's entry)."""
    if st.st_uid not in trusted:
        return f"{here} is owned by uid {st.st_uid}, not root or SlurmUser/SlurmdUser"
    if st.st_mode & 0o022 and (last or not st.st_mode & stat.S_ISVTX):
        return f"{here} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


class SpoolJobs(NamedTuple):
    """:func:`spool_slurm_jobs`'s answer: ``jobs`` job id -> the inode of its first step
    socket (extern, else batch, else the lowest step), None when no listing could be
    had (``error`` says why); ``path`` the directory read."""

    jobs: dict[str, int] | None
    error: str | None
    path: str


def spool_slurm_jobs(
    node: str,
    spool_dir: str,
    trusted: frozenset[int],
    max_entries: int = SPOOL_MAX_ENTRIES,
) -> SpoolJobs:
    """The Slurm jobs with a step on this node, from the step sockets slurmstepd makes in
    ``SlurmdSpoolDir`` (``spool_dir`` as ``scontrol show config`` prints it; ``%n`` is the
    NodeName ``node``, slurm_conf_expand_slurmd_path(), src/common/read_config.c 22.05.8
    line 5345): the names only (:func:`_step_socket`), never connecting to a socket (they
    are mode 0777, req.c 22.05.8 line 242). Only sockets owned by a ``trusted`` uid (root,
    SlurmUser, SlurmdUser) count, in a directory owned by one of them that no one else can
    write (slurmd makes it 0755, ``_set_slurmd_spooldir()``, src/slurmd/slurmd/slurmd.c
    22.05.8 lines 2319-2336); a symbolic link is never followed, save one owned by a
    ``trusted`` uid on the way to the directory, whose directories on the way are owned by
    them and not writable by others unless sticky. A socket goes at its step's end
    (``_domain_socket_destroy()``, req.c 22.05.8 line 254), so a job is listed while it has
    a step here. No listing (``jobs`` None): ``%h`` in the path (the NodeHostname is not
    known here), a relative path, a directory missing, unreadable or not trusted, or more
    than ``max_entries`` entries. No RPC, no process started; never raises."""
    path = spool_dir.replace("%n", node)
    if "%h" in path or not path.startswith("/"):
        return SpoolJobs(None, f"SlurmdSpoolDir {spool_dir!r}: not a path read here", path)

    def on_link(here: str, st: os.stat_result) -> None:
        if st.st_uid not in trusted:
            raise PermissionError(f"{here} is a symbolic link of uid {st.st_uid}")

    def on_dir(here: str, st: os.stat_result) -> None:
        why = _untrusted_dir(here, st, trusted, last=False)
        if why:
            raise PermissionError(why)

    try:
        real = resolve_checked(path, on_link, on_dir)
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        why = str(exc) if exc.errno is None else (exc.strerror or str(exc))
        return SpoolJobs(None, f"SlurmdSpoolDir {path}: {why}", path)
    try:
        why = _untrusted_dir(real, os.fstat(fd), trusted, last=True)
        if why:
            return SpoolJobs(None, f"SlurmdSpoolDir: {why}", path)
        pattern = _step_socket(node)
        best: dict[str, tuple[tuple[int, int], int]] = {}
        with os.scandir(fd) as it:
            for n, entry in enumerate(it):
                if n >= max_entries:
                    return SpoolJobs(
                        None, f"SlurmdSpoolDir {path}: more than {max_entries} entries", path
                    )
                m = pattern.fullmatch(entry.name)
                if not m:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone since listed: its step ended
                if not stat.S_ISSOCK(st.st_mode) or st.st_uid not in trusted:
                    continue
                job, step = m.group(1), int(m.group(2))
                if int(job) > 0xFFFFFFFF or step > 0xFFFFFFFF:
                    continue  # not a uint32_t, as Slurm's ids are (slurm_step_id_t)
                rank = (0 if step == EXTERN_STEP else 1 if step == BATCH_STEP else 2, step)
                job = str(int(job))
                if job not in best or rank < best[job][0]:
                    best[job] = (rank, st.st_ino)
    except OSError as exc:
        return SpoolJobs(None, f"SlurmdSpoolDir {path}: {exc.strerror or exc}", path)
    finally:
        os.close(fd)
    return SpoolJobs({job: ino for job, (_rank, ino) in best.items()}, None, path)


#: slurmctld's answer for a job it will not show this reader: ``ESLURM_INVALID_JOB_ID``
#: (src/common/slurm_errno.c "Invalid job id specified"), what scontrol -d show job ID
#: prints for another user's job under ``PrivateData=jobs`` (seen on the real
#: slurmctld 22.05, tests/test_slurm_json_versions.py)
INVALID_JOB_ID = "Invalid job id specified"


def _refused_again(out: Any, refused: int) -> int:
    """The refused-answer count after a failed query ``out``: one more when slurmctld
    answered that the job is none it will show (:data:`INVALID_JOB_ID`: the same answer
    each time while PrivateData hides it), else 0 (no answer: a timeout, a controller
    not reached)."""
    said = f"{out.stderr}\n{out.stdout}" if not out.hung else ""
    return refused + 1 if INVALID_JOB_ID in said else 0


class _Asked(NamedTuple):
    """One job's answer: ``key`` the inode of the directory it was asked for (None: known
    from a process only), ``alloc`` None while unknown (``error`` says why), ``at``
    when it was asked (the daemon's clock), ``refused`` how many answers in a row were
    read and refused (0: none, or no answer at all)."""

    key: int | None
    alloc: Allocation | None
    error: str | None
    at: float
    refused: int = 0


class CardJobs:
    """The Slurm jobs of each card of this node: which jobs from the node's own cgroups,
    their cards from one single-job query per job (see the module docstring);
    ``jobs_of(card)`` answers from the last :meth:`refresh`."""

    def __init__(
        self,
        scontrol: Sequence[str],
        node: str,
        timeout: float = 10.0,
        runner: Callable[..., Any] = run_tool,
        clock: Callable[[], float] = time.monotonic,
        config_cache_seconds: float = 600.0,
        retry_seconds: float = 60.0,
        fault_read_seconds: float = 600.0,
        cgroup_root: Path = CGROUP_ROOT,
        proc_root: Path | None = None,
        uid: int | None = None,
    ):
        head = list(scontrol[:-1])
        #: the fault path's whole-queue read (without a local job list only)
        self.argv = [*head, *squeue_argv(scontrol[-1])]
        # scontrol beside the same command (squeue_argv's rule), read-only
        tool_dir, sep, _tail = scontrol[-1].rpartition("/")
        self._head, self._scontrol = head, f"{tool_dir}{sep}scontrol"
        self.config_argv = [*head, self._scontrol, "show", "config"]
        self.version_argv = [*head, self._scontrol, "--version"]
        self.node, self.timeout = node, timeout
        self.config_cache_seconds, self.retry_seconds = config_cache_seconds, retry_seconds
        self.fault_read_seconds = fault_read_seconds
        self.cgroup_root, self.proc_root = cgroup_root, proc_root
        self.runner, self.clock = runner, clock
        self.error: str | None = None
        #: ``ProctrackType`` of ``scontrol show config`` (None: not read, see
        #: :attr:`stray_note`)
        self.proctrack: str | None = None
        self._proctrack_error: str | None = "not read yet"
        #: the uid slurmctld sees asking (the daemon's own, unless ``scontrol``'s argv
        #: prefix runs it as another: then that one's, passed here)
        self.uid = os.geteuid() if uid is None else uid
        #: ``PrivateData`` hides other users' jobs from :attr:`uid` (scontrol show config:
        #: not root, not SlurmUser); an answer that lists another user's job clears it
        self._private: str | None = None
        self._sees_others = False
        #: the installed Slurm (``scontrol --version``, local), None until read
        self.version: tuple[int, int, int] | None = None
        self._version_error: str | None = "not read yet"
        self._config_read_at: float | None = None
        #: ``SlurmdSpoolDir`` of ``scontrol show config`` (None: not read) and the uids
        #: whose step sockets and directory are Slurm's (root, SlurmUser, SlurmdUser)
        self.spool_dir: str | None = None
        self._slurm_uids: frozenset[int] = frozenset({0})
        #: why the last step-socket listing could not be had (None: it was, or not tried)
        self.spool_error: str | None = None
        #: job id -> its answer, kept while the job's directory is the same
        self._jobs: dict[str, _Asked] = {}
        self._by_identity: dict[int, frozenset[str]] | None = None
        self._unjudged: set[int] = set()
        self._cards: list[CardRecord] = []
        self._fault_read_at: float | None = None
        self._fault_map: dict[int, frozenset[str]] | None = None
        #: the IDX order of GRES names of several types (the GRES check's ``order``, set
        #: by the patrol; :func:`hetpatrol.slurm.jobguard.match_devices`)
        self.gres_order: Mapping[str, Any] | None = None
        #: single-job queries run so far (the whole-queue fault reads not counted)
        self.queries = 0

    @property
    def listed(self) -> bool:
        """True when Slurm's job cgroups say which jobs run here (proctrack/cgroup)."""
        return self.proctrack == CGROUP_PROCTRACK

    def refresh(self, cards: Sequence[CardRecord]) -> None:
        """Read ``ProctrackType`` (``scontrol show config``) and ``scontrol --version``
        every ``config_cache_seconds`` (every ``retry_seconds`` while either is unknown).
        Under ``proctrack/cgroup``: list the node's jobs (:func:`local_slurm_jobs`, the
        step sockets of :meth:`spool_jobs`, the job ids of ``cards``' processes), ask each
        job not asked yet (or whose directory is a new one, or whose query failed
        ``retry_seconds`` ago) with one
        single-job query, forget the jobs gone, and map this patrol's ``cards``.
        Otherwise ask nothing: every card's jobs are unknown (None)."""
        now = self.clock()
        self._cards = list(cards)
        self._fault_map = None
        known = self.proctrack is not None and self.version is not None
        if self._config_read_at is None or now - self._config_read_at >= (
            self.config_cache_seconds if known else self.retry_seconds
        ):
            self._config_read_at = now
            self._read_config()
        if not self.listed:  # the jobs are listed for a fault event only (fault_jobs_of)
            self._by_identity, self.error = None, self.private_note
            return
        if self.version is None:
            self._by_identity = None
            self.error = f"scontrol --version: {self._version_error}"
            return
        local: dict[str, int | None] = dict(
            local_slurm_jobs(self.node, self.cgroup_root, self.proc_root)
        )
        # the second source: a job with a step socket but no directory where it is
        # looked for (a hierarchy mounted elsewhere, a step starting) is asked too; a
        # job in both keeps its directory's inode
        for job, ino in (self.spool_jobs() or {}).items():
            local.setdefault(job, ino)
        for c in cards:
            for p in c.processes:
                if p.job_id is not None and p.job_id.isdigit():
                    local.setdefault(p.job_id, None)
        self._sync(local, now)
        self._map(cards)

    def _sync(self, local: Mapping[str, int | None], now: float) -> None:
        """Forget the jobs not in ``local`` (job id -> the inode of its directory or
        socket, None: seen by a process only), ask each new one (or one whose inode
        changed, or whose query failed ``retry_seconds`` ago)."""
        for job in [j for j in self._jobs if j not in local]:
            del self._jobs[job]  # its directory is gone: the job ended here
        for job, key in sorted(local.items(), key=lambda kv: int(kv[0])):
            had = self._jobs.get(job)
            same = had is not None and (key is None or had.key in (key, None))
            if same and (had.alloc is not None or now - had.at < self._retry_after(had)):
                if had.key is None and key is not None:  # first seen by a process
                    self._jobs[job] = had._replace(key=key)
                continue
            self._jobs[job] = self._ask(job, key, now, had.refused if same else 0)

    def _retry_after(self, asked: _Asked) -> float:
        """Seconds before a job without an allocation is asked again: ``retry_seconds``
        after no answer, doubled for each refused answer in a row (at most
        :data:`REFUSED_RETRY_MAX_SECONDS`)."""
        if asked.refused <= 0:
            return self.retry_seconds
        wait = self.retry_seconds * 2.0 ** min(asked.refused - 1, 32)
        return min(wait, max(REFUSED_RETRY_MAX_SECONDS, self.retry_seconds))

    def _ask(self, job: str, key: int | None, now: float, refused: int = 0) -> _Asked:
        """One single-job query (:func:`hetpatrol.slurm.job_gres.job_query`); a failed
        one says so, and that PrivateData may hide the job (:attr:`private_note`)."""
        asked = self._ask_once(job, key, now, refused)
        if asked.error is not None and self.private_note:
            return asked._replace(error=f"{asked.error} ({self.private_note})")
        return asked

    def _ask_once(self, job: str, key: int | None, now: float, refused: int = 0) -> _Asked:
        """``refused``: the refused answers in a row before this one."""
        version = self.version or JSON_ONE_JOB_SINCE
        argv = [*self._head, *job_query(self._scontrol, job, version)]
        what = "squeue --json" if version >= JSON_ONE_JOB_SINCE else SHOW_JOB
        self.queries += 1
        try:
            out = self.runner(argv, self.timeout)
        except OSError as exc:
            return _Asked(key, None, f"{what}: {exc.strerror or exc}", now)
        error = tool_error(out)
        if error:
            return _Asked(key, None, error, now, _refused_again(out, refused))
        alloc = parse_job_answer(out.stdout, job, self.node, version)
        task = array_task_query(out.stdout, job) if alloc.errors and what == SHOW_JOB else None
        if task is not None:  # an array's own id: its record alone, one more answer
            self.queries += 1
            try:
                out = self.runner([*self._head, self._scontrol, "-d", "show", "job", task],
                                  self.timeout)  # fmt: skip
            except OSError as exc:
                return _Asked(key, None, f"{what} {task}: {exc.strerror or exc}", now)
            error = tool_error(out)
            if error:
                return _Asked(key, None, error, now)
            alloc = parse_show_job_detail(out.stdout, job, self.node)
        if alloc.errors:  # read, and refused: asking again soon says the same
            return _Asked(key, None, "; ".join(alloc.errors), now, refused + 1)
        return _Asked(key, alloc, None, now)

    def _map(self, cards: Sequence[CardRecord]) -> None:
        self._by_identity, self._unjudged, self.error = self._mapped(cards)

    def _mapped(
        self, cards: Sequence[CardRecord]
    ) -> tuple[dict[int, frozenset[str]], set[int], str | None]:
        """(position -> job ids, positions not judged, error) of ``cards`` from the
        answers kept."""
        keys = [_card_key(c) for c in cards]
        out: dict[int, set[str]] = {i: set() for i in range(len(cards))}
        errors = []
        unmapped: set[int] = set()
        for job, asked in sorted(self._jobs.items(), key=lambda kv: int(kv[0])):
            if asked.alloc is None:
                errors.append(f"job {job}: {asked.error}")
                continue
            for gres, why in unmapped_gres(keys, asked.alloc, self.gres_order).items():
                errors.append(f"job {job}: {gres} IDX not mapped to cards: {why}")
                unmapped.update(
                    i for i, k in enumerate(keys) if str(k["gres"] or "").lower() == gres
                )
            matched, _missing = match_cards(keys, asked.alloc, self.gres_order)
            for card in matched:
                out[next(i for i, k in enumerate(keys) if k is card)].add(job)
        unknown = {job for job, asked in self._jobs.items() if asked.alloc is None}
        # a card a process of a job with an unknown allocation runs on: that process
        # may be on its own job's card, so the card is not judged (its jobs unknown);
        # every other card is judged by the answers of its own jobs
        unjudged = unmapped | {
            i for i, c in enumerate(cards) if any(p.job_id in unknown for p in c.processes)
        }
        if unknown and self.private_note:
            # a job hidden by PrivateData may hold any card no answer names: unknown,
            # never "no job"
            unjudged |= {i for i, v in out.items() if not v}
        return {i: frozenset(v) for i, v in out.items()}, unjudged, "; ".join(errors) or None

    def _unknown_jobs(self) -> bool:
        """Whether a job of the node has no allocation read (failed, refused, hidden)."""
        return any(asked.alloc is None for asked in self._jobs.values())

    def _read_config(self) -> None:
        """``ProctrackType`` and the Slurm version, each with why when unread."""
        for argv, attr in ((self.config_argv, "proctrack"), (self.version_argv, "version")):
            value: Any = None
            try:
                out = self.runner(argv, self.timeout)
            except OSError as exc:
                error: str | None = f"{exc.strerror or exc}"
            else:
                error = tool_error(out)
                if error is None and attr == "proctrack":
                    value = proctrack_type(out.stdout)
                    error = None if value else "no ProctrackType line"
                    self._read_private(out.stdout)
                    self._read_spool(out.stdout)
                elif error is None:
                    value = slurm_version(out.stdout)
                    error = None if value else f"said {out.stdout[:60]!r}: no Slurm version"
            setattr(self, attr, value)
            setattr(self, f"_{attr}_error", error)

    def _read_spool(self, config: str) -> None:
        """``SlurmdSpoolDir`` (raw, ``%n`` unexpanded as scontrol prints it) and the uids
        Slurm's own files there belong to: root, ``SlurmUser`` and ``SlurmdUser``."""
        self.spool_dir = config_value(config, "SlurmdSpoolDir")
        uids = {slurm_user_uid(config), slurm_user_uid(config, "SlurmdUser")}
        self._slurm_uids = frozenset({0} | {u for u in uids if u is not None})

    def spool_jobs(self) -> dict[str, int] | None:
        """:func:`spool_slurm_jobs` of this node's ``SlurmdSpoolDir`` (job id -> socket
        inode), None when no listing could be had (:attr:`spool_error` says why)."""
        if self.spool_dir is None:
            self.spool_error = "SlurmdSpoolDir unknown (scontrol show config)"
            return None
        got = spool_slurm_jobs(self.node, self.spool_dir, self._slurm_uids)
        self.spool_error = got.error
        return got.jobs

    def _read_private(self, config: str) -> None:
        """:attr:`private_note`'s facts from ``scontrol show config`` text: slurm.conf(5)
        PrivateData=jobs: "Prevents users from viewing jobs or job steps belonging to
        other users"; SlurmUser and root see every job (shown on slurmctld 22.05: as
        another uid, ``scontrol -d show job ID`` of root's job exits 1 "Invalid job id
        specified", ``squeue --json`` leaves it out; tests/test_slurm_json_versions.py)."""
        words = private_jobs(config) & PRIVATE_JOBS
        privileged = self.uid == 0 or self.uid == slurm_user_uid(config)
        self._private = (
            None if privileged or not words else "PrivateData=" + ",".join(sorted(words))
        )

    @property
    def private_note(self) -> str | None:
        """Why other users' jobs may be hidden from this reader (None: they are not):
        ``PrivateData=jobs`` and a uid that is neither root nor SlurmUser. slurmctld then
        answers for another user's job as for no job, so its cards are unknown, never
        "none". An operator or admin sees them (slurm.conf(5)), which scontrol show
        config cannot tell: a whole-queue answer listing another user's job clears it."""
        if self._private is None or self._sees_others:
            return None
        return (
            f"{self._private} (scontrol show config) hides other users' jobs from uid "
            f"{self.uid} (not root, not SlurmUser): a job hidden so answers as none, so "
            "the jobs of the cards are unknown"
        )

    @property
    def stray_note(self) -> str | None:
        """Why stray processes are not judged on this node (None: they are): Slurm puts
        a job's processes in no cgroup of its own, or that is unknown."""
        if self.listed:
            return None
        if self.proctrack is None:
            why = f"ProctrackType unknown (scontrol show config: {self._proctrack_error})"
        else:
            why = f"ProctrackType={self.proctrack} (scontrol show config)"
        return (
            f"{why}: only proctrack/cgroup puts a job's processes in its cgroup, which "
            "tells whether a process is in its job: stray_process is not judged"
        )

    def stray_jobs_of(self, card: CardRecord) -> frozenset[str] | None:
        """:meth:`jobs_of` for the stray check: None (not judged) without
        ``proctrack/cgroup`` (:attr:`stray_note`)."""
        return self.jobs_of(card) if self.listed else None

    def jobs_of(self, card: CardRecord) -> frozenset[str] | None:
        """The job ids of ``card`` (one of the last :meth:`refresh`'s cards), empty for
        none; None when unknown (no local job list, a process of a job whose query failed
        on the card, a job's IDX not mapped to cards of its GRES name, not one of the
        patrol's cards)."""
        if self._by_identity is None:
            return None
        for i, c in enumerate(self._cards):
            if c is card:
                return None if i in self._unjudged else self._by_identity.get(i, frozenset())
        return None

    def fault_jobs_of(self, card: CardRecord) -> frozenset[str] | None:
        """The job ids of ``card`` for a card fault event: :meth:`jobs_of` under
        ``proctrack/cgroup``; else the jobs of the step sockets in ``SlurmdSpoolDir``
        (:meth:`spool_jobs`), each new one asked once (a single-job query), mapped once
        per patrol; where no socket listing can be had (:attr:`spool_error`), one
        ``squeue --json`` (the whole queue: the one query that names a node's jobs
        without a job id) at most once per ``fault_read_seconds``. None when not read
        (the event still names the jobs of the card's processes)."""
        if self.listed:
            held = self.jobs_of(card)
            # no job known on it while a job of the node has an unknown allocation: it
            # may be that job's card (its owner's forged name, PrivateData), so unknown,
            # never "none" (the stray check judges it by its own jobs: jobs_of)
            return None if held == frozenset() and self._unknown_jobs() else held
        if self._fault_map is None and self.version is not None:
            sockets = self.spool_jobs()
            if sockets is not None:  # the step sockets: one single-job query per new job
                now = self.clock()
                local: dict[str, int | None] = dict(sockets)
                for c in self._cards:
                    for p in c.processes:
                        if p.job_id is not None and p.job_id.isdigit():
                            local.setdefault(p.job_id, None)
                self._sync(local, now)
                by_identity, unjudged, self.error = self._mapped(self._cards)
                unknown = self._unknown_jobs()  # an empty card may be such a job's
                self._fault_map = {
                    i: v for i, v in by_identity.items() if i not in unjudged and (v or not unknown)
                }
        if self._fault_map is None:
            now = self.clock()
            if self._fault_read_at is not None and (
                now - self._fault_read_at < self.fault_read_seconds
            ):
                return None
            self._fault_read_at = now
            try:
                out = self.runner(self.argv, self.timeout)
            except OSError as exc:
                self.error = f"squeue: {exc.strerror or exc}"
                return None
            error = tool_error(out)
            if error:
                self.error = error
                return None
            if self.private_note and lists_other_users(out.stdout, self.uid):
                self._sees_others = True  # an operator or admin: nothing is hidden
            if self.private_note:  # another user's job on a card would be missing
                self._fault_map, self.error = {}, self.private_note
            else:
                self._fault_map, self.error = card_jobs(
                    out.stdout, self.node, self._cards, self.gres_order
                )
        for i, c in enumerate(self._cards):
            if c is card:
                return self._fault_map.get(i) if self._fault_map else None  # absent: unknown
        return None
