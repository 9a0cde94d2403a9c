"""What the ledger asks Slurm besides sacct: the nodes' GRES types, the configuration, the
partitions (``scontrol``), all through an argv prefix (``["scontrol"]`` or
``["env", "SLURM_CONF=...", "scontrol"]``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hetpatrol.slurm.gres import parse_scontrol_nodes
from hetpatrol.tool import run_tool

#: Most bytes of one answer kept: 64 MiB (``scontrol show node -o`` is ~500 bytes a
#: node); a command printing more is killed and its answer refused, never parsed.
OUTPUT_MAX = 64 * 1024 * 1024


class SlurmQueryError(RuntimeError):
    """A Slurm command could not be run or exited non-zero (its stderr in the message)."""


def run(argv: Sequence[str], timeout: float = 60.0) -> str:
    """stdout of ``argv`` (run by :func:`hetpatrol.tool.run_tool`: its process group killed
    at ``timeout`` seconds or past :data:`OUTPUT_MAX` bytes); :class:`SlurmQueryError`
    with stderr when it fails, hangs or prints more than the bound."""
    cmd = " ".join(argv)
    try:
        out = run_tool(argv, timeout, stdout_cap=OUTPUT_MAX)
    except OSError as exc:
        raise SlurmQueryError(f"{cmd}: {exc.strerror or exc}") from None
    if out.truncated:
        raise SlurmQueryError(f"{cmd}: printed more than {OUTPUT_MAX} bytes: killed, not read")
    if out.hung:
        raise SlurmQueryError(f"{cmd}: no answer within {timeout:g} s: killed")
    if out.returncode != 0:
        raise SlurmQueryError(
            f"{' '.join(argv)} exited with {out.returncode}: {out.stderr.strip()[-1000:]}"
        )
    return out.stdout


def node_gres_types(scontrol_show_node: str) -> dict[str, dict[str, frozenset[str]]]:
    """``scontrol show node -o`` text -> node -> GRES name -> its types (lower case).

    Untyped entries add no type (a node with ``gpu:8`` gives ``{"gpu": frozenset()}``).
    """
    out: dict[str, dict[str, frozenset[str]]] = {}
    for node in parse_scontrol_nodes(scontrol_show_node):
        per: dict[str, set[str]] = {}
        for e in node.gres:
            s = per.setdefault(e.name.lower(), set())
            if e.type:
                s.add(e.type.lower())
        out[node.name] = {k: frozenset(v) for k, v in per.items()}
    return out


def parse_key_values(text: str) -> dict[str, str]:
    """``scontrol show config`` lines ``Key = value`` -> dict (first spelling kept)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def parse_partitions(text: str) -> dict[str, dict[str, str]]:
    """``scontrol show partition -o`` -> partition -> its ``Key=value`` fields.

    ``TRESBillingWeights=`` is absent from the line when the partition has none.
    """
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                fields.setdefault(key, value)
        if "PartitionName" in fields:
            out[fields["PartitionName"]] = fields
    return out


def read_node_gres(scontrol: Sequence[str]) -> dict[str, dict[str, frozenset[str]]]:
    return node_gres_types(run([*scontrol, "show", "node", "-o"]))
