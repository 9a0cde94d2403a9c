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


def test_every_data_file_beside_the_code_is_package_data():
    """A YAML file in ``collectors/`` (the plugins' profiles, the Ascend fault code table)
    or ``config/`` is read through ``importlib.resources``: one the package-data globs of
    its package miss is absent from every real install."""
    from fnmatch import fnmatch

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = setuptools["package-data"]
    for package, folder in setuptools["package-dir"].items():
        for path in sorted((REPO / folder).glob("*.yaml")):
            assert any(fnmatch(path.name, g) for g in data.get(package, ())), (package, path.name)
