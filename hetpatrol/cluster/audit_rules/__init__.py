"""The rules of ``hetpatrol audit-slurm``: one module per rule, each citing the Slurm man
page or source line it follows; :mod:`.registry` lists them, :mod:`.context` is what
they read."""
