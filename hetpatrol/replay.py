"""Replay directories: recorded vendor output standing in for the hardware (``--replay``).

A replay directory holds the stdout of vendor commands, named by their argv joined with
``_`` (``npu-smi-info.txt`` is accepted for ``npu-smi info``), ``nvidia-smi-q.xml`` for
the NVIDIA replay (a fake ``pynvml`` answering NVML calls from that dump), and an
optional ``scenario.yaml``::

    node: mixed-sick-01          # node name used for this replay
    description: ...
    sources: {file: provenance}  # where each recording came from
    nvml:                        # faults injected into the NVIDIA replay
      gpus: {1: {lost: true}}

Only the vendor boundary is swapped; everything above it runs as in production.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetpatrol.yaml_document import DocumentError, parse_document, read_document

SCENARIO_FILE = "scenario.yaml"


def load_scenario(directory: Path) -> dict[str, Any]:
    """The parsed ``scenario.yaml`` of a replay directory, ``{}`` when there is none.

    Raises ``ValueError`` naming the file when it cannot be read or is not a YAML
    mapping (the guards of :mod:`hetpatrol.yaml_document` apply).
    """
    path = Path(directory) / SCENARIO_FILE
    if not path.is_file():
        return {}
    try:
        data, _ = parse_document(read_document(path))
    except (OSError, DocumentError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a mapping")
    return data


def scenario_boots(directory: Path) -> list[Path]:
    """The replay directory of each boot of a multi-boot scenario, in order (``boots:``
    in its ``scenario.yaml``, paths relative to it): "boot N" is item N-1. Each is a
    replay directory of its own, with ``proc/sys/kernel/random/boot_id`` and
    ``proc/stat`` (``btime``) read as ``/proc`` is on a host (:mod:`hetpatrol.boot`).
    ``[]`` for a scenario without boots. Raises ``ValueError`` naming the file when
    ``boots`` is not a list of directories under ``directory``."""
    directory = Path(directory)
    boots = load_scenario(directory).get("boots")
    if boots is None:
        return []
    where = directory / SCENARIO_FILE
    if not isinstance(boots, list) or not all(isinstance(b, str) for b in boots):
        raise ValueError(f"{where}: boots must be a list of directories")
    out = []
    for name in boots:
        path = (directory / name).resolve()
        if directory.resolve() not in path.parents or not path.is_dir():
            raise ValueError(f"{where}: boot {name!r} is not a directory under {directory}")
        out.append(directory / name)
    return out
