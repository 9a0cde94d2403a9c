"""The ledger: accelerator card-hours per GRES name and type from Slurm accounting.

Modules: :mod:`.tres` (TRES strings -> cards per GRES type, typed/untyped reconciled),
:mod:`.sacct_stream` (``sacct -P`` streamed line by line into :class:`JobRun` records),
:mod:`.usage` (card-seconds, jobs and wait time grouped over a window), :mod:`.audit`
(is the Slurm configuration able to meter per card type?), :mod:`.quotas` (usage against
``sacctmgr`` limits or a quota file; exit code and Prometheus textfile), :mod:`.report`
(table, CSV, JSON) and :mod:`.efficiency` (allocated vs busy, from Prometheus).
"""
