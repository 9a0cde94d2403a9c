"""``hetpatrol gres-conf``: the gres.conf lines, slurm.conf fragment and TaskProlog that
this node's cards need, from its own patrol; ``--check`` compares them with the node's
installed ``gres.conf`` and with what slurmctld holds for the node.

Slurm finds NVIDIA (``AutoDetect=nvml``), AMD (``rsmi``), Intel (``oneapi``) and AWS
(``nrt``) cards itself (gres.conf(5), AutoDetect); every other vendor needs hand-written
lines. What each vendor's cards are called comes from its plugin
(:class:`hetpatrol.collector.GresDevice` on ``vendor_info.gres``), where each card sits
from sysfs (:mod:`hetpatrol.sysfs_pci`, under the replay's ``root/`` when replaying).

Slurm's rules followed here (Slurm 22.05, gres.conf(5) and ``src/plugins/gres/common/
gres_common.c``):

- ``File=`` must name a character or block device that exists on the node: slurmd
  ``stat()``s each (``_set_gres_device_desc``: "is not a valid character or block
  device, fix your gres.conf") for a GRES with a plugin (``gpu``...); a GRES of another
  name (``ascend``) is not checked by slurmd, so a wrong path is only found by a job;
- a device's number is the digits its file name ends with (``_init_gres_device``: the
  ``dev_num``), its GRES index the order of the files over the lines of one name
  (``common_node_config_load``); the gpu plugin numbers ``CUDA_VISIBLE_DEVICES`` by that
  index, "the order they enumerate on the PCI bus" (``common_gres_set_env``), so lines
  follow the tool's card order (NVML's index is PCI bus order);
- ``Count=``, with ``File=``, must be the number of files (gres.conf(5), Count);
- ``Cores=`` takes logical core indices, "Core 0 will be the first core on the first
  socket" (gres.conf(5), Cores; :func:`hetpatrol.sysfs_pci.slurm_cores`);
- Slurm sets ``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES`` only from its gpu plugin
  (``gres_common_gpu_set_env``); a job's GRES indices per node are in ``scontrol show
  job -d`` (``GRES=ascend:910b:2(IDX:0-1)``) and, as structured fields, in ``squeue
  --json`` (``gres_detail`` paired with ``job_resources``' hosts), which the TaskProlog
  reads through ``hetpatrol task-prolog`` (:mod:`hetpatrol.slurm.task_prolog`: one
  single-job query a task, ``squeue --json --jobs=`` from Slurm 23.02.3, Slurm's own
  per-node block of ``scontrol -d show job`` before, where ``squeue --json`` lists the
  whole queue); a TaskProlog's ``export NAME=value`` lines are set in the task's
  environment (slurm.conf(5), TaskProlog).

Exit codes: generate 0 every card has its line, 1 a card's cores could not be read (no
``Cores=``), 3 a card has no device file (no line); ``--check`` 0 no difference, 1
differences, 3 a source could not be read.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetpatrol.collector import GresDevice, load_collector
from hetpatrol.output import plain_help
from hetpatrol.schema import CardRecord
from hetpatrol.slurm.gres import (
    GresConfLine,
    find_node,
    parse_gres_conf,
    sum_gres,
)
from hetpatrol.slurm.inventory import card_gres, run_scontrol
from hetpatrol.slurm.task_prolog import TASK_PROLOG_PROGRAM, format_table
from hetpatrol.sysfs_pci import (
    format_ranges,
    read_cpu_cores,
    read_place,
    slurm_cores,
)

EXIT_OK, EXIT_WARNING, EXIT_UNKNOWN = 0, 1, 3
EX_USAGE = 64
#: a Slurm NodeName as gres-conf writes it (slurm.conf(5) NodeName: a host name)
_NODE_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class CardLine:
    """One card as ``gres.conf`` needs it: GRES ``name``/``type``, its device ``file``
    and ``number`` (None with ``problem`` saying why), ``cores`` (Slurm's logical core
    indices, None with ``cores_problem``), ``visible`` (variable -> the card's id in it)."""

    card: str
    vendor: str
    name: str
    type: str | None
    file: str | None
    number: int | None
    cores: tuple[int, ...] | None
    problem: str | None = None
    cores_problem: str | None = None
    visible: tuple[tuple[str, int], ...] = ()
    #: a MIG device's ``MultipleFiles=`` (the GPU's device file and the nvidia-caps
    #: files of its GPU and compute instance); ``file`` is then its GPU instance's file
    files: tuple[str, ...] = ()


@dataclass
class Plan:
    """What the node needs: ``cards`` in gres.conf order, ``notes`` per GRES name
    (AutoDetect, the vendor's caveat)."""

    node: str
    cards: list[CardLine] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)

    @property
    def placed(self) -> list[CardLine]:
        return [c for c in self.cards if c.file is not None]

    def lines(self) -> list[tuple[str, list[CardLine]]]:
        """(gres.conf line, its cards): consecutive cards of one name, type and cores
        whose files differ only by consecutive numbers share a line (``[0-3]``)."""
        out: list[tuple[str, list[CardLine]]] = []
        group: list[CardLine] = []

        def flush() -> None:
            if group:
                out.append((self._line(group), list(group)))
                group.clear()

        for card in self.placed:
            if group and (card.files or group[-1].files):
                flush()  # a MIG device is a line of its own
            if group:
                last = group[-1]
                same = (last.name, last.type, last.cores) == (card.name, card.type, card.cores)
                stem = _stem(last)
                if not (
                    same
                    and stem is not None
                    and stem == _stem(card)
                    and card.number == (last.number or 0) + 1
                ):
                    flush()
            group.append(card)
        flush()
        return out

    def _line(self, cards: list[CardLine]) -> str:
        first = cards[0]
        if len(cards) == 1:
            files = first.file
        else:
            stem = _stem(first) or ""
            files = f"{stem}[{first.number}-{cards[-1].number}]"
        parts = [f"NodeName={self.node}", f"Name={first.name}"]
        if first.type:
            parts.append(f"Type={first.type}")
        if first.files:
            # one MIG device a line: "MultipleFiles ... for GPUs with MIG, the files of
            # one GRES device" (gres.conf(5), MultipleFiles); Count is 1 per line
            parts.append(f"MultipleFiles={','.join(first.files)}")
        else:
            parts += [f"File={files}", f"Count={len(cards)}"]
        if first.cores:
            parts.append(f"Cores={format_ranges(first.cores)}")
        return " ".join(parts)

    def totals(self) -> list[tuple[str, str | None, int]]:
        """(name, type, count) of the placed cards, in first-seen order."""
        counts: dict[tuple[str, str | None], int] = {}
        for c in self.placed:
            counts[(c.name, c.type)] = counts.get((c.name, c.type), 0) + 1
        return [(n, t, k) for (n, t), k in counts.items()]

    def slurm_conf(self) -> list[str]:
        """``GresTypes=`` and the node's ``NodeName=... Gres=... Features=...``."""
        totals = self.totals()
        names = list(dict.fromkeys(n for n, _t, _k in totals))
        gres = ",".join(f"{n}:{t}:{k}" if t else f"{n}:{k}" for n, t, k in totals)
        features = ",".join(dict.fromkeys(t for _n, t, _k in totals if t))
        node = f"NodeName={self.node} Gres={gres}"
        if features:
            node += f" Features={features}"
        return [f"GresTypes={','.join(names)}", node]

    def task_prolog(self, program: str = TASK_PROLOG_PROGRAM) -> str | None:
        """The TaskProlog that sets each vendor's visible-devices variable from the job's
        GRES indices on this node, or None when Slurm sets every variable itself. It runs
        ``program`` (``hetpatrol task-prolog``, :mod:`hetpatrol.slurm.task_prolog`) with
        one ``--export NAME VAR INDEX=ID,...`` per GRES name and variable."""
        tables: dict[tuple[str, str], list[tuple[int, int]]] = {}
        index: dict[str, int] = {}
        # Slurm's index: the file's position among its name's files, type by type in the
        # order of the node's Gres= (this plan's, slurm_conf()): _merge_gres takes each
        # Gres= type's lines in file order (src/common/gres.c 22.05, 1981-1999; the same
        # in src/interfaces/gres.c 23.02 to 25.11), and common_node_config_load numbers
        # the merged records (gres_common.c)
        rank = {(n, t): i for i, (n, t, _k) in enumerate(self.totals())}
        ordered = sorted(
            enumerate(self.placed), key=lambda ic: (rank[ic[1].name, ic[1].type], ic[0])
        )
        for _pos, c in ordered:
            i = index.get(c.name, 0)
            index[c.name] = i + 1
            for var, ident in c.visible:
                tables.setdefault((c.name, var), []).append((i, ident))
        if not tables:
            return None
        prog = shlex.quote(program)
        missing = f"print hetpatrol TaskProlog: {program} is not installed: no device variable set"
        out = [
            "#!/bin/sh",
            f"# Slurm TaskProlog for {self.node}, written by hetpatrol gres-conf. slurmstepd",
            "# sets each 'export NAME=value' line it prints in the task's environment",
            "# (slurm.conf(5), TaskProlog); Slurm sets no device variable for these GRES.",
            "# hetpatrol task-prolog reads the job's GRES indices on this node with one",
            "# single-job query to slurmctld (squeue --json --jobs= from Slurm 23.02.3,",
            "# scontrol -d show job's own per-node block before) and maps each index",
            "# (gres.conf order) to the vendor's id: --export NAME VAR INDEX=ID,...",
            f"if [ ! -x {prog} ]; then",
            f"  echo {shlex.quote(missing)}",
            "  exit 0",
            "fi",
            f"exec {prog} \\",
        ]
        items = list(tables.items())
        for n, ((name, var), pairs) in enumerate(items):
            words = " ".join(shlex.quote(w) for w in (name, var, format_table(pairs)))
            out.append(f"  --export {words}" + (" \\" if n < len(items) - 1 else ""))
        return "\n".join(out) + "\n"


