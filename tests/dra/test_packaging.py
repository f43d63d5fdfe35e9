"""The wheel and the type check cover every top-level package (dra/ was once left out of both,
so `pip install .` and the image shipped `baton dra` without its package)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def top_level_packages() -> set[str]:
    """Directories at the root holding an `__init__.py`, tests aside."""
    return {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}


def test_every_package_is_in_the_wheel_and_type_checked() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    checked = set(config["tool"]["mypy"]["files"])
    packages = top_level_packages()
    assert "dra" in packages
    for package in sorted(packages):
        assert any(fnmatch.fnmatch(package, pattern) for pattern in include), package
        assert package in checked, package
