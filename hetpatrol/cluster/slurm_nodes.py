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
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hetpatrol.slurm.drain import ours
from hetpatrol.slurm.gres import GresEntry, parse_gres, parse_scontrol_nodes

#: The GRES strings of a cluster repeat (one per node batch): each is parsed once.
_parse_gres = lru_cache(maxsize=8192)(parse_gres)

#: Seconds one scontrol call may take (a 10,000-node JSON document takes about one).
SCONTROL_TIMEOUT = 60.0


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
    def drained_by_hetpatrol(self) -> bool:
        """Drained with a reason hetpatrol wrote (``hetpatrol: ...``)."""
        return self.drained and ours(self.reason)


def _split_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip() and v.strip() != "(null)")
    return tuple(v if isinstance(v, str) else str(v) for v in value if v or v == 0)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
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
    """One node object of ``scontrol --json show node`` / ``sinfo --json`` (either era)."""
    state = obj.get("state")
    flags: set[str] = {str(f).upper() for f in obj.get("state_flags") or ()}
    if isinstance(state, list):  # >= v0.0.39: ["IDLE", "DRAIN"]
        words = [str(s).upper() for s in state] or ["UNKNOWN"]
        base, flags = words[0], flags | set(words[1:])
    else:  # v0.0.37: "idle" + state_flags
        base = str(state or "UNKNOWN").upper()
    errors: list[str] = []
    return SlurmNode(
        name=str(obj.get("name") or ""),
        state=base,
        flags=frozenset(flags),
        partitions=_split_list(obj.get("partitions")),
        gres=_gres(_text(obj.get("gres")), errors),
        gres_used=_gres(_text(obj.get("gres_used")), errors),
        features=_split_list(obj.get("features")),
        reason=_text(obj.get("reason")),
        reason_user=_text(obj.get("reason_set_by_user")),
        hostname=_text(obj.get("hostname")),
        address=_text(obj.get("address")),
        gres_error="; ".join(errors) or None,
    )


def parse_nodes_json(text: str) -> list[SlurmNode]:
    """The ``nodes`` of a JSON document; ``ValueError`` when it is not one."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise ValueError("JSON without a 'nodes' list")
    errors = [e for e in doc.get("errors") or () if e]
    if errors and not doc["nodes"]:
        raise ValueError(f"Slurm reported errors: {json.dumps(errors)[:300]}")
    return [node_from_json(n) for n in doc["nodes"] if isinstance(n, dict)]


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


def parse_nodes_text(text: str) -> list[SlurmNode]:
    """``scontrol [-d] [-o] show node`` output, through :func:`parse_scontrol_nodes`."""
    out = []
    for info in parse_scontrol_nodes(_slim(text)):
        f = info.fields
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


def parse_nodes(text: str) -> list[SlurmNode]:
    """JSON (starts with ``{``) or scontrol text, whichever ``text`` is."""
    return parse_nodes_json(text) if text.lstrip().startswith("{") else parse_nodes_text(text)


def _run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise SlurmReadError(f"{argv[0]}: not found (is slurm-client installed?)") from None
    except subprocess.TimeoutExpired:
        raise SlurmReadError(f"{' '.join(argv)}: no answer within {timeout:.0f} s") from None


def read_nodes(
    scontrol: Sequence[str] = ("scontrol",), timeout: float = SCONTROL_TIMEOUT
) -> tuple[list[SlurmNode], str]:
    """Every node: ``(nodes, source)`` with source ``json`` or ``text``.

    ``SlurmReadError`` (with scontrol's own message) when neither form can be read.
    """
    js = _run([*scontrol, "--json", "show", "node"], timeout)
    if js.returncode == 0 and js.stdout.lstrip().startswith("{"):
        try:
            return parse_nodes_json(js.stdout), "json"
        except ValueError:
            pass
    txt = _run([*scontrol, "-d", "-o", "show", "node"], timeout)
    if txt.returncode != 0:
        detail = (txt.stderr.strip() or txt.stdout.strip() or "no output").splitlines()[-1]
        raise SlurmReadError(f"{' '.join([*scontrol, '-d', '-o', 'show', 'node'])}: {detail}")
    return parse_nodes_text(txt.stdout), "text"