def _stem(card: CardLine) -> str | None:
    """The file name without its trailing number, when it ends with ``card.number``."""
    if card.file is None or card.number is None:
        return None
    tail = str(card.number)
    return card.file[: -len(tail)] if card.file.endswith(tail) else None


# --------------------------------------------------------------------------- planning
def vendor_gres(vendor: str) -> GresDevice | None:
    """The plugin's :class:`GresDevice` (None when it declares none or cannot load)."""
    try:
        return load_collector(vendor).vendor_info.gres
    except Exception:  # noqa: BLE001 - a plugin that cannot load declares nothing
        return None


def card_label(rec: CardRecord) -> str:
    return f"{rec.vendor}/{rec.index}" + ("" if rec.chip is None else f"/{rec.chip}")


def build_plan(
    records: Iterable[CardRecord],
    config: Any,
    node: str,
    root: str | Path | None,
    gres_of: Callable[[str], GresDevice | None] = vendor_gres,
) -> Plan:
    """The :class:`Plan` of ``records`` (one patrol's cards) for Slurm node ``node``,
    placement read under ``root`` (None: not read, as for a replay without ``root/``).
    Cards whose profile names no GRES are left out."""
    plan = Plan(node)
    topology = read_cpu_cores(root) if root is not None else {}
    #: GRES name -> (where its vNPU note goes in its notes, [(chip label, vNPUs)])
    split: dict[str, tuple[int, list[tuple[str, int]]]] = {}
    for rec in sorted(records, key=lambda r: (r.vendor, r.index, r.chip or 0)):
        named = card_gres(rec, config)
        if named is None:
            continue
        name, gtype = named
        info = gres_of(rec.vendor)
        label = card_label(rec)
        notes = plan.notes.setdefault(name, [])
        if info is None:
            plan.cards.append(
                CardLine(
                    label,
                    rec.vendor,
                    name,
                    gtype,
                    None,
                    None,
                    None,
                    problem=f"the {rec.vendor} plugin says nothing of its device files",
                )
            )
            continue
        if info.autodetect and f"AutoDetect={info.autodetect}" not in " ".join(notes):
            notes.append(
                f"Slurm finds {rec.vendor} cards itself with AutoDetect={info.autodetect} "
                "(when slurmd is built with it); these lines need no such build"
            )
        if info.note and info.note not in notes:
            notes.append(info.note)
        place = read_place(root, rec.bus_id) if rec.bus_id and root is not None else None
        number, problem = _number(rec, info, place, root)
        cores = cores_problem = None
        if root is None:
            cores_problem = "the replay has no root/ tree: placement not read"
        elif place is None:
            cores_problem = "no bus id read: its NUMA node is unknown"
        elif place.local_cpus is None or place.numa_node is None:
            cores_problem = place.error or "no NUMA node"
        elif not topology:
            cores_problem = f"{Path(root) / 'sys/devices/system/cpu'}: no CPU topology"
        else:
            try:
                cores = slurm_cores(place.local_cpus, topology)
            except ValueError as exc:
                cores_problem = str(exc)
        migs = [p for p in rec.partitions if p.kind == "mig"]
        if migs:
            _mig_lines(plan, rec, name, label, info, number, problem, migs, cores, cores_problem)
            continue
        if any(p.kind == "vnpu" for p in rec.partitions):
            if name not in split:  # one note for all the name's split chips, said here
                split[name] = (len(notes), [])
                notes.append("")
            split[name][1].append((label, len(rec.partitions)))
        ident = {"device_number": number, "index": rec.index}.get(info.visible_id)
        visible = tuple((var, ident) for var in info.visible_env if ident is not None)
        if name == "gpu":  # Slurm's gpu plugin sets CUDA_VISIBLE_DEVICES itself
            visible = tuple(v for v in visible if v[0] != "CUDA_VISIBLE_DEVICES")
        plan.cards.append(
            CardLine(
                label,
                rec.vendor,
                name,
                gtype,
                None if number is None else info.file.replace("{n}", str(number)),
                number,
                cores,
                problem,
                cores_problem,
                visible,
            )
        )
    for name, (at, chips) in split.items():
        plan.notes[name][at] = _vnpu_note(chips)
    return plan


