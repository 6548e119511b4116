"""pyproject's package list is the package tree: every folder with an ``__init__.py`` under a mapped folder is
installed (a regular, non-editable install finds only the listed packages), and nothing listed is missing."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_subpackage_is_listed_and_every_listed_package_exists():
    st = _setuptools()
    mapping, listed = st["package-dir"], set(st["packages"])
    found = set()
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]) if rel.parts else package)
    assert found - listed == set(), f"packages missing from pyproject: {sorted(found - listed)}"
    assert listed - found == set(), f"listed packages with no folder: {sorted(listed - found)}"


def test_package_data_lies_in_listed_packages():
    st = _setuptools()
    for package, patterns in st["package-data"].items():
        assert package in st["packages"], package
        top = next(p for p in sorted(st["package-dir"], key=len, reverse=True) if package == p or
                   package.startswith(p + "."))
        folder = ROOT / st["package-dir"][top] / Path(*package.split(".")[len(top.split(".")):])
        assert any(folder.glob(pat) for pat in patterns), (package, patterns)
