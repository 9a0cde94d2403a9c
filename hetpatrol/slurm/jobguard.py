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
  job holds at least one card of the node. Other node findings let the job through:
  ``pci_unwatched`` (a card on the PCI bus its tool does not list, ``reset_card`` only
  after ``pci_census.unlisted_patrols`` daemon patrols in a row) names a card no job
  can be given through its tool; the daemon's drain acts on it.

Which cards (Slurm facts, checked in slurm.conf(5) of Slurm 22.05, section "Prolog and
Epilog Scripts", and in recorded outputs, fixtures/slurm):

- ``SLURM_JOB_GPUS``: "The GPU IDs of GPUs in the job allocation (if any). Available in
  the Prolog and Epilog" -- the GRES index (IDX) of the ``gpu`` GRES. ``SLURM_STEP_GPUS``
  (task environment) is the same for a step. ``CUDA_VISIBLE_DEVICES``: in the Prolog
  slurmd sets it to each device's ``unique_id`` (AutoDetect=nvml's MIG UUIDs) or its
  index (``gres_common_epilog_set_env``; seen on 22.05, tests/test_mig_gres_idx.py; not
  set when the ``File=`` is no device); in a step it may be renumbered by cgroup device
  constraints, so its numbers are used only when neither Slurm variable is there (UUID
  entries ``GPU-...``/``MIG-...`` are exact).
- The vendors' own variables (``CUDA_VISIBLE_DEVICES``, Ascend's ``ASCEND_VISIBLE_DEVICES``
  ...): the plugins declare them (``VendorInfo.job_env``,
  :class:`hetpatrol.collector.JobEnvVar`, with their sources) and the daemon writes
  them into the state file (``job_env``), so no plugin is imported here; a state file
  without that list (an older daemon's) has them read from the plugins
  (:func:`hetpatrol.collector.job_env_declarations`).
- Any vendor's GRES: one single-job answer of slurmctld (``REQUEST_JOB_INFO_SINGLE``,
  ``slurm_load_job()``), never the queue-wide dump, run only when a card with a blocking
  action has a GRES the environment did not cover: :func:`hetpatrol.slurm.job_gres.
  ask_job` picks the query by ``scontrol --version`` (local, no RPC): ``squeue --json
  --jobs=ID`` from Slurm 23.02.3 (its structured ``gres_detail`` paired with the hosts of
  ``job_resources``, :func:`parse_squeue_json`); up to 23.02.2 (22.05 here, whose
  ``squeue --json`` ignores ``--jobs=`` and lists every job, squeue(1): "All other
  formatting and filtering arguments will be ignored") ``scontrol -d show job ID``, read
  only from Slurm's own per-node block, and only when every block of that shape in the
  text agrees (:func:`hetpatrol.slurm.job_gres.parse_show_job_detail`). A job name,
  comment or work directory is free text that can hold a whole forged detail line or
  block (seen on slurmctld 22.05): the real block is always printed whole beside it, so
  a forged block that says otherwise makes the readings differ and nothing is taken
  (the job's other GRES unknown: the job goes through, the Epilog looks at every card);
  a copy that agrees says what Slurm says. A user's text can thus only make their own
  job's cards unknown, never credit it with a card it does not hold (which could drain
  the node). An answer that cannot be read is said in the line.

IDX -> card: Slurm numbers the devices of one GRES name on a node 0, 1, ... in gres.conf
``File=`` order (or the order AutoDetect found them); hetpatrol takes the cards of that
GRES name in (index, chip) order, which is the same order when ``File=/dev/nvidia[0-7]``
follows the NVML index (the usual case) and, for Ascend, ``/dev/davinci[0-7]`` the NPU
ID. On a GPU in MIG mode IDX counts MIG devices (one per ``MultipleFiles=`` line): the
job holds the MIG device's GPU, named ``nvidia/0 mig 3`` in the line. A GRES name of
several types (two models, MIG profiles, a whole GPU beside MIG devices) is numbered type
by type in the node's registered ``Gres=`` order, which the daemon writes into the state
file (``gres_order``). See :func:`_slurm_devices` for Slurm's rule and where it cannot be
told (then the IDX is reported unmatched, no card picked). An IDX with no card is
reported, never a reason to fail (a mapping fault must not drain a cluster).

Nothing here imports yaml, jsonschema, prometheus_client or pynvml. A state file whose
cards or findings lack the daemon's ``action`` (none the daemon writes) makes the
vendors' fault tables load, with their plugins (``VendorInfo.actions``).
"""

from __future__ import annotations

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
from hetpatrol.slurm.job_gres import (  # noqa: F401 - the Prolog's callers import these here
    GPU_GRES,
    SQUEUE_JSON_MAX,
    Allocation,
    Runner,
    _job_nodes,
    ask_job,
    find_scontrol,
    job_env_of,
    parse_index_list,
    parse_job_env_rows,
    parse_squeue_json,
    run_scontrol,
    squeue_argv,
)

EXIT_PASS = 0
EXIT_FAIL = 1


def plugin_job_env() -> list[Mapping[str, Any]]:
    """The installed plugins' ``job_env`` rows (imports them: a state file without its
    ``job_env`` list only)."""
    from hetpatrol.collector import job_env_declarations

    return list(job_env_declarations())


def parse_job_env(
    env: Mapping[str, str], job_env: Sequence[Mapping[str, Any]] | None = None
) -> Allocation:
    """:func:`hetpatrol.slurm.job_gres.parse_job_env_rows` with the vendors' variables
    ``job_env`` (rows of :func:`job_env_of`; None: the installed plugins',
    :func:`plugin_job_env`). Never raises; unreadable values go to ``errors``."""
    return parse_job_env_rows(env, plugin_job_env() if job_env is None else job_env)


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


#: the partitions Slurm counts as GRES devices of their own (``hetpatrol gres-conf``
#: writes a line per MIG device; a vNPU has no GRES model, its chip keeps its line)
_GRES_PARTITION_KINDS = ("mig",)


def _mig_parts(card: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The card's MIG devices (state ``partitions`` of kind ``mig``), in MIG index order."""
    parts = card.get("partitions")
    if not isinstance(parts, list):
        return []
    migs = [p for p in parts if isinstance(p, Mapping) and p.get("kind") in _GRES_PARTITION_KINDS]
    return sorted(migs, key=lambda p: _sort_key({"index": p.get("index")}))


