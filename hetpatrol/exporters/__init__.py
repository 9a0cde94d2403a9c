"""Exporters: Prometheus exposition, JSONL patrol log, state file."""

#: Mode of the files that name users and Slurm jobs per process: the JSONL patrol log
#: and the state file (owner read-write, group read: operators in the daemon's group,
#: root's ``hetpatrol check``; nobody else)
PRIVATE_FILE_MODE = 0o640