def _vnpu_note(chips: list[tuple[str, int]]) -> str:
    """The note of the chips split into vNPUs, (label, vNPUs) each: one for them all."""
    counts = sorted({n for _label, n in chips})
    many = len(chips) > 1
    each = (
        f"{counts[0]}{' each' if many else ''}" if len(counts) == 1 else "/".join(map(str, counts))
    )
    lines = "lines below are the whole chips" if many else "line below is the whole chip"
    return (
        f"{_cards_text([label for label, _n in chips])} {'are' if many else 'is'} split into "
        f"vNPUs ({each}): Slurm has no GRES model of a vNPU (gres.conf(5) knows "
        "File=/MultipleFiles= of whole devices; no GRES plugin reads npu-smi). The "
        f"{lines} (/dev/davinciN); a site that schedules vNPUs keeps them out of Slurm's "
        "GRES (a node feature or a partition per template, or a count-only GRES with a "
        "site plugin) and binds a job's vNPU with the ASCEND_VISIBLE_DEVICES "
        "/ASCEND_VNPU_SPECS of the Ascend docker runtime"
    )


def _mig_lines(
    plan: Plan,
    rec: CardRecord,
    name: str,
    label: str,
    info: GresDevice,
    number: int | None,
    problem: str | None,
    migs: Sequence[Any],
    cores: tuple[int, ...] | None,
    cores_problem: str | None,
) -> None:
    """One :class:`CardLine` per MIG device of ``rec``: ``Type=`` its profile,
    ``MultipleFiles=`` the GPU's device file and the nvidia-caps files of its GPU and
    compute instance, as Slurm's AutoDetect gives them (``_handle_mig()``:
    ``/dev/nvidia<minor>,/dev/nvidia-caps/nvidia-cap<GI>,/dev/nvidia-caps/nvidia-cap<CI>``,
    src/plugins/gpu/nvml/gpu_nvml.c, SchedMD/slurm)."""
    notes = plan.notes.setdefault(name, [])
    text = (
        f"{label} is in MIG mode: one line per MIG device (Type= its profile, which Slurm "
        "matches as a substring of AutoDetect's type, e.g. nvidia_a100_1g.20gb); the GPU "
        "itself is no GRES"
    )
    if text not in notes:
        notes.append(text)
    for part in migs:
        why = problem
        if why is None and not part.device_files:
            errs = "; ".join(e["error"] for e in part.errors) or "not read"
            why = f"its nvidia-caps device files are unknown ({errs})"
        if why is None and part.profile is None:
            why = "its MIG profile was not read"
        gpu_file = None if number is None else info.file.replace("{n}", str(number))
        files = () if why is not None else (str(gpu_file), *part.device_files)
        plan.cards.append(
            CardLine(
                f"{label}/mig{part.index}",
                rec.vendor,
                name,
                part.profile,
                files[1] if files else None,
                None,
                cores,  # a MIG device is as close to the CPUs as its GPU
                why,
                cores_problem,
                (),
                files,
            )
        )