def _file_number(path: Any) -> int | None:
    """The number a device file's name ends with (``nvidia-cap165`` -> 165), None if none."""
    digits = re.search(r"([0-9]{1,9})$", path) if isinstance(path, str) else None
    return int(digits.group(1)) if digits else None


def _key(card: Mapping[str, Any], part: Mapping[str, Any] | None) -> tuple[Any, Any, Any]:
    """(card index, chip, MIG index or None): a device as ``gres_order`` names it."""
    return card.get("index"), card.get("chip"), None if part is None else part.get("index")


def _order_entry(order: Mapping[str, Any] | None, gres: str) -> Mapping[str, Any] | None:
    """The state's ``gres_order`` entry of GRES name ``gres`` (None: none written)."""
    names = order.get("names") if isinstance(order, Mapping) else None
    entry = names.get(gres) if isinstance(names, Mapping) else None
    types = entry.get("types") if isinstance(entry, Mapping) else None
    return entry if isinstance(types, list) and types else None


def _by_types(
    devices: Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None]],
    entry: Mapping[str, Any],
    order: Mapping[str, Any],
    numbered: bool,
) -> tuple[list[tuple[Mapping[str, Any], Mapping[str, Any] | None]], str | None]:
    """The devices of a GRES name of several registered types in Slurm's IDX order, or
    ([], why): see :func:`_slurm_devices`. ``devices``: in gres-conf's order."""
    if entry.get("error"):
        return [], f"the node's registered Gres= does not fit its cards: {entry['error']}"
    at = {_key(c, p): (c, p) for c, p in devices}
    typed: list[tuple[Any, tuple[Any, Any, Any]]] = []
    for t in entry["types"]:
        keys = t.get("devices") if isinstance(t, Mapping) else None
        if not isinstance(keys, list):
            return [], "the state's gres_order is unreadable"
        for k in keys:
            if not (isinstance(k, list) and len(k) == 3):
                return [], "the state's gres_order is unreadable"
            typed.append((t.get("type"), (k[0], k[1], k[2])))
    order_keys = [k for _t, k in typed]
    if len(set(order_keys)) != len(order_keys) or set(order_keys) != set(at):
        return [], "the registered Gres= order names other devices than the cards"
    by_type = [at[k] for k in order_keys]
    plain = list(devices)
    mig = [p is not None for _c, p in plain]
    lines = order.get("gres_conf_lines")
    types = [str(t) for t, _k in typed]
    if lines is True:  # gres.conf lines: _merge_gres's order
        return by_type, None
    if not any(mig):
        pos = {_key(c, p): i for i, (c, p) in enumerate(plain)}
        if lines is False or order_keys == sorted(order_keys, key=pos.__getitem__):
            return plain, None  # AutoDetect: device file / NVML order; or the same
        met = dict.fromkeys(t for t, _k in sorted(typed, key=lambda tk: pos[tk[1]]))
        if list(dict.fromkeys(types)) != list(met):
            # AutoDetect's registration lists its types as its records (device order)
            # meet them (_build_node_gres_str): this one does not, so these are lines
            return by_type, None
        return [], (
            f"GRES types {', '.join(dict.fromkeys(types))} alternate among the cards: "
            "gres.conf lines number them by the registered Gres= types, AutoDetect=nvml "
            "by device; which one this node has is not known (gres.conf: "
            f"{order.get('gres_conf') or 'not read'})"
        )
    if lines is None and numbered and all(mig):
        return by_type, None  # numbers for MIG devices: gres.conf lines (no MIG UUIDs)
    return [], (
        f"GRES types {', '.join(dict.fromkeys(types))}"
        + (" (a whole GPU beside MIG devices)" if not all(mig) else "")
        + ": gres.conf lines number them by the registered Gres= types, AutoDetect=nvml "
        "otherwise; which one this node has is not known (gres.conf: "
        f"{order.get('gres_conf') or 'not read'})"
    )


