"""Every node Slurm knows, read once for the whole cluster.

Two sources, one result (:class:`SlurmNode`):

- ``scontrol --json show node`` (Slurm >= 23.02 with the ``data_parser`` plugins; the
  shape of slurmrestd's node object: ``state`` a list such as ``["IDLE", "DRAIN"]``,
  ``features`` a list) and ``sinfo --json`` of the openapi/v0.0.37 era (21.08, 22.05:
  ``state`` a string plus ``state_flags``, ``features`` a comma-separated string). Both
  carry ``gres``, ``gres_used``, ``partitions``, ``reason``, ``reason_set_by_user``.
- ``scontrol -d -o show node``: one line per node, the text every Slurm prints
  (``-d`` adds ``GresUsed=``). Slurm 22.05's scontrol has no ``--json`` for nodes (its
  openapi plugins serve slurmrestd only), so this is the path there.

:func:`read_nodes` tries JSON first and falls back to text when scontrol refuses it or
prints something that is not the node document.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hetpatrol.slurm.drain import ours
from hetpatrol.slurm.gres import GresEntry, parse_gres, parse_scontrol_nodes
from hetpatrol.tool import ToolOutput, run_tool

#: The GRES strings of a cluster repeat (one per node batch): each is parsed once.
_parse_gres = lru_cache(maxsize=8192)(parse_gres)

#: Seconds one scontrol call may take (a 10,000-node JSON document takes about one).
SCONTROL_TIMEOUT = 60.0
#: Most bytes of one scontrol answer kept: 64 MiB (``scontrol --json show node`` is
#: ~5 KB a node, 50 MB for 10,000; the text form a tenth of it). scontrol printing more
#: is killed and its answer refused, never parsed.
SCONTROL_OUTPUT_MAX = 64 * 1024 * 1024


class SlurmReadError(RuntimeError):
    """Slurm's node list could not be read; the message holds the command and its error."""


@dataclass(frozen=True)
class SlurmNode:
    """One node as Slurm has it.

    ``state`` is the base state upper-case (``IDLE``, ``MIXED``, ``ALLOCATED``, ``DOWN``);
    ``flags`` the rest (``DRAIN``, ``NOT_RESPONDING``...); ``gres`` the registration
    (``Gres=``), ``gres_used`` the allocated part (``GresUsed=``; empty when the source
    does not say); ``hostname``/``address`` are ``NodeHostName``/``NodeAddr``.
    """

    name: str
    state: str
    flags: frozenset[str] = frozenset()
    partitions: tuple[str, ...] = ()
    gres: tuple[GresEntry, ...] = ()
    gres_used: tuple[GresEntry, ...] = ()
    features: tuple[str, ...] = ()
    reason: str | None = None
    reason_user: str | None = None
    hostname: str | None = None
    address: str | None = None
    #: why ``Gres=``/``GresUsed=`` could not be read (the raw text is in the message);
    #: the node is kept, with no GRES from that field
    gres_error: str | None = None

    @property
    def drained(self) -> bool:
        """DRAIN flag set (drained or draining), or a DRAINED/DRAINING base state."""
        return "DRAIN" in self.flags or self.state in ("DRAINED", "DRAINING", "DRAIN")

    @property
    def down(self) -> bool:
        """Out of service whatever its reason: a ``DOWN`` base state, or the
        ``NOT_RESPONDING`` or ``FAIL`` flag. sinfo(1) NODE STATE CODES: DOWN "unavailable
        for use", FAIL "unavailable for use per system administrator request", ``*``
        (not responding) "will not be allocated any new work"; hetpatrol.slurm.states."""
        return self.state == "DOWN" or bool({"NOT_RESPONDING", "FAIL"} & self.flags)

    @property
    def drained_by_hetpatrol(self) -> bool:
        """Drained with a reason hetpatrol wrote (``hetpatrol: ...``)."""
        return self.drained and ours(self.reason)


class NodeList(list):
    """The readable nodes (a list of :class:`SlurmNode`), with ``unreadable``: (node or
    position, why) for each node object or line that could not be read (it is left out;
    the others are kept)."""

    def __init__(self, nodes=(), unreadable=()):
        super().__init__(nodes)
        self.unreadable: list[tuple[str, str]] = list(unreadable)