def _number(
    rec: CardRecord, info: GresDevice, place: Any, root: str | Path | None
) -> tuple[int | None, str | None]:
    if info.number == "index":
        return rec.index, None
    if info.number == "device_number":
        if rec.device_number is None:
            return None, f"the {rec.vendor} plugin read no device number for this card"
        return rec.device_number, None
    if info.number == "drm_render":
        if root is None:
            return None, "the replay has no root/ tree: its DRM render node is unknown"
        if place is None:
            return None, "no bus id read: its DRM render node is unknown"
        if place.render_minor is None:
            return None, f"sysfs shows no drm/renderD* under {rec.bus_id}"
        return place.render_minor, None
    return None, f"unknown device numbering {info.number!r} in the {rec.vendor} plugin"


#: gres.conf comments fit this many columns: an 80-column terminal or tmux pane shows each
#: whole (a longer line is broken mid-word there), and a diff of two files shows each
#: comment line on its own
COMMENT_WIDTH = 79


def comment(text: str, width: int = COMMENT_WIDTH) -> list[str]:
    """``text`` as gres.conf comment lines of at most ``width`` columns, broken at spaces
    (a word wider than a line, such as a long path, stays whole on a line of its own);
    every line starts with ``#``, the next ones indented under the first. slurmd reads
    gres.conf with ``s_p_parse_file``, whose ``_get_next_line`` cuts each line at its
    first unescaped ``#`` (``_strip_comments``) before it looks for a ``\\`` continuation
    (src/common/parse_config.c), so each line is a comment of its own, whatever it ends
    with, and the file's other lines are unchanged."""
    return textwrap.wrap(
        " ".join(text.split()),
        width,
        initial_indent="# ",
        subsequent_indent="#   ",
        break_long_words=False,
        break_on_hyphens=False,
    ) or ["#"]