def _slurm_devices(
    group: Sequence[Mapping[str, Any]],
    numbered: bool = False,
    order: Mapping[str, Any] | None = None,
    gres: str = GPU_GRES,
) -> tuple[list[tuple[Mapping[str, Any], Mapping[str, Any] | None]], str | None]:
    """The GRES devices of one GRES name in Slurm's IDX order: (card, MIG device or
    None) each, or ([], why) when that order cannot be told from the card records.

    Slurm's rule (22.05.8, 23.02-24.05 and 25.11.7): slurmd takes the gres.conf records
    (``gres_node_config_load``, src/common/gres.c; src/interfaces/gres.c from 23.02; the
    ``Name=`` lines before the ``NodeName=`` lines, ``s_p_get_array`` of each) and
    merges them with slurm.conf's ``Gres=``: for each type of the name in the order
    ``gres_add_type`` met them in ``Gres=``, the gres.conf records of that type in file
    order (``_merge_gres``/``_merge_gres2``, ``_match_type``; an untyped ``Gres=`` takes
    every record of the name in file order). ``common_node_config_load``
    (src/plugins/gres/common/gres_common.c) then numbers them: one index per ``File=``
    entry, one per ``MultipleFiles=`` record ("Don't ... increment the device bitmap
    index if this is a MultipleFiles GRES", then ``index++`` once per record); slurmctld
    gives bit ``gres_inx`` in the same record order (``_node_config_validate``), and that
    bit is the ``(IDX:n)`` of ``gres_detail`` and the number in ``SLURM_JOB_GPUS``
    (``gres_common_epilog_set_env``: ``gres_device->index``). So on a node in MIG mode
    IDX counts MIG devices. ``hetpatrol gres-conf`` writes the cards in (index, chip)
    order, a GPU in MIG mode as one ``MultipleFiles=`` line per MIG device in MIG index
    order: that order is IDX order when every device of the name has one type.

    Several types (two GPU models, MIG profiles, a whole GPU beside MIG devices): the
    order is the registered types' (``order``: the state's ``gres_order``, written by
    the daemon from ``scontrol show node``'s ``Gres=``, which slurmctld rebuilds from
    slurmd's records at registration; :func:`hetpatrol.slurm.inventory.gres_order`),
    each type's devices in gres-conf's order (:func:`_by_types`), taken when

    - the node's gres.conf (as the daemon read it) has lines and no AutoDetect, or
    - no MIG device: that order is the cards' own (AutoDetect's too), or the registered
      types are not in the order the cards meet them (AutoDetect's registration would
      be: its records are in device order, ``_merge_system_gres_conf``, gres_gpu.c), or
      gres.conf says AutoDetect (then the cards' own order: seen on slurmd 22.05 with
      Slurm's fake_gpus.conf, tests/test_gres_order.py), or
    - every device a MIG device and Slurm's variable numbered them (``numbered``:
      AutoDetect=nvml would have given their UUIDs).

    AutoDetect=nvml orders its records otherwise (``_merge_system_gres_conf``,
    src/plugins/gres/gpu/gres_gpu.c): by the ``File`` string (``strnatcmp``), then by the
    position of ``-1`` in ``Links``, which 22.05 sets for a MIG device to its MIG index
    (``gres_links_create_empty(j, mig_count)``, gpu_nvml.c) and 25.11 leaves empty. On
    slurmd 22.05 (Slurm's fake_gpus.conf standing in for NVML) two GPUs of four MIG
    devices were IDX 0 = GPU 1 MIG 0, IDX 1 = GPU 2 MIG 0, IDX 2 = GPU 1 MIG 1 ...;
    with gres.conf lines IDX 0-3 were GPU 1's. ``numbered``: Slurm's own variable of the
    name listed numbers (:attr:`Allocation.numbered`), so the devices are gres.conf
    lines. Not told (``why``) when

    - a MIG device has no profile or no device files: gres-conf writes no line for it
      and Slurm's IDX of the devices after it depends on what the site wrote;
    - the devices of the name have several types and the state has no ``gres_order``
      for it (an older daemon, an unread registration), the registration does not fit
      the cards, or none of the cases above says lines or AutoDetect;
    - without ``numbered``: several GPUs are in MIG mode (lines and AutoDetect order
      them differently, see above), or one GPU's MIG devices are not in the order of
      their GPU instance's nvidia-caps file (25.11's AutoDetect sorts by that file).

    A name of one type without MIG devices is the cards in (index, chip) order.
    """
    entry = _order_entry(order, gres)
    several = entry is not None and len(entry["types"]) > 1
    if entry is not None and not several and entry.get("error"):
        # one registered type that some devices do not have: Slurm left their lines out
        return [], f"the node's registered Gres= does not fit its cards: {entry['error']}"
    migs = [(c, _mig_parts(c)) for c in group]
    if not any(parts for _c, parts in migs):
        plain = [(c, None) for c in group]
        if several:
            return _by_types(plain, entry, order or {}, numbered)
        models = sorted({str(c["model"]) for c in group if isinstance(c.get("model"), str)})
        if entry is None and len(models) > 1:
            return [], (
                f"cards of models {', '.join(models)}: Slurm orders several types by the "
                "node's registered Gres=, which the state does not hold"
            )
        return plain, None
    devices: list[tuple[Mapping[str, Any], Mapping[str, Any] | None]] = []
    types: set[str] = set()
    for c, parts in migs:
        if not parts:
            devices.append((c, None))
            types.add(f"{card_name(c)} (a whole GPU)")
            continue
        for p in parts:
            profile, files = p.get("profile"), p.get("device_files")
            if not (isinstance(profile, str) and profile and isinstance(files, list) and files):
                return [], (
                    f"{card_name(c)} mig {p.get('index')} has no MIG profile or device "
                    "files (no gres.conf line): Slurm's IDX of the others is not known"
                )
            types.add(profile.lower())
            devices.append((c, p))
    if several:
        return _by_types(devices, entry, order or {}, numbered)
    if len(types) > 1 and entry is None:
        return [], (
            f"GRES types {', '.join(sorted(types))}: Slurm orders them by the node's "
            "registered Gres= types (_merge_gres), not in the state"
        )
    if numbered:
        return devices, None
    gpus = [c for c, parts in migs if parts]
    if len(gpus) > 1:
        return [], (
            f"{len(gpus)} GPUs in MIG mode: gres.conf lines number their MIG devices GPU "
            "by GPU, AutoDetect=nvml MIG index by MIG index; which one this node has is "
            "not known here (Slurm's CUDA_VISIBLE_DEVICES in the Prolog tells)"
        )
    caps = [_file_number(p["device_files"][0]) for _c, p in devices if p is not None]
    if None in caps or caps != sorted(caps):
        return [], (
            f"{card_name(gpus[0])}: MIG index order is not its nvidia-caps order "
            "(AutoDetect=nvml sorts by the files): Slurm's IDX order is not known"
        )
    return devices, None