def _split_list(value: Any, key: str = "") -> tuple[str, ...]:
    """A comma-separated string or a list of strings; ``ValueError`` for another type."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip() and v.strip() != "(null)")
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(v for v in value if v)
    raise ValueError(f"{key} is a {type(value).__name__}, not a string or a list of strings")


def _text(value: Any, key: str = "") -> str | None:
    """A string or number field (stripped; None when empty); ``ValueError`` for a list
    or an object."""
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        raise ValueError(f"{key} is a {type(value).__name__}, not a string")
    text = str(value).strip()
    return text or None


def _gres(text: str | None, errors: list[str]) -> tuple[GresEntry, ...]:
    """Parsed GRES, or () with the error noted (a GRES string Slurm would not print)."""
    try:
        return _parse_gres(text)
    except ValueError as exc:
        errors.append(str(exc))
        return ()


def node_from_json(obj: Mapping[str, Any]) -> SlurmNode:
    """One node object of ``scontrol --json show node`` / ``sinfo --json`` (either era).

    ``ValueError`` (naming the field) when a field has a type neither era prints (a name
    that is not a non-empty string, a state that is an object, ``state_flags`` a
    number...).
    """
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name is {json.dumps(name)[:80]}, not a node name")
    state = obj.get("state")
    flags: set[str] = {f.upper() for f in _split_list(obj.get("state_flags"), "state_flags")}
    if isinstance(state, list):  # >= v0.0.39: ["IDLE", "DRAIN"]
        words = [w.upper() for w in _split_list(state, "state")] or ["UNKNOWN"]
        base, flags = words[0], flags | set(words[1:])
    else:  # v0.0.37: "idle" + state_flags
        base = (_text(state, "state") or "UNKNOWN").upper()
    errors: list[str] = []
    return SlurmNode(
        name=name,
        state=base,
        flags=frozenset(flags),
        partitions=_split_list(obj.get("partitions"), "partitions"),
        gres=_gres(_text(obj.get("gres"), "gres"), errors),
        gres_used=_gres(_text(obj.get("gres_used"), "gres_used"), errors),
        features=_split_list(obj.get("features"), "features"),
        reason=_text(obj.get("reason"), "reason"),
        reason_user=_text(obj.get("reason_set_by_user"), "reason_set_by_user"),
        hostname=_text(obj.get("hostname"), "hostname"),
        address=_text(obj.get("address"), "address"),
        gres_error="; ".join(errors) or None,
    )


def _label(obj: Any, i: int) -> str:
    name = obj.get("name") if isinstance(obj, dict) else None
    return name if isinstance(name, str) and name.strip() else f"nodes[{i}]"


def parse_nodes_json(text: str) -> NodeList:
    """The ``nodes`` of a JSON document; ``ValueError`` when it is not one (also when
    nested too deep to parse). A node object that cannot be read is left out and listed
    in ``unreadable`` with the reason."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    except RecursionError:
        raise ValueError("JSON nested too deep to be a node list") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise ValueError("JSON without a 'nodes' list")
    raw_errors = doc.get("errors")
    errors = [e for e in raw_errors if e] if isinstance(raw_errors, list) else []
    if errors and not doc["nodes"]:
        raise ValueError(f"Slurm reported errors: {json.dumps(errors)[:300]}")
    out = NodeList()
    for i, obj in enumerate(doc["nodes"]):
        if not isinstance(obj, dict):
            out.unreadable.append((f"nodes[{i}]", f"a JSON {type(obj).__name__}, not an object"))
            continue
        try:
            out.append(node_from_json(obj))
        except ValueError as exc:
            out.unreadable.append((_label(obj, i), str(exc)))
    return out


#: The fields read from ``scontrol -d -o show node`` (the rest of a line is dropped
#: before parsing: a 22.05 node line has about 45 fields).
_WANTED_RE = re.compile(
    r"(?:^|(?<=\s))(?:NodeName|State|Gres|GresUsed|Partitions|AvailableFeatures|Features"
    r"|NodeHostName|NodeAddr)=\S*"
)


def _slim(text: str) -> str:
    """One-line (``-o``) output with only the wanted ``Key=value`` words before
    ``Reason=`` kept (``Reason=`` and what follows it kept whole); multi-line output
    (a line not starting ``NodeName=``) is returned as it is."""
    lines = text.splitlines()
    if not all(line.startswith("NodeName=") for line in lines if line.strip()):
        return text
    out = []
    for line in lines:
        idx = line.find(" Reason=")
        head, tail = (line, "") if idx < 0 else (line[:idx], line[idx:])
        out.append(" ".join(_WANTED_RE.findall(head)) + tail)
    return "\n".join(out)