def _cards_text(labels: Sequence[str]) -> str:
    """The cards ``labels`` name, short: a vendor's labels that differ in one number only
    with that number in ranges (``hygon/0`` ... ``hygon/7``: ``hygon/0-7``;
    ``nvidia/0/mig0`` ... ``mig3``: ``nvidia/0/mig0-3``; ``ascend/0/0``, ``ascend/1/0``:
    ``ascend/0-1/0``), others listed; vendors joined by ``, ``."""
    by_vendor: dict[str, list[list[str]]] = {}
    for label in labels:
        by_vendor.setdefault(label.split("/", 1)[0], []).append(re.split(r"(\d+)", label))
    out = []
    for parts in by_vendor.values():
        differ = [i for i in range(len(parts[0])) if len({tuple(p[i : i + 1]) for p in parts}) > 1]
        same_shape = len({len(p) for p in parts}) == 1
        if len(parts) > 1 and same_shape and len(differ) == 1 and parts[0][differ[0]].isdigit():
            i = differ[0]
            nums = format_ranges([int(p[i]) for p in parts])
            out.append("".join(parts[0][:i]) + nums + "".join(parts[0][i + 1 :]))
        else:
            out += ["".join(p) for p in parts]
    return ", ".join(out)


def gres_conf_text(plan: Plan) -> tuple[str, int]:
    """The gres.conf part of ``gres-conf``'s output: a header, each card without a line
    (cards of one GRES with the same reason said once, ``# hygon/0-7 (dcu:k100_ai, 8
    cards): no line: ...``), each GRES name's notes, then the lines, each after a comment
    when its cards' cores are unknown. Comments are wrapped by :func:`comment`. Returns
    (text, exit code: 0; 1 a line without ``Cores=``; 3 a card without a line)."""
    out = comment(f"gres.conf lines for {plan.node} (hetpatrol gres-conf)")
    code = EXIT_OK
    missing: dict[tuple[str, str], list[str]] = {}
    for c in plan.cards:
        if c.file is None:
            label = f"{c.name}:{c.type}" if c.type else c.name
            missing.setdefault((label, str(c.problem)), []).append(c.card)
            code = EXIT_UNKNOWN
    for (label, problem), cards in missing.items():
        many = f", {len(cards)} cards" if len(cards) > 1 else ""
        out += comment(f"{_cards_text(cards)} ({label}{many}): no line: {problem}")
    for name, notes in plan.notes.items():
        for n in notes:
            out += comment(f"{name}: {n}")
    lines = plan.lines()
    unplaced: dict[str, list[str]] = {}  # a reason -> the cards of the lines without Cores=
    for _line, cards in lines:
        for c in cards:
            if c.cores_problem:
                unplaced.setdefault(c.cores_problem, []).append(c.card)
    for line, cards in lines:
        for why in dict.fromkeys(c.cores_problem for c in cards if c.cores_problem):
            if why in unplaced:  # said once, before the first line it is about
                out += comment(f"{_cards_text(unplaced.pop(why))}: no Cores=: {why}")
                code = max(code, EXIT_WARNING)
        out.append(line)
    return "\n".join(out) + "\n", code


