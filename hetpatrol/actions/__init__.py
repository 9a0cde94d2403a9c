"""One fault vocabulary across vendors (issue 13): what to do about a finding.

- :mod:`~hetpatrol.actions.vocabulary`: the seven action words, their order and meaning;
- :mod:`~hetpatrol.actions.nvidia_xid`: XID -> action, from NVIDIA's XID catalog;
- :mod:`~hetpatrol.actions.nvml_recovery`: NVML GPU recovery action -> action;
- :mod:`~hetpatrol.actions.ascend_levels`: Ascend fault code -> MindCluster level -> action;
- :mod:`~hetpatrol.actions.findings`: the default action of every hetpatrol check;
- :mod:`~hetpatrol.actions.escalation`: frequency and duration rules, persistent state;
- :mod:`~hetpatrol.actions.settings`: the ``actions:`` config section (schema + defaults).

Nothing here imports more than the standard library at import time (the Slurm prolog
imports it before every job); the Ascend table's YAML is read on first use.
"""
