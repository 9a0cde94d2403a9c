"""The cluster-wide views: ``hetpatrol fleet`` (Slurm joined with the daemons' metrics in
Prometheus) and ``hetpatrol audit-slurm`` (the mixed-cluster Slurm checklist)."""
