"""pyproject.toml lists its packages one by one (``hetpatrol.collectors`` and
``hetpatrol.bundled`` live outside ``hetpatrol/``): a package left off that list works in
an editable install and is missing from every real one (wheel, Debian package)."""

from __future__ import annotations

import tomllib
from conftest import REPO


def test_every_package_under_hetpatrol_is_listed_in_pyproject():
    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "hetpatrol").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found - listed == set()