def render(plan: Plan) -> tuple[str, int]:
    """The text ``gres-conf`` prints (:func:`gres_conf_text`, the slurm.conf fragment,
    the TaskProlog), and its exit code."""
    text, code = gres_conf_text(plan)
    out = [text.rstrip("\n")]
    out += ["", "# slurm.conf (merge Features= with the node's own)", *plan.slurm_conf()]
    prolog = plan.task_prolog()
    if prolog is not None:
        out += ["", "# TaskProlog= (slurm.conf), e.g. /etc/slurm/taskprolog.sh:", prolog.rstrip()]
    return "\n".join(out) + "\n", code


# ------------------------------------------------------------------------------ check
@dataclass(frozen=True)
class Difference:
    """One difference ``--check`` found: where (``gres.conf:12``, ``slurmctld``), what,
    and the line that fixes it."""

    where: str
    message: str
    fix: str


def _cores_of(text: str, lineno: int) -> tuple[int, ...] | None:
    """``Cores=`` of gres.conf line ``lineno`` (keys case-insensitive), as indices."""
    from hetpatrol.sysfs_pci import parse_cpulist

    lines = text.splitlines()
    if not 0 < lineno <= len(lines):
        return None
    for token in lines[lineno - 1].split("#", 1)[0].split():
        key, sep, value = token.partition("=")
        if sep and key.lower() in ("cores", "cpus"):
            try:
                return parse_cpulist(value)
            except ValueError:
                return None
    return None


def check_gres_conf(plan: Plan, text: str, path: str) -> list[Difference]:
    """Differences between the installed gres.conf ``text`` (lines for ``plan.node``)
    and ``plan``. ``ValueError`` (naming the line) when the file cannot be parsed."""
    lines = [ln for ln in parse_gres_conf(text) if ln.name is not None]
    mine = [ln for ln in lines if ln.nodes is None or plan.node in ln.nodes]
    by_file: dict[str, GresConfLine] = {}
    for ln in mine:
        for f in ln.files:
            by_file.setdefault(f, ln)
    fix_of = {c.file: line for line, cards in plan.lines() for c in cards}
    out: list[Difference] = []
    for ln in mine:
        if ln.files and ln.count != len(ln.files) and _has_count(text, ln.line):
            out.append(
                Difference(
                    f"{path}:{ln.line}",
                    f"Count={ln.count} but {len(ln.files)} files (gres.conf(5): with File=, "
                    "Count must be the number of files)",
                    "drop Count= or make it the number of files",
                )
            )
    for c in plan.placed:
        fix = fix_of[c.file]
        ln = by_file.get(c.file or "")
        want = f"{c.name}:{c.type}" if c.type else c.name
        if ln is None:
            out.append(Difference(path, f"{c.card} ({want}): {c.file} is in no line", fix))
            continue
        have = f"{ln.name}:{ln.type}" if ln.type else str(ln.name)
        if (ln.name or "").lower() != c.name.lower() or (ln.type or "").lower() != (
            c.type or ""
        ).lower():
            out.append(
                Difference(
                    f"{path}:{ln.line}",
                    f"{c.file} is under {have}; the card ({c.card}) is {want}",
                    fix,
                )
            )
        cores = _cores_of(text, ln.line)
        if c.cores is not None and cores != c.cores:
            said = format_ranges(cores) if cores else "none"
            out.append(
                Difference(
                    f"{path}:{ln.line}",
                    f"{c.file}: Cores={said}, but the card's NUMA node has cores "
                    f"{format_ranges(c.cores)}",
                    fix,
                )
            )
    out += _mig_order(plan, by_file, fix_of, path)
    known = {c.file for c in plan.cards if c.file} | {f for c in plan.cards for f in c.files}
    for f, ln in by_file.items():
        if f not in known:
            out.append(
                Difference(
                    f"{path}:{ln.line}",
                    f"{f}: no card of this node has this device file",
                    f"remove {f} from line {ln.line}",
                )
            )
    return out


