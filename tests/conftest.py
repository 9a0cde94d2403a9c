"""Shared test helpers: where the recorded vendor samples and the bundled scenarios are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: ../shared/vendor-samples beside the checkout (read in place, never copied wholesale).
SAMPLES = REPO.parent / "shared" / "vendor-samples"
NODES = REPO / "fixtures" / "nodes"


def samples_dir(vendor: str) -> Path:
    """The recorded samples of a vendor; skip when absent, but fail under CI=true."""
    path = SAMPLES / vendor
    if not path.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{path} is missing: CI must have ../shared beside the clone")
        pytest.skip(f"{path} not found (run from a checkout with ../shared beside it)")
    return path


@pytest.fixture
def base_config():
    from hetpatrol.config import load_config

    return load_config()
