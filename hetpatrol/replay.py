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

import yaml

SCENARIO_FILE = "scenario.yaml"


def load_scenario(directory: Path) -> dict[str, Any]:
    """The parsed ``scenario.yaml`` of a replay directory, ``{}`` when there is none.

    Raises ``ValueError`` naming the file when it is not a YAML mapping.
    """
    path = Path(directory) / SCENARIO_FILE
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: invalid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a mapping")
    return data
