"""Ascend fault code -> MindCluster handling level -> action.

Huawei's MindCluster (Ascend Device Plugin, ``faultCode.json``) gives every NPU fault
code a handling level. The levels and what MindCluster does for each are in its table
"Fault levels and handling suggestions" (MindCluster 7.3, "Customized Processor Faults",
https://www.hiascend.com/document/detail/en/mindcluster/730/clustersched/schedulingug/dlug_api_035.html
and dl_resume_037.html, the zh twin dl_resume_036.html):

================  ==========================================================  ============
level             MindCluster's description (rescheduling column)             action
================  ==========================================================  ============
NotHandleFault    "does not affect services, no action is required"           none
SubHealthFault    handled by the job's subHealthyStrategy; card keeps running watch
RestartRequest    "the service request needs to be executed again"            restart_job
RestartBusiness   "the service needs to be executed again"                    restart_job
FreeRestartNPU    "the processor needs to be reset when it is idle"           reset_card
RestartNPU        "reset the processor ... immediately"                       reset_card
SeparateNPU       "cannot be recovered, the processor needs to be isolated"   isolate_card
PreSeparateNPU    "no further jobs scheduled to this processor"               isolate_card
================  ==========================================================  ============

Also mapped: ``ManuallySeparateNPU`` (the result of MindCluster's frequency rules in
``faultCustomization.json``: isolated until an operator releases it) -> isolate_card;
the node / UnifiedBus levels of the same page (dl_resume_084): ``PreSeparateFault`` and
``SeparateFault`` -> isolate_card, ``ResetFault`` -> reset_card, ``RestartRequestFault``
-> restart_job.

``PreSeparateNPU`` maps to ``isolate_card`` although MindCluster leaves the running job
alone: isolating is exactly "do not schedule on it again", and a Slurm drain lets the
running job finish.

The code -> level table is ``collectors/ascend_fault_codes.yaml`` (shipped with this
plugin; each class carries its ``level``, its ``severity`` and the ``action`` prose the
``ascend_fault_code`` finding shows: :func:`fault_code_table`). A code not in it is
``watch`` with the raw code (issue 13: never ``none``).
MindCluster itself treats an unlisted code by the driver's alarm grade ("prompt" or
"minor" -> NotHandleFault, else SeparateNPU, dl_resume_036); hetpatrol does not drain
on a code it cannot look up.

Importing this module reads nothing; :func:`load_code_levels` and
:func:`fault_code_table` read the YAML (and import ``yaml``) only when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hetpatrol.actions.vocabulary import (
    ISOLATE_CARD,
    NONE,
    RESET_CARD,
    RESTART_JOB,
    WATCH,
    ActionVerdict,
)

LEVEL_ACTION: dict[str, str] = {
    "NotHandleFault": NONE,
    "SubHealthFault": WATCH,
    "RestartRequest": RESTART_JOB,
    "RestartBusiness": RESTART_JOB,
    "FreeRestartNPU": RESET_CARD,
    "RestartNPU": RESET_CARD,
    "SeparateNPU": ISOLATE_CARD,
    "PreSeparateNPU": ISOLATE_CARD,
    "ManuallySeparateNPU": ISOLATE_CARD,
    # node and UnifiedBus device levels (dl_resume_084)
    "PreSeparateFault": ISOLATE_CARD,
    "SeparateFault": ISOLATE_CARD,
    "ResetFault": RESET_CARD,
    "RestartRequestFault": RESTART_JOB,
}

FAULT_CODE_FILE = "ascend_fault_codes.yaml"


def level_action(level: str | None) -> ActionVerdict:
    """The action of a MindCluster level name (``SeparateNPU``); a ``...Codes`` class
    name of faultCode.json (``SeparateNPUCodes``) is accepted too. Unknown -> watch."""
    name = (level or "").strip()
    if name not in LEVEL_ACTION and name.endswith("Codes"):
        name = name[: -len("Codes")]
    if name not in LEVEL_ACTION:
        return ActionVerdict(WATCH, "unknown", f"ascend_level:{level}", "level not known")
    return ActionVerdict(LEVEL_ACTION[name], "ascend_level", f"ascend_level:{name}", name)


def code_levels_from_document(doc: Mapping[str, Any]) -> dict[str, str]:
    """``{code (upper case): level}`` from the parsed YAML document.

    A class's level is its ``level`` key, else its name without ``Codes``. Raises
    ValueError for a document without ``classes``/``codes`` mappings.
    """
    classes = doc.get("classes")
    codes = doc.get("codes")
    if not isinstance(classes, Mapping) or not isinstance(codes, Mapping):
        raise ValueError("an Ascend fault code table needs 'classes' and 'codes' mappings")
    out: dict[str, str] = {}
    for cls, listed in codes.items():
        spec = classes.get(cls) or {}
        level = spec.get("level") if isinstance(spec, Mapping) else None
        if not level:
            level = str(cls).removesuffix("Codes")
        for code in listed or ():
            out[str(code).strip().upper()] = str(level)
    return out


def load_code_levels(path: Path | str | None = None) -> dict[str, str]:
    """Read the code table (default: the bundled ``ascend_fault_codes.yaml``).

    Raises OSError (unreadable) or ValueError (not a table)."""
    import yaml

    text = bundled_text() if path is None else Path(path).read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    if not isinstance(doc, Mapping):
        raise ValueError(f"{path or FAULT_CODE_FILE} is not a mapping")
    return code_levels_from_document(doc)


def bundled_text() -> str:
    """The text of the bundled ``ascend_fault_codes.yaml`` (beside this module, package
    data of ``hetpatrol.collectors``). Raises OSError."""
    from importlib.resources import files

    return files("hetpatrol.collectors").joinpath(FAULT_CODE_FILE).read_text(encoding="utf-8")


@dataclass(frozen=True)
class FaultCodeTable:
    """Severity per error code, from the bundled ``ascend_fault_codes.yaml``."""

    classes: Mapping[str, Mapping[str, str]]
    codes: Mapping[str, str]  # code -> class

    def lookup(self, code: str) -> tuple[str | None, str | None, str | None]:
        """(severity, class, action) of a code; (None, None, None) when not listed."""
        cls = self.codes.get(code.upper())
        if cls is None:
            return None, None, None
        spec = self.classes.get(cls, {})
        return spec.get("severity"), cls, spec.get("action")


@lru_cache(maxsize=1)
def fault_code_table() -> FaultCodeTable:
    """The bundled table, read once (imports yaml). Raises OSError / yaml.YAMLError."""
    import yaml

    data = yaml.safe_load(bundled_text())
    codes = {}
    for cls, listed in (data.get("codes") or {}).items():
        for code in listed or ():
            codes[str(code).upper()] = cls
    return FaultCodeTable(classes=data.get("classes") or {}, codes=codes)


def lookup_code(code: str) -> tuple[str | None, str | None, str | None]:
    """(severity, class, action) of one npu-smi error code by the bundled table
    (:meth:`FaultCodeTable.lookup`), as ``VendorInfo.fault_codes`` declares it."""
    return fault_code_table().lookup(code)


def code_action(
    code: str,
    levels: Mapping[str, str],
    overrides: Mapping[str, str] | None = None,
) -> ActionVerdict:
    """The action of one 8-hex-digit npu-smi error code.

    ``levels``: from :func:`load_code_levels`; ``overrides``: per-code action words
    from the config, keyed ``"ascend:<CODE>"``. Unknown code -> watch with the code.
    """
    upper = str(code).strip().upper()
    key = f"ascend:{upper}"
    if overrides and key in overrides:
        return ActionVerdict(overrides[key], "override", key, "per-code override in the config")
    level = levels.get(upper)
    if level is None:
        return ActionVerdict(WATCH, "unknown", key, f"code {upper} is not in the fault table")
    verdict = level_action(level)
    return ActionVerdict(verdict.action, "ascend_level", key, f"{upper}: {level}")