def parse_nodes_text(text: str) -> NodeList:
    """``scontrol [-d] [-o] show node`` output, through :func:`parse_scontrol_nodes`.

    ``ValueError`` for a line with no ``Key=Value`` word (not scontrol's output: garbage,
    binary); a node with an empty ``NodeName=`` is left out and listed in ``unreadable``.
    """
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip() and "=" not in line:
            raise ValueError(
                f"line {lineno} is not scontrol's node output (no Key=Value): {line[:80]!r}"
            )
    out = NodeList()
    for info in parse_scontrol_nodes(_slim(text)):
        f = info.fields
        if not info.name.strip():
            out.unreadable.append(("(empty NodeName=)", "a node line with an empty NodeName="))
            continue
        flags = set(info.flags)
        # the node-daemon parser notes an unreadable Gres= in gres_error (newer trees)
        errors = [e for e in (getattr(info, "gres_error", None),) if e]
        out.append(
            SlurmNode(
                name=info.name,
                state=info.base_state or "UNKNOWN",
                flags=frozenset(flags),
                partitions=_split_list(f.get("Partitions")),
                gres=info.gres,
                gres_used=_gres(f.get("GresUsed"), errors),
                features=_split_list(f.get("AvailableFeatures") or f.get("Features")),
                reason=info.reason,
                reason_user=info.reason_user,
                hostname=f.get("NodeHostName"),
                address=f.get("NodeAddr"),
                gres_error="; ".join(errors) or None,
            )
        )
    return out


def parse_nodes(text: str) -> NodeList:
    """JSON (starts with ``{``) or scontrol text, whichever ``text`` is."""
    return parse_nodes_json(text) if text.lstrip().startswith("{") else parse_nodes_text(text)


def require_nodes(nodes: NodeList, source: str) -> NodeList:
    """``nodes`` when it holds at least one node; ``SlurmReadError`` otherwise (a Slurm
    cluster has nodes: an empty list means the source was not Slurm's node list)."""
    if not nodes:
        why = f" ({len(nodes.unreadable)} unreadable)" if nodes.unreadable else ""
        raise SlurmReadError(f"{source}: no node could be read{why}: not Slurm's node list")
    return nodes


def run_scontrol(argv: Sequence[str], timeout: float) -> ToolOutput:
    """Run a Slurm command with :func:`hetpatrol.tool.run_tool`: its own process group
    killed at ``timeout`` seconds, at most :data:`SCONTROL_OUTPUT_MAX` bytes of stdout
    (more: killed). ``SlurmReadError`` when it cannot be run, has not answered in time
    (or ``timeout`` is spent already) or printed more than the bound."""
    cmd = " ".join(argv)
    if timeout <= 0:
        raise SlurmReadError(f"{cmd}: no time left of the --timeout to run it")
    try:
        out = run_tool(argv, timeout, stdout_cap=SCONTROL_OUTPUT_MAX)
    except FileNotFoundError:
        raise SlurmReadError(f"{argv[0]}: not found (is slurm-client installed?)") from None
    except OSError as exc:
        raise SlurmReadError(f"{cmd}: {exc.strerror or exc}") from None
    if out.truncated:
        raise SlurmReadError(
            f"{cmd}: printed more than {SCONTROL_OUTPUT_MAX} bytes: killed, not read"
        )
    if out.hung:
        raise SlurmReadError(f"{cmd}: no answer within {timeout:.3g} s")
    return out


_run = run_scontrol


def read_nodes(
    scontrol: Sequence[str] = ("scontrol",),
    timeout: float = SCONTROL_TIMEOUT,
    runner: Callable[[Sequence[str], float], ToolOutput] | None = None,
) -> tuple[NodeList, str]:
    """Every node: ``(nodes, source)`` with source ``json`` or ``text``.

    ``SlurmReadError`` (with scontrol's own message) when neither form can be read, or
    when they hold no node. ``timeout`` is for both calls together. ``runner``: what runs
    scontrol (default :func:`run_scontrol`; ``--replay`` passes a recording's).
    """
    call = runner or _run
    deadline = time.monotonic() + timeout
    js = call([*scontrol, "--json", "show", "node"], timeout)
    if js.returncode == 0 and js.stdout.lstrip().startswith("{"):
        try:
            nodes = parse_nodes_json(js.stdout)
            if nodes or nodes.unreadable:
                return nodes, "json"
        except ValueError:
            pass
    txt = call([*scontrol, "-d", "-o", "show", "node"], deadline - time.monotonic())
    if txt.returncode != 0:
        detail = (txt.stderr.strip() or txt.stdout.strip() or "no output").splitlines()[-1]
        raise SlurmReadError(f"{' '.join([*scontrol, '-d', '-o', 'show', 'node'])}: {detail}")
    cmd = " ".join([*scontrol, "-d", "-o", "show", "node"])
    try:
        nodes = parse_nodes_text(txt.stdout)
    except ValueError as exc:
        raise SlurmReadError(f"{cmd}: {exc}") from None
    return require_nodes(nodes, cmd), "text"
