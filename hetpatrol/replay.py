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
