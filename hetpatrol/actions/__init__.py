"""One fault vocabulary across vendors (issue 13): what to do about a finding.

- :mod:`~hetpatrol.actions.vocabulary`: the seven action words, their order and meaning;
- :mod:`~hetpatrol.actions.findings`: the default action of every hetpatrol check; the
  checks only a vendor makes take its plugin's fault tables, declared in
  ``VendorInfo.actions`` (:class:`hetpatrol.collector.VendorActions`: NVIDIA's XID
  catalog and NVML recovery action, ``hetpatrol.collectors.nvidia_actions``; Ascend's
  MindCluster levels, ``hetpatrol.collectors.ascend_actions``);
- :mod:`~hetpatrol.actions.escalation`: frequency and duration rules, persistent state;
- :mod:`~hetpatrol.actions.settings`: the ``actions:`` config section (schema + defaults).

Nothing here imports more than the standard library at import time (the Slurm prolog
imports it before every job); the plugins' tables are imported on first use.
"""
