#!/usr/bin/env python
"""Run import-linter (`lint-imports`, contracts in .importlinter) over halsift as it installs.

pyproject maps halsift's subpackages from separate top-level folders (``package-dir``: ``halsift`` = ``api/``,
``halsift.corpus`` = ``corpus/`` ...), which import-linter's graph builder cannot follow from the checkout, so the
package is staged as it installs (symlinks into a temporary folder) and linted there.

    python .ci/lint_imports.py [--src DIR]    # DIR: the tree to lint (default: this checkout)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stage(src: Path, into: Path) -> None:
    """Symlink each ``package-dir`` folder of ``src`` where its package would install under ``into``."""
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items(), key=lambda kv: kv[0].count(".")):
        target = into.joinpath(*package.split("."))
        if package.count(".") == 0:  # the root package: its files, so the subpackage links can sit beside them
            target.mkdir(parents=True)
            for f in (src / folder).glob("*.py"):
                (target / f.name).symlink_to(f.resolve())
        else:
            target.symlink_to((src / folder).resolve(), target_is_directory=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=REPO)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        stage(args.src, Path(tmp))
        env = {**os.environ, "PYTHONPATH": tmp}
        return subprocess.call(["lint-imports", "--no-cache", "--no-logo", str(REPO / ".importlinter")],
                               cwd=tmp, env=env)


if __name__ == "__main__":
    sys.exit(main())