def _mig_order(
    plan: Plan, by_file: dict[str, GresConfLine], fix_of: dict[Any, str], path: str
) -> list[Difference]:
    """The MIG lines of one GRES name that are not in the plan's order (GPUs by index,
    MIG devices by MIG index). Slurm numbers a name's devices (the job's IDX) in the order
    of its records: ``Name=`` lines, then ``NodeName=`` lines, each in file order
    (``gres_node_config_load``, src/common/gres.c 22.05), one index per ``MultipleFiles=``
    line (``common_node_config_load``, gres_common.c); hetpatrol's Prolog and card -> job
    map take a MIG device's IDX in the plan's order (``jobguard._slurm_devices``), so lines
    in another order would give a job's IDX to another MIG device."""
    out: list[Difference] = []
    seen: dict[str, list[tuple[tuple[int, int], CardLine]]] = {}
    for c in plan.placed:
        ln = by_file.get(c.file or "")
        if c.files and ln is not None:
            seen.setdefault(c.name, []).append(((0 if ln.nodes is None else 1, ln.line), c))
    for name, rows in seen.items():
        keys = [k for k, _c in rows]
        if keys == sorted(keys):
            continue
        first = next(c for (k, c), want in zip(rows, sorted(keys), strict=True) if k != want)
        out.append(
            Difference(
                f"{path}:{by_file[first.file or ''].line}",
                f"{name}: the MIG lines are not in the cards' order (GPU by index, MIG "
                f"devices by MIG index; {first.card} is out of place): Slurm numbers a "
                "job's IDX in line order, and hetpatrol maps an IDX to MIG devices in "
                "the cards' order",
                f"write the {name} MIG lines in the order gres-conf prints them: "
                f"{fix_of[first.file]}",
            )
        )
    return out


def _has_count(text: str, lineno: int) -> bool:
    lines = text.splitlines()
    if not 0 < lineno <= len(lines):
        return False
    return any(t.lower().startswith("count=") for t in lines[lineno - 1].split("#", 1)[0].split())


def check_registration(plan: Plan, scontrol_text: str) -> list[Difference]:
    """Differences between the node's GRES in slurmctld (``scontrol show node -o``
    output) and ``plan``. Types compare case-insensitively, as Slurm matches them."""
    info = find_node(scontrol_text, plan.node)
    fix = plan.slurm_conf()[1]
    if info is None:
        return [Difference("slurmctld", f"no node named {plan.node!r}", fix)]
    if info.gres_error is not None:
        return [Difference("slurmctld", f"Gres= not readable: {info.gres_error}", fix)]
    have = {(e.name.lower(), (e.type or "").lower()): e.count for e in sum_gres(info.gres)}
    want = {(n.lower(), (t or "").lower()): k for n, t, k in plan.totals()}
    names = {n for n, _t in want}
    out = []
    reason = f" (Reason: {info.reason})" if info.reason else ""
    tables = {c.name.lower() for c in plan.placed if c.visible}
    for name in sorted(tables):
        # the TaskProlog numbers a name's devices type by type in the plan's Gres= order;
        # Slurm in the registered Gres= order (_merge_gres, src/common/gres.c 22.05)
        ours = [t for n, t in want if n == name]
        theirs = [t for n, t in have if n == name and (n, t) in want]
        if len(ours) > 1 and sorted(theirs) == sorted(ours) and theirs != ours:
            out.append(
                Difference(
                    "slurmctld",
                    f"{name}: slurmctld's Gres= has the types in the order "
                    f"{', '.join(theirs)}, the TaskProlog numbers them {', '.join(ours)}: "
                    "Slurm numbers a job's IDX type by type in Gres= order (_merge_gres)",
                    fix,
                )
            )
    for key in sorted(set(have) | set(want)):
        if key[0] not in names:
            continue  # mps, shard, a site's own GRES: not cards
        h, w = have.get(key, 0), want.get(key, 0)
        if h != w:
            label = f"{key[0]}:{key[1]}" if key[1] else key[0]
            out.append(
                Difference(
                    "slurmctld",
                    f"{label}: slurmctld has {h}, the node's cards are {w}{reason}",
                    fix,
                )
            )
    return out


