"""Slurm integration: GRES registration vs the real cards, safe drain and resume.

- :mod:`hetpatrol.slurm.settings`: the ``slurm:`` config section (everything off by default).
- :mod:`hetpatrol.slurm.gres`: parsers for ``scontrol show node`` output, GRES strings
  (``gpu:a100:8(S:0-1)``), ``gres.conf`` and Slurm host lists.
- :mod:`hetpatrol.slurm.inventory`: the registration (read through ``scontrol``, cached,
  falling back to ``gres.conf``) compared with the cards found and healthy; a node check
  run by the patroller before the report is built.
- :mod:`hetpatrol.slurm.drain`: the drain / resume policy, run by the daemon after each
  report; every decision is a ``kind: "event"`` JSONL line.
- :mod:`hetpatrol.slurm.states`: which Slurm node states and flags allow a drain or a
  resume, and whose reason a reason is; shared by the daemon and the root helper.

This package imports nothing heavy at import time: :mod:`hetpatrol.config` imports
:mod:`hetpatrol.slurm.settings`.
"""
