"""The ``slurm:`` section of the configuration. Everything is off by default.

::

    slurm:
      enabled: false                 # GRES registration check (node finding gres_mismatch)
      node_name: null                # Slurm NodeName; null = the config's `node`
      scontrol: ["scontrol"]         # argv prefix of every scontrol call
      timeout_seconds: 10            # each scontrol call is killed after this long
      gres_conf: /etc/slurm/gres.conf   # fallback when scontrol cannot answer; null = none
      registration_cache_seconds: 300   # re-read the registration at most this often
      admin_comment: false           # card faults appended to the jobs' AdminComment
      drain:
        enabled: false               # drain on critical, resume our own drains
        dry_run: false               # log the decisions, change nothing
        resume_after_patrols: 3      # consecutive healthy patrols before a resume
        reboot: false                # reboot_node: scontrol reboot ASAP nextstate=DOWN
        breaker:                     # hold a drain when many nodes are drained already
          enabled: true
          max_share: 0.10            # of the nodes of this node's partitions ...
          window_seconds: 600        # ... drained by hetpatrol within this window
          sinfo: ["sinfo"]           # read-only, run as the daemon's user

Kept apart from :mod:`hetpatrol.config` so that module only wires it in: the JSON Schema
fragment :data:`SLURM_SCHEMA` is checked with the rest of the file (errors name key and
line), :func:`build_slurm_settings` turns the checked mapping into
:class:`SlurmSettings`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_GRES_CONF = "/etc/slurm/gres.conf"

SLURM_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "additionalProperties": False,
    "properties": {
        "enabled": {"type": "boolean"},
        "node_name": {"type": ["string", "null"], "minLength": 1, "pattern": "^\\S+$"},
        "scontrol": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "minLength": 1},
        },
        "timeout_seconds": {"type": "number", "exclusiveMinimum": 0},
        "gres_conf": {"type": ["string", "null"], "minLength": 1},
        "registration_cache_seconds": {"type": "number", "minimum": 0},
        "admin_comment": {"type": "boolean"},
        "drain": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "enabled": {"type": "boolean"},
                "dry_run": {"type": "boolean"},
                "resume_after_patrols": {"type": "integer", "minimum": 1},
                "reboot": {"type": "boolean"},
                "breaker": {
                    "type": ["object", "null"],
                    "additionalProperties": False,
                    "properties": {
                        "enabled": {"type": "boolean"},
                        "max_share": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                        "window_seconds": {"type": "number", "exclusiveMinimum": 0},
                        "sinfo": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string", "minLength": 1},
                        },
                    },
                },
            },
        },
    },
}


@dataclass(frozen=True)
class BreakerSettings:
    """``slurm.drain.breaker``: on by default where draining is."""

    enabled: bool = True
    max_share: float = 0.10
    window_seconds: float = 600.0
    sinfo: tuple[str, ...] = ("sinfo",)


@dataclass(frozen=True)
class DrainSettings:
    """``slurm.drain``: drain on critical, resume only our own drains."""

    enabled: bool = False
    dry_run: bool = False
    resume_after_patrols: int = 3
    #: reboot_node through Slurm (``scontrol reboot ASAP nextstate=DOWN``), opt-in
    reboot: bool = False
    breaker: BreakerSettings = field(default_factory=BreakerSettings)


@dataclass(frozen=True)
class SlurmSettings:
    """``slurm``: the GRES registration check and, under ``drain``, the drain policy."""

    enabled: bool = False
    node_name: str | None = None
    scontrol: tuple[str, ...] = ("scontrol",)
    timeout_seconds: float = 10.0
    gres_conf: Path | None = Path(DEFAULT_GRES_CONF)
    registration_cache_seconds: float = 300.0
    #: append each card fault to the AdminComment of the jobs on the card (opt-in)
    admin_comment: bool = False
    drain: DrainSettings = field(default_factory=DrainSettings)

    def slurm_node(self, node: str) -> str:
        """The Slurm NodeName of this node: ``node_name`` or else the config's ``node``."""
        return self.node_name or node


def build_slurm_settings(
    data: Mapping[str, Any] | None, expand: Callable[[str], Path] = Path
) -> SlurmSettings:
    """:class:`SlurmSettings` from the (schema-checked) ``slurm`` mapping; ``expand``
    turns the configured ``gres_conf`` text into a path (``~`` and ``$VAR``)."""
    data = data or {}
    drain = data.get("drain") or {}
    gres_conf = data.get("gres_conf", DEFAULT_GRES_CONF)
    return SlurmSettings(
        enabled=bool(data.get("enabled", False)),
        node_name=data.get("node_name"),
        scontrol=tuple(data.get("scontrol", ("scontrol",))),
        timeout_seconds=float(data.get("timeout_seconds", 10.0)),
        gres_conf=expand(gres_conf) if gres_conf else None,
        registration_cache_seconds=float(data.get("registration_cache_seconds", 300.0)),
        admin_comment=bool(data.get("admin_comment", False)),
        drain=DrainSettings(
            enabled=bool(drain.get("enabled", False)),
            dry_run=bool(drain.get("dry_run", False)),
            resume_after_patrols=int(drain.get("resume_after_patrols", 3)),
            reboot=bool(drain.get("reboot", False)),
            breaker=_breaker(drain.get("breaker") or {}),
        ),
    )


def _breaker(data: Mapping[str, Any]) -> BreakerSettings:
    return BreakerSettings(
        enabled=bool(data.get("enabled", True)),
        max_share=float(data.get("max_share", 0.10)),
        window_seconds=float(data.get("window_seconds", 600.0)),
        sinfo=tuple(data.get("sinfo", ("sinfo",))),
    )
