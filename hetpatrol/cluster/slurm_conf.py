"""``slurm.conf`` read for the audit: global settings, NodeName and PartitionName lines,
each with the file and line it came from.

Rules from slurm.conf(5) (https://slurm.schedmd.com/slurm.conf.html): keys are case
insensitive, node and partition names are not; ``#`` starts a comment; a line ending in
``\\`` continues on the next; ``Include <file>`` reads another file in place (relative to
the including file's directory); ``NodeName=DEFAULT`` / ``PartitionName=DEFAULT`` set
values for the lines after it; a value may be double-quoted (no shell quoting:
``_keyvalue_regex``). The continuation and
comment rules are those of ``_get_next_line`` in SchedMD/slurm
``src/common/parse_config.c``.

Also here: :func:`parse_show_config`, the ``Key = Value`` lines of ``scontrol show
config`` (the running slurmctld's settings when the file is not at hand).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from hetpatrol.cluster.sources import read_regular
from hetpatrol.slurm.gres import GresEntry, parse_gres

#: Deepest Include nesting followed.
INCLUDE_DEPTH = 8
#: Most Include lines followed in all (a file that includes another several times,
#: which does the same, fans out exponentially within the depth).
INCLUDE_MAX = 128


@dataclass(frozen=True)
class Setting:
    """One global ``Key=Value``; ``where`` is ``file:line``."""

    key: str
    value: str
    where: str


@dataclass(frozen=True)
class NodeDecl:
    """One ``NodeName=`` line (DEFAULT values applied): its host list and card-relevant
    values. ``gres_text`` is None when the line (and DEFAULT) sets no ``Gres=``."""

    names: str
    gres_text: str | None
    features: tuple[str, ...]
    where: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def gres(self) -> tuple[GresEntry, ...]:
        """The ``Gres=`` entries; () when it cannot be read (see :attr:`gres_error`)."""
        try:
            return parse_gres(self.gres_text)
        except ValueError:
            return ()

    @property
    def gres_error(self) -> str | None:
        """Why ``Gres=`` cannot be read (a string Slurm would refuse), else None."""
        try:
            parse_gres(self.gres_text)
        except ValueError as exc:
            return str(exc)
        return None


@dataclass(frozen=True)
class PartitionDecl:
    """One ``PartitionName=`` line (DEFAULT values applied)."""

    name: str
    nodes: str
    where: str
    fields: dict[str, str] = field(default_factory=dict)


@dataclass
class SlurmConf:
    """Everything read; ``settings`` keyed by lower-case key (last one wins, as in Slurm)."""

    source: str
    settings: dict[str, Setting] = field(default_factory=dict)
    nodes: list[NodeDecl] = field(default_factory=list)
    partitions: list[PartitionDecl] = field(default_factory=list)
    #: ``NodeSet=name Nodes=...`` / ``Feature=...``: name -> its keys (lower-case)
    nodesets: dict[str, dict[str, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: ``DownNodes=<host list> ...`` lines: (host list, where)
    downnodes: list[tuple[str, str]] = field(default_factory=list)
    #: Include lines followed so far (bounded by :data:`INCLUDE_MAX`)
    includes: int = 0

    def get(self, key: str) -> Setting | None:
        return self.settings.get(key.lower())


#: ``Key=Value`` as Slurm reads it (``_keyvalue_regex`` in src/common/parse_config.c): the
#: value is a double-quoted string (no quote inside, followed by a blank or the end) or
#: a run of non-blanks; a word without ``=`` is no pair. One pass, linear in the line
#: (shlex.split took 3 minutes on a 1.5 MB NodeName= list: it grows its token a
#: character at a time).
_PAIR_RE = re.compile(r'(?<!\S)([^\s="]+)=(?:"([^"]*)"(?!\S)|(\S*))')


def _pairs(text: str) -> list[tuple[str, str]]:
    return [(m[1], m[3] if m[2] is None else m[2]) for m in _PAIR_RE.finditer(text)]


def _logical_lines(path: Path) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for lineno, raw in enumerate(read_regular(path).splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = lineno
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        if text:
            out.append((start, text))
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _identity(path: Path) -> tuple[int, int] | str:
    try:
        st = path.stat()
        return (st.st_dev, st.st_ino)
    except OSError:
        return str(path)


def parse_slurm_conf(
    path: Path, conf: SlurmConf | None = None, depth: int = 0, chain: tuple = ()
) -> SlurmConf:
    """Read ``path`` (and its Includes). ``OSError`` when ``path`` cannot be read (also
    a FIFO, a device, a file over the size bound: :func:`read_regular`); an unreadable
    Include, an Include loop (a file including itself, directly or through others: not
    followed), nesting deeper than :data:`INCLUDE_DEPTH` and Includes past
    :data:`INCLUDE_MAX` are noted in ``problems``."""
    conf = conf if conf is not None else SlurmConf(source=str(path))
    chain = (*chain, _identity(path))
    node_default: dict[str, str] = {}
    part_default: dict[str, str] = {}
    for lineno, text in _logical_lines(path):
        where = f"{path}:{lineno}"
        first = text.split(None, 1)
        if first[0].lower() == "include" and len(first) == 2:
            target = Path(first[1].strip().strip('"'))
            if not target.is_absolute():
                target = path.parent / target
            if depth >= INCLUDE_DEPTH:
                conf.problems.append(f"{where}: Include nested deeper than {INCLUDE_DEPTH}")
                continue
            if _identity(target) in chain:
                conf.problems.append(
                    f"{where}: Include {target} is a loop (it includes this file): not followed"
                )
                continue
            if conf.includes >= INCLUDE_MAX:
                if conf.includes == INCLUDE_MAX:
                    conf.problems.append(
                        f"{where}: more than {INCLUDE_MAX} Includes: the rest not followed"
                    )
                    conf.includes += 1
                continue
            conf.includes += 1
            try:
                parse_slurm_conf(target, conf, depth + 1, chain)
            except OSError as exc:
                conf.problems.append(f"{where}: Include {target}: {exc.strerror or exc}")
            continue
        pairs = _pairs(text)
        if not pairs:
            conf.problems.append(f"{where}: not Key=Value: {text[:80]!r}")
            continue
        head_key, head_value = pairs[0]
        fields = {k.lower(): v for k, v in pairs[1:]}
        if head_key.lower() == "nodename":
            if head_value.upper() == "DEFAULT":
                node_default.update(fields)
                continue
            merged = {**node_default, **fields}
            conf.nodes.append(
                NodeDecl(
                    names=head_value,
                    gres_text=merged.get("gres"),
                    features=tuple(
                        f for f in (merged.get("features") or "").split(",") if f.strip()
                    ),
                    where=where,
                    fields=merged,
                )
            )
        elif head_key.lower() == "partitionname":
            if head_value.upper() == "DEFAULT":
                part_default.update(fields)
                continue
            merged = {**part_default, **fields}
            conf.partitions.append(
                PartitionDecl(head_value, merged.get("nodes", ""), where, merged)
            )
        elif head_key.lower() == "nodeset":
            conf.nodesets[head_value] = {k.lower(): v for k, v in pairs[1:]}
        elif head_key.lower() == "downnodes":
            conf.downnodes.append((head_value, where))
        elif head_key.lower() in ("frontendname", "switchname"):
            continue
        else:
            for key, value in pairs:
                conf.settings[key.lower()] = Setting(key, value, where)
    return conf


_SHOW_RE = re.compile(r"^(\S+)\s+=\s?(.*)$")


def parse_show_config(text: str, source: str = "scontrol show config") -> SlurmConf:
    """The global settings of ``scontrol show config`` (``Key = Value`` lines); nodes
    and partitions are read live (``scontrol show node`` / ``show partition``)."""
    conf = SlurmConf(source=source)
    for line in text.splitlines():
        m = _SHOW_RE.match(line.strip())
        if m and not line.startswith(" "):
            value = m.group(2).strip()
            if value in ("(null)", "none"):
                value = ""
            conf.settings[m.group(1).lower()] = Setting(
                m.group(1), value, f"{source} ({m.group(1)})"
            )
    return conf


def parse_show_partitions(text: str) -> list[PartitionDecl]:
    """``scontrol show partition -o``: one ``PartitionName=...`` line each."""
    out = []
    for line in text.splitlines():
        pairs = _pairs(line)
        if not pairs or pairs[0][0] != "PartitionName":
            continue
        fields = {k.lower(): v for k, v in pairs[1:]}
        out.append(
            PartitionDecl(pairs[0][1], fields.get("nodes", ""), f"partition {pairs[0][1]}", fields)
        )
    return out