def render_check(diffs: Sequence[Difference], unreadable: Sequence[str]) -> tuple[str, int]:
    out = [f"unknown: {u}" for u in unreadable]
    out += [f"warning {d.where}: {d.message}\n    fix: {d.fix}" for d in diffs]
    if not out:
        out.append("ok: gres.conf and slurmctld agree with the node's cards")
    code = EXIT_UNKNOWN if unreadable else (EXIT_WARNING if diffs else EXIT_OK)
    return "\n".join(out) + "\n", code


# -------------------------------------------------------------------------------- CLI
def add_gres_conf_parser(
    sub: Any,
    patrol: Callable[[argparse.Namespace], Any],
    add_common: Callable[[argparse.ArgumentParser], None],
) -> None:
    """``gres-conf``: ``patrol(args)`` runs the node's one patrol and returns (report,
    config); ``add_common`` adds the CLI's ``--config``/``--replay``/``--node``."""
    p = sub.add_parser(
        "gres-conf",
        help="the gres.conf lines, slurm.conf fragment and TaskProlog this node's cards "
        "need; --check compares them with gres.conf and slurmctld",
        description=plain_help(__doc__.split("\n\n")[0] if __doc__ else None)
        + " Exit 0; 1 a card's cores unread (no Cores=); 3 a card without a device file."
        " --check: 0 agree, 1 differences, 3 a source unreadable.",
    )
    add_common(p)
    p.add_argument(
        "--root",
        type=Path,
        default=None,
        metavar="DIR",
        help="read sysfs under DIR (default: /, or the replay's root/)",
    )
    p.add_argument("--check", action="store_true", help="compare with gres.conf and slurmctld")
    p.add_argument(
        "--gres-conf",
        type=Path,
        default=None,
        metavar="FILE",
        help="the installed gres.conf (default: the config's slurm.gres_conf)",
    )
    p.set_defaults(func=lambda args: cmd_gres_conf(args, patrol))


def cmd_gres_conf(args: argparse.Namespace, patrol: Callable[[argparse.Namespace], Any]) -> int:
    report, config = patrol(args)
    node = config.slurm.slurm_node(args.node or config.node)
    if not _NODE_WORD.fullmatch(node):
        # it is written into gres.conf's NodeName= and the TaskProlog: one word only
        why = "is not one word of letters, digits, '_', '.', '-'"
        where = "(--node, or slurm.node_name in the config)"
        print(f"hetpatrol gres-conf: node name {node!r} {why} {where}", file=sys.stderr)
        return EX_USAGE
    root: Path | None = args.root
    if root is None and args.replay is None:
        root = Path("/")
    elif root is None and (Path(args.replay) / "root").is_dir():
        root = Path(args.replay) / "root"
    plan = build_plan(report.cards, config, node, root)
    if not args.check and not plan.cards:
        # no card read: an empty `Gres=` / `GresTypes=` pasted into slurm.conf would
        # say the node has none; say why instead (each collector's state)
        states = ", ".join(f"{s.name} {s.state}" for s in report.collectors)
        print(
            f"hetpatrol gres-conf: no card was read on {node} ({states}): no line to write",
            file=sys.stderr,
        )
        return EXIT_UNKNOWN
    if not args.check:
        text, code = render(plan)
        sys.stdout.write(text)
        return code
    diffs: list[Difference] = []
    unreadable: list[str] = []
    path = args.gres_conf or config.slurm.gres_conf
    if path is not None:
        try:
            diffs += check_gres_conf(plan, Path(path).read_text(encoding="utf-8"), str(path))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            unreadable.append(f"{path}: {getattr(exc, 'strerror', None) or exc}")
    from hetpatrol.tool import run_tool

    out, error = run_scontrol(config.slurm, ["show", "node", "-o", node], run_tool)
    if error is not None or out is None:
        unreadable.append(f"scontrol show node {node}: {error}")
    else:
        diffs += check_registration(plan, out.stdout)
    text, code = render_check(diffs, unreadable)
    sys.stdout.write(text)
    return code
