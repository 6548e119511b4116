"""Layer contracts: corpus <- filtering <- eval <- training <- synth <- launch (and the notebook API on top).

``synth`` (the synthetic world, its world judge and the tiny test models) sits above every production stage: it
plugs in through the same registries and file formats a user would use, and only ``launch`` (recipes, ``halsift
synth``) and the notebook API import it.

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
    "synth": {"corpus", "filtering", "eval", "training"},
    "launch": {"corpus", "filtering", "eval", "training", "synth", "recipes"},
    "api": {"corpus", "filtering", "eval", "training", "synth", "launch"},
}


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


def test_production_stages_never_import_the_synthetic_world():
    bad = [f"{rel}:{line} imports {name}" for folder, rel, package, path in _modules()
           if folder not in ("synth", "launch", "api")
           for line, name in _imports(path, package) if name.startswith("halsift.synth")]
    assert not bad, "production code imports the synthetic world:\n" + "\n".join(bad)


def test_the_checker_sees_relative_and_nested_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from ..synth import scene\ndef g():\n    from halsift.launch import cli\n")
    assert _imports(f, "halsift.eval") == [(1, "halsift.synth"), (3, "halsift.launch")]
