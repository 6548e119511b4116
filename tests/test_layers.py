"""Layer contracts: corpus <- filtering <- eval <- training <- launch (and the notebook API on top); synthetic-world
modules are imported only by launch, by each other, and by the synth modules listed below (known debt).

Checked from the source with ``ast`` (imports inside functions count too). import-linter would be the library
for this, but its graph builder (grimp) cannot follow packages that pyproject maps from separate top-level folders
(``package-dir``), so it sees an empty ``halsift``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
# folder -> the halsift subpackages its modules may import (besides itself)
ALLOWED = {
    "corpus": set(),
    "filtering": {"corpus"},
    "eval": {"corpus", "filtering"},
    "training": {"corpus", "filtering", "eval"},
    "launch": {"corpus", "filtering", "eval", "training", "recipes"},
    "api": {"corpus", "filtering", "eval", "training", "launch"},
}
SYNTH = ("halsift.corpus.synth", "halsift.eval.ihalla_synth", "halsift.eval.vope_synth", "halsift.eval.vigil_synth",
         "halsift.training.world_judge", "halsift.filtering.tiny_vlm")
# modules that are themselves part of the synthetic world although they live in a stage folder (to move into one
# synth package, issue 15): they may import synth modules; nothing else outside launch may
SYNTH_HOMES = {"corpus/synth", "eval/ihalla_synth.py", "eval/vope_synth.py", "eval/vigil_synth.py",
               "training/world_judge.py", "training/world_judge_config.py", "filtering/tiny_vlm.py"}


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


def _modules():
    for folder in ALLOWED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            package = ".".join(["halsift", *rel.parent.parts]) if folder != "api" else "halsift"
            yield folder, rel, package, path


def test_stage_folders_import_only_lower_layers():
    bad = []
    for folder, rel, package, path in _modules():
        for line, name in _imports(path, package):
            parts = name.split(".")
            if parts[0] != "halsift" or len(parts) < 2 or parts[1] == folder:
                continue
            if parts[1] not in ALLOWED[folder] and folder != "api":
                bad.append(f"{rel}:{line} imports {name}")
    assert not bad, "layer contract broken:\n" + "\n".join(bad)


def test_synthetic_world_code_is_imported_only_from_launch_and_synth_modules():
    bad = []
    for folder, rel, package, path in _modules():
        if folder in ("launch", "api") or any(str(rel).startswith(h) for h in SYNTH_HOMES):
            continue
        for line, name in _imports(path, package):
            if name.startswith(SYNTH):
                bad.append(f"{rel}:{line} imports {name}")
    assert not bad, "production code imports the synthetic world:\n" + "\n".join(bad)


def test_the_checker_sees_relative_and_nested_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from ..corpus.synth import scene\ndef g():\n    from halsift.launch import cli\n")
    assert _imports(f, "halsift.eval") == [(1, "halsift.corpus.synth"), (3, "halsift.launch")]
