"""Exporters: Prometheus exposition, JSONL patrol log, state file."""
