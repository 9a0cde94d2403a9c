"""Bundled configuration files, importable as ``hetpatrol.bundled`` for importlib.resources."""