def _mig_uuid_hits(
    cards: Sequence[Mapping[str, Any]], uuid: str
) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(card, MIG device) of a MIG UUID: ``MIG-<uuid>`` (drivers >= R470) or
    ``MIG-GPU-<gpu uuid>/<GI>/<CI>`` (older drivers), the two forms Slurm's AutoDetect
    puts in ``CUDA_VISIBLE_DEVICES`` (``_nvml_use_mig_uuid``, gpu_nvml.c)."""
    out = []
    head, _sep, tail = uuid.partition("/")
    gi, _sep2, ci = tail.partition("/")
    for c in cards:
        for p in _mig_parts(c):
            if str(p.get("uuid") or "").lower() == uuid or (
                head.startswith("mig-gpu-")
                and str(c.get("uuid") or "").lower() == head[len("mig-") :]
                and f"{p.get('gpu_instance_id')}/{p.get('compute_instance_id')}" == f"{gi}/{ci}"
            ):
                out.append((c, p))
    return out


def gres_order_of(doc: Any) -> Mapping[str, Any] | None:
    """The state document's ``gres_order`` (:func:`hetpatrol.slurm.inventory.gres_order`
    with the gres.conf word the daemon read), None when it has none."""
    order = doc.get("gres_order") if isinstance(doc, Mapping) else None
    return order if isinstance(order, Mapping) else None


def device_label(card: Mapping[str, Any], part: Mapping[str, Any] | None) -> str:
    """``nvidia/0`` for a whole card, ``nvidia/0 mig 3`` for one of its MIG devices."""
    return card_name(card) + ("" if part is None else f" mig {part.get('index')}")


def match_devices(
    cards: Sequence[Mapping[str, Any]],
    alloc: Allocation,
    order: Mapping[str, Any] | None = None,
) -> tuple[list[tuple[Mapping[str, Any], Mapping[str, Any] | None]], list[str]]:
    """(the GRES devices the job holds: (state card line, its MIG device or None), the
    references that matched none). IDX -> device: :func:`_slurm_devices`; a GRES name
    whose order cannot be told leaves its IDX unmatched (``gpu IDX 3 (not mapped: why)``),
    never a card picked. UUIDs match a card or a MIG device (:func:`_mig_uuid_hits`); a
    GRES name whose MIG devices the job's UUIDs name is taken from the UUIDs alone
    (AutoDetect=nvml gives MIG UUIDs; its IDX order is Slurm's sort, see docs/slurm.md).
    ``order``: the state's ``gres_order`` (GRES names of several types)."""
    matched: list[tuple[Mapping[str, Any], Mapping[str, Any] | None]] = []
    missing: list[str] = []

    def add(card: Mapping[str, Any], part: Mapping[str, Any] | None = None) -> None:
        if all(card is not c or part is not p for c, p in matched):
            matched.append((card, part))

    uuid_hits = {u: _mig_uuid_hits(cards, u) for u in sorted(alloc.uuids)}
    by_uuid = {id(c) for hits in uuid_hits.values() for c, _p in hits}
    for gres, idxs in sorted(alloc.by_gres.items()):
        group = sorted(
            (c for c in cards if str(c.get("gres") or "").lower() == gres), key=_sort_key
        )
        if idxs and any(id(c) in by_uuid for c in group):
            continue  # the MIG UUIDs name the devices exactly
        devices, why = _slurm_devices(group, gres in alloc.numbered, order, gres)
        for i in sorted(idxs):
            if why is not None:
                missing.append(f"{gres} IDX {i} (not mapped: {why})")
            elif i < len(devices):
                add(*devices[i])
            else:
                missing.append(f"{gres} IDX {i}")
    for uuid in sorted(alloc.uuids):
        hit = [c for c in cards if str(c.get("uuid") or "").lower() == uuid]
        if hit:
            add(hit[0])
        elif uuid_hits[uuid]:
            add(*uuid_hits[uuid][0])
        else:
            missing.append(f"uuid {uuid}")
    for vendor, ids in sorted(alloc.vendor_ids.items()):
        group = sorted((c for c in cards if c.get("vendor") == vendor), key=_sort_key)
        for i in sorted(ids):
            if i < len(group):
                add(group[i])
            else:
                missing.append(f"{vendor} device {i}")
    return matched, missing


def unmapped_gres(
    cards: Sequence[Mapping[str, Any]],
    alloc: Allocation,
    order: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """GRES name -> why, for the names of which the job holds IDX that
    :func:`match_devices` could not map (:func:`_slurm_devices`): the job is on one of
    that name's cards, which one is not known."""
    out = {}
    for gres, idxs in sorted(alloc.by_gres.items()):
        group = sorted(
            (c for c in cards if str(c.get("gres") or "").lower() == gres), key=_sort_key
        )
        why = _slurm_devices(group, gres in alloc.numbered, order, gres)[1] if idxs else None
        if why is not None:
            out[gres] = why
    return out


def match_cards(
    cards: Sequence[Mapping[str, Any]],
    alloc: Allocation,
    order: Mapping[str, Any] | None = None,
) -> tuple[list[Mapping[str, Any]], list[str]]:
    """(the state's card lines the job holds, the references that matched no card):
    :func:`match_devices` with each card once (a job on MIG devices holds their GPU)."""
    devices, missing = match_devices(cards, alloc, order)
    held: list[Mapping[str, Any]] = []
    for card, _part in devices:
        if all(card is not c for c in held):
            held.append(card)
    return held, missing


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
    """True when asking slurmctld for the job could change the answer: a card of the
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


def _has_schema(doc: Any) -> bool:
    schema = doc.get("schema") if isinstance(doc, Mapping) else None
    return isinstance(schema, str) and schema.startswith(STATE_SCHEMA_PREFIX)


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
    if not _has_schema(doc):
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
    devices, missing = match_devices(cards, alloc, gres_order_of(doc))
    held: list[Mapping[str, Any]] = []
    for card, _part in devices:
        if all(card is not c for c in held):
            held.append(card)
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
    # a MIG device by its GPU and MIG index (nvidia/0 mig 3): its GPU's verdict is its own
    held_text = ", ".join(device_label(c, p) for c, p in devices) or "none held"
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
    """One prolog run: read the verdict, the environment, the job's one record
    (:func:`hetpatrol.slurm.job_gres.ask_job` beside ``scontrol``) only if
    :func:`needs_scontrol`; never raises, never runs longer than ``timeout`` seconds in
    those commands. The node name is ``SLURMD_NODENAME``, else the
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
    # no verdict fails whatever the job holds: its vendors' variables need no plugin then
    rows = job_env_of(doc) if _has_schema(doc) else []
    alloc = parse_job_env(env, rows)
    try:
        if needs_scontrol(doc, alloc, block_on):
            job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
            node = env.get("SLURMD_NODENAME") or str((doc or {}).get("node") or "")
            left = timeout - (time.monotonic() - start)
            if job and node and left > 0.05:
                # one single-job answer of slurmctld, never the queue-wide dump
                alloc = alloc.merged(ask_job(scontrol, str(job), node, timeout=left, runner=runner))
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
    return [card_name(c) for c in match_cards(cards, alloc, gres_order_of(doc))[0]]


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
    does not cover every GRES name of the node's cards, the job's one record
    (:func:`hetpatrol.slurm.job_gres.ask_job`: the record is still there while the
    Epilog runs, but Slurm 22.05 has already emptied its GRES detail then: every card is
    looked at, see :mod:`hetpatrol.slurm.epilog`).
    Never raises; returns (cards, the allocation used, whose ``errors`` say what could not
    be read)."""
    alloc = parse_job_env(env, job_env_of(doc))
    cards = [c for c in doc.get("cards") or [] if isinstance(c, Mapping)]
    uncovered = [
        c for c in cards if not alloc.covers(str(c.get("gres") or "") or None, c.get("vendor"))
    ]
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    node = env.get("SLURMD_NODENAME") or str(doc.get("node") or "")
    if uncovered and job and node:
        alloc = alloc.merged(ask_job(scontrol, str(job), node, timeout=timeout, runner=runner))
    return match_cards(cards, alloc, gres_order_of(doc))[0], alloc


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
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=5.0,
        metavar="S",
        help="hard time limit in seconds (default: %(default)g); past it the job is let through",
    )
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
    scontrol = args.scontrol or find_scontrol()
    return prolog_main(
        os.environ,
        args.state_path,
        block_on=block_on,
        max_age=args.max_age,
        timeout=max(0.1, min(args.timeout, 60.0)),
        set_reason=not args.no_set_reason,
        scontrol=scontrol,
    )
