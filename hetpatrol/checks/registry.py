"""The check families, in the order their findings land on a record.

A new card check family is one module in this package (see
:mod:`hetpatrol.checks.facts` for its shape) plus its line here; :mod:`hetpatrol.config`
assembles the config sections from these lists and :mod:`hetpatrol.judge` runs them.
"""

from __future__ import annotations

from hetpatrol.checks import (
    baseline,
    card_hung,
    card_thresholds,
    clocks,
    environment,
    fabric,
    fault_codes,
    interconnect,
    kernel_events,
    pci_census,
    stray_process,
)

#: card check families: each declares PROFILE_SCHEMA, build_profile() and evaluate()
CARD_CHECKS = (card_thresholds, baseline, clocks, fault_codes, interconnect, fabric, card_hung)
#: families with top-level config keys: each declares TOP_SCHEMA and build_top()
TOP_SECTIONS = (kernel_events, baseline, environment, pci_census, stray_process)
