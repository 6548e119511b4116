"""Layer contracts (``.importlinter``): corpus <- filtering <- eval <- training <- synth <- launch, the notebook API
on top; recipes import nothing. Checked by import-linter through ``.ci/lint_imports.py``, which stages the package
as it installs (pyproject maps the subpackages from separate folders, which import-linter cannot follow)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / ".ci" / "lint_imports.py"
FOLDERS = ("api", "corpus", "execution", "filtering", "eval", "training", "synth", "launch", "recipes")

pytestmark = pytest.mark.skipif(shutil.which("lint-imports") is None,
                                reason="import-linter is a test dependency: pip install -e '.[test]'")


def _lint(src: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--src", str(src)], capture_output=True, text=True,
                          timeout=120)


def test_the_layer_contracts_hold():
    done = _lint()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 kept, 0 broken" in done.stdout


@pytest.mark.parametrize("folder, line, broken", [
    ("corpus", "from halsift.filtering.detectors import spec", "halsift.corpus.bad -> halsift.filtering.detectors.spec"),
    ("eval", "def f():\n    from halsift.synth import world", "halsift.eval.bad -> halsift.synth.world"),
    ("recipes", "import halsift.corpus.bench", "halsift.recipes.bad -> halsift.corpus.bench"),
])
def test_an_upward_import_breaks_a_contract(tmp_path, folder, line, broken):
    """The same check on a copy with one bad module (imports inside functions count too)."""
    for f in FOLDERS:
        if f == folder:
            shutil.copytree(ROOT / f, tmp_path / f, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (tmp_path / f).symlink_to(ROOT / f, target_is_directory=True)
    (tmp_path / folder / "bad.py").write_text(line + "\n")
    done = _lint(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert " broken." in done.stdout and broken in done.stdout, done.stdout  # an upward import is also a cycle


@pytest.mark.parametrize("folder, files, cycle", [
    # two modules of one package importing each other (one of them inside a function)
    ("filtering", {"cyc_a.py": "from halsift.filtering import cyc_b\n",
                   "cyc_b.py": "def f():\n    from halsift.filtering import cyc_a\n"}, "No cycles are allowed in halsift.filtering"),
    # a cycle closed only by an import for type checkers
    ("corpus", {"cyc_a.py": "from halsift.corpus import cyc_b\n",
                "cyc_b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from halsift.corpus import cyc_a\n"},
     "No cycles are allowed in halsift.corpus"),
    # two sibling packages through their modules: eval.metrics -> eval.report -> eval.metrics
    ("eval", {"metrics/cyc.py": "import halsift.eval.report.markdown\n",
              "report/cyc.py": "import halsift.eval.metrics.detection\n"}, "No cycles are allowed in halsift.eval"),
])
def test_an_import_cycle_breaks_the_acyclic_contract(tmp_path, folder, files, cycle):
    """No import cycles at any level (import-linter's acyclic_siblings): a cycle between modules or between sibling
    packages is reported; imports under TYPE_CHECKING count too."""
    for f in FOLDERS:
        if f == folder:
            shutil.copytree(ROOT / f, tmp_path / f, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (tmp_path / f).symlink_to(ROOT / f, target_is_directory=True)
    for name, text in files.items():
        (tmp_path / folder / name).write_text(text)
    done = _lint(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 broken" in done.stdout and cycle in done.stdout, done.stdout
