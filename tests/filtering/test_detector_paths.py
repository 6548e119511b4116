"""DESIGN.md's rule for adding a detector family stays true: every family registered by halsift is
``halsift.filtering.detectors.<module>:<Class>`` with its module at ``filtering/detectors/<module>.py``, and the
design document names that pattern (not paths that do not exist)."""

from __future__ import annotations

import re
from pathlib import Path

from halsift.filtering.detectors import spec

ROOT = Path(__file__).parents[2]


def test_every_registered_family_lives_where_design_says():
    where = {f: (t.__module__, t.__name__) if isinstance(t, type) else tuple(t.split(":"))  # a name resolves to its
             for f, t in spec._REGISTRY.items()}                                                # class once imported
    own = {f: w for f, w in where.items() if w[0].startswith("halsift.")}  # (tests register families of their own)
    assert {"clip", "vlm", "lora", "cascade", "ensemble", "random", "oracle"} <= set(own)
    for family, (module, cls) in own.items():
        assert re.fullmatch(r"halsift\.filtering\.detectors\.\w+", module), (family, target)
        path = ROOT / "filtering" / "detectors" / f"{module.rsplit('.', 1)[1]}.py"
        assert path.is_file(), (family, path)
        assert re.search(rf"^class {cls}\b", path.read_text(), re.M), (family, cls, path)


def test_design_names_the_real_pattern_and_no_missing_detector_file():
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    assert "`filtering/detectors/<module>.py`" in design
    assert '"halsift.filtering.detectors.<module>:<Class>"' in design
    files = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py") if ".git" not in p.parts]
    named = set(re.findall(r"`([\w/.]*\w+\.py)(?:::\w+)?`", design))
    missing = [n for n in sorted(named) if not any(f == n or f.endswith("/" + n) for f in files)]
    assert not missing, f"DESIGN.md names Python files that do not exist: {missing}"
